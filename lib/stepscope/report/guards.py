"""Guards: the invariants a verdict rests on, checked before any sentence is written; `guarded`
withdraws the claims resting on a failing one (docs/verdict.md#guards).
"""

from __future__ import annotations

import re
from typing import Any

import pandas as pd
from msgspec.structs import replace

from stepscope.palette import COMMUNICATION_CATEGORIES
from stepscope.report.artifacts import RunArtifacts, num
from stepscope.report.verdict import biggest, caveats
from stepscope.schema.verdict import Guard, Verdict
from stepscope.thresholds import (GUARD_TOLERANCE_REL, LEVER_DOMINANT_SHARE, LEVER_TOP_KERNELS,
                                  READINGS_AGREE_REL, STEADY_STATE_MAX_STALL_SHARE, STEADY_STATE_MAX_X)

DENOMINATOR_CLAIMS = ("dominant", "boundness", "levers", "gap_levers", "between_steps", "biggest")
"""Claims that divide by the step: a denominator that cannot hold the work withdraws them."""
LEVER_CLAIMS = ("levers", "gap_levers", "between_steps", "biggest")
COMM_CLAIMS = ("communication", "comm_split")
KEPT_ALWAYS = ("identity", "basis", "plateau", "guards", "roofline_reason", "caveats")
"""What no guard withdraws: what the trace is, the denominator's name, the sweep's plateau (and the
caveats, listed after the guards)."""

COLLECTIVE_NAME = re.compile(
    r"nccl|rccl|c10d|gloo|shm_|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|send_?recv|"
    r"cross_device_reduce|custom_?ar|mscclpp|quick_?reduce|record_param_comms", re.I)
"""A kernel or op name that is a collective's (`record_param_comms`: the op c10d records around
each collective call, all a CPU-only export of an NCCL job shows of it). `broadcast` alone is
not: ATen's elementwise `type_specialized_broadcast_kernel` broadcasts shapes, not between ranks."""


def guarded(v: Verdict, a: RunArtifacts, totals: dict[str, Any], decode: pd.DataFrame | None) -> Verdict:
    """`v` with every invariant checked, the claims of the failing ones withdrawn, and every
    caveat listed (`report.verdict.caveats`: they read the failed checks)."""
    # a tuple of names reads back from verdict.json as a list: stored as one, the file is the verdict
    checks = tuple(replace(g, values=tuple((k, list(x) if isinstance(x, tuple) else x) for k, x in g.values))
                   for g in check(v, a, totals, decode))
    v = replace(withdraw(v, checks), guards=checks)
    return replace(v, caveats=caveats(v, a))


def check(v: Verdict, a: RunArtifacts, totals: dict[str, Any], decode: pd.DataFrame | None) -> tuple[Guard, ...]:
    """Every invariant, in the order the report states them. A capture fails the first and
    the rest are moot: nothing of a steady step is claimed of it."""
    kind = _kind_takes_verdict(v)
    if not kind.holds:
        return (kind,)
    out = [kind, _device_work_recorded(v), _share_at_most_step(decode), _busy_at_most_period(totals),
           _steps_apart(totals),
           *_below_peak(v), _clocks_agree(v), _classes_add_up(decode, totals),
           _communication_has_collectives(v, a), _steady_state(v), _steps_match_architecture(a)]
    out += _levers_coherent(v)
    return tuple(g for g in out if g is not None)


def withdraw(v: Verdict, checks: tuple[Guard, ...]) -> Verdict:
    """`v` without the claims the failing checks withdraw; the biggest lever re-chosen among
    the levers that remain (a withdrawn lever is never called the biggest)."""
    gone = {c for g in checks if not g.holds for c in g.withdrawn}
    if not gone:
        return v
    changes: dict[str, Any] = {}
    for name in v.__struct_fields__:
        if name in gone and name not in KEPT_ALWAYS:
            changes[name] = () if isinstance(getattr(v, name), tuple) else None
    levers = changes.get("levers", v.levers)
    levers = tuple(lv for lv in levers if f"lever:{lv.category}" not in gone)
    if "transfer" in gone:
        levers = tuple(replace(lv, transfer_ms=None, transfer_ceiling_x=None) for lv in levers)
    changes["levers"] = levers
    changes["roofline"] = tuple(r for r in changes.get("roofline", v.roofline) if f"roofline:{r.category}" not in gone)
    if "biggest" not in gone:
        changes["biggest"] = biggest(levers, changes.get("between_steps", v.between_steps),
                                     changes.get("gap_levers", v.gap_levers))
    return replace(v, **changes)


# --------------------------------------------------------------------------- the checks


def _kind_takes_verdict(v: Verdict) -> Guard:
    i = v.identity
    every = tuple(name for name in v.__struct_fields__ if name not in KEPT_ALWAYS)
    return Guard("kind_takes_verdict", holds=i.kind != "capture",
                 values=(("kind", i.kind), ("evidence", i.evidence_for("capture"))),
                 withdrawn=every if i.kind == "capture" else ())


def _device_work_recorded(v: Verdict) -> Guard | None:
    """Checked only where stage 05 found the marks of a GPU job: a CPU engine's trace, whose
    host ops are its work, is not a host-only export."""
    host_ops = v.identity.host_only_of_gpu_job
    if not host_ops:
        return None
    return Guard("device_work_recorded", holds=False, values=(("host_ops", host_ops),),
                 withdrawn=(*LEVER_CLAIMS, "boundness", *COMM_CLAIMS))


def _share_at_most_step(decode: pd.DataFrame | None) -> Guard | None:
    if decode is None or "share_of_step" not in decode or not len(decode):
        return None
    shares = decode["share_of_step"].astype(float)
    i = int(shares.to_numpy().argmax())
    top = float(shares.iloc[i])
    return Guard("share_at_most_step", holds=top <= 1 + GUARD_TOLERANCE_REL,
                 values=(("category", str(decode["category"].iloc[i])), ("share_pct", 100 * top)),
                 withdrawn=DENOMINATOR_CLAIMS if top > 1 + GUARD_TOLERANCE_REL else ())


def _busy_at_most_period(totals: dict[str, Any]) -> Guard | None:
    busy, step = num(totals.get("union_ms")), num(totals.get("step_ms"))
    if busy is None or not step:
        return None
    ok = busy <= step * (1 + GUARD_TOLERANCE_REL)
    return Guard("busy_at_most_period", holds=ok,
                 values=(("busy_ms", busy), ("step_ms", step), ("denominator", totals.get("step_basis"))),
                 withdrawn=() if ok else DENOMINATOR_CLAIMS)


def _steps_apart(totals: dict[str, Any]) -> Guard | None:
    """On the period basis only (a span is each step's own work), and on medians: one descheduled step
    moved the mean span past the mean period with no two steps overlapping."""
    span = num(totals.get("span_median_ms", totals.get("span_ms")))
    period = num(totals.get("period_median_ms", totals.get("period_ms")))
    if totals.get("step_basis") != "period" or span is None or not period:
        return None
    ok = span <= period * (1 + READINGS_AGREE_REL)
    return Guard("steps_apart", holds=ok, values=(("span_ms", span), ("period_ms", period)),
                 withdrawn=() if ok else ("boundness", "gap_levers"))


def _below_peak(v: Verdict) -> list[Guard]:
    out = []
    for r in v.roofline:
        if not r.peak_known:
            continue
        over = [(what, p) for what, p in (("bandwidth", r.pct_peak_bw), ("compute", r.pct_peak_flops))
                if p is not None and p > 100 * (1 + GUARD_TOLERANCE_REL)]
        out.append(Guard("below_peak", holds=not over, subject=r.category,
                         values=(("pct_peak_bw", r.pct_peak_bw), ("pct_peak_flops", r.pct_peak_flops),
                                 ("device", r.device)),
                         withdrawn=(f"roofline:{r.category}",) if over else ()))
    return out


def _clocks_agree(v: Verdict) -> Guard | None:
    s = v.comm_split
    if s is None or s.status != "split":
        return None
    return Guard("clocks_agree", holds=not s.clock_flag, values=(("world_size", s.world_size),),
                 withdrawn=("comm_split", "transfer") if s.clock_flag else ())


def _classes_add_up(decode: pd.DataFrame | None, totals: dict[str, Any]) -> Guard | None:
    busy = num(totals.get("union_ms"))
    if decode is None or "exposed_ms_mean" not in decode or not busy:
        return None
    exposed = float(decode["exposed_ms_mean"].astype(float).sum())
    ok = abs(exposed - busy) <= READINGS_AGREE_REL * busy
    return Guard("classes_add_up", holds=ok, values=(("exposed_sum_ms", exposed), ("busy_ms", busy)),
                 withdrawn=() if ok else LEVER_CLAIMS)


def _communication_has_collectives(v: Verdict, a: RunArtifacts) -> Guard | None:
    c = v.communication
    if c is None or c.status == "none":
        return None
    i = v.identity
    world = max([w for w in (i.world_size, i.tp if i.tp_source not in (None, "default") else None) if w] or [0])
    names = _comm_kernel_names(a)
    collective = [n for n in names if COLLECTIVE_NAME.search(n)]
    ok = world > 1 or bool(collective) or (not names and not world)
    comm_levers = tuple(f"lever:{lv.category}" for lv in v.levers if lv.category in COMMUNICATION_CATEGORIES)
    return Guard("communication_has_collectives", holds=ok,
                 values=(("world_size", world or None), ("comm_ms", c.comm_ms),
                         ("kernels", tuple(names[:3])), ("collective_kernels", len(collective))),
                 withdrawn=() if ok else COMM_CLAIMS + comm_levers)


def _comm_kernel_names(a: RunArtifacts) -> list[str]:
    k = a.category_kernels
    if k is None or "category" not in k:
        return []
    sub = k[k["category"].isin(COMMUNICATION_CATEGORIES)]
    return [str(n) for n in sub.sort_values("sum_ms_per_step", ascending=False)["name"]]


def _steady_state(v: Verdict) -> Guard | None:
    b = v.biggest
    if b is None:
        return None
    # long gaps as a per-step mean: one long gap in one step of many is no stalled steady state
    long = next((g for g in v.gap_levers if g.kind == "long gaps"), None)
    stall_share = long.idle_ms / long.step_ms if long is not None and long.step_ms else None
    stalled = stall_share is not None and stall_share > STEADY_STATE_MAX_STALL_SHARE
    ok = b.ceiling_x <= STEADY_STATE_MAX_X
    # a step that is mostly stall: the stall is no lever, the categories' ceilings still stand
    withdrawn = LEVER_CLAIMS if not ok else ("gap_levers",) if stalled else ()
    return Guard("steady_state", holds=ok and not stalled, subject=b.name,
                 values=(("ceiling_x", b.ceiling_x), ("bound_x", STEADY_STATE_MAX_X), ("lever", b.name),
                         ("long_gaps_ms", None if long is None else long.idle_ms),
                         ("step_ms", None if long is None else long.step_ms),
                         ("stall_pct", None if stall_share is None else 100 * stall_share),
                         ("stall_bound_pct", 100 * STEADY_STATE_MAX_STALL_SHARE)),
                 withdrawn=withdrawn)


def _steps_match_architecture(a: RunArtifacts) -> Guard | None:
    """Every judged decode step off the architecture's collectives: none is a forward pass, so nothing
    said of "the step" holds (stage 05 sets failing steps apart, so this fails only when all do)."""
    cc = a.trace_summary.collectives_check if a.trace_summary is not None else None
    if cc is None or not cc.steps_failing or cc.expected is None:
        return None
    n = cc.observed.n_steps if cc.observed is not None else 0
    ok = len(cc.steps_failing) < n
    return Guard("steps_match_architecture", holds=ok,
                 values=(("n_failing", len(cc.steps_failing)), ("n_steps", n),
                         ("all_reduce", cc.expected.all_reduce)),
                 withdrawn=() if ok else (*DENOMINATOR_CLAIMS, *COMM_CLAIMS))


def _levers_coherent(v: Verdict) -> list[Guard]:
    """The levers the verdict may name, checked in order until two coherent ones (the lever sentence's
    best and next) are found, by stage 05's mark; a lever without one (an older run) is not checked."""
    out: list[Guard] = []
    for lv in v.levers:
        if sum(g.holds for g in out) >= 2:
            break
        if lv.coherent is None:
            continue
        ok = lv.coherent
        out.append(Guard("lever_coherent", holds=ok, subject=lv.category,
                         values=(("n_names", lv.n_names), ("top_share_pct", lv.top_share_pct),
                                 ("top_kernels", LEVER_TOP_KERNELS), ("dominant_share_pct", 100 * LEVER_DOMINANT_SHARE),
                                 ("module", lv.module), ("module_share_pct", lv.module_share_pct)),
                         withdrawn=() if ok else (f"lever:{lv.category}",)))
    return out

