"""Sweep figures. Each function takes the levels table and returns a Figure; saving is apart."""

from __future__ import annotations

import textwrap
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from stepscope.runfolder import save_figures  # noqa: F401  (the one saver; re-exported)

FIGURE_NAMES = {
    "throughput": "sweep_output_tok_s_vs_concurrency.png",
    "latency": "sweep_latency_vs_concurrency.png",
    "curve": "sweep_latency_vs_throughput.png",
    "capture": "capture_batch1_latency_per_request.png",
    "by_source": "sweep_output_tok_s_vs_concurrency_by_source.png",
    "distribution": "sweep_tpot_itl_distribution_by_concurrency.png",
    "per_gpu": "sweep_tok_s_per_gpu_vs_tok_s_per_user.png",
}


# Concurrency doubles per level: label the log-2 axis 1, 2, 4 rather than 2^0, 2^1, 2^2.
_PLAIN = FuncFormatter(lambda v, _pos: f"{v:g}")
# On a log axis spanning less than a decade, label the 2s and 5s between the powers of ten too.
_PLAIN_25 = FuncFormatter(lambda v, _pos: f"{v:g}" if f"{v:e}"[0] in "25" else "")
LOG_MINOR_LABEL_DECADES = 1.5


def _log_ticks(axis, values: pd.Series) -> None:
    """Plain labels on a log axis; the 2s and 5s only where the data span under LOG_MINOR_LABEL_DECADES, so
    labels never overlap."""
    v = values[values > 0]
    axis.set_major_formatter(_PLAIN)
    span = float(np.log10(v.max() / v.min())) if len(v) else 0.0
    axis.set_minor_formatter(_PLAIN_25 if span < LOG_MINOR_LABEL_DECADES else NullFormatter())


def _latency_yscale(ax, values: pd.Series) -> None:
    """A log latency axis, so a p50 stays readable beside a p99 ten times its size; symlog where a
    value is 0 (a bunched level's TPOT), which a log axis would drop."""
    v = values.dropna()
    if (v > 0).all():
        ax.set_yscale("log")
    elif (v > 0).any():
        ax.set_yscale("symlog", linthresh=float(v[v > 0].min()))
    _log_ticks(ax.yaxis, v)


def _title(text: str, width_in: float, fontsize: float = 10) -> str:
    """A title wrapped to the figure's width, so no end of it is cut off."""
    chars = max(30, int(0.9 * width_in * 72 / (0.6 * fontsize)))  # DejaVu Sans: about 0.6 em a character
    return "\n".join(textwrap.wrap(text, chars))


def _concurrency_axis(ax) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(_PLAIN)


def _throughput_axes(fig: Figure, ax, title: str) -> Figure:
    """Axes, title and legend shared by the two tok/s-against-concurrency figures."""
    _concurrency_axis(ax)
    ax.set_xlabel("concurrency C (requests in flight, closed loop)")
    ax.set_ylabel("output throughput (tok/s)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _closed(levels: pd.DataFrame) -> pd.DataFrame:
    c = levels[(levels["mode"] == "concurrency") & (levels["n_completed"] > 0)]
    return c.sort_values("concurrency")


def _count_note(levels: pd.DataFrame) -> str:
    n = levels["n_completed"]
    return f"{len(levels)} levels, {int(n.min())}-{int(n.max())} completed requests each" if len(n) else "no levels"


def plot_throughput_vs_concurrency(levels: pd.DataFrame, summary: dict[str, Any] | None = None) -> Figure:
    """Output tok/s (and peak 1-s tok/s) against concurrency, with the knee marked."""
    c = _closed(levels)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(c["concurrency"], c["output_throughput_tok_s"], "o-", label="output tok/s (tokens / duration)")
    ax.plot(c["concurrency"], c["peak_output_tok_s_1s"], "x:", alpha=0.7, label="peak 1-s output tok/s (vLLM's method;\nbelow the mean when a level lasts < 2 s)")
    knee = (summary or {}).get("knee_concurrency")
    plateau = (summary or {}).get("plateau_output_tok_s")
    if knee is not None:
        ax.axvline(knee, color="tab:red", ls="--", lw=1, label=f"knee: C={knee}")
    if plateau is not None:
        ax.axhline(plateau, color="tab:gray", ls=":", lw=1, label=f"plateau {plateau:,.0f} tok/s")
    bound = c[c["client_bound"].eq(True)]
    if len(bound):
        ax.scatter(bound["concurrency"], bound["output_throughput_tok_s"], s=120, facecolors="none",
                   edgecolors="tab:orange", label="client may be the bottleneck")
    return _throughput_axes(fig, ax, f"Output throughput vs concurrency ({_count_note(c)})")


def plot_latency_vs_concurrency(levels: pd.DataFrame) -> Figure:
    """TTFT and TPOT, median and p99 (ms, over completed requests), against concurrency."""
    c = _closed(levels)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric, label in ((axes[0], "ttft", "TTFT"), (axes[1], "tpot", "TPOT")):
        ax.plot(c["concurrency"], c[f"{metric}_ms_median"], "o-", label=f"{label} p50")
        ax.plot(c["concurrency"], c[f"{metric}_ms_p99"], "s--", label=f"{label} p99")
        _concurrency_axis(ax)
        _latency_yscale(ax, pd.concat([c[f"{metric}_ms_median"], c[f"{metric}_ms_p99"]]))
        ax.set_xlabel("concurrency C")
        ax.set_ylabel(f"{label} (ms, log scale)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(_title(f"Latency vs concurrency, per request ({_count_note(c)}); TPOT = (E2EL-TTFT)/(out-1)", 10),
                 fontsize=10)
    fig.tight_layout()
    return fig


def plot_latency_vs_throughput(levels: pd.DataFrame) -> Figure:
    """The latency-throughput curve: median TPOT and TTFT against output tok/s, one point per level."""
    c = _closed(levels)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(c["output_throughput_tok_s"], c["tpot_ms_median"], "o-", label="TPOT p50 (ms)")
    ax2 = ax.twinx()
    ax2.plot(c["output_throughput_tok_s"], c["ttft_ms_median"], "s--", color="tab:green", label="TTFT p50 (ms)")
    for _, r in c.iterrows():
        ax.annotate(f"C={int(r['concurrency'])}", (r["output_throughput_tok_s"], r["tpot_ms_median"]),
                    textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("output throughput (tok/s)")
    ax.set_ylabel("TPOT p50 (ms)")
    ax2.set_ylabel("TTFT p50 (ms)", color="tab:green")
    ax.set_title(f"Latency vs throughput ({_count_note(c)})", fontsize=10)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_per_gpu_vs_per_user(points: pd.DataFrame, tp: int, summary: dict[str, Any] | None = None) -> Figure:
    """Output tok/s per GPU against tok/s per user, one point per level, goodput beside it, the SLO's TPOT
    bound as a line, knee and SLO boundary marked."""
    s = summary or {}
    fig, ax = plt.subplots(figsize=(7, 4.4))
    ax.plot(points["tok_s_per_user"], points["tok_s_per_gpu"], "o-", label="output tok/s per GPU")
    if points["goodput_tok_s_per_gpu"].notna().any():
        ax.plot(points["tok_s_per_user"], points["goodput_tok_s_per_gpu"], "v:", color="tab:green",
                label="goodput tok/s per GPU (requests within the SLO)")
    for _, r in points.iterrows():
        ax.annotate(f"C={int(r['concurrency'])}", (r["tok_s_per_user"], r["tok_s_per_gpu"]),
                    textcoords="offset points", xytext=(4, 4), fontsize=7)
    searched = points[points["slo_search"].astype(bool)] if "slo_search" in points else points.iloc[0:0]
    if len(searched):  # the SLO search's extra levels, told apart from the planned ones
        ax.scatter(searched["tok_s_per_user"], searched["tok_s_per_gpu"], s=70, marker="s", facecolors="none",
                   edgecolors="tab:orange", zorder=3,
                   label=f"SLO-search level ({len(searched)} of {len(points)}, by bisection)")
    slo = s.get("slo") or {}
    bound = (slo.get("bounds_ms") or {}).get("tpot_ms")
    if bound:
        ax.axvline(1000.0 / bound, color="tab:purple", ls="--", lw=1,
                   label=f"SLO TPOT <= {bound:g} ms: {1000.0 / bound:,.1f} tok/s per user")
    for key, marker, color, what in (("knee", "D", "tab:red", "knee"), ("slo", "*", "tab:purple", "SLO boundary")):
        c = s.get("knee_concurrency") if key == "knee" else ((slo.get("concurrency") or {}).get("boundary_load"))
        hit = points[points["concurrency"] == c] if c is not None else points.iloc[0:0]
        if len(hit):
            ax.scatter(hit["tok_s_per_user"], hit["tok_s_per_gpu"], s=140, marker=marker, facecolors="none",
                       edgecolors=color, zorder=3, label=f"{what}: C={int(c)}")
    ax.set_xlabel("tok/s per user (1000 / median TPOT in ms)")
    ax.set_ylabel(f"output tok/s per GPU (throughput / TP={tp})")
    share = f", SLO met by >= {100 * slo['min_share']:g} % of requests" if slo.get("min_share") else ""
    ax.set_title(_title(f"Throughput per GPU vs interactivity ({_count_note(points)}{share})", 7), fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_throughput_by_source(levels: pd.DataFrame) -> Figure:
    """Output tok/s against concurrency, one line per source (this sweep, imported results)."""
    c = _closed(levels)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for source, g in c.groupby("source", sort=False):
        ax.plot(g["concurrency"], g["output_throughput_tok_s"], "o-", label=f"{source} ({len(g)} levels)")
    return _throughput_axes(fig, ax, "Output throughput vs concurrency, by source (tokens / duration)")


def comparison_figures(levels: pd.DataFrame, imported: pd.DataFrame) -> dict[str, Figure]:
    """The by-source throughput figure when there are imported results; nothing otherwise."""
    if imported is None or imported.empty:
        return {}
    return {FIGURE_NAMES["by_source"]: plot_throughput_by_source(pd.concat([levels, imported], ignore_index=True))}


def sweep_figures(levels: pd.DataFrame, summary: dict[str, Any] | None = None, tp: int = 1) -> dict[str, Figure]:
    from stepscope.sweep.goodput import per_gpu_points

    return {
        FIGURE_NAMES["throughput"]: plot_throughput_vs_concurrency(levels, summary),
        FIGURE_NAMES["latency"]: plot_latency_vs_concurrency(levels),
        FIGURE_NAMES["curve"]: plot_latency_vs_throughput(levels),
        FIGURE_NAMES["per_gpu"]: plot_per_gpu_vs_per_user(per_gpu_points(levels, tp), tp, summary),
    }


def plot_latency_distributions(samples: pd.DataFrame) -> Figure:
    """ECDF of TPOT (per request) and ITL (pooled gaps) at each concurrency, ms on a log axis, from
    `distributions.latency_samples`."""
    import seaborn as sns
    from matplotlib.colors import Normalize

    data = samples[samples["value_ms"] > 0]
    levels = sorted(data["concurrency"].unique())
    cmap = sns.color_palette("viridis", as_cmap=True)
    norm = Normalize(vmin=0, vmax=max(1, len(levels) - 1))
    palette = {c: cmap(norm(i)) for i, c in enumerate(levels)}
    fig = Figure(figsize=(10.5, 4.2), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, metric, label, per in ((axes[0], "tpot", "TPOT", "requests"), (axes[1], "itl", "ITL", "gaps")):
        d = data[data["metric"] == metric]
        counts = d.groupby("concurrency").size()
        if len(d):
            sns.ecdfplot(data=d, x="value_ms", hue="concurrency", hue_order=levels, palette=palette,
                         log_scale=True, ax=ax, legend=False)
        for c in levels:
            ax.plot([], [], color=palette[c], label=f"C={c} (n={int(counts.get(c, 0))})")
        _log_ticks(ax.xaxis, d["value_ms"])
        ax.set_xlabel(f"{label} (ms, log scale)")
        ax.set_ylabel(f"fraction of {per} at or below")
        ax.set_title(f"{label}: {int(counts.sum())} {per} over {len(counts)} levels", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("Latency distributions per concurrency (ECDF; TPOT per request = (E2EL-TTFT)/(out-1), "
                 "ITL per chunk, pooled)", fontsize=10)
    return fig


def distribution_figures(samples: pd.DataFrame) -> dict[str, Figure]:
    """The TPOT/ITL distribution figure, or nothing when no closed-loop level has samples."""
    if samples.empty or not (samples["value_ms"] > 0).any():
        return {}
    return {FIGURE_NAMES["distribution"]: plot_latency_distributions(samples)}


def plot_capture_requests(requests: pd.DataFrame) -> Figure:
    """Per-request TTFT and TPOT of the profiled batch-1 requests (stage 04)."""
    r = requests[requests["success"]]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    axes[0].bar(r["request_id"].astype(str), r["ttft_ms"])
    axes[0].set_ylabel("TTFT (ms)")
    axes[1].bar(r["request_id"].astype(str), r["tpot_ms"], color="tab:orange")
    axes[1].set_ylabel("TPOT (ms)")
    for ax in axes:
        ax.set_xlabel("captured request #")
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"Batch-1 requests while the profiler ran ({len(r)} completed, client-side, "
                 "profiler overhead included)", fontsize=10)
    fig.tight_layout()
    return fig
