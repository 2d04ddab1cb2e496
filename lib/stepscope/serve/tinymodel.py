"""A tiny, randomly initialised model (Llama, or DeepSeek-V3 with MLA and MoE) made entirely on this machine,
so the CPU vLLM has something to serve in the demo and tests. Nothing is downloaded: the tokenizer is trained
on Python's stdlib sources."""

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
    if spec.arch == "deepseek_v3":
        _validate_deepseek_v3(spec)
        return
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


def _validate_deepseek_v3(spec: TinyModelParams) -> None:
    # MLA's head size is kv_lora_rank + qk_rope_head_dim (576), whatever hidden/heads is.
    if spec.layers <= DEEPSEEK_V3_MOE["first_k_dense_replace"]:
        raise StepscopeError(
            f"layers {spec.layers} leaves no MoE layer after the first dense one",
            where="model.tiny.layers", hint="use at least 2 layers (the demo uses 3)")


# The MoE and MLA part of the tiny DeepSeek-V3 (docs/methods.md#the-tiny-deepseek-v3). MLA keeps
# Kimi's latent sizes: vLLM's CPU MLA decode kernel takes head size 576 = 512 + 64 only.
# n_group/topk_group 1 as Kimi-K2: ungrouped top-8, so D(M) = E(1 - (1 - k/E)^M) holds.
DEEPSEEK_V3_MOE: dict[str, int | float] = {
    "n_routed_experts": 64, "num_experts_per_tok": 8, "moe_intermediate_size": 128,
    "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
    "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 64, "v_head_dim": 64,
    "q_lora_rank": 128, "routed_scaling_factor": 2.827,
}
# transformers' DeepseekV3Config does not write these; without them vLLM builds softmax
# routing with no correction bias, not DeepSeek-V3's (and Kimi's) sigmoid noaux_tc.
DEEPSEEK_V3_ROUTING: dict[str, str] = {"topk_method": "noaux_tc", "scoring_func": "sigmoid"}
# The sizes `stepscope tiny-model --arch deepseek_v3` writes when no flag says otherwise.
TINY_DEFAULTS: dict[str, TinyModelParams] = {
    "llama": TinyModelParams(),
    "deepseek_v3": TinyModelParams(arch="deepseek_v3", layers=3, hidden=256, heads=4, kv_heads=4,
                                   intermediate=512),
}


def _train_tokenizer(spec: TinyModelParams, out_dir: Path) -> int:
    """Train the byte-level BPE, save it to `out_dir`, and return its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

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
    return tok.get_vocab_size()


def _build_model(spec: TinyModelParams, vocab_size: int, moe_experts: int, moe_top_k: int):
    """The randomly initialised transformers model `spec` describes."""
    common = dict(
        vocab_size=vocab_size, hidden_size=spec.hidden,
        intermediate_size=spec.intermediate, num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
        max_position_embeddings=spec.max_position, bos_token_id=0, eos_token_id=1,
        pad_token_id=3, tie_word_embeddings=False, torch_dtype="bfloat16",
    )
    if spec.arch == "deepseek_v3":
        from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

        # MLA: every head reads the one latent, so there are as many KV heads as heads
        common["num_key_value_heads"] = spec.heads
        return DeepseekV3ForCausalLM(DeepseekV3Config(num_nextn_predict_layers=0, **DEEPSEEK_V3_MOE, **common))
    if moe_experts:
        from transformers import MixtralConfig, MixtralForCausalLM

        config = MixtralConfig(num_local_experts=moe_experts, num_experts_per_tok=moe_top_k, **common)
        return MixtralForCausalLM(config)
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(**common))


def create_tiny_model(out_dir: str | Path, spec: TinyModelParams = TinyModelParams(),
                      *, moe_experts: int = 0, moe_top_k: int = 2) -> Path:
    """Write config, bf16 safetensors weights and a tokenizer to `out_dir`: a tiny DeepSeek-V3 for `spec.arch`
    "deepseek_v3", a Mixtral-style MoE for Llama with `moe_experts > 0`."""
    import torch

    validate_tiny(spec)
    if moe_experts and spec.arch != "llama":
        raise StepscopeError(f"moe_experts applies to the llama arch only, not {spec.arch!r}",
                             where="tiny-model --moe-experts",
                             hint="the deepseek_v3 arch has its own experts; drop --moe-experts")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab_size = _train_tokenizer(spec, out_dir)
    torch.manual_seed(spec.seed)
    model = _build_model(spec, vocab_size, moe_experts, moe_top_k).to(torch.bfloat16)
    model.save_pretrained(out_dir, safe_serialization=True)
    if spec.arch == "deepseek_v3":
        config_path = out_dir / "config.json"
        config_path.write_text(json.dumps({**json.loads(config_path.read_text()), **DEEPSEEK_V3_ROUTING},
                                          indent=2))
    (out_dir / "stepscope_tiny.json").write_text(json.dumps(
        {"made_by": "stepscope tiny-model", "spec": msgspec.structs.asdict(spec), "moe_experts": moe_experts,
         "note": "random weights; outputs are meaningless by design"}, indent=2))
    return out_dir


def tiny_model_exists(path: str | Path) -> bool:
    p = Path(path)
    return (p / "config.json").is_file() and any(p.glob("*.safetensors")) and (p / "tokenizer.json").is_file()
