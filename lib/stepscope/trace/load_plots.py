"""The step under load, drawn: category time per step against decode batch size."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from stepscope.trace.plots import plot_category_bars

LOAD_FIGURE = "05_load_anatomy_ms_per_step_by_batch.png"


def load_bars(table: pd.DataFrame, kind: str = "decode") -> tuple[pd.DataFrame, list[float], int]:
    """(long-form bars: one per captured level and batch size of `kind` steps, the period of
    each bar in ms, steps counted) from load_anatomy.csv."""
    t = table[table["step_kind"] == kind].copy()
    t["label"] = ("c=" + t["concurrency"].astype(int).astype(str) + ", batch "
                  + t["decode_requests"].astype(int).astype(str) + " (n=" + t["n_steps"].astype(int).astype(str) + ")")
    t = t.sort_values(["decode_requests", "concurrency"], kind="stable")
    groups = t.drop_duplicates("label")
    return (t[["label", "category", "ms_per_step"]], groups["period_ms"].astype(float).tolist(),
            int(groups["n_steps"].sum()))


def plot_load_anatomy(table: pd.DataFrame, kind: str = "decode") -> Figure:
    """Stacked ms per step by category, one bar per (captured concurrency, decode batch size),
    the mean step period of each marked on top (load_anatomy.csv)."""
    bars, periods, n = load_bars(table, kind)
    return plot_category_bars(bars, {"step period (start to next start)": periods},
                              xlabel="captured concurrency, decode requests per step", step_label=f"{kind} step",
                              title=f"{kind.capitalize()} step anatomy against batch size, {n} steps, reference rank\n"
                                    "(bars: category busy time, group mean, stacked; marks: group mean period)")
