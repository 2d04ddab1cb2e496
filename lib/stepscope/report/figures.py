"""Report figures: each function takes DataFrames and returns a matplotlib Figure.

Nothing here reads or writes files; `save_figure` is the one place a figure hits disk.
Every figure names its unit, its count and its method in the title or axis labels, and
takes category colours from `stepscope.palette` so a category looks alike everywhere.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # reports are rendered headless; never grab a display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

# Log axes label plain numbers ("20", "1k"), which read faster than 2 x 10^1.
_PLAIN = FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 1 else f"{v:g}")
_GENERAL = FuncFormatter(lambda v, _pos: f"{v:g}")

from stepscope.palette import IDLE_COLOR, category_sort_key, color_for  # noqa: E402

DPI = 110


def _new(width: float = 8.0, height: float = 4.2) -> tuple[Figure, plt.Axes]:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    return fig, fig.add_subplot()


def save_figure(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- decode breakdown


def plot_decode_category_time_stacked(
    bars: pd.DataFrame, markers: dict[str, float] | None = None, n_steps: int | None = None
) -> Figure:
    """Stacked bars of category time per decode step.

    `bars` is long-form: label (one bar each, e.g. a rank), category, ms_per_step.
    `markers` draws horizontal reference lines (e.g. union, span, capture TPOT in ms), so the
    reader sees at once whether summed kernel time exceeds the wall time of a step.
    """
    fig, ax = _new(8.5, 4.6)
    labels = list(dict.fromkeys(bars["label"]))
    cats = sorted(bars["category"].unique(), key=category_sort_key)
    bottom = np.zeros(len(labels))
    for cat in cats:
        sub = bars[bars["category"] == cat].groupby("label")["ms_per_step"].sum()
        vals = np.array([float(sub.get(lbl, 0.0)) for lbl in labels])
        ax.bar(labels, vals, bottom=bottom, color=color_for(cat), label=cat, edgecolor="white",
               linewidth=0.4)
        bottom += vals
    styles = ["--", ":", "-.", (0, (5, 1))]
    for i, (name, value) in enumerate((markers or {}).items()):
        if value is None or not np.isfinite(value):
            continue
        ax.axhline(value, color="black", linestyle=styles[i % len(styles)], linewidth=1.2,
                   label=f"{name}: {value:.3g} ms")
    ax.set_ylabel("ms per decode step (each category's busy time)")
    steps = f", mean over {n_steps} decode steps" if n_steps else ""
    ax.set_title(f"Category time per decode step{steps}\n(bars: per-category busy time, stacked; lines: whole-step readings)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    if len(labels) > 4:
        ax.tick_params(axis="x", rotation=30)
    return fig


def plot_category_shares(decode: pd.DataFrame, n_steps: int | None = None) -> Figure:
    """Horizontal bars: each category's share of a decode step (%), largest on top."""
    df = decode.copy()
    df["share_pct"] = 100.0 * df["share_of_step"].astype(float)
    df = df.sort_values("share_pct")
    fig, ax = _new(8.0, max(2.5, 0.32 * len(df) + 1.2))
    ax.barh(df["category"], df["share_pct"], color=[color_for(c) for c in df["category"]])
    for y, (v, ms) in enumerate(zip(df["share_pct"], df["ms_per_step_mean"])):
        ax.text(v, y, f" {v:.1f} % ({ms:.3g} ms)", va="center", fontsize=8)
    ax.set_xlabel("share of the decode step (%)")
    steps = f"{n_steps} decode steps, " if n_steps else ""
    ax.set_title(f"Category shares of a decode step\n({steps}mean ms per step / step time)")
    ax.set_xlim(0, max(5.0, float(df["share_pct"].max()) * 1.3))
    ax.grid(axis="x", alpha=0.3)
    return fig


def plot_decode_step_timeline(timeline: pd.DataFrame, title_note: str = "",
                              highlight: str | None = None, lane: str = "stream") -> Figure:
    """One decode step on one rank: a lane per stream, each event coloured by category.

    `timeline`: stream, category, start_us, dur_us (name optional). Times are shifted so
    the step starts at 0; white space between boxes is idle device time. `highlight`
    greys out every category but that one; `lane` names the lanes ("thread" on CPU traces).
    """
    df = timeline.copy()
    df["start_us"] = df["start_us"].astype(float)
    df["dur_us"] = df["dur_us"].astype(float)
    t0 = float(df["start_us"].min())
    df["start_us"] -= t0
    streams = sorted(df["stream"].astype(str).unique(), key=lambda s: (len(s), s))
    fig, ax = _new(10.0, max(2.2, 0.55 * len(streams) + 1.6))
    ax.set_facecolor(IDLE_COLOR)
    for row, stream in enumerate(streams):
        sub = df[df["stream"].astype(str) == stream]
        for cat, grp in sub.groupby("category"):
            color = color_for(str(cat)) if highlight in (None, str(cat)) else "#e6e6e6"
            ax.broken_barh(list(zip(grp["start_us"], grp["dur_us"])), (row - 0.4, 0.8),
                           facecolors=color, edgecolor="none")
    ax.set_yticks(range(len(streams)), [f"{lane} {s}" for s in streams])
    ax.set_ylim(-0.6, len(streams) - 0.4)
    ax.invert_yaxis()
    end_us = float((df["start_us"] + df["dur_us"]).max())
    ax.set_xlim(0, end_us * 1.01 if end_us > 0 else 1)
    ax.set_xlabel("µs since the step's first device event")
    cats = sorted(df["category"].astype(str).unique(), key=category_sort_key)
    if highlight is not None:
        cats = [c for c in cats if c == highlight]
    ax.legend(handles=[Patch(color=color_for(c), label=c) for c in cats], loc="upper left",
              bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    note = f" {title_note}" if title_note else ""
    ax.set_title(f"Timeline of one decode step, rank 0: {len(df)} device events on {len(streams)} "
                 f"{lane}(s), {end_us:.0f} µs span{note}\n(white = no device work)")
    ax.grid(axis="x", alpha=0.3)
    return fig


def plot_amdahl_ceiling(amdahl: pd.DataFrame) -> Figure:
    """Horizontal bars of the Amdahl ceiling per category (× faster if its exposed time were 0)."""
    df = amdahl[np.isfinite(amdahl["max_speedup"].astype(float))].sort_values("max_speedup")
    fig, ax = _new(8.0, max(2.5, 0.32 * len(df) + 1.2))
    ax.barh(df["category"], df["max_speedup"] - 1.0, left=1.0,
            color=[color_for(c) for c in df["category"]])
    for y, v in enumerate(df["max_speedup"]):
        ax.text(v, y, f" {v:.2f}×", va="center", fontsize=8)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("decode step speed-up if the category's exposed time were removed (×)")
    ax.set_title("Amdahl ceiling per category (step time / (step time − exposed time))")
    ax.set_xlim(1.0, max(1.1, float(df["max_speedup"].max()) * 1.08) if len(df) else 2.0)
    ax.grid(axis="x", alpha=0.3)
    return fig


# --------------------------------------------------------------------------- fallbacks for stage plots


def plot_throughput_vs_concurrency(levels: pd.DataFrame, knee: float | None = None) -> Figure:
    """Output tok/s against concurrency (closed-loop levels), with the knee marked."""
    df = levels.dropna(subset=["concurrency"]).sort_values("concurrency")
    fig, ax = _new()
    ax.plot(df["concurrency"], df["output_throughput_tok_s"], "o-", color="#1f4e9c",
            label="output tok/s")
    if "total_throughput_tok_s" in df:
        ax.plot(df["concurrency"], df["total_throughput_tok_s"], "s--", color="#7f7f7f",
                label="total (input+output) tok/s")
    if knee is not None and np.isfinite(knee):
        ax.axvline(knee, color="#d62728", linestyle=":", label=f"knee: c={knee:g}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency (requests in flight, closed loop)")
    ax.set_ylabel("tok/s")
    n = int(df["n_completed"].sum()) if "n_completed" in df else None
    ax.set_title(f"Throughput against concurrency ({len(df)} levels"
                 + (f", {n} completed requests" if n is not None else "") + ")")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def plot_latency_vs_concurrency(levels: pd.DataFrame) -> Figure:
    """TTFT and TPOT (median and p99, ms) against concurrency, per-request statistics."""
    df = levels.dropna(subset=["concurrency"]).sort_values("concurrency")
    fig = Figure(figsize=(10, 4.0), dpi=DPI, layout="constrained")
    for i, metric in enumerate(("ttft", "tpot")):
        ax = fig.add_subplot(1, 2, i + 1)
        for stat, style in (("median", "o-"), ("p99", "s--")):
            col = f"{metric}_ms_{stat}"
            if col in df:
                ax.plot(df["concurrency"], df[col], style, label=stat,
                        color="#1f4e9c" if stat == "median" else "#d62728")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_ylabel(f"{metric.upper()} (ms)")
        ax.set_title(f"{metric.upper()} per request against concurrency")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    return fig


def plot_gemm_roofline(gemm: pd.DataFrame, peak_bw_gbps: float | None = None,
                       peak_tflops: float | None = None) -> Figure:
    """Achieved TFLOP/s against arithmetic intensity (FLOP/byte) for each timed GEMM,
    with the memory and compute roofs when the device peaks are known."""
    df = gemm[(gemm.get("status", "ok") == "ok")].copy() if "status" in gemm else gemm.copy()
    df = df.dropna(subset=["tflops", "gbps"])
    df = df[(df["gbps"] > 0) & (df["tflops"] > 0)]
    df["intensity"] = df["tflops"] * 1e3 / df["gbps"]  # TFLOP/s / (GB/s) = 1e3 FLOP/byte
    fig, ax = _new()
    for (backend, dtype), grp in df.groupby(["backend", "dtype"], dropna=False):
        ax.scatter(grp["intensity"], grp["tflops"], s=18, alpha=0.8, label=f"{backend} {dtype}")
    if peak_bw_gbps and len(df):
        x = np.logspace(np.log10(df["intensity"].min() / 2), np.log10(df["intensity"].max() * 2), 50)
        roof = peak_bw_gbps * x / 1e3
        if peak_tflops:
            roof = np.minimum(roof, peak_tflops)
        ax.plot(x, roof, "k--", linewidth=1, label=f"roof: {peak_bw_gbps:g} GB/s"
                + (f", {peak_tflops:g} TFLOP/s" if peak_tflops else ""))
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(_GENERAL)
        axis.set_minor_formatter(_GENERAL)
    ax.set_xlabel("arithmetic intensity (FLOP / byte, byte model of FACTS §6)")
    ax.set_ylabel("achieved TFLOP/s (median time)")
    ax.set_title(f"GEMM roofline ({len(df)} timed shapes × M)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return fig


def plot_collective_latency_vs_size(coll: pd.DataFrame) -> Figure:
    """Median latency (µs) against message size, one line per op / mode / backend."""
    df = coll.dropna(subset=["size_bytes", "time_us_median"]).sort_values("size_bytes")
    fig, ax = _new()
    keys = [k for k in ("op", "mode", "backend", "world_size") if k in df]
    for key, grp in df.groupby(keys, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        label = " ".join(str(k) for k in key)
        ax.plot(grp["size_bytes"], grp["time_us_median"], "o-", label=label)
        if {"time_us_min", "time_us_max"} <= set(grp):
            ax.fill_between(grp["size_bytes"], grp["time_us_min"], grp["time_us_max"], alpha=0.15)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("time per op (µs, median; band: min–max across ranks)")
    ax.yaxis.set_major_formatter(_PLAIN)
    ax.yaxis.set_minor_formatter(_PLAIN)
    ax.set_title("Collective latency against message size")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return fig


# --------------------------------------------------------------------------- what-if


def plot_speculative_whatif(whatif: pd.DataFrame, measured_tpot_ms: float) -> Figure:
    """Projected TPOT against acceptance length, one line per draft cost fraction."""
    fig, ax = _new(7.5, 4.0)
    for frac, grp in whatif.groupby("draft_cost_fraction"):
        grp = grp.sort_values("acceptance_length")
        ax.plot(grp["acceptance_length"], grp["tpot_ms_projected"], "o-",
                label=f"draft cost {100 * frac:g} % of a step")
    ax.axhline(measured_tpot_ms, color="black", linestyle="--",
               label=f"measured: {measured_tpot_ms:.3g} ms")
    ax.set_xlabel("mean acceptance length (tokens emitted per verify step)")
    ax.set_ylabel("projected TPOT (ms)")
    ax.set_title("What-if: speculative decoding, projected from the measured step")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig
