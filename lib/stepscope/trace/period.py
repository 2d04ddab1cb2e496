"""Step period, idle inside a step (micro and macro) and launch-to-execute delay.

The period (one step's start to the next's) is what TPOT measures; the span leaves out the time between steps.
Method and sources: docs/trace-analysis.md#step-period-and-the-denominator.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd

from stepscope.thresholds import MACRO_GAP_US
from stepscope.trace import account
from stepscope.trace.account import in_steps, rows_of
from stepscope.trace.step_sources import ENGINE_STEP_FRAME
from stepscope.trace.steps import STEP_LIKE, WHOLE_TRACE

PERIOD_COLUMNS = ["step_id", "period_us", "period_from_device", "between_steps_us", "period_busy_us",
                  "idle_micro_us", "idle_macro_us",
                  "largest_gap_us", "largest_gap_start_us", "gap_before", "gap_after", "gap_host_call",
                  "gap_host_frame", "gap_python_frames", "between_host_frame", "launch_delay_us"]
NAME_CHARS = 160
"""Kernel names beside a gap are cut to this many characters (templated names run to 1,000+)."""


def step_periods(steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(period, taken from the device) per step, in step order (NaN for the last): host annotations' start to
    start, unless shorter than the step's own device busy time (a step cannot repeat faster than its work
    runs); then first device event to the next step's."""
    ts = steps["annotation_ts_us"].to_numpy(float)
    out = np.full(len(ts), np.nan)
    from_device = np.zeros(len(ts), dtype=bool)
    if len(ts) > 1 and not (steps["source"] == WHOLE_TRACE).all():
        out[:-1] = np.diff(ts)
        if "first_start_us" in steps and "busy_us" in steps:
            dev = np.full(len(ts), np.nan)
            dev[:-1] = np.diff(steps["first_start_us"].to_numpy(float))
            busy = steps["busy_us"].to_numpy(float)
            from_device = np.isfinite(dev) & (dev > 0) & (out < busy)
            out = np.where(from_device, dev, out)
    return out, from_device


GAP_CHUNK_ROWS = 1 << 16
"""Rows `_gaps_one` reads at a time. A trace with no step marker is one step, the whole trace:
its gaps, running ends and names made whole were ~165 bytes a kernel (issue 39)."""


def _gaps_one(w: pd.DataFrame) -> tuple[float, float, float, float, str, str]:
    """(micro, macro, largest, its start, before, after) idle of one step's work (by start), a
    slice of GAP_CHUNK_ROWS at a time, the running end carried from slice to slice."""
    n = len(w)
    if n < 2:
        return 0.0, 0.0, 0.0, np.nan, "", ""
    s = w["start_us"].to_numpy(float)
    ends = account.Ends(s, w["dur_us"].to_numpy(float))
    micro = macro = largest = 0.0
    i = -1  # the largest gap lies after row i's running end, before row i + 1's start
    run_i = carried = -np.inf
    for lo in range(0, n - 1, GAP_CHUNK_ROWS):
        hi = min(lo + GAP_CHUNK_ROWS, n - 1)
        run = np.maximum(np.maximum.accumulate(ends[lo:hi]), carried)
        carried = run[-1]
        gap = s[lo + 1:hi + 1] - run
        gap = np.where(gap > 0, gap, 0.0)
        big = gap >= MACRO_GAP_US
        micro, macro = micro + float(gap[~big].sum()), macro + float(gap[big].sum())
        k = int(np.argmax(gap))
        if gap[k] > largest:
            largest, i, run_i = float(gap[k]), lo + k, float(run[k])
    if i < 0:
        return micro, 0.0, 0.0, np.nan, "", ""
    # The work that ended last before the gap (the last row up to i whose end is the running end),
    # and the work that starts it again.
    ended = next(lo + int(np.flatnonzero(ends[lo:hi] == run_i)[-1])
                 for hi in range(i + 1, 0, -GAP_CHUNK_ROWS) for lo in [max(0, hi - GAP_CHUNK_ROWS)]
                 if (ends[lo:hi] == run_i).any())
    names, cats = w["name"], w["category"]
    return (micro, macro, largest, run_i, f"{cats.iloc[ended]}: {names.iloc[ended]}"[:NAME_CHARS],
            f"{cats.iloc[i + 1]}: {names.iloc[i + 1]}"[:NAME_CHARS])


def host_call_during(host: pd.DataFrame, start: float, end: float) -> str:
    """The longest host runtime call covering most of [start, end), e.g. a blocking memcpy
    behind a stall; "" when none does."""
    if not len(host) or not np.isfinite(start):
        return ""
    s = host["ts"].to_numpy(float)
    e = s + host["dur"].to_numpy(float)
    cover = np.minimum(e, end) - np.maximum(s, start)
    i = int(np.argmax(cover))
    return str(host["name"].iloc[i]) if cover[i] >= 0.5 * (end - start) else ""


def host_frame_around(frames: pd.DataFrame | None, start: float, end: float,
                      skip: frozenset[str] = frozenset()) -> str:
    """The innermost host frame (`ts`, `dur`, `name`) covering at least GAP_FRAME_COVER_SHARE of [start, end):
    what the host did while the device waited. Step markers and `skip` hold the whole step and name no cause.
    "" for none."""
    from stepscope.thresholds import GAP_FRAME_COVER_SHARE

    if frames is None or not len(frames) or not np.isfinite(start) or end <= start:
        return ""
    s = frames["ts"].to_numpy(float)
    d = frames["dur"].to_numpy(float)
    names = frames["name"].astype(str).to_numpy()
    cover = np.minimum(s + d, end) - np.maximum(s, start)
    ok = (cover >= GAP_FRAME_COVER_SHARE * (end - start)) & ~np.isin(names, list(skip))
    ok[ok] = [not (STEP_LIKE.search(n) or ENGINE_STEP_FRAME.search(n)) for n in names[ok]]
    if not ok.any():
        return ""
    i = np.flatnonzero(ok)[np.argmin(d[ok])]
    return str(names[i])


def python_frames_in(frames: pd.DataFrame | None, start: float, end: float) -> int:
    """Python frames starting inside [start, end): any means the Python tracer ran then, so a host gap holding
    them may be longer than untraced. 0 without a `cat` column."""
    if frames is None or "cat" not in frames or not np.isfinite(start):
        return 0
    ts = frames["ts"].to_numpy(float)
    return int(((frames["cat"].to_numpy() == "python_function") & (ts >= start) & (ts < end)).sum())


def _between_frames(steps_tot: pd.DataFrame, frames: pd.DataFrame | None, skip: frozenset[str]) -> list[str]:
    """Per step, the host frame holding the device's gap to the next step when that gap is macro, else ""."""
    first = steps_tot["first_start_us"].to_numpy(float) if "first_start_us" in steps_tot else np.array([])
    if len(first) < 2:
        return [""] * len(steps_tot)
    last_end = first + steps_tot["span_us"].to_numpy(float)
    nxt = np.r_[first[1:], np.nan]
    return [host_frame_around(frames, a, b, skip) if np.isfinite(a) and np.isfinite(b) and b - a >= MACRO_GAP_US
            else "" for a, b in zip(last_end.tolist(), nxt.tolist())]


def launch_delays(launches: pd.DataFrame, step_ids: np.ndarray | None = None) -> np.ndarray:
    """First kernel start minus launch call start (µs), one per launch of `step_ids` (all when None), in no
    set order."""
    picked = launches if step_ids is None else launches[in_steps(launches["step_id"].to_numpy(), step_ids)]
    if picked["correlation"].duplicated().any():  # a launch with kernels in two steps: its first
        picked = picked.sort_values("first_start_us", kind="stable").drop_duplicates("correlation")
    return _delays(picked)


def _delays(launches: pd.DataFrame) -> np.ndarray:
    """Per launch row: its first kernel's start minus the launch call's start (µs)."""
    return launches["first_start_us"].to_numpy(float) - launches["launch_us"].to_numpy(float)


def _launch_delay_by_step(launches: pd.DataFrame) -> dict[int, float]:
    """Per step (id >= 0) with launches: the median of its launch delays (µs; each launch once
    per step, as the table has it)."""
    sid = launches["step_id"].to_numpy()
    keep = sid >= 0
    sid, delay = sid[keep], _delays(launches)[keep]
    o = np.argsort(sid, kind="stable")
    sid, delay = sid[o], delay[o]
    cut = np.flatnonzero(sid[1:] != sid[:-1]) + 1
    return {int(sid[lo]): float(np.median(part)) for lo, part in zip(np.r_[0, cut], np.split(delay, cut))} \
        if len(sid) else {}


_IDLE_COLUMNS = ["step_id", "start_us", "dur_us", "name", "category"]
"""The work columns step_idle reads (its gaps): a copy of every column of the work table was
stage 05's largest transient on a kernel-dense trace after the build."""


def _by_step(att: pd.DataFrame) -> Iterator[tuple[int, pd.DataFrame]]:
    """(step id, its rows) per step of `att` (start order); slices where each step's rows are one run, as
    steps in time order make them."""
    sid = att["step_id"].to_numpy()
    starts = np.flatnonzero(sid[1:] != sid[:-1]) + 1 if len(sid) else np.array([], dtype=np.int64)
    starts = np.r_[0, starts] if len(sid) else starts
    if len(np.unique(sid[starts])) < len(starts):  # a step in two runs: steps overlap in time
        yield from ((int(k), w) for k, w in att.groupby("step_id", sort=False))
        return
    for lo, hi in zip(starts.tolist(), np.r_[starts[1:], len(sid)].tolist()):
        yield int(sid[lo]), att.iloc[lo:hi]


def step_idle(work: pd.DataFrame, steps_tot: pd.DataFrame, launches: pd.DataFrame | None = None,
              host: pd.DataFrame | None = None, frames: pd.DataFrame | None = None) -> pd.DataFrame:
    """PERIOD_COLUMNS per step of one rank; `launches` for launch delay, `host` runtime calls and `frames` to
    name what lies behind each macro gap."""
    skip = frozenset(steps_tot["name"].astype(str)) if "name" in steps_tot else frozenset()
    period, from_device = step_periods(steps_tot)
    span = steps_tot["span_us"].to_numpy(float)
    rows = {}
    att = rows_of(work, work["step_id"].to_numpy() >= 0, _IDLE_COLUMNS)
    start = att["start_us"].to_numpy()
    if len(start) > 1 and not (start[1:] >= start[:-1]).all():  # build_work sorts it: no copy then
        att = att.sort_values("start_us", kind="stable")
    delay = _launch_delay_by_step(launches) if launches is not None else {}
    between = _between_frames(steps_tot, frames, skip)
    for sid, w in _by_step(att):
        rows[sid] = (*_gaps_one(w), delay.get(sid, np.nan))
    busy_in = period_busy(work, steps_tot, period, span)
    out = []
    for k, sid in enumerate(steps_tot["step_id"].astype(int)):
        micro, macro, largest, g0, before, after, delay = rows.get(
            sid, (0.0, 0.0, 0.0, np.nan, "", "", np.nan))
        call = host_call_during(host, g0, g0 + largest) if (
            host is not None and largest >= MACRO_GAP_US) else ""
        macro_gap = largest >= MACRO_GAP_US
        frame = host_frame_around(frames, g0, g0 + largest, skip) if macro_gap else ""
        out.append({"step_id": sid, "period_us": period[k], "period_from_device": bool(from_device[k]),
                    "between_steps_us": period[k] - span[k] if np.isfinite(period[k]) else np.nan,
                    "period_busy_us": busy_in[k],
                    "idle_micro_us": micro, "idle_macro_us": macro, "largest_gap_us": largest,
                    "largest_gap_start_us": g0, "gap_before": before, "gap_after": after,
                    "gap_host_call": call, "gap_host_frame": frame,
                    "gap_python_frames": python_frames_in(frames, g0, g0 + largest) if macro_gap else 0,
                    "between_host_frame": between[k], "launch_delay_us": delay})
    return pd.DataFrame(out, columns=PERIOD_COLUMNS)


def period_busy(work: pd.DataFrame, steps_tot: pd.DataFrame, period: np.ndarray, span: np.ndarray) -> np.ndarray:
    """Per step, the device's busy time within its period (all work, any step's or none's) where consecutive
    steps overlap by more than READINGS_AGREE_REL; NaN otherwise, without a pass over `work`."""
    att = work
    from stepscope.thresholds import READINGS_AGREE_REL

    out = np.full(len(period), np.nan)
    ok = np.isfinite(period) & np.isfinite(span)
    if not ok.any() or np.median(span[ok]) <= np.median(period[ok]) * (1 + READINGS_AGREE_REL) or not len(att):
        return out
    s = att["start_us"].to_numpy(float)
    run_end = np.maximum.accumulate(s + att["dur_us"].to_numpy(float))
    first = np.r_[True, s[1:] > run_end[:-1]]  # each merged interval's first row
    ms, me = s[first], run_end[np.r_[np.flatnonzero(first)[1:] - 1, len(s) - 1]]
    a = steps_tot["first_start_us"].to_numpy(float)
    out[ok] = account.covered_per_window(ms, me, a[ok], a[ok] + period[ok])
    return out


def _stats(v: np.ndarray) -> dict:
    v = v[np.isfinite(v)]
    if not len(v):
        return {"mean": None, "median": None, "p90": None, "n": 0}
    return {"mean": float(v.mean()), "median": float(np.median(v)),
            "p90": float(np.percentile(v, 90)), "n": int(len(v))}


def decode_period(steps_tot: pd.DataFrame, judged: pd.DataFrame, launches: pd.DataFrame) -> dict:
    """The `decode` block's period, idle, largest gap and launch delay on one rank, over `judged` (decode
    steps, else every step with work); the period over judged steps followed by one of the same kind."""
    kinds = steps_tot["kind"].to_numpy()
    same_next = np.r_[kinds[1:] == kinds[:-1], False]
    ok = steps_tot["step_id"].isin(judged["step_id"]).to_numpy() & same_next
    period_ms = steps_tot["period_us"].to_numpy(float)[ok] / 1e3
    p = _stats(period_ms)
    # The basis itself is chosen once, by `account.step_basis`; this says why it is what it is.
    if p["n"]:
        reason = "step start to next step start, same kind of step"
    else:
        window = "source" in steps_tot and (steps_tot["source"] == WHOLE_TRACE).all()
        reason = ("no step marker: the whole trace is one window, with no next step to measure a period against"
                  if window else "one step only: no next step to measure a period against" if len(judged) <= 1
                  else "no two consecutive steps of this kind")
    n_dev = int(steps_tot["period_from_device"].to_numpy(bool)[ok].sum()) if "period_from_device" in steps_tot else 0
    if n_dev:
        reason = (f"step start to next step start, same kind of step; in {n_dev} of {p['n']} steps the host's "
                  f"period was shorter than the device's busy time, so the device's step (first device event "
                  f"to the next step's) was used")
    out: dict = {"period_ms": p, "denominator_reason": reason,
                 "period_from_device_n": n_dev}
    if judged.empty:
        out.update(idle_micro_ms=None, idle_macro_ms=None, largest_gap=None, host_gap=None, between_steps=None,
                   launch_delay_us={"median": None, "p90": None})
        return out
    out["host_gap"], out["between_steps"] = host_gaps(steps_tot, judged, ok)
    out["idle_micro_ms"] = float(judged["idle_micro_us"].mean() / 1e3)
    out["idle_macro_ms"] = float(judged["idle_macro_us"].mean() / 1e3)
    g = judged.loc[judged["largest_gap_us"].idxmax()]
    out["largest_gap"] = ({"dur_ms": float(g["largest_gap_us"] / 1e3), "step": int(g["step_id"]),
                           "before": str(g["gap_before"]), "after": str(g["gap_after"]),
                           "host_call": str(g["gap_host_call"]) or None,
                           "host_frame": str(g.get("gap_host_frame") or "") or None,
                           "macro": bool(g["largest_gap_us"] >= MACRO_GAP_US)}
                          if g["largest_gap_us"] > 0 else None)
    d = launch_delays(launches, judged["step_id"].to_numpy())
    out["launch_delay_us"] = {"median": float(np.median(d)) if len(d) else None,
                              "p90": float(np.percentile(d, 90)) if len(d) else None}
    return out


def host_gaps(steps_tot: pd.DataFrame, judged: pd.DataFrame, ok: np.ndarray) -> tuple[dict | None, dict | None]:
    """(inside, between): the judged steps' largest macro gap and the device gap between consecutive steps,
    each as `_gap_time`; `ok`: the rows the period is measured over."""
    rows = steps_tot[steps_tot["step_id"].isin(judged["step_id"])]
    if rows.empty or "largest_gap_us" not in rows:
        return None, None
    big = rows["largest_gap_us"].to_numpy(float)
    big = np.where(big >= MACRO_GAP_US, big, 0.0)
    with_period = ok[steps_tot["step_id"].isin(judged["step_id"]).to_numpy()]
    idle = rows["period_us"].to_numpy(float) - rows["busy_us"].to_numpy(float)
    if not with_period.any():  # no period: the idle inside the span is all there is
        with_period = np.ones(len(rows), bool)
        idle = rows["span_us"].to_numpy(float) - rows["busy_us"].to_numpy(float)
    inside = _gap_time(big, idle, with_period, rows["gap_host_frame"], rows.get("gap_python_frames"))
    per = steps_tot[ok]
    between = per["between_steps_us"].to_numpy(float) if len(per) else np.array([])
    between = np.where(np.isfinite(between) & (between > 0), between, 0.0)
    out = None
    if len(per) and between.any() and "between_host_frame" in per:
        idle_p = per["period_us"].to_numpy(float) - per["busy_us"].to_numpy(float)
        out = _gap_time(between, idle_p, np.ones(len(per), bool), per["between_host_frame"], None)
    return (inside if big.any() else None), out


def _gap_time(gap_us: np.ndarray, idle_us: np.ndarray, counted: np.ndarray, frame: pd.Series,
              python_frames: pd.Series | None) -> dict:
    """One gap per step, pooled: mean ms per step, share of those steps' idle, and the host frame holding most
    of it (time per step, steps, median Python frames inside)."""
    names = frame.fillna("").astype(str).to_numpy()
    idle = float(np.nansum(idle_us[counted]))
    out = {"ms_per_step": float(gap_us.mean() / 1e3), "n_steps": int(len(gap_us)),
           "share_of_idle": float(gap_us[counted].sum() / idle) if idle > 0 else None,
           "frame": None, "frame_ms_per_step": None, "n_steps_in_frame": 0, "python_frames": None}
    named = (names != "") & (gap_us > 0)
    if not named.any():
        return out
    by = pd.Series(gap_us[named]).groupby(names[named], sort=False).sum().sort_values(ascending=False, kind="stable")
    top = str(by.index[0])
    mine = named & (names == top)
    py = python_frames.to_numpy(float)[mine] if python_frames is not None else np.array([])
    out.update(frame=top, frame_ms_per_step=float(by.iloc[0] / len(gap_us) / 1e3), n_steps_in_frame=int(mine.sum()),
               python_frames=int(np.median(py)) if len(py) and np.isfinite(py).all() else None)
    return out
