"""What one decode step does under tensor parallelism: per-GPU GEMMs, collectives, bytes.

Follows vLLM's layer classes (column-parallel splits N, row-parallel splits K and all-reduces, replicated
keeps all); `n` output and `k` input features, `m` the step's tokens.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import pandas as pd

from stepscope.model.arch import Architecture, ArchitectureError

BITS_W4A16_G32 = 4.5
"""4-bit weights plus one 16-bit scale per group of 32: 4 + 16/32 bits per weight."""


SHAPE_COLUMNS = ["model", "tp", "layer_kind", "gemm", "n", "k", "batch", "count_per_layer", "layers",
                 "replicated", "split", "weight_bytes_16bit", "weight_bytes_4p5bit", "note"]


# --------------------------------------------------------------------------- formulas


def gemm_flops(m: int | np.ndarray, n: int | np.ndarray, k: int | np.ndarray, batch: int = 1):
    """FLOPs of a [m,k] x [k,n] GEMM: 2·M·N·K (a multiply and an add per term)."""
    return 2 * batch * np.asarray(m, dtype=np.float64) * n * k


def gemm_bytes(m, n, k, *, weight_bits: float = 16, act_bytes: int = 2, group_size: int | None = None,
               scale_bytes: int = 2, batch: int = 1):
    """Bytes a GEMM must move (docs/methods.md#gemm-byte-model): weights at `weight_bits` plus one
    `scale_bytes` scale per `group_size`, and activations in and out."""
    m = np.asarray(m, dtype=np.float64)
    nk = np.asarray(n, dtype=np.float64) * k
    w = nk * weight_bits / 8
    if group_size:
        w = w + scale_bytes * nk / group_size
    return batch * (w + act_bytes * (m * k + m * n))


def distinct_experts(n_experts: int, top_k: int, m: int | float | np.ndarray):
    """Expected distinct experts touched by m tokens, each routing to top_k of n_experts
    uniformly: E·(1 − (1 − k/E)^M). Real routers are not uniform; this is the usual model."""
    if n_experts <= 0:
        return np.zeros_like(np.asarray(m, dtype=np.float64))
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** np.asarray(m, dtype=np.float64))


def fused_moe_flops(m: int, top_k: int, hidden: int, intermediate: int) -> float:
    """FLOPs of one fused routed-expert call on m tokens: each of the m·top_k (token, expert)
    pairs runs gate_up ([2I, H]) and down ([H, I]): 2·(m·k)·(3·I)·H."""
    return float(gemm_flops(m * top_k, 3 * intermediate, hidden))


def fused_moe_bytes(m: int, experts: int, hidden: int, intermediate: int, *, weight_bytes: float = 2,
                    act_bytes: int = 2) -> float:
    """Bytes one fused routed-expert call must move (docs/methods.md#gemm-byte-model): the
    weights of the experts it touches (3·I·H each) once, the m hidden vectors in and out."""
    return float(experts * 3 * intermediate * hidden * weight_bytes + 2 * m * hidden * act_bytes)


def hidden_vector_bytes(arch: Architecture, m: int = 1, dtype_bytes: int = 2) -> int:
    """Size of one all-reduce message at batch m: m × hidden × dtype bytes."""
    return int(m * arch.hidden * dtype_bytes)


# --------------------------------------------------------------------------- collectives


def expected_collectives(arch: Architecture, tp: int) -> dict[str, int]:
    """Collectives per decode step in vLLM at this TP: {"all_reduce": 2L+1, "all_gather": 1} (after each
    o_proj and MLP/MoE, the embedding, the logits); nothing at TP=1."""
    if tp <= 1:
        return {"all_reduce": 0, "all_gather": 0}
    return {"all_reduce": 2 * arch.n_layers + 1, "all_gather": 1}


def explain_collectives(arch: Architecture, tp: int) -> str:
    """The expected count in words, with the reasons an observed count may differ."""
    c = expected_collectives(arch, tp)
    if tp <= 1:
        return f"{arch.name} at TP=1: no collectives expected."
    mlp = "MoE (shared + routed experts summed, then reduced once)" if arch.is_moe else "dense MLP down_proj"
    return (
        f"{arch.name} at TP={tp}, {arch.n_layers} layers: expected {c['all_reduce']} all-reduces per "
        f"decode step = 1 (VocabParallelEmbedding) + {arch.n_layers} (attention o_proj) + "
        f"{arch.n_layers} ({mlp}), each of batch × {arch.hidden} elements, plus {c['all_gather']} "
        f"all-gather of the logits (batch × {math.ceil(arch.vocab / tp)} per rank). "
        "Observed counts can differ when: an all-reduce is fused with the next RMSNorm (a fused "
        "kernel replaces the collective kernel); several all-reduce implementations split by message "
        "size (custom all-reduce for small, NCCL for large: count them together); the embedding's "
        "all-reduce is missed or counted as prefill; or steps are mixed prefill/decode."
    )


# --------------------------------------------------------------------------- GEMM shapes


def _split(total: int, tp: int, what: str, arch: Architecture) -> int:
    if total % tp:
        raise ArchitectureError(
            f"{what} = {total} is not divisible by TP={tp}", where=arch.source or arch.name,
            hint="vLLM requires it; choose a TP size that divides it")
    return total // tp


def gemm_shapes(arch: Architecture, tp: int) -> pd.DataFrame:
    """Every GEMM of one decode step on one GPU at TP `tp`: shapes, `batch` (batched GEMMs such as MLA's
    per-head matmuls), calls per layer at batch 1, split, and one call's weight bytes (16-bit and W4A16)."""
    if tp < 1:
        raise ArchitectureError(f"TP must be >= 1, got {tp}", where="server.tp")
    rows: list[dict] = []

    def add(kind: str, gemm: str, n: int, k: int, layers: int, split: str, count: int = 1,
            batch: int = 1, note: str = "") -> None:
        if layers <= 0 or n <= 0 or k <= 0:
            return
        rows.append(dict(model=arch.name, tp=tp, layer_kind=kind, gemm=gemm, n=int(n), k=int(k),
                         batch=int(batch), count_per_layer=int(count), layers=int(layers),
                         replicated=split == "replicated", split=split,
                         weight_bytes_16bit=int(batch * n * k * 2),
                         weight_bytes_4p5bit=batch * n * k * BITS_W4A16_G32 / 8, note=note))

    L, H = arch.n_layers, arch.hidden
    heads_tp = _split(arch.heads, tp, "attention heads", arch)
    if arch.is_mla:
        qk = arch.qk_nope_head_dim + arch.qk_rope_head_dim
        if arch.q_lora_rank:
            add("attention", "q_a_proj", arch.q_lora_rank, H, L, "replicated",
                note="vLLM may fuse q_a and kv_a into one fused_qkv_a_proj")
            add("attention", "q_b_proj", heads_tp * qk, arch.q_lora_rank, L, "column")
        else:
            add("attention", "q_proj", heads_tp * qk, H, L, "column")
        add("attention", "kv_a_proj_with_mqa", arch.kv_lora_rank + arch.qk_rope_head_dim, H, L, "replicated")
        add("attention", "mla_w_uk", arch.kv_lora_rank, arch.qk_nope_head_dim, L, "column", batch=heads_tp,
            note="kv_b_proj's K half, absorbed into q at decode (one bmm over local heads)")
        add("attention", "mla_w_uv", arch.v_head_dim, arch.kv_lora_rank, L, "column", batch=heads_tp,
            note="kv_b_proj's V half, applied to the latent output at decode (one bmm)")
        add("attention", "o_proj", H, heads_tp * arch.v_head_dim, L, "row")
    else:
        kv_tp = max(1, arch.kv_heads // tp)
        note = "KV heads replicated (kv_heads < TP)" if arch.kv_heads < tp else ""
        add("attention", "qkv_proj", (heads_tp + 2 * kv_tp) * arch.head_dim, H, L, "column", note=note)
        add("attention", "o_proj", H, heads_tp * arch.head_dim, L, "row")

    n_dense = arch.n_dense_layers if arch.is_moe else L
    if arch.intermediate:
        inter_tp = _split(arch.intermediate, tp, "intermediate_size", arch)
        add("dense_mlp", "gate_up_proj", 2 * inter_tp, H, n_dense, "column")
        add("dense_mlp", "down_proj", H, inter_tp, n_dense, "row")

    if arch.is_moe:
        n_moe = arch.n_moe_layers
        add("router", "gate", arch.n_routed_experts, H, n_moe, "replicated")
        if arch.shared_intermediate:
            sh_tp = _split(arch.shared_intermediate, tp, "shared-expert intermediate", arch)
            add("shared_expert", "shared_gate_up_proj", 2 * sh_tp, H, n_moe, "column")
            add("shared_expert", "shared_down_proj", H, sh_tp, n_moe, "row")
        e_tp = _split(arch.moe_intermediate, tp, "moe_intermediate_size", arch)
        add("routed_expert", "expert_gate_up", 2 * e_tp, H, n_moe, "column", count=arch.top_k,
            note="per expert; calls per step = distinct experts touched, see calls_per_step")
        add("routed_expert", "expert_down", H, e_tp, n_moe, "row", count=arch.top_k,
            note="per expert; calls per step = distinct experts touched, see calls_per_step")

    add("lm_head", "lm_head", math.ceil(arch.vocab / tp), H, 1, "column",
        note="vocab split over TP; logits all-gathered")
    return pd.DataFrame(rows, columns=SHAPE_COLUMNS)


def calls_per_step(shapes: pd.DataFrame, m: int, arch: Architecture) -> pd.DataFrame:
    """Add calls_per_step and m_rows at batch m: routed experts run once per distinct expert touched (D(m) per
    MoE layer) on m·k/D(m) rows, everything else count_per_layer × layers times on m rows."""
    out = shapes.copy()
    routed = out["layer_kind"] == "routed_expert"
    out["calls_per_step"] = (out["count_per_layer"] * out["layers"]).astype(float)
    out["m_rows"] = float(m)
    if routed.any():
        d = float(distinct_experts(arch.n_routed_experts, arch.top_k, m))
        out.loc[routed, "calls_per_step"] = d * out.loc[routed, "layers"]
        out.loc[routed, "m_rows"] = m * arch.top_k / d
    return out


def decode_weight_bytes(arch: Architecture, tp: int, m_values, *,
                        quant_scope: Literal["none", "routed_experts", "all"] = "none",
                        dense_bytes: int = 2) -> pd.DataFrame:
    """Weight bytes one GPU reads in one decode step at each batch m, by layer kind: each weight once, routed
    experts only for the D(m) touched; `quant_scope` weights at W4A16 g=32."""
    shapes = gemm_shapes(arch, tp)
    rows = []
    for m in m_values:
        c = calls_per_step(shapes, int(m), arch)
        quant = (c["layer_kind"] == "routed_expert") if quant_scope == "routed_experts" else \
            pd.Series(quant_scope == "all", index=c.index)
        per_call = np.where(quant, c["weight_bytes_4p5bit"], c["weight_bytes_16bit"] / 2 * dense_bytes)
        c = c.assign(weight_bytes=per_call * c["calls_per_step"])
        d = float(distinct_experts(arch.n_routed_experts, arch.top_k, int(m)))
        for kind, b in c.groupby("layer_kind", sort=False)["weight_bytes"].sum().items():
            rows.append(dict(m=int(m), layer_kind=kind, distinct_experts=d, weight_bytes=float(b)))
    return pd.DataFrame(rows, columns=["m", "layer_kind", "distinct_experts", "weight_bytes"])
