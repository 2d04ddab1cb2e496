"""The tiny model: made locally, loadable by transformers, servable by vLLM's CPU backend."""

from __future__ import annotations

import json

import pytest

from stepscope.config import TinyModelParams
from stepscope.errors import StepscopeError
from stepscope.serve.tinymodel import validate_tiny


def test_head_size_16_is_refused_with_the_supported_sizes():
    with pytest.raises(StepscopeError) as exc:
        validate_tiny(TinyModelParams(hidden=64, heads=4))
    assert "head size 64/4 = 16" in str(exc.value) and "32" in str(exc.value)


def test_kv_heads_must_divide_heads():
    with pytest.raises(StepscopeError, match="kv_heads"):
        validate_tiny(TinyModelParams(hidden=128, heads=4, kv_heads=3))


@pytest.mark.slow
def test_tiny_model_loads_in_transformers(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stepscope.serve import create_tiny_model

    out = create_tiny_model(tmp_path / "m", TinyModelParams(layers=2, hidden=128, heads=4, kv_heads=2,
                                                            vocab_size=1024))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["hidden_size"] // cfg["num_attention_heads"] == 32
    assert cfg["vocab_size"] == 1024
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok("def main():\n    return 0\n")["input_ids"]
    assert tok.decode(ids) == "def main():\n    return 0\n"  # byte-level BPE round-trips exactly
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.bfloat16
    assert sum(p.numel() for p in model.parameters()) > 0
    logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), 1024)
