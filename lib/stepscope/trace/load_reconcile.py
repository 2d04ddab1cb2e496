"""Where a captured sweep level's wall time went: measured parts that add up to the level.

The trace's throughput (tokens over summed step periods) and the sweep's (tokens over the
level's wall time) differ by whatever the level spent outside back-to-back engine steps, and by
the level's steps being other steps than the trace's. So the level's time, first request's
start to last request's end (as the sweep times it: `sweep.metrics.level_metrics`), is cut
into parts, each instant in exactly one:

1. `stalls`: server-wide silences the sweep counts (`sweep.stalls.find_stalls`);
2. `client_overhead`: no request waits for a token (every slot is between a request's last
   token and the next one's dispatch, or closing its stream): the client's own time;
3. `ramp_up`, `turnaround`, `drain`: some request but fewer than the level's concurrency waits
   for a token: before the level first had them all, between a request's last token and its
   replacement's dispatch, and after the level last had them all;
4. the rest, the level's concurrency in flight, is engine time, cut by the level's own steps
   (`client_steps`): the chunks one engine step emits reach the client together, one per
   request it decoded or prefilled, so a run of chunks in which no request repeats is one
   step. Each step owns the time since the step before it; a step holding a request's first
   token is `prefill_mixed_steps`, the others `decode_steps`; `unexplained` is what is left
   (engine time after the last step the level saw).

Every part is timed in the level itself, without the profiler. The engine's own iteration
count over the level (vLLM's `iteration_tokens_total` count, differenced across the level's
/metrics scrapes) checks the steps found: the level adds up when the unexplained part is
within LOAD_RECONCILE_SHARE of its time and the steps found are within that share of the
engine's count.

The trace is then set beside the level: its steps' kinds (decode tokens per decode step,
prefills per prefill or mixed step) and median periods, and `traced_steps_s`, the level's
tokens priced at them (what the trace's steps would have taken to emit them). The steps' part
less `traced_steps_s` is the part of the trace-versus-sweep gap that lies in the steps
themselves: the profiler's cost and the machine's pace at another time (the periods), and a
sweep whose requests start together (all one length) batching prefills as the capture's
staggered load does not (the mix). The profiler's cost is measured once, client-side at batch 1
(`profiler_cost_ms_per_step`), and shown beside it.
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


def _grid(recs: list[RequestRecord], concurrency: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(edges, requests waiting for a token, stalled, full) over the level's elementary intervals:
    full is the level's concurrency waiting and no stall."""
    start, last, end = _timeline(recs)
    stalls = [(s.start_s, s.start_s + s.dur_s) for s in find_stalls(recs)]
    edges = np.unique(np.concatenate([start, last, end, np.ravel(stalls) if stalls else np.empty(0)]))
    edges = edges[(edges >= start.min()) & (edges <= end.max())]
    mid = (edges[:-1] + edges[1:]) / 2
    waiting = ((start[:, None] <= mid) & (mid < last[:, None])).sum(axis=0)
    stalled = np.zeros(len(mid), bool)
    for a, b in stalls:
        stalled |= (mid >= a) & (mid < b)
    return edges, waiting, stalled, (waiting >= concurrency) & ~stalled


def _wall_parts(recs: list[RequestRecord], grid: tuple) -> tuple[dict[str, float], np.ndarray]:
    """(seconds of the level (its measured `recs`, their `_grid`) in stalls, client overhead,
    ramp-up, turnaround, drain and engine time (`engine_s`: the level's concurrency waiting for
    tokens, no stall), and the prefills and decode tokens received in that engine time)."""
    edges, waiting, stalled, full = grid
    mid, dur = (edges[:-1] + edges[1:]) / 2, np.diff(edges)
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


MERGED_S = 0.001
"""Two chunks of one request this close came out together (the API process sending a backlog
at once, after a stall): chunks of consecutive steps, not a new step."""

STEP_GAP_S = 0.015
"""A request's first token this long after the chunk before it starts a new group even when no
request repeats (at c=1, the next request's prefill after the last one's final token). Only
first tokens: a decode chunk always follows its own request's chunk of the step before, while
the API process, sharing the cores with the engine, can pause 15 ms or more within one step's
chunks (at c=32 on 2 cores, splitting on any such pause found 252 steps where vLLM counted 233)."""


def client_steps(records: Iterable[RequestRecord]) -> pd.DataFrame:
    """The engine steps the level's streams saw, one row each, in time order: `t_s` (its first
    chunk's arrival), `steps` (1, or the steps since the last one seen where no chunk came
    between: a server streaming every N tokens), `prefills` (first tokens in it) and `chunks`.

    Without speculative decoding a request gets one token per step from its prefill on, so its
    k-th token came `k` steps after its prefill's; what the client must find is how the
    requests' counters line up. One step's chunks reach the client together, so a run of chunks
    in which no request repeats (`_groups`) is one step, and each such run of single chunks
    says that its requests' counters stand at one step: their offsets (`_Offsets`). A step is
    then one value of offset + token index; a backlog sent at once (several chunks of one
    request within MERGED_S) falls into its steps by the same counters. A chunk of several
    tokens (a server streaming every N tokens) advances the counter by the request's mean
    tokens per chunk."""
    recs = [r for r in records if not r.warmup]
    ev = sorted((t, i, j) for i, r in enumerate(recs) for j, t in enumerate(r.chunk_times_s))
    token = [_token_index(r) for r in recs]
    off = _Offsets(len(recs))
    for group in _groups(ev):
        ids = [i for _, i, _ in group]
        if len(set(ids)) == len(ids):  # single chunks: one step
            _, i0, j0 = group[0]
            for _, i, j in group[1:]:
                off.link(i0, i, token[i0][j0] - token[i][j])
    keys = [(root, d + token[i][j], t, j) for t, i, j in ev for root, d in [off.find(i)]]
    df = pd.DataFrame(keys, columns=["component", "step", "t_s", "j"])
    steps = df.groupby(["component", "step"]).agg(t_s=("t_s", "min"), prefills=("j", lambda j: int((j == 0).sum())),
                                                  chunks=("j", "size")).reset_index()
    # the steps since the component's last seen one: more than 1 where no chunk came between
    steps["steps"] = steps.groupby("component")["step"].diff().fillna(1).clip(lower=1)
    return steps[["t_s", "steps", "prefills", "chunks"]].sort_values("t_s", kind="stable").reset_index(drop=True)


def _token_index(r: RequestRecord) -> list[int]:
    """Each chunk's step after the request's prefill: its index, or, where the request's chunks
    carry more tokens than one each, its cumulative tokens less the prefill's."""
    per_chunk = _tokens_per_chunk(r)
    return [0] + [round(k * per_chunk) for k in range(1, len(r.chunk_times_s))]


def _tokens_per_chunk(r: RequestRecord) -> float:
    """Output tokens per chunk after the first (the prefill's own token): more than 1 where
    chunks came merged or a server streams every N tokens; 1 without a later chunk."""
    n = len(r.chunk_times_s)
    return max((r.output_tokens or n) - 1, 0) / (n - 1) if n > 1 else 1.0


def _groups(ev: list[tuple[float, int, int]]) -> list[list[tuple[float, int, int]]]:
    """Runs of chunks in arrival order, cut where a request already in the run sends again more
    than MERGED_S after its last chunk, or a first token comes STEP_GAP_S after the chunk before."""
    out: list[list] = []
    seen: dict[int, float] = {}
    last_t = -math.inf
    for t, i, j in ev:
        if not out or (i in seen and t - seen[i] > MERGED_S) or (j == 0 and t - last_t > STEP_GAP_S):
            out.append([])
            seen = {}
        out[-1].append((t, i, j))
        seen[i], last_t = t, t
    return out


class _Offsets:
    """Union-find with offsets: each request's step counter relative to its group's root. A
    link that contradicts what is known already is dropped (the first evidence stands)."""

    def __init__(self, n: int):
        self.parent, self.delta = list(range(n)), [0] * n

    def find(self, i: int) -> tuple[int, int]:
        """(root, offset of i from it), compressing the path on the way."""
        path = []
        while self.parent[i] != i:
            path.append(i)
            i = self.parent[i]
        total = 0
        for k in reversed(path):  # nearest the root first
            total += self.delta[k]
            self.parent[k], self.delta[k] = i, total
        return i, (self.delta[path[0]] if path else 0)

    def link(self, a: int, b: int, b_minus_a: int) -> None:
        """offset(b) − offset(a) = b_minus_a."""
        (ra, da), (rb, db) = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb], self.delta[rb] = ra, da + b_minus_a - db


def step_parts(steps: pd.DataFrame, edges: np.ndarray, full: np.ndarray) -> dict:
    """The engine time (`full`) cut by the level's steps: each step owns the time since the step
    before it (the level's start for the first), as much of it as lies in engine time. Seconds
    and steps (a step partly outside engine time counts by the share inside) of each kind."""
    cum = np.concatenate([[0.0], np.cumsum(np.diff(edges) * full)])  # engine time since the level's start
    at = np.interp(steps["t_s"].to_numpy(float), edges, cum)
    owned = np.diff(np.concatenate([[0.0], at]))
    span = np.diff(np.concatenate([[edges[0]], steps["t_s"].to_numpy(float)]))
    share = np.divide(owned, span, out=np.ones_like(owned), where=span > 0)
    n = steps["steps"].to_numpy(float) * share
    pm = steps["prefills"].to_numpy() > 0
    return {"decode_s": float(owned[~pm].sum()), "prefill_s": float(owned[pm].sum()),
            "decode_steps": float(n[~pm].sum()), "prefill_mixed_steps": float(n[pm].sum()),
            "prefills_in_steps": float((steps["prefills"].to_numpy() * share)[pm].sum())}


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
        decode += _tokens_per_chunk(r) * float(inside[1:].sum())
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
                    lender: pd.DataFrame | None = None, profiler_ms: float | None = None,
                    iterations: float | None = None) -> dict:
    """A LoadReconciliationLevel: the level's time cut into PART_ORDER's parts (seconds), its
    steps checked against the engine's `iterations`, and the trace's steps (`steps`, the level's
    step_totals; `lender` as in `step_costs`) set beside them (see the module's note)."""
    recs = [r for r in records if not r.warmup]
    if not recs:
        raise StepscopeError("the level has no measured request", where=f"sweep level c={concurrency}",
                             hint="re-run stage 01 for this level")
    start, _, end = _timeline(recs)
    level_s = float(end.max() - start.min())
    grid = _grid(recs, concurrency)
    wall, tokens = _wall_parts(recs, grid)
    seen = client_steps(recs)
    own = step_parts(seen, grid[0], grid[3])
    parts = {"decode_steps": own["decode_s"], "prefill_mixed_steps": own["prefill_s"],
             **{k: v for k, v in wall.items() if k != "engine_s"}}
    parts["unexplained"] = level_s - sum(parts.values())
    found = float(seen["steps"].sum())
    steps_agree = None if not iterations else bool(abs(found / iterations - 1) <= LOAD_RECONCILE_SHARE)
    within = unexplained_within(parts["unexplained"], level_s)
    cost = step_costs(steps, lender)
    return {"concurrency": int(concurrency), "level_s": level_s, "parts": {k: float(parts[k]) for k in PART_ORDER},
            "unexplained_share": parts["unexplained"] / level_s if level_s > 0 else math.nan,
            "adds_up": bool(within and steps_agree is not False),
            "n_requests": len(recs), "prefills": float(tokens[0]), "decode_tokens": float(tokens[1]),
            "decode_steps": own["decode_steps"], "prefill_mixed_steps": own["prefill_mixed_steps"],
            "level_decode_period_ms": _per_step_ms(own["decode_s"], own["decode_steps"]),
            "level_prefill_period_ms": _per_step_ms(own["prefill_s"], own["prefill_mixed_steps"]),
            "level_prefills_per_step": own["prefills_in_steps"] / own["prefill_mixed_steps"]
            if own["prefill_mixed_steps"] else None,
            "steps_found": found, "engine_iterations": iterations, "steps_agree": steps_agree,
            "traced_steps_s": traced_steps_s(float(tokens[0]), float(tokens[1]), cost),
            "profiler_cost_ms_per_step": profiler_ms, **cost}


def unexplained_within(unexplained_s: float, level_s: float) -> bool:
    """A level's unexplained part within LOAD_RECONCILE_SHARE of its time: the one rule for the
    reconciliation, the report's wording of it, and the micro curve's rebuilt level."""
    return abs(unexplained_s) <= LOAD_RECONCILE_SHARE * level_s


def _per_step_ms(seconds: float, steps: float) -> float | None:
    return 1e3 * seconds / steps if steps else None


def traced_steps_s(prefills: float, decode_tokens: float, cost: dict) -> float | None:
    """The level's engine-time tokens priced at the trace's steps (`step_costs`): prefills over
    the trace's prefills per prefill or mixed step, the decode tokens those steps do not carry
    over its decode tokens per decode step, each times its median traced period, s; None
    without a traced decode period."""
    if not cost["decode_period_ms"] or not cost["decode_tokens_per_step"]:
        return None
    pm_steps = prefills / cost["prefills_per_step"] if cost["prefills_per_step"] else 0.0
    dec_steps = max(decode_tokens - pm_steps * cost["prefill_step_decode_tokens"], 0.0) / cost["decode_tokens_per_step"]
    return (dec_steps * cost["decode_period_ms"] + pm_steps * (cost["prefill_period_ms"] or 0.0)) / 1e3


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
    profiler_ms, scrapes = profiler_cost_ms(run_dir), sweep_scrapes(run_dir)
    out = []
    for c, steps in levels:
        path = level_records_path(run_dir, c)
        if path.is_file():
            row = reconcile_level(read_records(path), c, steps, lender, profiler_ms, engine_iterations(scrapes, c))
            out.append(dict(row, records=str(path.relative_to(run_dir))))
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


def sweep_scrapes(run_dir: str | Path) -> pd.DataFrame | None:
    """01_macro_sweep/server_metrics.csv, read once; None without it."""
    path = Path(run_dir) / "01_macro_sweep" / "server_metrics.csv"
    return pd.read_csv(path) if path.is_file() else None


def engine_iterations(scrapes: pd.DataFrame | None, concurrency: int) -> float | None:
    """Engine iterations over the sweep level (`c<CCCC>`, phase `measure`): the difference of
    vLLM's iteration counter between the level's first and last /metrics scrape; None without
    the counter or two scrapes."""
    if scrapes is None or "iteration_tokens_count" not in scrapes:
        return None
    mine = scrapes[(scrapes["level"] == f"c{concurrency:04d}") & (scrapes["phase"] == "measure")]
    counts = mine["iteration_tokens_count"].dropna()
    return float(counts.iloc[-1] - counts.iloc[0]) if len(counts) >= 2 else None

