"""The campaign's two figures. Drawing only: every number comes in computed."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from stepscope.palette import category_sort_key, color_for
from stepscope.trace.plots import new_figure

_PLAIN = FuncFormatter(lambda v, _pos: f"{v:g}")


def plot_throughput_by_variant(levels: dict[str, pd.DataFrame], runs_per_variant: dict[str, int]) -> Figure:
    """Output tok/s against concurrency (log 2), one line per variant."""
    fig, ax = new_figure(7.5, 4.2)
    for name, lv in levels.items():
        lv = lv.sort_values("concurrency")
        n = runs_per_variant.get(name, 1)
        ax.plot(lv["concurrency"], lv["output_throughput_tok_s"], "o-",
                label=f"{name} ({n} run{'s' if n != 1 else ''})")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(_PLAIN)
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("output throughput (tok/s)")
    ax.set_title("Output throughput by variant (closed loop; mean over runs)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def plot_category_by_variant(cats: pd.DataFrame, step_ms: dict[str, float | None], n_steps: dict[str, int | None]) -> Figure:
    """Stacked bars: decode ms per step by category, one bar per variant; a marker at the step period."""
    fig, ax = new_figure(7.5, 4.4)
    variants = list(cats.columns)
    x = np.arange(len(variants))
    bottom = np.zeros(len(variants))
    for cat in sorted(cats.index, key=category_sort_key):
        vals = cats.loc[cat].to_numpy(float)
        ax.bar(x, vals, bottom=bottom, color=color_for(cat), label=cat, width=0.6)
        bottom += vals
    for i, v in enumerate(variants):
        if step_ms.get(v):
            ax.plot([i - 0.35, i + 0.35], [step_ms[v]] * 2, "k--", lw=1)
    ax.set_xticks(x, [f"{v}\n({n_steps.get(v) or '?'} steps)" for v in variants])
    ax.set_ylabel("ms per decode step (mean)")
    ax.set_title("Decode step time by category and variant (union per category; dashed: step period)")
    ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig
