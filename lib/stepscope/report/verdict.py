"""The verdict as typed findings (`schema.verdict`, the file format too): every number a judgement
rests on, its threshold and its denominator, before any sentence is written, so a test can check
each number in the text against its field. How each is decided: docs/verdict.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgspec
import pandas as pd
from msgspec.structs import replace

from stepscope import schema, wording
from stepscope.palette import COMMUNICATION_CATEGORIES, GEMM_CATEGORIES
from stepscope.report.artifacts import RunArtifacts, num
from stepscope.report.kinds import judged_kind, kind_table, kinds_apart
from stepscope.report.load import load_growth
from stepscope.schema.verdict import (Agreement, BetweenSteps, BiggestLever, Boundness, Caveat, CommSplit,
                                      Communication, Component, Dominant, GapLever, LoadGrowth, Lever,
                                      Overlap, Plateau, RooflineFinding, SpecDecodeSeen, StepBasis, StepPrediction,
                                      TpotGap, TraceIdentity, Verdict)
from stepscope.trace.account import ceiling_x
from stepscope.trace.micro_curve import judge_components
from stepscope.trace.tpot import tpot_against_step
from stepscope.trace.steps import WHOLE_TRACE
from stepscope.thresholds import (BETWEEN_STEPS_SHARE, HEADLINE_IDLE_SHARE, LEVER_MIN_X, COMM_EXPOSED_SHARE, COMM_HIDDEN_SHARE, DEVICE_BOUND_IDLE_SHARE,
                                  HOST_AHEAD_LAUNCH_DELAY_US, HOST_BOUND_MICRO_IDLE_SHARE, HOST_GAP_IDLE_SHARE,
                                  LAUNCH_BOUND_IDLE_SHARE, LOW_CONFIDENCE_STEPS, OVERLAP_RATIO,
                                  STALLED_LEVEL_SHARE, PREDICTION_TOLERANCE, STALL_GAP_SHARE)


# --------------------------------------------------------------------------- identity


def trace_identity(a: RunArtifacts) -> TraceIdentity:
    """The trace's kind, engine, device, batch and TP: stage 05's `trace_info` when present."""
    ts = a.trace_summary
    info = _plain(ts.trace_info) if ts is not None else None
    ranks = [_plain(r) for r in a.ranks]
    ref = ranks[0] if ranks else {}
    cm = (_plain(ts.collectives_matched) if ts is not None else None) or {}
    params_tp, params_src = _params_tp(a)
    if info is not None:
        kind = str(info.get("kind") or "unknown")
        step_kinds = info.get("step_kinds") if isinstance(info.get("step_kinds"), dict) else {}
        # no step marker: stage 05 read the trace whole, one window with no steps to count
        window = info.get("step_source") == WHOLE_TRACE
        if window:
            judged = None
        elif info.get("judged_kind") in step_kinds:
            judged = step_kinds[info["judged_kind"]]
        else:
            judged = info.get("n_decode_steps") if kind in ("decode", "mixed") else info.get("n_steps")
        present = _count(info.get("ranks_present"))
        tp = _int(info.get("tp")) or params_tp
        return TraceIdentity(
            kind=kind, step_label=wording.step_label(kind, window), source="trace_info",
            engine=_known(info.get("engine")), device_name=_known(info.get("device_name")),
            device_count=_int(info.get("device_count")), batch_size=_whole(num(info.get("batch_size"))),
            batch_source=_known(info.get("batch_source")),
            tp=tp, tp_source=str(info.get("tp_source") or (params_src if tp else None)),
            tp_disagreement=bool(info.get("tp_disagreement")),
            world_size=_int(info.get("world_size")) or _int(cm.get("world_size")),
            ranks_present=_count(cm.get("ranks_present")) or present or (len(ranks) or None),
            n_steps=_int(info.get("n_steps")), n_judged_steps=_int(judged),
            low_confidence=bool(info.get("low_confidence", (_int(judged) or 0) < LOW_CONFIDENCE_STEPS)),
            graph_replay=info.get("graph_replay") if isinstance(info.get("graph_replay"), bool) else None,
            weight_formats_named=tuple(info.get("weight_formats_named") or ()),
            evidence=tuple((str(k), tuple(str(x) for x in v)) for k, v in (info.get("kind_evidence") or {}).items()),
            model_passes=_int(info.get("model_passes")),
            mixed=({k: (_whole(num(x)) if k != "n_steps" else _int(x)) for k, x in info["mixed"].items()}
                   if isinstance(info.get("mixed"), dict) else None),
            host_only_of_gpu_job=tuple(str(x) for x in info.get("host_only_of_gpu_job") or ()))
    if ts is None and not ranks:  # stage 05 failed or never ran: no kind, no steps to claim
        return TraceIdentity(kind="unknown", step_label="step", source="none", tp=params_tp,
                             tp_source=params_src if params_tp else None)
    # An older summary: the kind from the step counts, the rest from the run's own files.
    n_dec = _int(ref.get("n_decode_steps"))
    if n_dec:
        kind, label, judged = "decode", wording.step_label("decode"), n_dec
    else:
        src = str(ref.get("step_source") or "")
        kind = "unknown"
        label = "profiler step" if "profiler_step" in src else "step"
        judged = (a.decode.steps.n_steps or None) or _int(ref.get("n_steps"))
    return TraceIdentity(
        kind=kind, step_label=label, source="step counts",
        engine=_known((a.server.engine if a.server else None) or (a.manifest.engine if a.manifest else None)),
        tp=params_tp, tp_source=params_src if params_tp else None,
        ranks_present=len(ranks) or None, n_steps=_int(ref.get("n_steps")), n_judged_steps=judged,
        low_confidence=(judged or 0) < LOW_CONFIDENCE_STEPS)


def _params_tp(a: RunArtifacts) -> tuple[int | None, str]:
    srv = a.server.tp if a.server is not None else None
    if srv:
        return srv, "server"
    p = a.params or {}
    v = _int(((p.get("analysis") or {}).get("tp"))) or _int(((p.get("server") or {}).get("tp")))
    # `stepscope analyze` without --tp writes no TP: a default of 1 would be a guess.
    return (v, "params") if v and (a.server is not None or (p.get("analysis") or {}).get("tp")) else (None, "")


def _plain(struct: Any) -> dict | None:
    """A schema Struct as a mapping (None stays None): the findings below read optional
    nested keys, all typed and defaulted by `stepscope.schema`."""
    return None if struct is None else schema.to_builtins(struct)


def _known(v: Any) -> str | None:
    """A text value, or None for missing ones (None, empty, "unknown", a table's NaN)."""
    if isinstance(v, float) and v != v:
        return None
    return None if v in (None, "", "unknown") else str(v)


def _count(v: Any) -> int | None:
    """How many ranks: stage 05 lists them (`ranks_present: [0, 1]`); a bare count is read too."""
    return len(v) if isinstance(v, list) else _int(v)


def _whole(v: float | None) -> float | int | None:
    """A count read as a float (a median of counts) as an int when it is one: "32 requests",
    not "32.0 requests"."""
    return int(v) if v is not None and float(v).is_integer() else v


def _int(v: Any) -> int | None:
    f = num(v)
    return int(f) if f is not None else None


# --------------------------------------------------------------------------- findings


def spec_decode_seen(a: RunArtifacts, basis: StepBasis) -> SpecDecodeSeen | None:
    """Verify steps from the trace and, when stage 04 read the server's counters around the
    profiled requests, what the server accepted and what a token then costs."""
    sd = _plain(a.decode.spec_decode)
    if not sd or not _int(sd.get("n_verify_steps")):
        return None
    c = a.capture_counters
    per_step = c.tokens_per_decode_step if c is not None else None
    return SpecDecodeSeen(n_verify_steps=_int(sd["n_verify_steps"]), n_decode_steps=_int(sd.get("n_decode_steps")) or 0,
                          scored_tokens_per_verify_step=num(sd.get("scored_tokens_per_verify_step")),
                          verify_step_ms=num(sd.get("verify_step_ms")), plain_step_ms=num(sd.get("plain_step_ms")),
                          accepted_tokens=round(c.accepted_tokens) if c is not None else None,
                          draft_tokens=round(c.draft_tokens) if c is not None else None,
                          acceptance_pct=100 * c.acceptance_rate if c is not None and c.acceptance_rate is not None
                          else None,
                          tokens_per_decode_step=per_step,
                          ms_per_token=basis.step_ms / per_step if per_step and basis.step_ms else None)


def step_basis(a: RunArtifacts) -> StepBasis:
    """Stage 05's step basis (`RunArtifacts.step_basis`), as a finding."""
    denominator, step_ms, reason = a.step_basis()
    return StepBasis(denominator=denominator if step_ms else None, step_ms=step_ms, reason=reason)


def dominant(decode: pd.DataFrame | None, basis: StepBasis, ident: TraceIdentity) -> Dominant | None:
    if decode is None or not len(decode):
        return None
    top = decode.iloc[0]
    share = num(top.get("share_of_step"))
    return Dominant(category=str(top["category"]), ms_per_step=float(top["ms_per_step_mean"]),
                    share_pct=100 * share if share is not None else None, step_ms=basis.step_ms,
                    denominator=basis.denominator, n_steps=ident.n_judged_steps, step_label=ident.step_label)


def communication(decode: pd.DataFrame | None, amdahl: pd.DataFrame | None) -> Communication | None:
    if decode is None or not len(decode):
        return None
    sub = decode[decode["category"].isin(COMMUNICATION_CATEGORIES)]
    comm = float(sub["ms_per_step_mean"].sum()) if len(sub) else 0.0
    if comm <= 0:
        return Communication(status="none")
    exposed = None
    if "exposed_ms_mean" in decode:
        exposed = float(sub["exposed_ms_mean"].sum())
    elif amdahl is not None:
        s2 = amdahl[amdahl["category"].isin(COMMUNICATION_CATEGORIES)]
        exposed = float(s2["exposed_ms"].sum()) if len(s2) else None
    if exposed is None:
        return Communication(status="unknown", comm_ms=comm)
    frac = exposed / comm
    status = ("exposed" if frac >= COMM_EXPOSED_SHARE else "hidden" if frac <= COMM_HIDDEN_SHARE
              else "partly hidden")
    return Communication(status=status, comm_ms=comm, exposed_ms=exposed, exposed_pct=100 * frac)


def _waitiest_category(cm: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """(category, its figures): the collective whose ranks wait longest in all. Skew is a
    per-kind figure; runs without `by_category` fall back to the pooled block."""
    by = cm.get("by_category") if isinstance(cm.get("by_category"), dict) else {}

    def total_wait(v: Any) -> float:
        w = v.get("wait_ms_per_step_by_rank") if isinstance(v, dict) else None
        return sum(x for x in (w or {}).values() if isinstance(x, (int, float)))

    if not by:
        return None, cm
    cat = max(sorted(by), key=lambda c: total_wait(by[c]))
    return cat, by[cat]


def comm_split(a: RunArtifacts, ident: TraceIdentity, comm: Communication | None) -> CommSplit | None:
    """Transfer against waiting from stage 05's cross-rank matching; no claim with ranks missing."""
    if comm is None or comm.status == "none":
        return None
    cm = _plain(a.trace_summary.collectives_matched) if a.trace_summary is not None else None
    if not cm:
        status = "ranks missing" if ident.ranks_missing else "not matched"
        return CommSplit(status=status, world_size=ident.world_size, ranks_present=ident.ranks_present)
    ws, present = _int(cm.get("world_size")), _count(cm.get("ranks_present"))
    if ws is None and not cm.get("complete"):  # no world size said: "1 of – ranks" would be no count
        return CommSplit(status="not matched", ranks_present=present)
    if not cm.get("complete", ws is not None and present is not None and present >= ws):
        return CommSplit(status="ranks missing", world_size=ws, ranks_present=present)
    cat, per = _waitiest_category(cm)
    skew = per.get("skew_us") if isinstance(per.get("skew_us"), dict) else {}
    waits = {int(r): w for r, v in (cm.get("wait_ms_per_step_by_rank") or {}).items() if (w := num(v)) is not None}
    least = min(waits, key=lambda r: (waits[r], r)) if len(waits) > 1 else None
    most = max(waits, key=lambda r: (waits[r], -r)) if len(waits) > 1 else None
    return CommSplit(status="split", transfer_ms=num(cm.get("transfer_ms_per_step")),
                     least_wait_rank=least, least_wait_ms=waits.get(least), most_wait_rank=most,
                     most_wait_ms=waits.get(most),
                     wait_ms=num(cm.get("wait_ms_per_step")), skew_p90_us=num(skew.get("p90")), skew_category=cat,
                     straggler_rank=_int(per.get("straggler_rank")), world_size=ws, ranks_present=present,
                     n_instances=_int(cm.get("n_instances_judged", cm.get("n_instances"))), clock_flag=bool(cm.get("clock_flag")))


def boundness(a: RunArtifacts, totals: dict[str, Any], basis: StepBasis,
              ident: TraceIdentity) -> Boundness | None:
    """Device- or host-bound from the step's own numbers on the step basis (docs/verdict.md#host-bound-device-bound-or-one-stall-boundness)."""
    step, busy, span = basis.step_ms, totals.get("union_ms"), totals.get("span_ms")
    if not step or busy is None:
        return None
    d = _plain(a.decode)
    cpu = totals.get("mode") == "cpu"
    idle_frac = max(step - busy, 0.0) / step
    micro, macro = num(d.get("idle_micro_ms")), num(d.get("idle_macro_ms"))
    gap = d.get("largest_gap") if isinstance(d.get("largest_gap"), dict) else {}
    gap_ms = num(gap.get("dur_ms"))
    ld = d.get("launch_delay_us") if isinstance(d.get("launch_delay_us"), dict) else {}
    delay = num(ld.get("median"))
    idle_ms = step - busy
    kw = dict(device_word="CPU worker" if cpu else "device", step_ms=step, busy_ms=busy,
              idle_pct=100 * idle_frac, busy_pct=100 * (1 - idle_frac), denominator=basis.denominator, cpu=cpu,
              micro_idle_pct=100 * micro / step if micro is not None else None,
              macro_idle_pct=100 * macro / step if macro is not None else None,
              between_steps_pct=(100 * max(step - span, 0.0) / step
                                 if basis.denominator == "period" and span is not None else None),
              largest_gap_ms=gap_ms,
              macro_pct_of_idle=100 * macro / idle_ms if macro is not None and idle_ms > 0 else None,
              gap_before=_known(gap.get("before")), gap_after=_known(gap.get("after")),
              gap_host_call=_known(gap.get("host_frame") or gap.get("host_call")),
              launch_delay_median_us=delay, graph_replay=ident.graph_replay, **_host_gap(d.get("host_gap")))
    if idle_frac <= DEVICE_BOUND_IDLE_SHARE:
        return Boundness(status="device-bound", **kw)
    one_gap = kw.get("host_gap_pct_of_idle")
    # one step's one gap is a stall: a single step cannot say the host holds every step
    if (idle_frac > HOST_GAP_IDLE_SHARE and one_gap is not None and one_gap >= 100 * STALL_GAP_SHARE
            and (kw.get("n_steps") or 0) > 1):
        return Boundness(status="host gap", **kw)
    if micro is None:
        # Without the split one long stall and many launch gaps look alike: decide nothing.
        return Boundness(status="undetermined" if idle_frac >= LAUNCH_BOUND_IDLE_SHARE else "mixed", **kw)
    if micro / step >= HOST_BOUND_MICRO_IDLE_SHARE:
        host_ahead = not cpu and delay is not None and delay >= HOST_AHEAD_LAUNCH_DELAY_US
        return Boundness(status="host-ahead gaps" if host_ahead else "host-bound", **kw)
    if macro is not None and idle_ms > 0 and macro / idle_ms >= STALL_GAP_SHARE:
        return Boundness(status="stall", **kw)
    return Boundness(status="mixed", **kw)


def _host_gap(g: Any) -> dict[str, Any]:
    """Boundness's fields from stage 05's `host_gap` block (each step's one long gap and the host
    frame it lies in); none where the run predates it."""
    if not isinstance(g, dict) or num(g.get("ms_per_step")) is None:
        return {}
    share = num(g.get("share_of_idle"))
    return dict(host_gap_ms=num(g.get("ms_per_step")), host_gap_pct_of_idle=None if share is None else 100 * share,
                host_frame=_known(g.get("frame")), host_frame_steps=_int(g.get("n_steps_in_frame")),
                n_steps=_int(g.get("n_steps")), python_frames=_int(g.get("python_frames")))


def overlap(totals: dict[str, Any]) -> Overlap | None:
    s, u = totals.get("kernel_sum_ms"), totals.get("union_ms")
    if s and u and s / u >= OVERLAP_RATIO:
        return Overlap(kernel_sum_ms=s, union_ms=u, overstate_pct=100 * (s / u - 1))
    return None


def tpot_gap(totals: dict[str, Any], ident: TraceIdentity) -> TpotGap | None:
    """TPOT against the device step: only for decode, and only when the gap is worth saying."""
    j = tpot_against_step(totals.get("tpot_capture_ms"), totals.get("period_ms"), totals.get("span_ms"))
    if not ident.has_decode or j is None or j.code != "tpot_above":  # the one judgement (trace.tpot)
        return None
    return TpotGap(tpot_ms=j.tpot_ms, step_ms=j.step_ms, denominator=j.reference, gap_ms=j.gap_ms,
                   gap_pct=100 * j.gap_share)


def between_steps(totals: dict[str, Any], ident: TraceIdentity, a: RunArtifacts | None = None) -> BetweenSteps | None:
    """The period minus the span when the steps have a period and the gap is worth a lever, named by
    the host frame stage 05 found over it."""
    period, span = num(totals.get("period_ms")), num(totals.get("span_ms"))
    if ident.kind == "capture" or not period or not span or period - span <= BETWEEN_STEPS_SHARE * period:
        return None
    g = _plain(a.decode).get("between_steps") if a is not None else None
    g = g if isinstance(g, dict) else {}
    return BetweenSteps(gap_ms=period - span, period_ms=period, span_ms=span, gap_pct=100 * (period - span) / period,
                        ceiling_x=period / span, n_intervals=_int(totals.get("period_n")),
                        host_frame=_known(g.get("frame")), host_frame_intervals=_int(g.get("n_steps_in_frame")))


def levers(amdahl: pd.DataFrame | None, basis: StepBasis, a: RunArtifacts | None = None) -> tuple[Lever, ...]:
    """Every category's Amdahl ceiling; a collective matched across ranks (in `a`) also gets
    the ceiling of a faster transfer."""
    if amdahl is None or not len(amdahl) or not basis.step_ms:
        return ()
    cm = a.trace_summary.collectives_matched if a is not None and a.trace_summary is not None else None
    by_cat = (cm.by_category if cm is not None else None) or {}
    out = []
    for _, r in amdahl.iterrows():
        if num(r.get("speedup_ceiling")) is None:
            continue
        lever = Lever(category=str(r["category"]), exposed_ms=float(r["exposed_ms"]),
                      ceiling_x=float(r["speedup_ceiling"]), step_ms=basis.step_ms, denominator=basis.denominator)
        stats = by_cat.get(lever.category)
        transfer = num(stats.transfer_ms_per_step) if stats is not None else None
        if transfer is not None:
            cut = min(lever.exposed_ms, transfer)
            lever = replace(lever, transfer_ms=transfer, transfer_ceiling_x=ceiling_x(basis.step_ms, cut))
        out.append(_with_stage05_reading(lever, a.category_levers if a is not None else None))
    return tuple(out)


def _with_stage05_reading(lever: Lever, table: pd.DataFrame | None) -> Lever:
    """`lever` with stage 05's reading of its category (category_levers.csv): its coherence
    mark, its largest kernels and the module holding most of its time. Judged there, not here."""
    if table is None or "category" not in table:
        return lever
    rows = table[table["category"] == lever.category]
    if rows.empty:
        return lever
    r = rows.iloc[0]
    module, top, mod = r.get("module"), num(r.get("top_share")), num(r.get("module_share"))
    return replace(lever, coherent=bool(r["coherent"]), n_names=int(r["n_names"]),
                   top_kernels=tuple(_split_top_kernels(r.get("top_kernels"))),
                   top_share_pct=None if top is None else 100 * top,
                   module=str(module) if isinstance(module, str) and module else None,
                   module_share_pct=None if mod is None else 100 * mod)


_TOP_KERNEL_SHARE = re.compile(r" \(\d+(?:\.\d+)?%\)$")


def _split_top_kernels(cell: Any) -> list[str]:
    """category_levers.csv's `top_kernels` cell (`name (share%)` joined by ` | `) as names."""
    if not isinstance(cell, str) or not cell:
        return []
    return [_TOP_KERNEL_SHARE.sub("", part) for part in cell.split(" | ")]


def agreements(mvt: pd.DataFrame | None) -> tuple[Agreement, ...]:
    if mvt is None:
        return ()
    out = []
    for _, r in mvt.iterrows():
        t, p, ratio = num(r["trace_ms_per_step"]), num(r["micro_predicted_ms_per_step"]), \
            num(r["ratio_trace_over_micro"])
        if t is None or p is None or ratio is None:
            continue
        what = "communication" if "communication" in str(r["quantity"]) else "GEMM time"
        same = r.get("same_implementation")
        out.append(Agreement(quantity=what, trace_ms=t, predicted_ms=p, ratio=ratio,
                             agree=abs(ratio - 1) <= PREDICTION_TOLERANCE,
                             trace_implementation=_known(r.get("trace_implementation")),
                             micro_backend=_known(r.get("micro_backend")),
                             same_implementation=None if same is None or pd.isna(same) else bool(same)))
    return tuple(out)


def component_check(trace: dict[str, float], predicted: dict[str, float],
                    denominator: str | None = None) -> StepPrediction:
    """The predicted step against the trace's, component by component (ms per step), judged by
    the one offsetting rule (`trace.micro_curve.judge_components`)."""
    agree, off, offsetting = judge_components(trace, predicted)
    comps = tuple(Component(name=k, trace_ms=t, predicted_ms=predicted[k], off=k in off) for k, t in trace.items())
    return StepPrediction(trace_ms=sum(trace.values()), predicted_ms=sum(predicted.values()), agree=agree,
                          components=comps, offsetting=offsetting, denominator=denominator)


def step_prediction(a: RunArtifacts, basis: StepBasis) -> StepPrediction | None:
    """The batch-1 step as the micro-benchmarks predict it, beside the trace's, by component;
    None without both predictions or a step basis."""
    from stepscope.report.analysis import category_ms, gemm_prediction_ms
    from stepscope.report.load import SCALED_WITH_BATCH

    dec, cp = a.decode_categories, a.comm_prediction
    gemm_p = gemm_prediction_ms(a, 1)
    comm_p = num(cp.comm_us_per_decode_step) if cp is not None else None
    if dec is None or gemm_p is None or comm_p is None or not basis.step_ms:
        return None
    gemm, comm = category_ms(dec, GEMM_CATEGORIES) or 0.0, category_ms(dec, COMMUNICATION_CATEGORIES) or 0.0
    attention = category_ms(dec, frozenset(SCALED_WITH_BATCH)) or 0.0
    cm = a.trace_summary.collectives_matched if a.trace_summary is not None else None
    matched = num(cm.transfer_ms_per_step) if cm is not None else None  # unmatched: all of it counts as transfer
    transfer = comm if matched is None else min(matched, comm)
    trace = {"GEMM": gemm, "collective transfer": transfer, "collective wait": comm - transfer,
             "attention": attention, "rest": basis.step_ms - gemm - comm - attention}
    predicted = {**trace, "GEMM": gemm_p, "collective transfer": comm_p / 1e3, "collective wait": 0.0}
    return component_check(trace, predicted, basis.denominator)


def roofline(a: RunArtifacts, basis: StepBasis | None = None,
             levers: tuple[Lever, ...] = ()) -> tuple[RooflineFinding, ...]:
    """GEMM-like rows of stage 05's on-trace roofline, with the device they were judged against
    and, where a peak is known, what kernels at the roofline would buy (`at_peak_ms`)."""
    rf = _plain(a.trace_summary.roofline) if a.trace_summary is not None else None
    if not rf:
        return ()
    dev = rf.get("device") if isinstance(rf.get("device"), dict) else {}
    known = bool(dev.get("known")) and (num(dev.get("peak_mem_bw_gbps")) is not None
                                        or num(dev.get("peak_tflops")) is not None)
    out = []
    for r in rf.get("rows") or []:
        if not isinstance(r, dict) or r.get("category") not in GEMM_CATEGORIES:
            continue
        finding = RooflineFinding(
            category=str(r["category"]), time_ms_per_step=num(r.get("time_ms_per_step")),
            achieved_gbps=num(r.get("achieved_gbps")), pct_peak_bw=num(r.get("pct_peak_bw")) if known else None,
            achieved_tflops=num(r.get("achieved_tflops")),
            pct_peak_flops=num(r.get("pct_peak_flops")) if known else None,
            device=_known(dev.get("name")), peak_known=known, micro_gbps=num(r.get("micro_gbps")),
            micro_vs_trace=num(r.get("micro_vs_trace")))
        out.append(_at_peak(finding, basis, next((lv for lv in levers if lv.category == finding.category), None)))
    return tuple(out)


def _at_peak(r: RooflineFinding, basis: StepBasis | None, lever: Lever | None) -> RooflineFinding:
    """`r` with the roofline's time and the Amdahl ceiling of reaching it, where both are known."""
    pcts = [p for p in (r.pct_peak_bw, r.pct_peak_flops) if p is not None]
    if not pcts or r.time_ms_per_step is None or basis is None or not basis.step_ms or lever is None:
        return r
    at_peak = r.time_ms_per_step * max(pcts) / 100
    cut = min(lever.exposed_ms, max(r.time_ms_per_step - at_peak, 0.0))
    return replace(r, at_peak_ms=at_peak, at_peak_ceiling_x=ceiling_x(basis.step_ms, cut), step_ms=basis.step_ms,
                   denominator=basis.denominator)


def plateau(macro: dict[str, Any] | None) -> Plateau | None:
    """The knee and plateau as stage 01 found them; without a knee, no plateau is claimed."""
    if not macro or (macro.get("knee_concurrency") is None and macro.get("best_output_tok_s") is None):
        return None
    gain = num(macro.get("knee_gain"))
    knee = _int(macro.get("knee_concurrency"))
    stall = num(macro.get("plateau_stall_share"))
    stalled = stall is not None and stall > STALLED_LEVEL_SHARE
    return Plateau(reached=knee is not None, knee_concurrency=knee,
                   plateau_tok_s=num(macro.get("plateau_output_tok_s")) if knee is not None else None,
                   best_tok_s=num(macro.get("best_output_tok_s")),
                   best_concurrency=_int(macro.get("best_concurrency")),
                   knee_gain_pct=100 * gain if gain is not None else None,
                   stall_pct=100 * stall if stalled else None,
                   stall_concurrency=_int(macro.get("plateau_stall_concurrency")) if stalled else None)


def _load_growth(a: RunArtifacts, macro: dict[str, Any] | None) -> LoadGrowth | None:
    return load_growth(a, _int((macro or {}).get("knee_concurrency")))


def verdict(a: RunArtifacts, totals: dict[str, Any], decode: pd.DataFrame | None,
            amdahl: pd.DataFrame | None, mvt: pd.DataFrame | None,
            macro: dict[str, Any] | None = None) -> Verdict:
    """Every finding of the report, typed, before `report.guards.guarded` withdraws what a failing
    invariant does not support (the guards read these findings, so they sit above this module)."""
    ident = trace_identity(a)
    basis = step_basis(a)
    comm = communication(decode, amdahl)
    category_levers, between = levers(amdahl, basis, a), between_steps(totals, ident, a)
    gaps = gap_levers(a, basis, cpu=totals.get("mode") == "cpu")
    return Verdict(identity=ident, basis=basis, spec_decode=spec_decode_seen(a, basis),
                   dominant=dominant(decode, basis, ident), communication=comm,
                   comm_split=comm_split(a, ident, comm), boundness=boundness(a, totals, basis, ident),
                   overlap=overlap(totals), tpot_gap=tpot_gap(totals, ident), levers=category_levers,
                   between_steps=between, gap_levers=gaps, biggest=biggest(category_levers, between, gaps),
                   agreements=agreements(mvt), roofline=roofline(a, basis, category_levers), roofline_reason=_roofline_reason(a),
                   step_prediction=step_prediction(a, basis),
                   plateau=plateau(macro), load_growth=_load_growth(a, macro),
                   kinds_apart=kinds_apart(kind_table(a.run_dir, a.decode.rank), judged_kind(a) or ident.kind))


BETWEEN_STEPS_LEVER = "time between steps"
GAP_LEVER_NAMES = {"short gaps": "short gaps inside the step", "long gaps": "long gaps inside the step"}
"""The names the biggest lever goes by when it is idle time, not a category."""


def gap_levers(a: RunArtifacts, basis: StepBasis, cpu: bool = False) -> tuple[GapLever, ...]:
    """Stage 05's per-step short (micro) and long (macro) idle inside the step, as levers."""
    d = _plain(a.decode)
    step = basis.step_ms
    out = []
    for kind, key in (("short gaps", "idle_micro_ms"), ("long gaps", "idle_macro_ms")):
        idle = num(d.get(key))
        if step and idle is not None and 0 < idle < step:
            out.append(GapLever(kind=kind, idle_ms=idle, step_ms=step, denominator=basis.denominator,
                                ceiling_x=ceiling_x(step, idle), cpu=cpu))
    return tuple(out)


def biggest(category_levers: tuple[Lever, ...], between: BetweenSteps | None,
            gaps: tuple[GapLever, ...]) -> BiggestLever | None:
    """The lever with the highest ceiling; a category wins a tie (it is the one a fix names)."""
    found = [BiggestLever(lv.category, lv.ceiling_x, "category") for lv in category_levers[:1]]
    if between is not None:
        found.append(BiggestLever(BETWEEN_STEPS_LEVER, between.ceiling_x, "between steps"))
    found += [BiggestLever(GAP_LEVER_NAMES[g.kind], g.ceiling_x, g.kind) for g in gaps]
    return max(found, key=lambda b: (b.ceiling_x, b.kind == "category")) if found else None


def _roofline_reason(a: RunArtifacts) -> str | None:
    rf = a.trace_summary.roofline if a.trace_summary is not None else None
    return _known(rf.reason) if rf is not None else None


# --------------------------------------------------------------------------- caveats and the headline


VERDICT_CAVEATS = ("not_analysed", "host_only", "not_decode", "claims_withdrawn", "ranks_missing", "low_confidence",
                   "tpot_gap", "offsetting_agreement", "prediction_disagrees", "overlap", "plateau_stalls",
                   "spec_decode")
"""The verdict's own caveats, in the order they matter; the headline says the first that applies."""


@dataclass(frozen=True)
class Headline:
    """What the report's "In short" and the terminal's closing lines say, and nothing more: the
    dominant cost, the biggest lever (its own finding, with the ceiling) and one caveat."""

    dominant: Dominant | None
    lever: Lever | BetweenSteps | GapLever | None
    caveat: Caveat | None
    lever_buys_little: bool = False
    """The lever's ceiling is under LEVER_MIN_X: said as no lever worth naming."""
    idle: Boundness | None = None
    """The boundness finding, when the device idles over HEADLINE_IDLE_SHARE of the step and the
    lever is no gap (which would say where the idle goes)."""
    host_gap: Boundness | None = None
    """The boundness finding when it is `host gap`: the headline then says the step is host-bound
    and where the host was, in place of a category lever (no kernel fix reaches that idle)."""


def caveats(v: Verdict, a: RunArtifacts | None = None) -> tuple[Caveat, ...]:
    """Every caveat, the one that changes a decision most first: the verdict's own, then the artifacts'
    flags and failed checks (`report.analysis.artifact_caveats`)."""
    from stepscope.report.analysis import artifact_caveats

    return _verdict_caveats(v) + (artifact_caveats(a, v.identity.step_label) if a is not None else ())


def _verdict_caveats(v: Verdict) -> tuple[Caveat, ...]:
    i = v.identity
    if not i.analysed:  # nothing else can apply to a trace nobody read
        return (Caveat("not_analysed", "trace", "identity"),)
    # A GPU job's host-only export first: every time in it is the host's.
    failed = [g for g in v.failed_guards if g.invariant != "device_work_recorded"]
    found = [Caveat("host_only", "trace", "guards", g.invariant) for g in v.failed_guards if g not in failed]
    found += [Caveat("not_decode", "trace", "identity")] if not i.has_decode else []
    found += [Caveat("claims_withdrawn", "trace", "guards", g.invariant) for g in failed][:1]
    found += [Caveat("ranks_missing", "trace", "identity")] if i.ranks_missing else []
    found += [Caveat("low_confidence", "trace", "identity")] if i.low_confidence and i.n_judged_steps is not None else []
    found += [Caveat("tpot_gap", "capture", "tpot_gap")] if v.tpot_gap is not None else []
    sp = v.step_prediction
    found += [Caveat("offsetting_agreement", "micro", "step_prediction")] if sp is not None and sp.offsetting else []
    found += [Caveat("prediction_disagrees", "micro", "agreements", g.quantity) for g in v.agreements if not g.agree][:1]
    found += [Caveat("overlap", "trace", "overlap")] if v.overlap is not None else []
    found += [Caveat("plateau_stalls", "sweep", "plateau")] if v.plateau is not None and v.plateau.stall_pct is not None else []
    found += [Caveat("spec_decode", "trace", "spec_decode")] if v.spec_decode is not None else []
    return tuple(found)


def rests_on(v: Verdict, c: Caveat) -> Any:
    """The finding a caveat rests on: the verdict's field it names (the failed guard or the
    disagreeing agreement it names, of several); None for an artifact's flag or check."""
    if c.finding == "guards":
        return next((g for g in v.failed_guards if g.invariant == c.subject), None)
    if c.finding == "agreements":
        return next((g for g in v.agreements if g.quantity == c.subject and not g.agree), None)
    return getattr(v, c.finding) if c.finding is not None else None


def headline_findings(v: Verdict) -> Headline:
    """The headline's three findings; the biggest lever's is the one `biggest` chose, the
    caveat the first of the verdict's own."""
    kind = v.biggest.kind if v.biggest is not None else None
    lever: Lever | BetweenSteps | GapLever | None = None
    if kind == "category" and v.levers:
        lever = v.levers[0]
    elif kind == "between steps":
        lever = v.between_steps
    elif kind is not None:
        lever = next((g for g in v.gap_levers if g.kind == kind), None)
    found = [c for c in v.caveats if c.code in VERDICT_CAVEATS]
    b = v.boundness
    if b is not None and b.status == "host gap":
        # the host-bound sentence says what the stall guard's caveat would: the next caveat instead
        found = [c for c in found if not _says_stall(v, c)]
        return Headline(dominant=v.dominant, lever=None, caveat=found[0] if found else None, host_gap=b)
    return Headline(dominant=v.dominant, lever=lever, caveat=found[0] if found else None,
                    lever_buys_little=lever is not None and v.biggest.ceiling_x < LEVER_MIN_X,
                    # a gap or between-steps lever already says where the idle time goes
                    idle=(b if b is not None and b.idle_pct > 100 * HEADLINE_IDLE_SHARE
                          and not isinstance(lever, (BetweenSteps, GapLever)) else None))


def _says_stall(v: Verdict, c: Caveat) -> bool:
    """The steady-state guard's caveat that the step is mostly one host stall."""
    g = rests_on(v, c)
    return c.code == "claims_withdrawn" and c.subject == "steady_state" and g is not None and "levers" not in g.withdrawn


def finding_name(src: tuple[Any, ...]) -> str:
    """`caveat:<code>` for a caveat's sentence, else the finding's type in snake case: what
    verdict.json says each sentence came from."""
    cav = next((s for s in src if isinstance(s, Caveat)), None)
    if cav is not None:
        return f"caveat:{cav.code}"
    name = type(src[0]).__name__ if src else "none"
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")


def with_sentences(v: Verdict, headline: list, sentences: list) -> schema.VerdictFile:
    """`06_writeup/verdict.json`: the verdict itself, with the (findings, text) sentences
    `report.prose` wrote from it."""
    return schema.VerdictFile(**msgspec.structs.asdict(v),
                              headline=tuple(schema.VerdictSentence(finding=finding_name(s), text=t) for s, t in headline),
                              sentences=tuple(schema.VerdictSentence(finding=finding_name(s), text=t) for s, t in sentences))
