"""A tiny, randomly initialised Llama-style model made entirely on this machine.

Nothing is downloaded: the tokenizer is a byte-level BPE trained on Python's own
standard-library sources, and the weights are random. It exists so a real vLLM
server (the CPU build) has something to serve in the demo and the tests; its
outputs are gibberish by design.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import msgspec

from stepscope.config import TinyModelParams
from stepscope.errors import StepscopeError

# vLLM's CPU attention supports these head sizes only (docs/methods.md#vllm-cpu-backend); 16 fails at the first request.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
_TRAIN_BYTES = 4_000_000  # enough text for a 2k-token BPE; keeps training to a few seconds


def _stdlib_corpus(limit_bytes: int = _TRAIN_BYTES) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    total = 0
    for path in sorted(root.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text)
        total += len(text)
        if total >= limit_bytes:
            break
    if not texts:
        raise StepscopeError("no Python standard-library sources found to train a tokenizer on",
                             where=str(root))
    return texts


def validate_tiny(spec: TinyModelParams) -> None:
    if spec.hidden % spec.heads:
        raise StepscopeError(f"hidden {spec.hidden} is not a multiple of heads {spec.heads}",
                             where="model.tiny", hint="pick heads that divide hidden")
    head_size = spec.hidden // spec.heads
    if head_size not in CPU_HEAD_SIZES:
        raise StepscopeError(
            f"head size {spec.hidden}/{spec.heads} = {head_size} is not served by vLLM's CPU backend",
            where="model.tiny", hint=f"choose hidden/heads in {CPU_HEAD_SIZES}")
    if spec.heads % spec.kv_heads:
        raise StepscopeError(f"heads {spec.heads} is not a multiple of kv_heads {spec.kv_heads}",
                             where="model.tiny")


def create_tiny_model(out_dir: str | Path, spec: TinyModelParams = TinyModelParams(),
                      *, moe_experts: int = 0, moe_top_k: int = 2) -> Path:
    """Write config, bf16 safetensors weights and a tokenizer to `out_dir`.

    `moe_experts > 0` writes a Mixtral-style MoE variant instead of a dense Llama.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    validate_tiny(spec)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    special = ["<s>", "</s>", "<unk>", "<pad>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=spec.vocab_size, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_stdlib_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>",
                                   model_max_length=spec.max_position)
    fast.save_pretrained(out_dir)

    torch.manual_seed(spec.seed)
    common = dict(
        vocab_size=tok.get_vocab_size(), hidden_size=spec.hidden,
        intermediate_size=spec.intermediate, num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
        max_position_embeddings=spec.max_position, bos_token_id=0, eos_token_id=1,
        pad_token_id=3, tie_word_embeddings=False, torch_dtype="bfloat16",
    )
    if moe_experts:
        from transformers import MixtralConfig, MixtralForCausalLM

        config = MixtralConfig(num_local_experts=moe_experts, num_experts_per_tok=moe_top_k, **common)
        model = MixtralForCausalLM(config)
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(**common)
        model = LlamaForCausalLM(config)
    model = model.to(torch.bfloat16)
    model.save_pretrained(out_dir, safe_serialization=True)
    (out_dir / "stepscope_tiny.json").write_text(json.dumps(
        {"made_by": "stepscope tiny-model", "spec": msgspec.structs.asdict(spec), "moe_experts": moe_experts,
         "note": "random weights; outputs are meaningless by design"}, indent=2))
    return out_dir


def tiny_model_exists(path: str | Path) -> bool:
    p = Path(path)
    return (p / "config.json").is_file() and any(p.glob("*.safetensors")) and (p / "tokenizer.json").is_file()
