"""Stage-05 figures. Each function takes DataFrames and returns a Figure; saving is apart."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from stepscope.trace.categorize import CATEGORIES

_CMAP = plt.get_cmap("tab20")
COLORS = {c: _CMAP(i % 20) for i, c in enumerate(CATEGORIES)}
COLORS["other"] = (0.5, 0.5, 0.5, 1.0)


def plot_decode_steps(step_categories: pd.DataFrame, steps: pd.DataFrame, rank: int = 0) -> Figure:
    """Stacked bar per decode step: union ms of each category, with the step's work span
    and kernel sum marked. Categories overlap, so bars can exceed the busy time."""
    st = steps[(steps["rank"] == rank) & (steps["n_events"] > 0)]
    dec = st[st["label"] == "decode"]
    which = "decode steps"
    if dec.empty:
        dec, which = st, "all steps (no decode labels)"
    sc = step_categories[(step_categories["rank"] == rank)
                         & step_categories["step_id"].isin(dec["step_id"])]
    piv = sc.pivot_table(index="step_id", columns="category", values="union_us",
                         aggfunc="sum", fill_value=0.0).reindex(dec["step_id"], fill_value=0.0) / 1e3
    order = piv.mean().sort_values(ascending=False).index
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(piv) + 3), 4.2))
    x = np.arange(len(piv))
    bottom = np.zeros(len(piv))
    for cat in order:
        ax.bar(x, piv[cat].to_numpy(), bottom=bottom, color=COLORS.get(cat), label=cat, width=0.8)
        bottom += piv[cat].to_numpy()
    ax.plot(x, dec["span_us"].to_numpy() / 1e3, "k_", markersize=14, mew=2, label="work span")
    ax.plot(x, dec["kernel_sum_us"].to_numpy() / 1e3, "r.", label="kernel/op sum")
    ax.set_xticks(x, [str(s) for s in piv.index], rotation=90 if len(x) > 30 else 0, fontsize=7)
    ax.set_xlabel("step id")
    ax.set_ylabel("ms per step (union of each category's intervals)")
    ax.set_title(f"Rank {rank}: time per category in {len(piv)} {which}\n"
                 "(interval union per category, ms; bars stack overlapping categories)", fontsize=10)
    ax.legend(fontsize=7, ncol=2, bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    return fig


def plot_step_timeline(timeline: pd.DataFrame) -> Figure:
    """One representative decode step: each event as a bar on its stream/thread row."""
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.45 * max(1, timeline["stream"].nunique())))
    if timeline.empty:
        ax.text(0.5, 0.5, "no decode step", ha="center", va="center", transform=ax.transAxes)
        return fig
    streams = sorted(timeline["stream"].unique())
    y = {s: i for i, s in enumerate(streams)}
    for cat, g in timeline.groupby("category"):
        for s, gs in g.groupby("stream"):
            ax.broken_barh(list(zip(gs["start_us"] / 1e3, gs["dur_us"] / 1e3)),
                           (y[s] - 0.4, 0.8), color=COLORS.get(cat), label=None)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS.get(c)) for c in
               timeline.groupby("category")["dur_us"].sum().sort_values(ascending=False).index]
    labels = list(timeline.groupby("category")["dur_us"].sum().sort_values(ascending=False).index)
    ax.legend(handles, labels, fontsize=7, ncol=1, bbox_to_anchor=(1.01, 1), loc="upper left")
    ax.set_yticks(range(len(streams)), [f"stream/thread {s}" for s in streams], fontsize=7)
    ax.set_xlabel("ms from the step's first event")
    sid = int(timeline["step_id"].iloc[0])
    ax.set_title(f"Rank {int(timeline['rank'].iloc[0])}, decode step {sid} (median span): "
                 f"{len(timeline)} events by category", fontsize=10)
    fig.tight_layout()
    return fig


def plot_cross_rank(cross_rank: pd.DataFrame) -> Figure:
    """Per category: min / median / max across ranks of decode ms per step."""
    d = cross_rank.head(12)
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(d) + 1.5))
    yy = np.arange(len(d))[::-1]
    ax.hlines(yy, d["ms_per_step_min"], d["ms_per_step_max"], color="0.6")
    ax.plot(d["ms_per_step_min"], yy, "|", color="k", markersize=10, label="min rank")
    ax.plot(d["ms_per_step_max"], yy, "|", color="r", markersize=10, label="max rank")
    ax.plot(d["ms_per_step_median"], yy, "o", color="C0", label="median")
    ax.set_yticks(yy, d["category"], fontsize=8)
    ax.set_xlabel("ms per decode step (union), across ranks")
    n = int(d["n_ranks"].max()) if len(d) else 0
    ax.set_title(f"Across {n} ranks: a collective's min-rank time approximates the transfer; "
                 "the rest is waiting", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def stage_figures(an) -> dict[str, Figure]:
    """The stage's figures by file name (without extension)."""
    ref = an.reference
    figs = {
        f"05_decode_step_categories_rank{ref.rank}": plot_decode_steps(ref.step_categories,
                                                                      an.steps, ref.rank),
        f"05_step_timeline_rank{ref.rank}": plot_step_timeline(an.timeline),
    }
    if len(an.ranks) > 1 and not an.cross_rank.empty:
        figs["05_cross_rank_categories"] = plot_cross_rank(an.cross_rank)
    return figs


def save_figures(figures: dict[str, Figure], run_dir: str | Path) -> list[Path]:
    from stepscope.runfolder import figures_dir

    out = []
    d = figures_dir(run_dir)
    for name, fig in figures.items():
        p = d / f"{name}.png"
        fig.savefig(p, dpi=130, bbox_inches="tight")
        out.append(p)
    return out
