"""Model architecture: shapes, collectives and bytes per decode step under TP.

Public API (all pure):

- `load_architecture(config_json=None, preset=None) -> Architecture` — HF config.json (file or
  folder; Kimi-K2.5's `text_config` read) for Llama, Mistral, Qwen2/3, Qwen2/3-MoE, Mixtral,
  DeepSeek-V2/V3, Kimi-K2/K2.5, gpt-oss; or a preset (`PRESET_NAMES`: kimi-k2, kimi-k2.5,
  deepseek-v3). Bad input raises `ArchitectureError` (a StepscopeError) naming file and options.
- `architecture_from_params(params)` — model.config_json, else <model.path>/config.json, else
  model.arch_preset.
- `expected_collectives(arch, tp) -> {"all_reduce": 2L+1, "all_gather": 1}` (zeros at TP=1);
  `explain_collectives(arch, tp) -> str`.
- `gemm_shapes(arch, tp) -> DataFrame[model, tp, layer_kind, gemm, n, k, batch, count_per_layer,
  layers, replicated, split, weight_bytes_16bit, weight_bytes_4p5bit, note]`.
- `calls_per_step(shapes, m, arch)` adds calls_per_step, m_rows (routed experts: D(m) distinct
  experts per MoE layer on m·k/D(m) rows each).
- `decode_weight_bytes(arch, tp, m_values, quant_scope=...) -> DataFrame[m, layer_kind,
  distinct_experts, weight_bytes]`.
- Formulas: `gemm_flops` (2MNK), `gemm_bytes` (docs/methods.md#gemm-byte-model), `fused_moe_flops`,
  `fused_moe_bytes` (one grouped routed-expert call), `distinct_experts`
  (E·(1−(1−k/E)^M)), `hidden_vector_bytes`.
"""

from stepscope.model.arch import (
    PRESET_NAMES,
    SUPPORTED_MODEL_TYPES,
    Architecture,
    ArchitectureError,
    architecture_from_config,
    architecture_from_params,
    get_preset,
    load_architecture,
)
from stepscope.model.shapes import (
    BITS_W4A16_G32,
    SHAPE_COLUMNS,
    calls_per_step,
    decode_weight_bytes,
    distinct_experts,
    expected_collectives,
    explain_collectives,
    fused_moe_bytes,
    fused_moe_flops,
    gemm_bytes,
    gemm_flops,
    gemm_shapes,
    hidden_vector_bytes,
)

__all__ = [
    "PRESET_NAMES", "SUPPORTED_MODEL_TYPES", "Architecture", "ArchitectureError", "architecture_from_config",
    "architecture_from_params", "get_preset", "load_architecture", "BITS_W4A16_G32", "SHAPE_COLUMNS",
    "calls_per_step", "decode_weight_bytes", "distinct_experts", "expected_collectives",
    "explain_collectives", "fused_moe_bytes", "fused_moe_flops", "gemm_bytes", "gemm_flops", "gemm_shapes", "hidden_vector_bytes",
]
