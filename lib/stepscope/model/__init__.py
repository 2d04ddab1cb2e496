"""Model architecture: shapes, collectives and bytes per decode step under TP (all pure).

`load_architecture` reads an HF config.json or a preset; `gemm_shapes`, `expected_collectives` and
`decode_weight_bytes` derive what one decode step runs (docs/methods.md#gemm-byte-model, #architectures).
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
