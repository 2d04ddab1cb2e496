"""Read a model's architecture from a Hugging Face `config.json` or a built-in preset, keeping only what the
decode-step arithmetic needs, mapped from each family's spelling onto one `Architecture`."""

from __future__ import annotations

import dataclasses
import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from stepscope.errors import StepscopeError


class ArchitectureError(StepscopeError):
    """A config.json or preset that cannot be read as a supported architecture."""


@dataclass(frozen=True)
class Architecture:
    """The decode-relevant shape of a decoder-only transformer (whole model, before TP)."""

    name: str
    """Preset name or the config file's path (for tables and the report)."""
    family: str
    """`llama`, `qwen2`, `qwen3`, `qwen2_moe`, `qwen3_moe`, `mixtral`, `deepseek_v2`,
    `deepseek_v3` (Kimi-K2/K2.5 included) or `gpt_oss`."""
    n_layers: int
    n_dense_layers: int
    """Layers with a dense MLP instead of MoE (DeepSeek's `first_k_dense_replace`)."""
    hidden: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    """Per-head width of q/k (for MLA: qk_nope + qk_rope)."""
    intermediate: int
    """Dense-MLP width (used by the dense layers only in MoE models)."""
    n_routed_experts: int = 0
    top_k: int = 0
    n_shared_experts: int = 0
    moe_intermediate: int = 0
    """Width of one routed expert."""
    shared_intermediate: int = 0
    """Total width of the shared-expert MLP (DeepSeek: n_shared x moe_intermediate;
    Qwen2-MoE: shared_expert_intermediate_size)."""
    q_lora_rank: int | None = None
    """MLA: None means a plain q_proj (DeepSeek-V2-Lite)."""
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    tie_embeddings: bool = False
    model_type: str = ""
    """The config's `model_type` as written (the outer one for Kimi-K2.5)."""
    source: str = ""
    """Where it came from: a file path or `preset:<name>`."""

    @property
    def is_moe(self) -> bool:
        return self.n_routed_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - self.n_dense_layers if self.is_moe else 0


# docs/methods.md#architectures. Kimi-K2.5's language model is DeepSeek-V3's with 384 experts, 64 heads and
# one dense layer; both use 61 layers, hidden 7168, dense FFN 18432, expert FFN 2048.
_PRESETS: dict[str, Architecture] = {
    "kimi-k2.5": Architecture(
        name="kimi-k2.5", family="deepseek_v3", n_layers=61, n_dense_layers=1, hidden=7168,
        vocab=163840, heads=64, kv_heads=64, head_dim=192, intermediate=18432,
        n_routed_experts=384, top_k=8, n_shared_experts=1, moe_intermediate=2048,
        shared_intermediate=2048, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, tie_embeddings=False, model_type="kimi_k25",
        source="preset:kimi-k2.5"),
    "deepseek-v3": Architecture(
        name="deepseek-v3", family="deepseek_v3", n_layers=61, n_dense_layers=3, hidden=7168,
        vocab=129280, heads=128, kv_heads=128, head_dim=192, intermediate=18432,
        n_routed_experts=256, top_k=8, n_shared_experts=1, moe_intermediate=2048,
        shared_intermediate=2048, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, tie_embeddings=False, model_type="deepseek_v3",
        source="preset:deepseek-v3"),
}
# The two models of the public MI300X traces in tests/data/traces (their captures ship no
# config.json); values from the models' published config.json files (Qwen/Qwen3-8B,
# openai/gpt-oss-20b on Hugging Face).
_PRESETS["qwen3-8b"] = Architecture(
    name="qwen3-8b", family="qwen3", n_layers=36, n_dense_layers=36, hidden=4096, vocab=151936,
    heads=32, kv_heads=8, head_dim=128, intermediate=12288, tie_embeddings=False,
    model_type="qwen3", source="preset:qwen3-8b")
_PRESETS["gpt-oss-20b"] = Architecture(
    name="gpt-oss-20b", family="gpt_oss", n_layers=24, n_dense_layers=0, hidden=2880, vocab=201088,
    heads=64, kv_heads=8, head_dim=64, intermediate=0, n_routed_experts=32, top_k=4,
    moe_intermediate=2880, tie_embeddings=False, model_type="gpt_oss", source="preset:gpt-oss-20b")
_PRESETS["kimi-k2"] = dataclasses.replace(_PRESETS["kimi-k2.5"], name="kimi-k2", model_type="kimi_k2",
                                          source="preset:kimi-k2")

PRESET_NAMES: tuple[str, ...] = tuple(sorted(_PRESETS))

_FAMILY_OF_MODEL_TYPE = {
    "llama": "llama", "mistral": "llama",
    "qwen2": "qwen2", "qwen3": "qwen3",
    "qwen2_moe": "qwen2_moe", "qwen3_moe": "qwen3_moe",
    "mixtral": "mixtral",
    "deepseek_v2": "deepseek_v2", "deepseek_v3": "deepseek_v3", "kimi_k2": "deepseek_v3",
    "gpt_oss": "gpt_oss",
}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_FAMILY_OF_MODEL_TYPE))


def get_preset(name: str) -> Architecture:
    """A built-in architecture by name (`kimi-k2.5`, `kimi-k2`, `deepseek-v3`, `qwen3-8b`,
    `gpt-oss-20b`)."""
    key = name.strip().lower()
    if key not in _PRESETS:
        near = difflib.get_close_matches(key, PRESET_NAMES, n=1, cutoff=0.4)
        raise ArchitectureError(
            f"unknown architecture preset {name!r}", where="model.arch_preset",
            hint=(f"did you mean {near[0]!r}? " if near else "")
                 + f"valid presets: {', '.join(PRESET_NAMES)}; or give model.config_json")
    return _PRESETS[key]


def load_architecture(config_json: str | Path | None = None, preset: str | None = None) -> Architecture:
    """The architecture from a HF `config.json` (file or folder; Kimi-K2.5's `text_config`), else from a
    preset."""
    if config_json is None and preset is None:
        raise ArchitectureError(
            "no architecture given", where="model",
            hint=f"set model.config_json, model.path (a folder with config.json) or "
                 f"model.arch_preset (one of {', '.join(PRESET_NAMES)})")
    if config_json is None:
        return get_preset(preset)
    path = Path(config_json)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ArchitectureError(
            "config.json not found", where=str(path),
            hint="point model.config_json at the model's config.json, or set model.arch_preset "
                 f"(one of {', '.join(PRESET_NAMES)})")
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArchitectureError(f"not valid JSON: {exc}", where=str(path),
                                hint="the file must be a Hugging Face config.json") from None
    if not isinstance(cfg, Mapping):
        raise ArchitectureError("not a JSON object", where=str(path),
                                hint="the file must be a Hugging Face config.json")
    return architecture_from_config(cfg, source=str(path))



def architecture_from_config(cfg: Mapping[str, Any], source: str = "<config>") -> Architecture:
    """Map one HF config dict onto an `Architecture`."""
    outer_type = str(cfg.get("model_type", ""))
    text = cfg.get("text_config")
    if isinstance(text, Mapping) and "num_hidden_layers" in text:
        inner = dict(text)
        inner.setdefault("model_type", outer_type)
        cfg = inner
    model_type = str(cfg.get("model_type", ""))
    family = _FAMILY_OF_MODEL_TYPE.get(model_type)
    if family is None:
        raise ArchitectureError(
            f"unsupported model_type {model_type!r}", where=source,
            hint=f"supported model_type values: {', '.join(SUPPORTED_MODEL_TYPES)}; "
                 f"or set model.arch_preset (one of {', '.join(PRESET_NAMES)})")

    def req(key: str) -> Any:
        if cfg.get(key) is None:
            raise ArchitectureError(f"missing key {key!r} for model_type {model_type!r}", where=source,
                                    hint="is this the model's own config.json?")
        return cfg[key]

    n_layers = int(req("num_hidden_layers"))
    hidden = int(req("hidden_size"))
    heads = int(req("num_attention_heads"))
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    common = dict(name=cfg.get("_name_or_path") or Path(source).parent.name or source, family=family, n_layers=n_layers,
                  hidden=hidden, vocab=int(req("vocab_size")), heads=heads, kv_heads=kv_heads,
                  head_dim=head_dim, tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                  model_type=outer_type or model_type, source=source)

    if family in ("llama", "qwen2", "qwen3"):
        return Architecture(n_dense_layers=n_layers, intermediate=int(req("intermediate_size")), **common)

    if family == "mixtral" or family == "gpt_oss":
        return Architecture(n_dense_layers=0, intermediate=0, n_routed_experts=int(req("num_local_experts")),
                            top_k=int(req("num_experts_per_tok")),
                            moe_intermediate=int(req("intermediate_size")), **common)

    if family in ("qwen2_moe", "qwen3_moe"):
        n_experts = int(req("num_experts"))
        step = int(cfg.get("decoder_sparse_step") or 1)
        mlp_only = set(cfg.get("mlp_only_layers") or ())
        n_moe = sum(1 for i in range(n_layers) if i not in mlp_only and n_experts > 0 and (i + 1) % step == 0)
        shared = int(cfg.get("shared_expert_intermediate_size") or 0)
        return Architecture(n_dense_layers=n_layers - n_moe, intermediate=int(cfg.get("intermediate_size") or 0),
                            n_routed_experts=n_experts, top_k=int(req("num_experts_per_tok")),
                            n_shared_experts=1 if shared else 0, moe_intermediate=int(req("moe_intermediate_size")),
                            shared_intermediate=shared, **common)

    # DeepSeek-V2/V3 and Kimi-K2/K2.5: MLA attention, MoE after the first k dense layers.
    n_experts = int(cfg.get("n_routed_experts") or 0)
    moe_inter = int(cfg.get("moe_intermediate_size") or 0)
    n_shared = int(cfg.get("n_shared_experts") or 0)
    freq = int(cfg.get("moe_layer_freq") or 1)
    first_dense = int(cfg.get("first_k_dense_replace") or 0)
    n_moe = sum(1 for i in range(n_layers) if n_experts and i >= first_dense and i % freq == 0)
    nope, rope = int(req("qk_nope_head_dim")), int(req("qk_rope_head_dim"))
    common["head_dim"] = nope + rope
    q_lora = cfg.get("q_lora_rank")
    return Architecture(n_dense_layers=n_layers - n_moe, intermediate=int(req("intermediate_size")),
                        n_routed_experts=n_experts, top_k=int(cfg.get("num_experts_per_tok") or 0),
                        n_shared_experts=n_shared, moe_intermediate=moe_inter,
                        shared_intermediate=n_shared * moe_inter,
                        q_lora_rank=int(q_lora) if q_lora else None, kv_lora_rank=int(req("kv_lora_rank")),
                        qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=int(req("v_head_dim")),
                        **common)


def architecture_from_params(params) -> Architecture:
    """The served model's architecture: model.config_json, else <model.path>/config.json,
    else model.arch_preset, else model.tiny's values. Relative paths are from the repository root."""
    from stepscope.paths import REPO_ROOT

    m = params.model

    def resolve(p: str) -> Path:
        q = Path(p)
        return q if q.is_absolute() else REPO_ROOT / q

    if m.config_json:
        return load_architecture(resolve(m.config_json))
    if m.path and (resolve(m.path) / "config.json").is_file():
        return load_architecture(resolve(m.path) / "config.json")
    if m.arch_preset:
        return load_architecture(preset=m.arch_preset)
    if m.tiny is not None and m.tiny.arch == "llama":
        # The runner makes the tiny model from these values; reading them directly lets the
        # micro stages run before (or without) the model folder existing. A tiny DeepSeek-V3
        # is read from the config.json stage 00 writes (its MoE sizes live in serve.tinymodel).
        t = m.tiny
        return Architecture(name=m.served_name or "tiny-llama", family="llama", n_layers=t.layers,
                            n_dense_layers=t.layers, hidden=t.hidden, vocab=t.vocab_size, heads=t.heads,
                            kv_heads=t.kv_heads, head_dim=t.hidden // t.heads, intermediate=t.intermediate,
                            model_type="llama", source="params:model.tiny")
    where = str(resolve(m.path) / "config.json") if m.path else "model"
    raise ArchitectureError(
        "no architecture: config.json not found and no preset set", where=where,
        hint="create the model first (stage 00 / `stepscope tiny-model`), set model.config_json, "
             f"or set model.arch_preset (one of {', '.join(PRESET_NAMES)})")
