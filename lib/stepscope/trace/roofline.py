"""A roofline on the trace: what the GEMM-like categories of a decode step achieved.

FLOPs and bytes per step from the architecture (`stepscope.model`) over each category's measured union give
TFLOP/s, GB/s and a share of the device's peaks. Method: docs/trace-analysis.md#a-roofline-on-the-trace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pandas as pd

from stepscope.palette import GEMM_CATEGORIES


@dataclass(frozen=True)
class WeightFormat:
    """Stored weight width (bits, without scales) and one scale of `scale_bytes` per group."""

    label: str
    bits: float
    group_size: int | None = None
    scale_bytes: int = 2


BF16 = WeightFormat("bf16", 16)
MXFP4 = WeightFormat("mxfp4 (4-bit, one 8-bit scale per 32)", 4, 32, 1)
W4A16_G32 = WeightFormat("w4a16 g=32 (4-bit, one 16-bit scale per 32)", 4, 32, 2)
FP8 = WeightFormat("fp8 (8-bit; its block, channel or tensor scales, under 1 % of the bytes, not counted)", 8)

FP8_LAYER_KINDS = ("attention", "dense_mlp", "shared_expert", "routed_expert")
"""What an FP8 model stores in 8 bits: every linear layer but the MoE router (vLLM builds it
unquantized) and the LM head (a vocabulary embedding, which vLLM's fp8 method does not take)."""
SIXTEEN_BIT_GEMMS = ("mla_w_uk", "mla_w_uv")
"""MLA's absorbed per-head matmuls: vLLM keeps 16-bit copies of kv_b_proj for them, having no
quantized bmm (`vllm/v1/attention/backends/mla/common.py`), whatever the checkpoint stores."""


def weight_formats(arch: Any, quantization: str | None = None) -> dict[str, WeightFormat]:
    """Weight format per layer kind (or GEMM name, which wins): gpt-oss's routed experts in MXFP4, an
    INT4/W4A16 label's routed experts, an FP8 label's FP8_LAYER_KINDS."""
    q = (quantization or "").lower()
    if "fp8" in q and "mxfp4" not in q:
        return {**{kind: FP8 for kind in FP8_LAYER_KINDS}, **{g: BF16 for g in SIXTEEN_BIT_GEMMS}}
    routed = BF16
    if arch.family == "gpt_oss" or "mxfp4" in q:
        routed = MXFP4
    elif "w4a16" in q or "int4" in q:
        routed = W4A16_G32
    return {"routed_expert": routed}


# TRT-LLM-gen's GEMM names spell the types: `bmm_<output>_<weights><activations>_<accumulator>_...`
# (`bmm_Bfloat16_MxE2m1MxE4m3_Fp32_...`: MXFP4 weights, MXFP8 activations, bf16 out). An `Mx`
# prefix is the OCP microscaling block format (one 8-bit power-of-two scale per 32 elements);
# a bare E2m1 is NVFP4 (an E4m3 scale per 16).
_TRTLLM_GEN_TYPES = re.compile(r"^bmm_(?:Mx)?[A-Za-z0-9]+?_(?P<w>(?:Mx)?E\dm\d|Bfloat16|Fp16)"
                               r"(?P<a>(?:Mx)?E\dm\d|Bfloat16|Fp16)_")
# Triton's matmul_ogs: `_matmul_ogs_<layout>_<output>x<activations>x<weights>_<tile>`.
_OGS_T = r"(?:bf16|fp16|fp32|mxfp4|mxfp8|nvfp4|fp8|float8e4nv)"
_OGS_TYPES = re.compile(rf"_matmul_ogs_[A-Z]+_(?P<o>{_OGS_T})x(?P<a>{_OGS_T})x(?P<w>{_OGS_T})_")
_TYPE_FORMAT = {"mxe2m1": "mxfp4", "e2m1": "nvfp4", "mxe4m3": "mxfp8", "e4m3": "fp8", "mxe5m2": "mxfp8",
                "e5m2": "fp8", "bfloat16": "bf16", "bf16": "bf16", "fp16": "fp16", "mxfp4": "mxfp4",
                "mxfp8": "mxfp8", "fp8": "fp8", "float8e4nv": "fp8", "nvfp4": "nvfp4"}


def kernel_formats(name: str) -> tuple[str | None, str | None]:
    """(weights, activations) format a GEMM kernel's name spells (`..._MxE2m1MxE4m3_...`: MXFP4 with MXFP8),
    each None where it does not say."""
    m = _TRTLLM_GEN_TYPES.search(name) or _OGS_TYPES.search(name)
    if not m:
        return None, None
    return _TYPE_FORMAT.get(m.group("w").lower()), _TYPE_FORMAT.get(m.group("a").lower())


MODELLED_FORMATS = ("mxfp4", "w4a16", "fp8")
"""The `trace_info.weight_formats_named` formats `weight_formats` knows how to count."""


def roofline_quantization(params_quantization: str | None, named: list[dict[str, Any]]
                          ) -> tuple[str | None, str]:
    """The format the roofline counts bytes with and its source: params' `model.quantization`, else the one
    MODELLED_FORMATS format the kernels name; a mixture is not guessed at."""
    if params_quantization and params_quantization.lower() != "none":
        return params_quantization, "params"
    modelled = [r["format"] for r in named if r["format"] in MODELLED_FORMATS]
    if len(modelled) == 1:
        return modelled[0], "kernel names"
    return None, "none"


def _assign(work: pd.DataFrame, present: set[str]) -> pd.Series:
    """The trace category each GEMM's time is counted in, by where its kernels land (rules.yaml): quantized in
    `quant_gemm`, 16-bit in `dense_gemm`, routed experts in `fused_moe`, LM head in `lm_head`; a category the
    trace lacks falls back to the other GEMM category."""

    def first_present(*cats: str) -> str:
        return next((c for c in cats if c in present), cats[0])

    quantized = work["weights"] != BF16.label
    out = quantized.map({True: first_present("quant_gemm", "dense_gemm"),
                         False: first_present("dense_gemm", "quant_gemm")})
    for kind, cat in (("routed_expert", "fused_moe"), ("lm_head", "lm_head")):
        if cat in present:
            out[work["layer_kind"] == kind] = cat
    return out


def model_work(arch: Any, tp: int, m: int, formats: dict[str, WeightFormat]) -> pd.DataFrame:
    """Per GEMM of one decode step at batch m on one GPU: calls, FLOPs and bytes per step."""
    from stepscope.model import calls_per_step, gemm_bytes, gemm_flops, gemm_shapes

    c = calls_per_step(gemm_shapes(arch, tp), m, arch)
    flops, byts, labels = [], [], []
    for r in c.itertuples(index=False):
        f = formats.get(r.gemm, formats.get(r.layer_kind, BF16))
        flops.append(float(gemm_flops(r.m_rows, r.n, r.k, r.batch)) * r.calls_per_step)
        byts.append(float(gemm_bytes(r.m_rows, r.n, r.k, weight_bits=f.bits, group_size=f.group_size,
                                     scale_bytes=f.scale_bytes, batch=r.batch)) * r.calls_per_step)
        labels.append(f.label)
    return c.assign(flops_per_step=flops, bytes_per_step=byts, weights=labels)


def roofline(decode_cats: pd.DataFrame, arch: Any, tp: int, batch: float | None,
             device: dict[str, Any], quantization: str | None = None,
             micro: pd.DataFrame | None = None, quantization_from: str = "params") -> dict[str, Any]:
    """The `roofline` block of summary.json for the reference rank's decode categories.
    `quantization_from` says where `quantization` came from (`params`, `kernel names`)."""
    out: dict[str, Any] = {"device": device, "rows": [], "reason": None}
    gemm = decode_cats[decode_cats["category"].isin(GEMM_CATEGORIES)] if len(decode_cats) else decode_cats
    if arch is None:
        out["reason"] = "no architecture (pass --model config.json or set model.arch_preset)"
        return out
    if not batch:
        out["reason"] = "no decode batch size in the trace's annotations"
        return out
    if gemm.empty:
        out["reason"] = "no GEMM-like category in the decode steps"
        return out
    m = int(round(batch))
    work = model_work(arch, tp, m, weight_formats(arch, quantization))
    work["category"] = _assign(work, set(gemm["category"]))
    bw, tf = device.get("peak_mem_bw_gbps"), device.get("peak_tflops")
    for cat, g in work.groupby("category", sort=False):
        hit = gemm[gemm["category"] == cat]
        if hit.empty:
            continue
        t_ms = float(hit["union_ms_mean"].iloc[0])
        flops, byts = float(g["flops_per_step"].sum()), float(g["bytes_per_step"].sum())
        gbps = byts / t_ms / 1e6 if t_ms > 0 else None
        tflops = flops / t_ms / 1e9 if t_ms > 0 else None
        row = {"category": cat, "calls_per_step": float(hit["calls_per_step"].iloc[0]),
               "model_gemms_per_step": float(g["calls_per_step"].sum()),
               "flops_per_step": flops, "bytes_per_step": byts, "time_ms_per_step": t_ms,
               "achieved_tflops": tflops, "achieved_gbps": gbps,
               "pct_peak_bw": 100.0 * gbps / bw if gbps is not None and bw else None,
               "pct_peak_flops": 100.0 * tflops / tf if tflops is not None and tf else None,
               "gemms": "+".join(dict.fromkeys(g["gemm"])),
               "source": (f"architecture {arch.name} at TP={tp}, batch {m}; weights "
                          + ", ".join(sorted(set(g["weights"])))
                          + (" (format from the kernel names)" if quantization_from == "kernel names"
                             and set(g["weights"]) - {BF16.label} else "")
                          + "; time = the category's union "
                          "per decode step")}
        row.update(_micro_beside(g, micro, m, gbps))
        out["rows"].append(row)
    return out


def _micro_beside(g: pd.DataFrame, micro: pd.DataFrame | None, m: int, trace_gbps: float | None) -> dict:
    """Stage 02's achieved GB/s on the same GEMMs at the same M (cold weights), if it ran them."""
    none = {"micro_gbps": None, "micro_vs_trace": None}
    if micro is None or micro.empty or not {"gemm", "m", "time_us_median", "bytes"} <= set(micro):
        return none
    ok = micro[(micro.get("status", "ok") == "ok") & (micro["m"] == m)]
    if "mode" in ok:
        ok = ok[ok["mode"] == "cold"] if (ok["mode"] == "cold").any() else ok
    t = b = 0.0
    for r in g.itertuples(index=False):
        hit = ok[ok["gemm"].astype(str).str.split("+").apply(lambda parts, name=r.gemm: name in parts)]
        if hit.empty:
            return none
        best = hit.sort_values("time_us_median").iloc[0]  # the fastest backend it timed
        t += float(best["time_us_median"]) * r.calls_per_step
        b += float(best["bytes"]) * r.calls_per_step
    micro_gbps = b / t / 1e3 if t > 0 else None
    return {"micro_gbps": micro_gbps,
            "micro_vs_trace": trace_gbps / micro_gbps if micro_gbps and trace_gbps else None}
