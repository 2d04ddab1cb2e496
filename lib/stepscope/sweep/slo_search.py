"""The SLO search (params `sweep.slo_search`): refine the SLO boundary by bisection
(docs/methods.md#the-slo-search). Pure: `sweep.run` measures the levels it returns, recording them in
`plan.json` first so --resume treats them as planned."""

from __future__ import annotations

from typing import Any

import pandas as pd

from stepscope.sweep.goodput import slo_bounds, slo_boundary

SEARCH_MODES = ("concurrency", "rate")
"""The load modes the search bisects on, in the order it spends its budget."""


def bracket(levels: pd.DataFrame, slo: Any, mode: str) -> tuple[float | None, float | None]:
    """(boundary load, first-miss load) of `mode` over `levels`; either is None where the
    levels leave no such level (nothing passed, or nothing missed)."""
    if not slo_bounds(slo) or not len(levels):
        return None, None
    b = slo_boundary(levels, float(slo.min_share), mode)
    return b["boundary_load"], b["first_miss_load"]


def midpoint(mode: str, lo: float | None, hi: float | None,
             min_rate_step_share: float) -> tuple[float | None, str]:
    """The next load between `lo` (met) and `hi` (missed), or (None, why not): integer concurrency, or a rate
    rounded to 3 decimals so its level name stays short."""
    if lo is None and hi is None:
        return None, "no level of this mode has an SLO reading"
    if lo is None:
        return None, "even the lowest level missed the SLO: nothing below it to bisect (lower the load)"
    if hi is None:
        return None, "every level met the SLO: the boundary is above the highest level (extend the sweep)"
    if mode == "concurrency":
        a, b = int(lo), int(hi)
        if b - a < 2:
            return None, f"the boundary C={a} and the first miss C={b} are adjacent concurrencies"
        return float((a + b) // 2), ""
    if hi - lo <= min_rate_step_share * lo:
        return None, (f"the first miss ({hi:g} req/s) is within {100 * min_rate_step_share:g} % of the "
                      f"boundary ({lo:g} req/s)")
    return round((lo + hi) / 2, 3), ""


def next_load(levels: pd.DataFrame, slo: Any, search: Any, mode: str) -> tuple[float | None, str]:
    """The search's next load along `mode` given every level measured so far (SloSearchParams
    `search`), or (None, why it stops there)."""
    lo, hi = bracket(levels, slo, mode)
    return midpoint(mode, lo, hi, float(search.min_rate_step_share))


def mode_summary(planned: pd.DataFrame, levels: pd.DataFrame, slo: Any, chosen: list[str],
                 stopped: str, mode: str) -> dict[str, Any]:
    """summary.json's `slo_search.<mode>` (SloSearchMode): the bracket the planned levels left,
    the refined one over every level, the extra levels and why the search stopped."""
    p_lo, p_hi = bracket(planned, slo, mode)
    lo, hi = bracket(levels, slo, mode)
    return {"planned_boundary_load": p_lo, "planned_first_miss_load": p_hi, "boundary_load": lo,
            "first_miss_load": hi, "levels": list(chosen), "stopped": stopped}

