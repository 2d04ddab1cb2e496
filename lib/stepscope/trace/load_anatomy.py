"""The step under load: steps grouped by what they process, per captured concurrency.

Steps are grouped by the engine's own count of requests (decode, mixed, prefill), never by the client's
concurrency, and a line per category over decode requests says what grows with the batch; collectives by their
transfer, routed experts against D(M). Method: docs/methods.md#the-step-under-load.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from stepscope import schema
from stepscope.thresholds import LOAD_SLOPE_SIGMAS, LOAD_TRICKLE_SHARE

LOAD_KINDS = ("decode", "mixed", "prefill")
"""Step kinds the anatomy groups; idle and unlabelled steps are left out."""

ANATOMY_COLUMNS = ["concurrency", "step_kind", "decode_requests", "prefill_tokens", "n_steps", "category",
                   "ms_per_step", "share_of_period", "period_ms", "busy_ms"]
EXPERTS_CATEGORY = "fused_moe"
"""The routed experts' category, set beside D(M)."""


class LevelTrace(NamedTuple):
    """One captured level as stage 05 analysed it (reference rank)."""

    concurrency: int
    trace_dir: str
    """Relative to the run folder."""
    steps: pd.DataFrame
    """step_totals (`RankResult.steps_tot`)."""
    step_categories: pd.DataFrame
    instances: pd.DataFrame | None = None
    """collective_instances (`Analysis.collective_instances`); None for one rank."""


def load_steps(step_totals: pd.DataFrame) -> pd.DataFrame:
    """The steps the anatomy counts: decode, mixed or prefill, with work attributed to them."""
    st = step_totals
    keep = st["label"].isin(LOAD_KINDS) & (st["n_events"] > 0)
    out = st.loc[keep, ["step_id", "label", "decode_requests", "decode_tokens", "prefill_requests",
                        "prefill_tokens", "busy_us", "period_us"]].rename(columns={"label": "step_kind"})
    out["prefill_tokens"] = out["prefill_tokens"].clip(lower=0)
    out["decode_requests"] = out["decode_requests"].clip(lower=0).astype(np.int64)
    return out.reset_index(drop=True)


def per_step_categories(steps: pd.DataFrame, step_cats: pd.DataFrame) -> pd.DataFrame:
    """steps x categories: each category's union per step in ms (0 where it did not run)."""
    sc = step_cats[step_cats["step_id"].isin(steps["step_id"])]
    wide = sc.pivot_table(index="step_id", columns="category", values="union_us", aggfunc="sum")
    return (wide.reindex(steps["step_id"]).fillna(0.0) / 1e3).rename_axis(columns=None)


def anatomy(step_totals: pd.DataFrame, step_cats: pd.DataFrame, concurrency: int) -> pd.DataFrame:
    """load_anatomy.csv rows (ANATOMY_COLUMNS) of one captured level."""
    steps = load_steps(step_totals)
    if steps.empty:
        return pd.DataFrame(columns=ANATOMY_COLUMNS)
    wide = per_step_categories(steps, step_cats)
    rows = []
    for (kind, dreq), g in steps.groupby(["step_kind", "decode_requests"], sort=True):
        period = g["period_us"].to_numpy(float)
        period = period[np.isfinite(period)]
        period_ms = float(period.mean()) / 1e3 if len(period) else None
        cats = wide.loc[g["step_id"]].mean(axis=0)
        for cat, ms in cats[cats > 0].sort_values(ascending=False).items():
            rows.append({"concurrency": int(concurrency), "step_kind": kind, "decode_requests": int(dreq),
                         "prefill_tokens": float(g["prefill_tokens"].mean()), "n_steps": int(len(g)),
                         "category": cat, "ms_per_step": float(ms),
                         "share_of_period": float(ms) / period_ms if period_ms else None,
                         "period_ms": period_ms, "busy_ms": float(g["busy_us"].mean()) / 1e3})
    out = pd.DataFrame(rows, columns=ANATOMY_COLUMNS)
    order = {k: i for i, k in enumerate(LOAD_KINDS)}
    return out.sort_values(["step_kind", "decode_requests", "ms_per_step"],
                           key=lambda s: s.map(order) if s.name == "step_kind" else
                           (-s if s.name == "ms_per_step" else s), kind="stable").reset_index(drop=True)


def ols(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float | None]:
    """(intercept, slope, slope's standard error) of y = a + b x; the error is None with fewer
    than three points or no spread in x."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    n = len(x)
    sxx = float(((x - x.mean()) ** 2).sum())
    if n < 2 or sxx == 0:
        return float(y.mean()) if n else math.nan, math.nan, None
    b = float(((x - x.mean()) * (y - y.mean())).sum() / sxx)
    a = float(y.mean() - b * x.mean())
    if n < 3:
        return a, b, None
    resid = y - (a + b * x)
    return a, b, math.sqrt(float((resid ** 2).sum()) / (n - 2) / sxx)


def collective_parts(instances: pd.DataFrame | None, step_ids: pd.Series, rank: int | None) -> pd.DataFrame | None:
    """steps x (category, `transfer` | `wait`), ms: the summed transfer of each step's matched instances and
    this rank's summed wait; None without a cross-rank match."""
    if instances is None or instances.empty:
        return None
    col = f"wait_us_r{rank}" if rank is not None else None
    if col not in instances.columns:
        col = next((c for c in instances.columns if c.startswith("wait_us_r")), None)
    if col is None:
        return None
    g = instances[instances["step_id"].isin(step_ids)].groupby(["step_id", "category"])
    parts = pd.concat({"transfer": g["transfer_us"].sum() / 1e3, "wait": g[col].sum() / 1e3}, axis=1)
    wide = parts.unstack("category").swaplevel(axis=1)
    return wide.reindex(step_ids).fillna(0.0)


def fit_series(steps: pd.DataFrame, step_cats: pd.DataFrame, instances: pd.DataFrame | None = None,
               rank: int | None = None) -> pd.DataFrame:
    """steps x (category, measure), ms per step: each category's union (`union`), except a
    collective matched across ranks, which gives its transfer and its wait instead."""
    wide = per_step_categories(steps, step_cats)
    wide.columns = pd.MultiIndex.from_tuples([(c, "union") for c in wide.columns])
    coll = collective_parts(instances, steps["step_id"], rank)
    if coll is None:
        return wide
    keep = [c for c in wide.columns if c[0] not in set(coll.columns.get_level_values(0))]
    return pd.concat([wide[keep], coll.set_axis(wide.index)], axis=1)


def _decode_series(levels: list[tuple], rank: int | None) -> tuple[np.ndarray, np.ndarray, pd.DataFrame] | None:
    """(decode requests per step, each step's level index, fit_series rows) over the decode steps
    of every level ((step_totals, step_categories[, instances]) each); None without a decode step."""
    xs, idx, frames = [], [], []
    for i, (st, sc, *rest) in enumerate(levels):
        steps = load_steps(st)
        steps = steps[steps["step_kind"] == "decode"]
        if steps.empty:
            continue
        xs.append(steps["decode_requests"].to_numpy())
        idx.append(np.full(len(steps), i))
        frames.append(fit_series(steps, sc, rest[0] if rest else None, rank).reset_index(drop=True))
    if not frames:
        return None
    return np.concatenate(xs), np.concatenate(idx), pd.concat(frames, ignore_index=True).fillna(0.0)


def fit_categories(levels: list[tuple], rank: int | None = None) -> list[dict]:
    """One LoadFit per category and measure over the decode steps of every level
    ((step_totals, step_categories[, collective instances]) each), largest slope first."""
    got = _decode_series(levels, rank)
    if got is None:
        return []
    x, _, wide = got
    fits = []
    for cat, measure in wide.columns:
        y = wide[(cat, measure)].to_numpy(float)
        a, b, se = ols(x, y)
        lo, hi = int(x.min()), int(x.max())
        fits.append({"category": cat, "measure": measure, "n_steps": int(len(x)),
                     "n_batches": int(len(np.unique(x))), "intercept_ms": _num(a), "slope_ms_per_request": _num(b),
                     "slope_se_ms": se, "ms_at_batch_min": float(y[x == lo].mean()),
                     "ms_at_batch_max": float(y[x == hi].mean()), "batch_min": lo, "batch_max": hi})
    return sorted(fits, key=lambda f: -(f["slope_ms_per_request"] or -math.inf))


def fastest_growing(fits: list[dict]) -> str | None:
    """The category with the largest slope that clears LOAD_SLOPE_SIGMAS standard errors; a
    collective's wait is rank skew, never what grows."""
    for f in fits:
        b, se = f["slope_ms_per_request"], f["slope_se_ms"]
        if f.get("measure") == "wait":
            continue
        if b is not None and se is not None and b > 0 and b > LOAD_SLOPE_SIGMAS * se:
            return f["category"]
    return None


def expert_growth(levels: list[LevelTrace], arch: Any) -> dict | None:
    """fused_moe ms per decode step against D(M)·MoE layers, with the per-level cost per layer per distinct
    expert; None for a dense model."""
    from stepscope.model.shapes import distinct_experts

    if arch is None or not getattr(arch, "is_moe", False):
        return None
    got = _decode_series([(lv.steps, lv.step_categories) for lv in levels], None)
    if got is None or (EXPERTS_CATEGORY, "union") not in got[2].columns:
        return None
    m, idx, wide = got
    y = wide[(EXPERTS_CATEGORY, "union")].to_numpy(float)
    layers = int(arch.n_moe_layers)
    x = np.asarray(distinct_experts(arch.n_routed_experts, arch.top_k, m), float) * layers
    a, b, se = ols(x, y)
    by_level = [_expert_level(levels[i].concurrency, m[idx == i], y[idx == i], x[idx == i]) for i in np.unique(idx)]
    return {"category": EXPERTS_CATEGORY, "n_routed_experts": int(arch.n_routed_experts), "top_k": int(arch.top_k),
            "n_moe_layers": layers, "n_steps": int(len(y)), "n_batches": int(len(np.unique(m))),
            "intercept_ms": _num(a), "slope_ms_per_expert_layer": _num(b), "slope_se_ms": se,
            "by_level": by_level, "follows_distinct_experts": _follows(by_level)}


def _expert_level(concurrency: int, m: np.ndarray, ms: np.ndarray, expert_layers: np.ndarray) -> dict:
    """One level's fused_moe ms per decode step (mean, standard error of the mean) and the cost
    per layer per distinct expert it implies (the mean over the mean D(M)·layers)."""
    se = float(ms.std(ddof=1) / math.sqrt(len(ms))) if len(ms) > 1 else None
    per = 1e3 / float(expert_layers.mean()) if expert_layers.mean() > 0 else None
    layers_d = float(expert_layers.mean())
    return {"concurrency": int(concurrency), "n_steps": int(len(ms)), "decode_requests_mean": float(m.mean()),
            "expert_layers": layers_d, "ms_mean": float(ms.mean()), "ms_se": se,
            "us_per_expert_layer": float(ms.mean()) * per if per else None,
            "us_per_expert_layer_se": se * per if per and se is not None else None}


def _follows(by_level: list[dict]) -> bool | None:
    """Whether every level's cost per layer per distinct expert agrees with the lowest level's within
    LOAD_SLOPE_SIGMAS standard errors; None with fewer than two levels that spread."""
    rows = [r for r in by_level if r["us_per_expert_layer_se"] is not None]
    if len(rows) < 2:
        return None
    base = rows[0]
    return all(abs(r["us_per_expert_layer"] - base["us_per_expert_layer"])
               <= LOAD_SLOPE_SIGMAS * math.hypot(r["us_per_expert_layer_se"], base["us_per_expert_layer_se"])
               for r in rows[1:])


def _num(v: float) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


def level_summary(step_totals: pd.DataFrame, concurrency: int, trace_dir: str) -> dict:
    """A LoadLevel without the sweep's side: what the steps held and the throughput they imply
    (generated tokens of decode and mixed steps over the summed periods of all counted steps)."""
    steps = load_steps(step_totals)
    kinds = steps["step_kind"].value_counts()
    dec = steps[steps["step_kind"].isin(("decode", "mixed"))]
    with_next = steps[np.isfinite(steps["period_us"].to_numpy(float))]
    window_s = float(with_next["period_us"].sum()) / 1e6 if len(with_next) else None
    tokens = int(with_next["decode_tokens"].clip(lower=0).sum())
    return {"concurrency": int(concurrency), "trace_dir": trace_dir, "n_steps": int(len(steps)),
            "n_decode_steps": int(kinds.get("decode", 0)), "n_mixed_steps": int(kinds.get("mixed", 0)),
            "n_prefill_steps": int(kinds.get("prefill", 0)),
            "decode_requests_mean": float(dec["decode_requests"].mean()) if len(dec) else None,
            "decode_requests_max": int(dec["decode_requests"].max()) if len(dec) else None,
            "period_ms_mean": float(with_next["period_us"].mean()) / 1e3 if len(with_next) else None,
            "busy_share": (float(with_next["busy_us"].sum() / with_next["period_us"].sum())
                           if len(with_next) and with_next["period_us"].sum() > 0 else None),
            "output_tokens": tokens, "window_s": window_s,
            "predicted_output_tok_s": tokens / window_s if window_s else None}


def load_capture_dirs(run_dir) -> list[tuple[int, object]]:
    """(concurrency, folder) of every load capture stage 04 wrote (`04_profiler_capture/c<C>/`)."""
    from pathlib import Path

    stage = Path(run_dir) / "04_profiler_capture"
    out = []
    for d in stage.glob("c*") if stage.is_dir() else []:
        if d.name[1:].isdigit() and (d / "traces").is_dir() and any((d / "traces").iterdir()):
            out.append((int(d.name[1:]), d))
    return sorted(out, key=lambda t: t[0])


def sweep_throughput(run_dir) -> dict[int, float]:
    """{concurrency: the sweep's measured output tok/s} from 01_macro_sweep/levels.csv."""
    from pathlib import Path

    path = Path(run_dir) / "01_macro_sweep" / "levels.csv"
    if not path.is_file():
        return {}
    lv = pd.read_csv(path)
    lv = lv[(lv["mode"] == "concurrency") & lv["output_throughput_tok_s"].notna()]
    return {int(c): float(t) for c, t in zip(lv["concurrency"], lv["output_throughput_tok_s"])}


def build(levels: list[LevelTrace | tuple], run_dir=None, rank: int | None = None, arch: Any = None
          ) -> tuple[pd.DataFrame, dict]:
    """(load_anatomy.csv, load_anatomy.json) from each captured level, with the sweep's and capture's
    throughput and the routed experts against D(M) where known."""
    from pathlib import Path

    levels = [LevelTrace(*lv) for lv in levels]
    table = pd.concat([anatomy(lv.steps, lv.step_categories, lv.concurrency) for lv in levels], ignore_index=True) \
        if levels else pd.DataFrame(columns=ANATOMY_COLUMNS)
    series = [(lv.steps, lv.step_categories, lv.instances) for lv in levels]
    fits = fit_categories(series, rank)
    measured = sweep_throughput(run_dir) if run_dir is not None else {}
    out_levels = []
    for c, tdir, st, *_ in levels:
        lv = level_summary(st, c, tdir)
        lv["measured_output_tok_s"] = measured.get(c)
        win = Path(run_dir) / "04_profiler_capture" / f"c{c}" / "load_window.json" if run_dir else None
        if win is not None and win.is_file():
            lv["capture_output_tok_s"] = schema.read(win, schema.LoadWindow).capture_output_tok_s
        out_levels.append(lv)
    notes = [f"c={lv['concurrency']}: its steps decoded {lv['decode_requests_mean']:.1f} requests on average, under "
             f"half the {lv['concurrency']} in flight: a trickle, not the batch asked for (a request cap such as "
             "--max-num-seqs, KV-cache space, or a client that cannot keep them in flight)"
             for lv in out_levels if lv["decode_requests_mean"] is not None
             and lv["decode_requests_mean"] < LOAD_TRICKLE_SHARE * lv["concurrency"]]
    if fits and all(f["n_batches"] < 2 for f in fits):
        notes.append("every decode step has the same batch size: no slope can be fitted; capture more "
                     "levels (capture.concurrency)")
    return table, {"rank": rank, "levels": out_levels, "fits": fits, "fastest_category": fastest_growing(fits),
                   "experts": expert_growth(levels, arch), "notes": notes}


def read_outputs(out_dir) -> tuple[pd.DataFrame, schema.LoadAnatomySummary] | None:
    """Stage 05's load_anatomy.csv and .json through their schema, or None when it wrote none."""
    from pathlib import Path

    csv, js = Path(out_dir) / "load_anatomy.csv", Path(out_dir) / "load_anatomy.json"
    if not (csv.is_file() and js.is_file()):
        return None
    return schema.check_frame(pd.read_csv(csv), schema.LoadAnatomyRow, str(csv)), schema.read(js, schema.LoadAnatomySummary)


def levels_table(summary: schema.LoadAnatomySummary) -> pd.DataFrame:
    """One row per captured level: its steps, batch, period and the trace's throughput beside
    the sweep's and the capture client's (for display)."""
    cols = ["concurrency", "n_steps", "n_decode_steps", "n_mixed_steps", "decode_requests_mean", "period_ms_mean",
            "busy_share", "predicted_output_tok_s", "measured_output_tok_s", "capture_output_tok_s"]
    return pd.DataFrame(schema.to_builtins(summary.levels), columns=cols).set_index("concurrency")
