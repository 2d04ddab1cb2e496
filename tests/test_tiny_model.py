"""The tiny model: made locally, loadable by transformers, servable by vLLM's CPU backend."""

from __future__ import annotations

import json

import pytest

from conftest import free_port
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


# ---------------------------------------------------------------- the tiny DeepSeek-V3


def test_deepseek_v3_needs_a_moe_layer_after_the_dense_one():
    with pytest.raises(StepscopeError, match="no MoE layer") as exc:
        validate_tiny(TinyModelParams(arch="deepseek_v3", layers=1, hidden=256))
    assert exc.value.where == "model.tiny.layers"


def test_deepseek_v3_takes_any_hidden_per_head():
    # MLA's head size is kv_lora_rank + qk_rope_head_dim (576), not hidden/heads
    validate_tiny(TinyModelParams(arch="deepseek_v3", layers=3, hidden=256, heads=3))


def test_the_cli_offers_every_tiny_arch():
    import typing

    from stepscope.cli import build_parser
    from stepscope.serve.tinymodel import TINY_DEFAULTS

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["tiny-model"]
    choices = next(a for a in sub._actions if a.dest == "arch").choices
    arches = typing.get_args(typing.get_type_hints(TinyModelParams)["arch"])
    assert tuple(choices) == tuple(TINY_DEFAULTS) == arches
    assert all(TINY_DEFAULTS[a].arch == a for a in arches)


@pytest.fixture(scope="module")
def tiny_dsv3(tmp_path_factory):
    from stepscope.serve import create_tiny_model
    from stepscope.serve.tinymodel import TINY_DEFAULTS

    return create_tiny_model(tmp_path_factory.mktemp("tiny-dsv3") / "m", TINY_DEFAULTS["deepseek_v3"])


def test_tiny_deepseek_v3_config_is_the_reference_kind(tiny_dsv3):
    from safetensors import safe_open

    from stepscope.model import load_architecture

    cfg = json.loads((tiny_dsv3 / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"] and cfg["model_type"] == "deepseek_v3"
    # vLLM's CPU MLA decode kernel takes head size 576 = kv_lora_rank + qk_rope_head_dim only
    assert (cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]) == (512, 64)
    # written by stepscope: transformers leaves them out, and vLLM then routes by softmax
    assert (cfg["topk_method"], cfg["scoring_func"]) == ("noaux_tc", "sigmoid")
    assert (cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["n_shared_experts"]) == (64, 8, 1)
    assert (cfg["first_k_dense_replace"], cfg["num_hidden_layers"], cfg["hidden_size"]) == (1, 3, 256)
    assert (cfg["n_group"], cfg["topk_group"]) == (1, 1)
    arch = load_architecture(tiny_dsv3)
    assert (arch.family, arch.n_dense_layers, arch.n_routed_experts, arch.top_k) == ("deepseek_v3", 1, 64, 8)
    assert (arch.moe_intermediate, arch.shared_intermediate, arch.intermediate) == (128, 128, 512)
    with safe_open(str(tiny_dsv3 / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        bias = f.get_tensor("model.layers.1.mlp.gate.e_score_correction_bias")
    # noaux_tc's correction bias is in the checkpoint (vLLM would keep uninitialised memory otherwise)
    assert bias.shape == (64,) and float(bias.abs().sum()) == 0.0
    assert "model.layers.0.mlp.gate_proj.weight" in names and "model.layers.0.mlp.gate.weight" not in names
    assert "model.layers.2.mlp.shared_experts.down_proj.weight" in names
    assert "model.layers.2.mlp.experts.63.up_proj.weight" in names


@pytest.mark.slow
def test_vllm_cpu_serves_the_tiny_deepseek_v3(tiny_dsv3, tmp_path):
    """The demo's server settings (params/cpu-moe.yaml) serve it at TP=2 with MLA and fused MoE."""
    import urllib.request

    from stepscope.config import deep_merge, load_params, params_from_dict, params_to_dict
    from stepscope.paths import REPO_ROOT
    from stepscope.serve import launch

    base = load_params(REPO_ROOT / "params" / "cpu-moe.yaml")
    params = params_from_dict(deep_merge(params_to_dict(base), {
        "model": {"path": str(tiny_dsv3)}, "server": {"port": free_port(), "profiler": {"enabled": False}}}))
    proc, handle = launch(params, tmp_path, progress=False)
    try:
        body = json.dumps({"model": handle.served_model, "prompt": "def main():", "max_tokens": 4,
                           "temperature": 0, "ignore_eos": True}).encode()
        req = urllib.request.Request(f"{handle.base_url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            answer = json.loads(resp.read())
    finally:
        proc.stop()
    assert answer["usage"]["completion_tokens"] == 4 and answer["choices"][0]["text"]
    log = proc.log_path.read_text()
    assert "Using CPU_MLA backend" in log and "CPUUnquantizedExperts" in log
    assert "forcing chunked prefill and prefix caching to be disabled" in log
