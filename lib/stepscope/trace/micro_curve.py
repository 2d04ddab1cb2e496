"""The micro-predicted curve: the decode step at each sweep concurrency predicted from the
micro-benchmarks before any load trace, and each reconciled sweep level's time rebuilt from it.

The step at concurrency M is stage 02's GEMM time at M + stage 03's collectives (timed at the
largest batch at or below M) + the batch-1 trace's attention and KV-cache writes × M + the rest
of the batch-1 period unchanged; throughput is M / step. It is compared with the sweep's
measured throughput, and where stage 05 reconciled the level's wall time part by part
(`trace.load_reconcile`) the level is rebuilt from the prediction: its measured parts other
than the decode steps stay, the decode steps take the predicted step, and the difference
between the level's traced decode period and the predicted step, times its decode steps, is
the prediction's error, set apart by component where the level's trace gives the component
(its decode steps' categories in `load_anatomy.csv`). With the reconciliation's own
unexplained remainder the parts sum to the level's time by construction.
"""

from __future__ import annotations

import msgspec
import numpy as np
import pandas as pd

from stepscope import schema
from stepscope.palette import COMMUNICATION_CATEGORIES, GEMM_CATEGORIES
from stepscope.thresholds import PREDICTION_TOLERANCE

SCALED_WITH_BATCH = ("attention", "kv_cache_write")
"""Categories scaled from the batch-1 trace by the batch (each request reads its own KV cache
and writes its own new entry; the sweep's context length is the same at every level)."""

COMPONENTS: dict[str, frozenset[str]] = {"gemm": frozenset(GEMM_CATEGORIES),
                                         "comm": frozenset(COMMUNICATION_CATEGORIES),
                                         "attention_kv": frozenset(SCALED_WITH_BATCH)}
"""The predicted components and the trace categories each stands for; `rest` is the period less them."""

KEPT_PARTS = ("prefill_mixed_steps", "stalls", "client_overhead", "ramp_up", "turnaround", "drain")
"""The reconciliation's measured parts a level rebuilt from the prediction keeps as they are."""

METHOD = ("decode step at sweep concurrency M = stage 02's GEMM time at M (linear between the batches it timed) "
          "+ stage 03's collectives per step (timed at the largest batch at or below M) + the batch-1 trace's "
          "attention and KV-cache writes × M + the rest of the batch-1 period unchanged; throughput = M / step. "
          "A reconciled level keeps its measured parts other than its decode steps; its decode steps take the "
          "predicted step, and (traced decode period − predicted step) × decode steps is the prediction's error, "
          "by component from the level's own trace")


def batch1_basis(decode: pd.DataFrame | None) -> dict[str, float] | None:
    """From the batch-1 trace's decode categories (one rank's `decode_categories.csv` rows): its
    period (ms; the median over categories of union / share of period) and the ms per step of each
    component; None without the categories or a period."""
    if decode is None or decode.empty or not {"category", "union_ms_mean", "share_of_period"} <= set(decode):
        return None
    union = decode["union_ms_mean"].astype(float)
    shares = decode["share_of_period"].astype(float)
    if not (shares > 0).any():
        return None
    ms = dict(zip(decode["category"].astype(str), union))
    out = {k: float(sum(v for c, v in ms.items() if c in cats)) for k, cats in COMPONENTS.items()}
    out["period"] = float((union / shares)[shares > 0].median())
    out["rest"] = out["period"] - sum(out[k] for k in COMPONENTS)
    return out


def _interp(curve: dict[str, float], m: int) -> float | None:
    """`curve` ({batch: value}) at m: linear between its batches, clamped at its edges (as stage
    02's own sum is)."""
    pts = sorted((int(k), float(v)) for k, v in curve.items() if v is not None)
    if not pts:
        return None
    xs, ys = zip(*pts)
    return float(np.interp(m, xs, ys))


def _comm_at(comm: schema.CommPrediction | None, m: int) -> tuple[float | None, int | None]:
    """(stage 03's collectives per step at m, ms; the batch they were timed at): the largest batch
    at or below m."""
    by_batch = {int(k): v.comm_us_per_decode_step for k, v in (comm.by_batch if comm else {}).items()}
    at = max((b for b in by_batch if b <= m), default=None)
    if at is None or by_batch[at] is None:
        return None, at
    return by_batch[at] / 1e3, at


def predict_level(m: int, gemm: schema.GemmPrediction | None, comm: schema.CommPrediction | None,
                  basis: dict[str, float], measured_tok_s: float | None) -> schema.MicroCurveLevel:
    """The decode step predicted at concurrency m (`MicroCurveLevel`, not yet reconciled)."""
    g = _interp(gemm.gemm_us_per_decode_step, m) if gemm is not None else None
    gemm_ms = g / 1e3 if g is not None else None
    comm_ms, at = _comm_at(comm, m)
    attn = basis["attention_kv"] * m
    step = None if gemm_ms is None or comm_ms is None else basis["rest"] + gemm_ms + comm_ms + attn
    return schema.MicroCurveLevel(
        concurrency=int(m), gemm_ms=gemm_ms, comm_ms=comm_ms, comm_from_batch=at,
        comm_implementation=comm.implementation if comm is not None else None, attention_kv_ms=attn,
        rest_ms=basis["rest"], step_ms=step, predicted_tok_s=m * 1e3 / step if step else None,
        measured_tok_s=measured_tok_s)


def level_components(table: pd.DataFrame | None, concurrency: int, period_ms: float) -> dict[str, float] | None:
    """The level's decode steps by component, ms per step, from its `load_anatomy.csv` rows: each
    component's categories' union, mean over the level's decode steps (every batch group weighted
    by its steps), and `rest`, `period_ms` less them; None when the table has no decode step of it."""
    if table is None or table.empty:
        return None
    t = table[(table["concurrency"] == concurrency) & (table["step_kind"] == "decode")]
    groups = t.drop_duplicates("decode_requests")
    n = float(groups["n_steps"].sum())
    if not n:
        return None
    weighted = t["ms_per_step"].astype(float) * t["n_steps"].astype(float)
    out = {k: float(weighted[t["category"].isin(cats)].sum() / n) for k, cats in COMPONENTS.items()}
    out["rest"] = period_ms - sum(out.values())
    return out


def reconcile(point: schema.MicroCurveLevel, rec: schema.LoadReconciliationLevel,
              trace: dict[str, float] | None) -> schema.MicroCurveReconciled | None:
    """The level's time rebuilt from the predicted step (`MicroCurveReconciled`); None without a
    predicted step or a traced decode period. Without the level's categories (`trace` None) the
    error is all `rest`."""
    if point.step_ms is None or rec.decode_period_ms is None:
        return None
    predicted = {"gemm": point.gemm_ms or 0.0, "comm": point.comm_ms or 0.0,
                 "attention_kv": point.attention_kv_ms, "rest": point.rest_ms}
    if trace is None:  # the whole traced period as `rest`: one error, not split
        trace = {**{k: predicted[k] for k in COMPONENTS}, "rest": rec.decode_period_ms - sum(
            predicted[k] for k in COMPONENTS)}
    error = {k: _clean(trace[k] - predicted[k]) for k in predicted}
    parts = {k: float(rec.parts.get(k, 0.0)) for k in KEPT_PARTS}
    parts["decode_steps_predicted"] = rec.decode_steps * point.step_ms / 1e3
    parts.update({f"error_{k}": rec.decode_steps * v / 1e3 for k, v in error.items()})
    # The level's decode steps ran at its own pace, not the trace's: the difference stays a part.
    parts["level_pace"] = float(rec.parts.get("decode_steps", 0.0)) - rec.decode_steps * rec.decode_period_ms / 1e3
    parts["unexplained"] = float(rec.parts.get("unexplained", 0.0))
    agree, off, offsetting = judge_components(trace, predicted)
    return schema.MicroCurveReconciled(
        level_s=rec.level_s, decode_steps=rec.decode_steps, decode_tokens_per_step=rec.decode_tokens_per_step,
        trace_step_ms=rec.decode_period_ms, trace_ms=trace, error_ms=error, parts=parts,
        agree=agree, off_components=off, offsetting=offsetting,
        predicted_level_s=rec.level_s - sum(v for k, v in parts.items() if k.startswith("error_") or k == "level_pace"))


def judge_components(trace: dict[str, float], predicted: dict[str, float]) -> tuple[bool, list[str], bool]:
    """(the totals agree, the components off beyond their band, the agreement is an offsetting
    one): a component is off when it and its prediction differ by more than PREDICTION_TOLERANCE
    of the larger; an agreeing total is offsetting when components are off both ways by more in
    all than the tolerance of the total. The one rule for every micro-versus-trace comparison."""
    off = [k for k, t in trace.items() if abs(predicted[k] - t) > PREDICTION_TOLERANCE * max(abs(predicted[k]), abs(t))]
    total_t, total_p = sum(trace.values()), sum(predicted.values())
    agree = total_p > 0 and abs(total_t / total_p - 1) <= PREDICTION_TOLERANCE
    both_ways = any(predicted[k] > trace[k] for k in off) and any(predicted[k] < trace[k] for k in off)
    spread = sum(abs(predicted[k] - trace[k]) for k in off)
    return bool(agree), off, bool(agree and both_ways and spread > PREDICTION_TOLERANCE * total_t)


def _clean(ms: float) -> float:
    """A difference of two readings of the same number (batch 1's attention, read from the same
    trace on both sides) is 0, not float noise of 1e-16 ms."""
    return 0.0 if abs(ms) < 1e-9 else float(ms)


def _measured(levels: pd.DataFrame) -> list[tuple[int, float | None]]:
    """(concurrency, measured output tok/s) of every closed-loop sweep level, in order."""
    lv = levels[levels["mode"] == "concurrency"].sort_values("concurrency")
    return [(int(c), None if pd.isna(t) else float(t))
            for c, t in zip(lv["concurrency"], lv["output_throughput_tok_s"])]


def build(gemm: schema.GemmPrediction | None, comm: schema.CommPrediction | None, decode: pd.DataFrame | None,
          levels: pd.DataFrame | None, table: pd.DataFrame | None = None,
          reconciliation: schema.LoadReconciliation | None = None) -> schema.MicroCurve | None:
    """The micro-predicted curve over the sweep's closed-loop levels, each reconciled level rebuilt
    from it (`comm` already pointed at the implementation the trace ran:
    `micro.collectives.prediction_for_trace`); None without the batch-1 trace's categories or a
    closed-loop level."""
    basis = batch1_basis(decode)
    if basis is None or levels is None or not {"mode", "concurrency", "output_throughput_tok_s"} <= set(levels):
        return None
    recs = {r.concurrency: r for r in (reconciliation.levels if reconciliation is not None else [])}
    out = []
    for m, tok in _measured(levels):
        p = predict_level(m, gemm, comm, basis, tok)
        r = recs.get(m)
        if r is not None and r.decode_period_ms is not None:
            p = msgspec.structs.replace(p, reconciled=reconcile(p, r, level_components(table, m, r.decode_period_ms)))
        out.append(p)
    if not out:
        return None
    return schema.MicroCurve(method=METHOD, batch1_period_ms=basis["period"],
                             comm_implementation=comm.implementation if comm is not None else None,
                             comm_implementation_reason=comm.implementation_reason if comm is not None else None,
                             comm_matches_trace=comm.matches_trace if comm is not None else None, levels=out)
