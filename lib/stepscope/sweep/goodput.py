"""Goodput under per-request SLOs, and the SLO-boundary level of a sweep.

Definitions follow `vllm bench serve --goodput` (docs/methods.md#goodput-and-slos), plus an ITL bound and
goodput in tok/s; a failed request meets no bound.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from stepscope.sweep.metrics import RequestRecord, _as_records, _ok

SLO_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")

GOODPUT_COLUMNS = ["goodput_rps", "goodput_tok_s", "slo_met_share",
                   *[f"slo_{k.removesuffix('_ms')}_share" for k in SLO_KEYS]]
"""levels.csv columns this module fills (NaN when no SLO, or a bound not set)."""


def slo_bounds(slo: Any) -> dict[str, float]:
    """{ttft_ms: bound, ...} for the bounds set in `slo` (SloParams, a mapping, or None)."""
    if slo is None:
        return {}
    if not isinstance(slo, Mapping):  # SloParams
        slo = {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "itl_ms": slo.itl_ms, "e2el_ms": slo.e2el_ms,
               "min_share": slo.min_share}
    return {k: float(slo[k]) for k in SLO_KEYS if slo.get(k) is not None}


def request_latencies(records: Iterable[RequestRecord | Mapping[str, Any]]) -> pd.DataFrame:
    """Per measured request: completed, output_tokens, and ttft/tpot/itl/e2el in ms as the
    SLO reads them (tpot 0 for one token; itl the longest inter-chunk gap, 0 with one chunk)."""
    rows = []
    for r in _as_records(records):
        if r.warmup:
            continue
        ok = _ok(r)
        row = {"completed": ok, "output_tokens": 0, **{k: math.nan for k in SLO_KEYS}}
        if ok:
            out = r.output_tokens if r.output_tokens is not None else len(r.chunk_times_s)
            ttft, e2el = r.chunk_times_s[0] - r.start_s, r.chunk_times_s[-1] - r.start_s
            gaps = np.diff(r.chunk_times_s)
            row.update(output_tokens=out, ttft_ms=ttft * 1e3, e2el_ms=e2el * 1e3,
                       tpot_ms=(e2el - ttft) / (out - 1) * 1e3 if out > 1 else 0.0,
                       itl_ms=float(gaps.max()) * 1e3 if gaps.size else 0.0)
        rows.append(row)
    return pd.DataFrame(rows, columns=["completed", "output_tokens", *SLO_KEYS])


def goodput_metrics(records: Iterable[RequestRecord | Mapping[str, Any]], slo: Any,
                    duration_s: float) -> dict[str, float]:
    """The GOODPUT_COLUMNS of one level; every value NaN when no bound is set."""
    bounds = slo_bounds(slo)
    out = {c: math.nan for c in GOODPUT_COLUMNS}
    if not bounds:
        return out
    t = request_latencies(records)
    if not len(t):
        return out
    good = t["completed"].to_numpy(dtype=bool).copy()
    for k, bound in bounds.items():
        meets = t["completed"].to_numpy(dtype=bool) & (t[k].to_numpy(dtype=float) <= bound)
        out[f"slo_{k.removesuffix('_ms')}_share"] = float(meets.mean())
        good = good & meets
    out["slo_met_share"] = float(good.mean())
    if duration_s and duration_s > 0:
        out["goodput_rps"] = float(good.sum()) / duration_s
        out["goodput_tok_s"] = float(t.loc[good, "output_tokens"].sum()) / duration_s
    return out


def _load_axis(levels: pd.DataFrame, mode: str) -> tuple[pd.DataFrame, str]:
    key = "concurrency" if mode == "concurrency" else "request_rate"
    complete = levels["complete"].astype(bool) if "complete" in levels else True  # older tables lack it
    lv = levels[(levels["mode"] == mode) & complete]
    return lv.dropna(subset=["slo_met_share"]).sort_values(key), key


def slo_boundary(levels: pd.DataFrame, min_share: float, mode: str = "concurrency") -> dict[str, Any]:
    """The highest level of `mode` meeting the SLO for `min_share` of its requests, counted up from the lowest
    and stopping at the first miss (levels passing above it are named in `passes_above_miss`)."""
    out: dict[str, Any] = {"boundary_level": None, "boundary_load": None, "first_miss_level": None,
                           "first_miss_load": None, "passes_above_miss": [], "n_levels": 0}
    if "slo_met_share" not in levels or not len(levels):
        return out
    lv, key = _load_axis(levels, mode)
    out["n_levels"] = int(len(lv))
    for _, r in lv.iterrows():
        passed = float(r["slo_met_share"]) >= min_share
        if out["first_miss_level"] is None:
            if passed:
                out["boundary_level"], out["boundary_load"] = str(r["level"]), float(r[key])
            else:
                out["first_miss_level"], out["first_miss_load"] = str(r["level"]), float(r[key])
        elif passed:
            out["passes_above_miss"].append(str(r["level"]))
    return out


def slo_summary(levels: pd.DataFrame, slo: Any) -> dict[str, Any] | None:
    """summary.json's `slo`: the bounds, the share, and the boundary of each load mode measured."""
    bounds = slo_bounds(slo)
    if not bounds:
        return None
    min_share = float(slo.get("min_share", 0.9) if isinstance(slo, Mapping) else slo.min_share)
    out: dict[str, Any] = {"bounds_ms": bounds, "min_share": min_share}
    for mode in ("concurrency", "rate"):
        b = slo_boundary(levels, min_share, mode)
        if not b["n_levels"]:
            continue
        row = levels[levels["level"] == b["boundary_level"]]
        if len(row):
            b["output_tok_s"] = float(row["output_throughput_tok_s"].iloc[0])
            b["goodput_tok_s"] = float(row["goodput_tok_s"].iloc[0])
            b["goodput_rps"] = float(row["goodput_rps"].iloc[0])
        out[mode] = b
    return out


def slo_flags(summary: Mapping[str, Any] | None) -> list[str]:
    """Flags in words for summary.json: no level meets the SLO, every level does, or a level
    above the first miss passes again."""
    if not summary:
        return []
    flags = []
    share = f"{100 * summary['min_share']:g} %"
    for mode, b in ((m, summary.get(m)) for m in ("concurrency", "rate")):
        if not b:
            continue
        if b["boundary_level"] is None:
            flags.append(f"SLO: no {mode} level met the SLO for {share} of its requests, not even the lowest "
                         f"({b['first_miss_level']}); lower the load or relax sweep.slo")
        elif b["first_miss_level"] is None:
            flags.append(f"SLO: every {mode} level met the SLO for {share} of its requests; the boundary is "
                         "above the highest level measured (extend the sweep)")
        if b["passes_above_miss"]:
            flags.append(f"SLO: {', '.join(b['passes_above_miss'])} met the SLO again above the first miss "
                         f"({b['first_miss_level']}); the boundary stays below the miss")
    return flags


def per_gpu_points(levels: pd.DataFrame, tp: int) -> pd.DataFrame:
    """The capacity planner's chart, one row per completed closed-loop level: output tok/s per GPU against
    tok/s per user (1000 / median TPOT), with goodput per GPU where an SLO was set."""
    c = levels[(levels["mode"] == "concurrency") & (levels["n_completed"] > 0)].sort_values("concurrency")
    tpot = pd.to_numeric(c["tpot_ms_median"], errors="coerce")
    good = pd.to_numeric(c["goodput_tok_s"], errors="coerce") if "goodput_tok_s" in c else np.nan
    return pd.DataFrame({"level": c["level"] if "level" in c else c["concurrency"].map(lambda x: f"c{int(x):04d}"),
                         "concurrency": c["concurrency"], "n_completed": c["n_completed"],
                         "tok_s_per_gpu": pd.to_numeric(c["output_throughput_tok_s"]) / max(1, int(tp)),
                         "tok_s_per_user": 1000.0 / tpot.where(tpot > 0),
                         "goodput_tok_s_per_gpu": good / max(1, int(tp)),
                         "slo_search": (c["slo_search"].fillna(False).astype(bool) if "slo_search" in c
                                        else False)}).reset_index(drop=True)
