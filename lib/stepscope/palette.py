"""One colour per kernel category, shared by every figure (`color_for`), so a colour means one category
everywhere: communication reds/oranges, GEMMs blues, memory greys, "other" a neutral grey."""

from __future__ import annotations

import hashlib

CATEGORY_ORDER: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "all_to_all",
    "other_collective",
    "communication",
    "collective_wait",
    "quant_gemm",
    "dense_gemm",
    "fused_moe",
    "moe_routing",
    "attention",
    "kv_cache_write",
    "norm",
    "activation",
    "rotary",
    "conv",
    "lm_head",
    "loss",
    "optimizer",
    "embedding",
    "quantize",
    "sampling",
    "elementwise",
    "unattributed_elementwise",
    "memcpy",
    "memset",
    "framework",
    "other",
)
"""Display order: communication first, then compute, then memory, then other."""

CATEGORY_COLORS: dict[str, str] = {
    "all_reduce": "#d62728",
    "all_gather": "#ff7f0e",
    "all_to_all": "#f16913",
    "other_collective": "#8c1c13",
    # A run that does not split communication gets the all-reduce red: it is nearly always
    # all-reduce, and the colour then means the same thing across runs.
    "communication": "#d62728",
    "collective_wait": "#f4a582",
    "quant_gemm": "#1f4e9c",
    "dense_gemm": "#4a90d9",
    "fused_moe": "#17becf",
    "moe_routing": "#9edae5",
    "attention": "#2ca02c",
    "kv_cache_write": "#98df8a",
    "norm": "#9467bd",
    "activation": "#c5b0d5",
    "rotary": "#e377c2",
    "quantize": "#bcbd22",
    "sampling": "#dbdb8d",
    "conv": "#6baed6",
    "lm_head": "#08519c",
    "loss": "#fdae6b",
    "optimizer": "#e6550d",
    "embedding": "#8ca252",
    "elementwise": "#8c564b",
    # Library kernels whose op is unknown: a washed-out elementwise brown, near "other".
    "unattributed_elementwise": "#c7a99f",
    "memcpy": "#7f7f7f",
    "memset": "#b0b0b0",
    "framework": "#c49c94",
    "other": "#d9d9d9",
}

IDLE_COLOR = "#ffffff"
"""Gaps in a timeline: drawn as background, never as a category."""

COMMUNICATION_CATEGORIES: frozenset[str] = frozenset(
    {"all_reduce", "all_gather", "all_to_all", "other_collective", "communication", "collective_wait"}
)
GEMM_CATEGORIES: frozenset[str] = frozenset({"quant_gemm", "dense_gemm", "fused_moe", "lm_head"})


def color_for(category: str) -> str:
    """Hex colour of a category. Unknown names (user rules) get a stable colour from a hash,
    so the same user category is drawn alike in every figure and run."""
    key = str(category).strip().lower()
    if key in CATEGORY_COLORS:
        return CATEGORY_COLORS[key]
    digest = hashlib.sha1(key.encode()).digest()
    # Muted tones, so a user category never outshouts the built-in ones.
    r, g, b = (96 + digest[i] % 128 for i in range(3))
    return f"#{r:02x}{g:02x}{b:02x}"


def category_sort_key(category: str) -> tuple[int, str]:
    """Sort key that puts categories in `CATEGORY_ORDER`, unknown ones just before 'other'."""
    if category == "other":
        return (len(CATEGORY_ORDER) + 1, "")
    if category in CATEGORY_ORDER:
        return (CATEGORY_ORDER.index(category), "")
    return (len(CATEGORY_ORDER), str(category))
