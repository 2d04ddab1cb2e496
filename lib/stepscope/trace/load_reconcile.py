"""Where a captured sweep level's wall time went: measured parts that add up to the level.

The trace's throughput (tokens over summed step periods) and the sweep's (tokens over the
level's wall time) differ by whatever the level spent outside back-to-back engine steps. The
gaps inside a step's period cannot explain that: they are inside the period on both sides. So
the level's time, first request's start to last request's end (as the sweep times it:
`sweep.metrics.level_metrics`), is cut into parts, each instant in exactly one:

1. `stalls`: server-wide silences the sweep counts (`sweep.stalls.find_stalls`);
2. `client_overhead`: no request waits for a token (every slot is between a request's last
   token and the next one's dispatch, or closing its stream): the client's own time;
3. `ramp_up`, `turnaround`, `drain`: some request but fewer than the level's concurrency waits
   for a token: before the level first had them all, between a request's last token and its
   replacement's dispatch, and after the level last had them all;
4. the rest, the level's concurrency in flight, is engine time, cut by the tokens the client
   received in it: `prefill_mixed_steps` (each request's first token is its prefill's; the
   level's trace says how many prefills a prefill or mixed step holds and its period) and
   `decode_steps` (the other tokens over the decode requests per decode step, times the
   decode period), and `unexplained`, what is left (negative when the trace's steps were
   slower than the sweep's).

The sweep ran without the profiler and the traces with it. The run measures the difference
once, client-side at batch 1 (`profiler_cost_ms_per_step`: the capture's TPOT less the sweep's
c=1 TPOT), and shows it beside the parts without taking it off: it holds the profiler's cost and
any change in the machine between stages 01 and 04, which it cannot tell apart.

Two readings check the parts: the engine's own iteration count over the level (vLLM's
`iteration_tokens_total` count, differenced across the level's /metrics scrapes) against the
steps the parts count, and the level's mean time per iteration (its time less stalls and
client overhead, over that count) against the traced periods the parts use. When the counts
agree and the paces do not, the unexplained part is the engine running at another pace in the
sweep than in the capture (the profiler, or the machine's load at another time).

The parts are measured, none fitted, and they sum to the level's time by construction; the
level "adds up" when the unexplained part is within LOAD_RECONCILE_SHARE of it. Periods are
medians over the level's steps: a capture window of a few steps holds the profiler's own
outliers (a step descheduled for ten periods), which a mean would charge to every step of
the level.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from stepscope.errors import StepscopeError
from stepscope.sweep.metrics import RequestRecord
from stepscope.sweep.stalls import find_stalls
from stepscope.thresholds import LOAD_RECONCILE_SHARE

PART_ORDER = ("decode_steps", "prefill_mixed_steps", "stalls", "client_overhead", "ramp_up", "turnaround",
              "drain", "unexplained")
"""The parts of a level's time, in the order the report shows them."""


def _timeline(recs: list[RequestRecord]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, last token, end) per request, s; a request with no token waits until its end."""
    start = np.array([r.start_s for r in recs], float)
    end = np.array([r.end_s if r.end_s is not None else (r.chunk_times_s[-1] if r.chunk_times_s else r.start_s)
                    for r in recs], float)
    last = np.array([r.chunk_times_s[-1] if r.chunk_times_s else e for r, e in zip(recs, end)], float)
    return start, np.minimum(last, end), end


def wall_parts(records: Iterable[RequestRecord], concurrency: int) -> tuple[dict[str, float], np.ndarray]:
    """(seconds of the level in stalls, client overhead, ramp-up, turnaround, drain and engine
    time (`engine_s`: the level's concurrency waiting for tokens, no stall), and the prefills
    and decode tokens received in that engine time)."""
    recs = [r for r in records if not r.warmup]
    start, last, end = _timeline(recs)
    stalls = [(s.start_s, s.start_s + s.dur_s) for s in find_stalls(recs)]
    edges = np.unique(np.concatenate([start, last, end, np.ravel(stalls) if stalls else np.empty(0)]))
    edges = edges[(edges >= start.min()) & (edges <= end.max())]
    mid, dur = (edges[:-1] + edges[1:]) / 2, np.diff(edges)
    waiting = ((start[:, None] <= mid) & (mid < last[:, None])).sum(axis=0)
    stalled = np.zeros(len(mid), bool)
    for a, b in stalls:
        stalled |= (mid >= a) & (mid < b)
    full = (waiting >= concurrency) & ~stalled
    first_full = edges[:-1][full].min() if full.any() else edges[-1]
    last_full = edges[1:][full].max() if full.any() else edges[-1]
    some = ~stalled & (waiting > 0) & ~full
    out = {"stalls": float(dur[stalled].sum()),
           "client_overhead": float(dur[~stalled & (waiting == 0)].sum()),
           "ramp_up": float(dur[some & (mid < first_full)].sum()),
           "turnaround": float(dur[some & (mid >= first_full) & (mid < last_full)].sum()),
           "drain": float(dur[some & (mid >= last_full)].sum()),
           "engine_s": float(dur[full].sum())}
    return out, _tokens_in(recs, edges, full)


def _tokens_in(recs: list[RequestRecord], edges: np.ndarray, full: np.ndarray) -> np.ndarray:
    """(prefills, decode tokens) received while the level had its concurrency in flight: a
    request's first chunk is its prefill's token, its later chunks carry the rest of its output
    tokens (merged chunks carry more than one) in equal shares."""
    prefills = decode = 0.0
    for r in recs:
        t = np.asarray(r.chunk_times_s, float)
        if not len(t):
            continue
        i = np.clip(np.searchsorted(edges, t, side="left") - 1, 0, len(full) - 1)  # the interval a token ends
        inside = full[i] & (t >= edges[0]) & (t <= edges[-1])
        prefills += float(inside[0])
        if len(t) > 1:
            per_chunk = max((r.output_tokens or len(t)) - 1, 0) / (len(t) - 1)
            decode += per_chunk * float(inside[1:].sum())
    return np.array([prefills, decode])


def _kinds(steps: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(decode steps, prefill and mixed steps) with work and a next step."""
    ok = steps[np.isfinite(steps["period_us"].to_numpy(float)) & (steps["n_events"] > 0)]
    return ok[ok["label"] == "decode"], ok[ok["label"].isin(("prefill", "mixed")) & (ok["prefill_requests"] > 0)]


def step_costs(steps: pd.DataFrame, lender: pd.DataFrame | None = None) -> dict:
    """From a level's step_totals: the decode steps' median period (ms) and decode tokens per
    step; the prefill and mixed steps' median period, prefills and decode tokens per step.

    A window without prefill or mixed steps borrows the prefill's cost from `lender` (another
    level's steps): its prefill or mixed steps' median period less its decode steps' (the
    increment a prefill adds to a step), with no decode tokens of its own, so the decodes it
    would share a step with are counted among this level's decode steps."""
    dec, pm = _kinds(steps)
    out = {"decode_period_ms": _median(dec["period_us"]) / 1e3 if len(dec) else None,
           "decode_tokens_per_step": float(dec["decode_tokens"].clip(lower=0).mean()) if len(dec) else None,
           "prefill_period_ms": _median(pm["period_us"]) / 1e3 if len(pm) else None,
           "prefills_per_step": float(pm["prefill_requests"].mean()) if len(pm) else None,
           "prefill_step_decode_tokens": float(pm["decode_tokens"].clip(lower=0).mean()) if len(pm) else 0.0,
           "prefill_steps_borrowed": False}
    if len(pm) or lender is None:
        return out
    l_dec, l_pm = _kinds(lender)
    if len(l_dec) and len(l_pm):
        out.update(prefill_period_ms=max(_median(l_pm["period_us"]) - _median(l_dec["period_us"]), 0.0) / 1e3,
                   prefills_per_step=float(l_pm["prefill_requests"].mean()), prefill_steps_borrowed=True)
    return out


def _median(v: pd.Series) -> float:
    return float(np.median(v.to_numpy(float)))


def reconcile_level(records: list[RequestRecord], concurrency: int, steps: pd.DataFrame,
                    lender: pd.DataFrame | None = None, profiler_ms: float | None = None) -> dict:
    """A LoadReconciliationLevel: the level's time cut into PART_ORDER's parts (seconds);
    `profiler_ms` is recorded beside them, not applied (see the module's note)."""
    recs = [r for r in records if not r.warmup]
    if not recs:
        raise StepscopeError("the level has no measured request", where=f"sweep level c={concurrency}",
                             hint="re-run stage 01 for this level")
    start, _, end = _timeline(recs)
    level_s = float(end.max() - start.min())
    wall, tokens = wall_parts(recs, concurrency)
    prefills, decode_tokens = float(tokens[0]), float(tokens[1])
    cost = step_costs(steps, lender)
    pm_steps = prefills / cost["prefills_per_step"] if cost["prefills_per_step"] else 0.0
    dec_left = max(decode_tokens - pm_steps * cost["prefill_step_decode_tokens"], 0.0)
    dec_steps = dec_left / cost["decode_tokens_per_step"] if cost["decode_tokens_per_step"] else 0.0
    parts = {"decode_steps": dec_steps * (cost["decode_period_ms"] or 0.0) / 1e3,
             "prefill_mixed_steps": pm_steps * (cost["prefill_period_ms"] or 0.0) / 1e3,
             **{k: v for k, v in wall.items() if k != "engine_s"}}
    parts = {k: float(v) for k, v in parts.items()}
    parts["unexplained"] = level_s - sum(parts.values())
    return {"concurrency": int(concurrency), "level_s": level_s, "parts": {k: parts[k] for k in PART_ORDER},
            "unexplained_share": parts["unexplained"] / level_s if level_s > 0 else math.nan,
            "adds_up": bool(abs(parts["unexplained"]) <= LOAD_RECONCILE_SHARE * level_s),
            "n_requests": len(recs), "prefills": prefills, "decode_tokens": decode_tokens,
            "decode_steps": float(dec_steps), "prefill_mixed_steps": float(pm_steps),
            "profiler_cost_ms_per_step": profiler_ms, **cost}


def level_records_path(run_dir: str | Path, concurrency: int) -> Path:
    """01_macro_sweep/levels/c<CCCC>.jsonl: the sweep level's raw request records."""
    return Path(run_dir) / "01_macro_sweep" / "levels" / f"c{concurrency:04d}.jsonl"


def read_records(path: Path) -> list[RequestRecord]:
    """A level's records; StepscopeError naming the file and line when one cannot be read."""
    import json

    out = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                out.append(RequestRecord.from_dict(json.loads(line)))
            except (ValueError, KeyError, TypeError) as exc:
                raise StepscopeError(f"line {n} is not a request record ({exc})", where=str(path),
                                     hint="re-run stage 01 for this level, or remove the file to leave the "
                                          "level out of the reconciliation") from None
    return out


def build(run_dir: str | Path, levels: list[tuple[int, pd.DataFrame]]) -> dict | None:
    """A LoadReconciliation over every captured level ((concurrency, its step_totals)) whose
    sweep level has records; None when none has. A level's window without prefill or mixed
    steps borrows the prefill's cost from the captured level that has the most (`step_costs`)."""
    lender = max((st for _, st in levels), key=lambda st: len(_kinds(st)[1]), default=None)
    profiler_ms = profiler_cost_ms(run_dir)
    out = []
    for c, steps in levels:
        path = level_records_path(run_dir, c)
        if path.is_file():
            row = reconcile_level(read_records(path), c, steps, lender, profiler_ms)
            out.append(dict(row, **pace_check(row, engine_iterations(run_dir, c)),
                            records=str(path.relative_to(run_dir))))
    if not out:
        return None
    return {"tolerance_share": LOAD_RECONCILE_SHARE, "levels": out}


def profiler_cost_ms(run_dir: str | Path) -> float | None:
    """The profiler's cost per step, ms: the batch-1 capture's client TPOT (profiled) less the
    sweep's c=1 TPOT (not profiled), both means at the same lengths; 0 when the profiled one was
    faster (no cost seen), None without both."""
    from stepscope import schema

    run_dir = Path(run_dir)
    lat_path, levels_csv = run_dir / "04_profiler_capture" / "capture_latency.json", run_dir / "01_macro_sweep" / "levels.csv"
    if not (lat_path.is_file() and levels_csv.is_file()):
        return None
    profiled = schema.read(lat_path, schema.CaptureLatency).tpot_ms_mean
    lv = pd.read_csv(levels_csv)
    one = lv[(lv["mode"] == "concurrency") & (lv["concurrency"] == 1)]["tpot_ms_mean"].dropna()
    if profiled is None or one.empty:
        return None
    return max(float(profiled) - float(one.iloc[0]), 0.0)


def engine_iterations(run_dir: str | Path, concurrency: int) -> float | None:
    """Engine iterations over the sweep level (`c<CCCC>`, phase `measure`): the difference of
    vLLM's iteration counter between the level's first and last /metrics scrape; None without
    the counter or two scrapes."""
    path = Path(run_dir) / "01_macro_sweep" / "server_metrics.csv"
    if not path.is_file():
        return None
    sm = pd.read_csv(path)
    if "iteration_tokens_count" not in sm:
        return None
    mine = sm[(sm["level"] == f"c{concurrency:04d}") & (sm["phase"] == "measure")]["iteration_tokens_count"].dropna()
    return float(mine.iloc[-1] - mine.iloc[0]) if len(mine) >= 2 else None


def pace_check(row: dict, iterations: float | None) -> dict:
    """The level's engine iterations (the engine's count) beside the steps the parts count, and
    its mean ms per iteration beside the traced periods' mean over those steps."""
    steps = row["decode_steps"] + row["prefill_mixed_steps"]
    p = row["parts"]
    traced_ms = 1e3 * (p["decode_steps"] + p["prefill_mixed_steps"]) / steps if steps else None
    busy_s = row["level_s"] - p["stalls"] - p["client_overhead"]
    level_ms = 1e3 * busy_s / iterations if iterations else None
    return {"engine_iterations": iterations, "traced_step_ms": traced_ms, "level_iteration_ms": level_ms}


def largest_parts(level: dict, n: int = 3) -> list[tuple[str, float]]:
    """The level's n largest parts by magnitude, (name, seconds)."""
    return sorted(level["parts"].items(), key=lambda kv: -abs(kv[1]))[:n]
