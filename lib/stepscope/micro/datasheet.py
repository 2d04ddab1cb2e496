"""The decode step predicted from datasheet peaks alone, before any GPU run.

`datasheet_curve` sums GEMMs, attention/KV reads and collectives, each at the device's peak, with nothing
overlapping: a bound. `anchored` adds what it leaves unexplained of a measured batch-1 step. Method and the
generated table: docs/methods.md#a-prediction-for-the-first-gpu-run (`python -m stepscope.micro.datasheet
PARAMS [DOC]`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from stepscope.model import Architecture, calls_per_step, distinct_experts, gemm_flops
from stepscope.model.shapes import gemm_bytes, gemm_shapes

ALLREDUCE_LATENCY_US = 55.8
"""One NCCL all-reduce of a hidden vector at batch 1 on the reference box (8 PCIe GPUs): the
reference campaign's burst of 122 in 6.81 ms. Not a datasheet figure: no datasheet prints a
collective's latency; it is held for every message size."""
PCIE_GEN5_X16_GBPS = 63.0
"""PCIe 5.0 x16, one direction: 32 GT/s × 16 lanes × 128/130 encoding ≈ 63 GB/s (PCI-SIG's
signalling rate). NCCL's ring over PCIe without NVLink reaches less; the bound takes the link."""
BEGIN, END = "<!-- datasheet-prediction:begin -->", "<!-- datasheet-prediction:end -->"


@dataclass(frozen=True)
class DatasheetPoint:
    """One batch size's predicted decode step on one GPU."""

    m: int
    experts_touched: float
    """D(M) distinct routed experts per MoE layer."""
    weight_gb: float
    """Weight bytes one GPU reads in the step, GB (10^9)."""
    gemm_ms: float
    attention_kv_ms: float
    comm_ms: float
    bound_step_ms: float
    bound_tok_s: float
    """M / bound step: every request in flight decodes one token per step."""
    anchored_step_ms: float | None
    anchored_tok_s: float | None


def datasheet_curve(arch: Architecture, tp: int, m_values: list[int], *, peak_mem_bw_gbps: float,
                    peak_tflops: float | None, context_tokens: float, link_gbps: float = PCIE_GEN5_X16_GBPS,
                    collective_latency_us: float = ALLREDUCE_LATENCY_US,
                    measured_batch1_ms: float | None = None) -> list[DatasheetPoint]:
    """The predicted decode step at each M (see the module docstring for the model)."""
    shapes = gemm_shapes(arch, tp)
    bound = {m: _bound_parts(arch, tp, shapes, m, peak_mem_bw_gbps, peak_tflops, context_tokens, link_gbps,
                             collective_latency_us) for m in sorted(set(m_values) | {1})}
    rest = max(measured_batch1_ms - sum(bound[1][2:]), 0.0) if measured_batch1_ms is not None else None
    out = []
    for m in sorted(set(m_values)):
        d, wb, g, att, comm = bound[m]
        step = g + att + comm
        anchored = step + rest if rest is not None else None
        out.append(DatasheetPoint(m, d, wb / 1e9, g, att, comm, step, 1e3 * m / step, anchored,
                                  1e3 * m / anchored if anchored else None))
    return out


def _bound_parts(arch: Architecture, tp: int, shapes: pd.DataFrame, m: int, bw_gbps: float,
                 tflops: float | None, context: float, link_gbps: float, lat_us: float
                 ) -> tuple[float, float, float, float, float]:
    """(D(M), weight bytes, GEMM ms, attention + KV ms, collectives ms) of one GPU at batch m."""
    c = calls_per_step(shapes, m, arch)
    routed = c["layer_kind"] == "routed_expert"
    by = [gemm_bytes(r.m_rows, r.n, r.k, weight_bits=4 if q else 16, group_size=32 if q else None, batch=r.batch)
          for r, q in zip(c.itertuples(index=False), routed)]
    fl = gemm_flops(c["m_rows"].to_numpy(), c["n"].to_numpy(), c["k"].to_numpy(), c["batch"].to_numpy())
    t_mem = pd.Series(by, index=c.index).astype(float) / (bw_gbps * 1e9)
    t_fl = pd.Series(fl, index=c.index) / (tflops * 1e12) if tflops else 0.0 * t_mem
    gemm_s = float((pd.concat([t_mem, t_fl], axis=1).max(axis=1) * c["calls_per_step"]).sum())
    weights = float((c["weight_bytes_4p5bit"].where(routed, c["weight_bytes_16bit"]) * c["calls_per_step"]).sum())
    latent = (arch.kv_lora_rank + arch.qk_rope_head_dim) if arch.kv_lora_rank else 2 * arch.kv_heads * arch.head_dim / tp
    attn_s = m * context * latent * 2 * arch.n_layers / (bw_gbps * 1e9)
    n = tp
    ar_bytes = m * arch.hidden * 2 * 2 * (n - 1) / n
    ag_bytes = m * arch.vocab * 2 * (n - 1) / n
    comm_s = (2 * arch.n_layers + 1) * (lat_us * 1e-6 + ar_bytes / (link_gbps * 1e9)) \
        + lat_us * 1e-6 + ag_bytes / (link_gbps * 1e9) if n > 1 else 0.0
    d = float(distinct_experts(arch.n_routed_experts, arch.top_k, m))
    return d, weights, 1e3 * gemm_s, 1e3 * attn_s, 1e3 * comm_s


def curve_table(points: list[DatasheetPoint]) -> str:
    """The curve as a markdown table, units in the headers."""
    head = ("| M (requests per step) | experts touched D(M) | weights read (GB/GPU) | GEMM (ms) | attention + KV (ms) "
            "| collectives (ms) | bound step (ms) | bound (tok/s) | anchored step (ms) | anchored (tok/s) |\n"
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    return head + "".join(
        f"| {p.m} | {p.experts_touched:.1f} | {p.weight_gb:.2f} | {p.gemm_ms:.2f} | {p.attention_kv_ms:.2f} | "
        f"{p.comm_ms:.2f} | {p.bound_step_ms:.2f} | {p.bound_tok_s:,.0f} | "
        + (f"{p.anchored_step_ms:.2f} | {p.anchored_tok_s:,.0f} |\n" if p.anchored_step_ms else "– | – |\n")
        for p in points)


REFERENCE_BATCH1_MS = 12.1
"""The reference campaign's single-stream TPOT (docs/methods.md#the-reference-campaign)."""


def params_curve(params_path: str | Path) -> tuple[list[DatasheetPoint], dict]:
    """The curve of a params file's model, TP, sweep concurrencies and hardware; and the
    inputs it used (for the text beside it)."""
    from stepscope.config import load_params
    from stepscope.hardware import KNOWN_DEVICES
    from stepscope.model import architecture_from_params

    params = load_params(params_path)
    arch = architecture_from_params(params)
    bw = params.hardware.peak_mem_bw_gbps
    # The params name says "RTX PRO 6000 Blackwell" without the edition; its 1,792 GB/s is the
    # Workstation's (and Max-Q's): the Workstation's tensor rate is the one a datasheet prints.
    dev = next(d for d in KNOWN_DEVICES if d.key == "rtx-pro-6000-ws") if "RTX PRO 6000" in (params.hardware.name or "") \
        else None
    tflops = params.hardware.peak_tflops or (dev.bf16_dense_tflops if dev else None)
    ctx = params.sweep.input_len + params.sweep.output_len / 2
    used = dict(model=arch.name, tp=params.server.tp, peak_mem_bw_gbps=bw, peak_tflops=tflops, context_tokens=ctx,
                device=dev.name if dev else params.hardware.name, link_gbps=PCIE_GEN5_X16_GBPS,
                latency_us=ALLREDUCE_LATENCY_US, batch1_ms=REFERENCE_BATCH1_MS)
    pts = datasheet_curve(arch, params.server.tp, list(params.sweep.concurrency), peak_mem_bw_gbps=bw,
                          peak_tflops=tflops, context_tokens=ctx, measured_batch1_ms=REFERENCE_BATCH1_MS)
    return pts, used


def main(argv: list[str]) -> int:
    if not argv or len(argv) > 2:
        print("usage: python -m stepscope.micro.datasheet PARAMS [DOC]", file=sys.stderr)
        return 2
    pts, used = params_curve(argv[0])
    table = (f"*Generated by `python -m stepscope.micro.datasheet {argv[0]} docs/methods.md`: {used['model']} at "
             f"TP={used['tp']} on {used['device']} ({used['peak_mem_bw_gbps']:,.0f} GB/s, "
             f"{used['peak_tflops']:,.1f} dense BF16 TFLOP/s), context {used['context_tokens']:,.0f} tokens, "
             f"link {used['link_gbps']:.0f} GB/s, {used['latency_us']} µs per collective; anchored on a "
             f"{used['batch1_ms']} ms batch-1 step.*\n\n" + curve_table(pts))
    if len(argv) == 1:
        print(table)
        return 0
    doc = Path(argv[1])
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        print(f"{doc}: no {BEGIN} ... {END} markers to write between", file=sys.stderr)
        return 1
    head, rest = text.split(BEGIN, 1)
    doc.write_text(head + BEGIN + "\n" + table + END + rest.split(END, 1)[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
