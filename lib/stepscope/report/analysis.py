"""The report's numbers: derived from the artifacts, never from a notebook.

Pure functions over `RunArtifacts` (or plain values) returning dicts and DataFrames: the
step readings, the category table, Amdahl ceilings, micro-vs-trace, macro headlines, the
reconciliation and the caveats. The verdict's judgements are typed findings in
`report.verdict`, written out by `report.prose`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from stepscope.palette import COMMUNICATION_CATEGORIES, GEMM_CATEGORIES
from stepscope.report.artifacts import (STAGE_TITLES, RunArtifacts, collective_counts, name_of, num, pick,
                                        words)
from stepscope.report.numbers import fmt_num as _fmt
from stepscope.thresholds import PREDICTION_TOLERANCE, TPOT_GAP_SHARE


# --------------------------------------------------------------------------- decode step


def decode_step_totals(a: RunArtifacts) -> dict[str, Any]:
    """Per-decode-step wall and kernel readings in ms, with what each is based on.

    `step_ms` is the basis for shares and Amdahl ceilings: the period (start of one step to
    the start of the next, what TPOT measures) when stage 05 gives it, else the span (first to
    last device event of a step), else the union, else the capture TPOT. `basis_reason` says
    why the period was not used.
    """
    d = a.decode
    # Stage 05 writes decode.steps = {kernel_sum_ms: {mean, median, p90}, ...}; flat keys are
    # read too. The mean is used: it is what Amdahl ceilings and shares are computed against.
    st = d.get("steps") if isinstance(d.get("steps"), dict) else {}

    def reading(*names: str) -> float | None:
        for src in (st, d):
            v = pick(src, *names)
            if isinstance(v, dict):
                v = pick(v, "mean", "median")
            if num(v) is not None:
                return num(v)
        return None

    out: dict[str, Any] = {
        "kernel_sum_ms": reading("kernel_sum_ms", "kernel_sum_ms_per_step"),
        "union_ms": reading("union_ms", "busy_ms", "union_ms_per_step"),
        "span_ms": reading("span_ms", "span_ms_per_step"),
        "annotation_ms": reading("annotation_ms"),
        "tpot_capture_ms": reading("tpot_capture_ms", "capture_tpot_ms"),
        "n_decode_steps": pick(st, "n_steps") or pick(d, "n_decode_steps", "n_steps"),
        "steps_used": pick(st, "steps_used"),
        "source": "05_categorize/summary.json",
        "mode": "gpu",
    }
    ranks = (a.trace_summary or {}).get("ranks") or []
    if ranks and isinstance(ranks[0], dict) and ranks[0].get("mode"):
        out["mode"] = str(ranks[0]["mode"])
    steps = a.steps
    if steps is not None and (out["span_ms"] is None or out["union_ms"] is None):
        dec = steps
        kind = "label" if "label" in dec else ("kind" if "kind" in dec else None)
        if kind:
            dec = dec[dec[kind].astype(str) == "decode"]
        if "rank" in dec and len(dec):
            dec = dec[dec["rank"] == dec["rank"].min()]
        for key, col in (("span_ms", "span_us"), ("union_ms", "busy_us"), ("kernel_sum_ms", "kernel_sum_us")):
            if out[key] is None and col in dec and len(dec):
                out[key] = float(dec[col].mean()) / 1000.0
        if out["n_decode_steps"] is None and len(dec):
            out["n_decode_steps"] = int(len(dec))
    if out["kernel_sum_ms"] is None and a.decode_categories is not None:
        out["kernel_sum_ms"] = float(a.decode_categories["ms_per_step_mean"].sum())
    if out["tpot_capture_ms"] is None and a.capture_latency:
        out["tpot_capture_ms"] = num(pick(a.capture_latency, "tpot_ms_mean", "tpot_ms_median"))
    if out["n_decode_steps"] is None and a.trace_summary:
        ranks = a.trace_summary.get("ranks") or []
        if ranks:
            out["n_decode_steps"] = ranks[0].get("n_decode_steps")
    span, union = out["span_ms"], out["union_ms"]
    period = d.get("period_ms") if isinstance(d.get("period_ms"), dict) else {}
    out["period_ms"] = num(pick(period, "mean", "median"))
    out["period_n"] = period.get("n")
    use_period = out["period_ms"] is not None and d.get("denominator", "period") == "period"
    out["idle_ms"] = span - union if span is not None and union is not None else None
    if use_period:
        out["step_ms"], out["step_basis"], out["basis_reason"] = out["period_ms"], "period", None
    else:
        out["step_ms"] = span or union or out["tpot_capture_ms"]
        out["step_basis"] = "span" if span else ("union" if union else ("capture TPOT" if out["step_ms"] else None))
        out["basis_reason"] = (words(d.get("denominator_reason")) or
                               ("stage 05 gave no step period" if out["period_ms"] is None else
                                f"stage 05 chose the {d.get('denominator')}"))
    return out


def decode_category_table(a: RunArtifacts, totals: dict[str, Any]) -> pd.DataFrame | None:
    """Per category: ms per step (mean, median, p90), % of step, calls per step, µs per call."""
    df = a.decode_categories
    if df is None or "category" not in df or "ms_per_step_mean" not in df:
        return None
    df = df.copy()
    step = totals.get("step_ms")
    if step:
        # Always against the report's basis: stage 05's share_of_span divides by the span.
        df["share_of_step"] = df["ms_per_step_mean"] / step
    if "us_per_call" not in df and "calls_per_step" in df:
        df["us_per_call"] = 1000.0 * df["ms_per_step_mean"] / df["calls_per_step"].replace(0, np.nan)
    df = df.sort_values("ms_per_step_mean", ascending=False, kind="stable").reset_index(drop=True)
    return df


def amdahl_ceilings(a: RunArtifacts, totals: dict[str, Any]) -> pd.DataFrame | None:
    """Per category: exposed ms per step and the step speed-up if it were removed.

    max_speedup = step / (step - exposed), on the report's step basis (the period when
    known). Stage 05's ceiling is used only when the basis is unknown.
    """
    df = a.amdahl
    if df is None or "category" not in df or "exposed_ms_per_step" not in df:
        return None
    df = df[["category", "exposed_ms_per_step"] + (["max_speedup"] if "max_speedup" in df else [])].copy()
    step = totals.get("step_ms")
    if step:
        remaining = step - df["exposed_ms_per_step"].astype(float)
        df["max_speedup"] = np.where(remaining > 0, step / remaining.where(remaining > 0, np.nan), np.inf)
    elif "max_speedup" not in df:
        return None
    df = df.sort_values("max_speedup", ascending=False, kind="stable").reset_index(drop=True)
    return df


def _device(totals: dict[str, Any]) -> str:
    return "CPU worker" if totals.get("mode") == "cpu" else "device"


def reconciliation(totals: dict[str, Any]) -> list[str]:
    """Sentences relating kernel sum, union, span and capture TPOT (all per decode step)."""
    s, u, sp, tpot = (totals.get(k) for k in ("kernel_sum_ms", "union_ms", "span_ms", "tpot_capture_ms"))
    out: list[str] = []
    if s is not None and u is not None and u > 0:
        overlap = s - u
        if overlap > 0.005 * u:
            out.append(f"Kernels overlap: the summed kernel time ({_fmt(s)} ms) exceeds the time the device "
                       f"was busy ({_fmt(u)} ms) by {_fmt(overlap)} ms ({_fmt(100 * overlap / u, 2)} %), "
                       f"so adding up kernel durations overstates the step.")
        else:
            out.append(f"Kernels barely overlap: summed kernel time ({_fmt(s)} ms) and busy time "
                       f"({_fmt(u)} ms) agree.")
    if u is not None and sp is not None and sp > 0:
        idle = sp - u
        gaps = ("gaps between ops where the worker runs Python, scheduling or synchronisation instead of "
                "counted work" if totals.get("mode") == "cpu" else
                "gaps between kernels where the device waits for the host to launch work or for data")
        out.append(f"Within a step's span of {_fmt(sp)} ms the {_device(totals)} is busy {_fmt(u)} ms and idle "
                   f"{_fmt(idle)} ms ({_fmt(100 * idle / sp, 2)} % of the span): {gaps}.")
    period = totals.get("period_ms")
    if period is not None and sp is not None and period > 0:
        n = totals.get("period_n")
        out.append(f"Consecutive steps start {_fmt(period)} ms apart (the period, mean"
                   + (f" over {_fmt(n)} intervals" if n else "") + f"), against a span of {_fmt(sp)} ms: "
                   f"{_fmt(max(period - sp, 0.0))} ms per step pass with no device work of the step. Shares and "
                   f"Amdahl ceilings divide by the period, because it is what TPOT measures.")
    if tpot is not None and sp is not None and tpot > 0:
        gap = tpot - sp
        if abs(gap) <= TPOT_GAP_SHARE * tpot:
            out.append(f"The TPOT measured by the client during capture ({_fmt(tpot)} ms) matches the span "
                       f"({_fmt(sp)} ms) within {_fmt(100 * abs(gap) / tpot, 2)} %: the device steps account "
                       f"for the time per token.")
        elif gap > 0:
            out.append(f"The TPOT measured during capture ({_fmt(tpot)} ms) is {_fmt(gap)} ms above the span "
                       f"({_fmt(100 * gap / tpot, 2)} % of TPOT): that time is spent between device steps, "
                       f"in the scheduler, host-side sampling, detokenization or streaming.")
        else:
            out.append(f"The span per step ({_fmt(sp)} ms) exceeds the TPOT measured during capture "
                       f"({_fmt(tpot)} ms) by {_fmt(-gap)} ms: steps overlap in time (asynchronous "
                       f"scheduling) or the client's TPOT averages in faster tokens.")
    elif tpot is not None and s is not None:
        out.append(f"The capture's TPOT is {_fmt(tpot)} ms against {_fmt(s)} ms of summed kernel time per step; "
                   f"without a span the gap cannot be split into overlap and idle time.")
    return out


# --------------------------------------------------------------------------- cross-checks


def _category_ms(decode: pd.DataFrame | None, cats: frozenset[str]) -> float | None:
    if decode is None:
        return None
    sub = decode[decode["category"].isin(cats)]
    return float(sub["ms_per_step_mean"].sum()) if len(sub) else None


def _gemm_prediction_ms(a: RunArtifacts, m: int = 1) -> float | None:
    by_m = (a.gemm_prediction or {}).get("gemm_us_per_decode_step")
    if not isinstance(by_m, dict):
        return None
    v = num(by_m.get(str(m), by_m.get(m)))
    return v / 1000.0 if v is not None else None


def micro_vs_trace(a: RunArtifacts) -> pd.DataFrame | None:
    """Trace GEMM and communication time per decode step against the micro predictions."""
    rows = []
    dec = a.decode_categories
    pred_gemm = _gemm_prediction_ms(a, 1)
    trace_gemm = _category_ms(dec, GEMM_CATEGORIES)
    if pred_gemm is not None or trace_gemm is not None:
        gp = a.gemm_prediction or {}
        cfg = gp.get("config") if isinstance(gp.get("config"), dict) else {}
        how = (" ".join(str(cfg[k]) for k in ("backend", "dtype", "mode") if cfg.get(k))
               or str(gp.get("method", "n/a")))
        rows.append({"quantity": "GEMM time per decode step (batch 1)", "trace_ms_per_step": trace_gemm,
                     "micro_predicted_ms_per_step": pred_gemm,
                     "prediction_method": how if len(how) <= 80 else how[:77] + "…"})
    cp = a.comm_prediction or {}
    pred_comm = num(cp.get("comm_us_per_decode_step"))
    trace_comm = _category_ms(dec, COMMUNICATION_CATEGORIES)
    if pred_comm is not None or trace_comm is not None:
        how = (f"{cp.get('k', '?')} × {_fmt(num(cp.get('per_op_us')))} µs, {cp.get('size_bytes', '?')} B, "
               f"{cp.get('backend', '?')} {cp.get('mode', '?')}") if cp else "n/a"
        rows.append({"quantity": "communication time per decode step", "trace_ms_per_step": trace_comm,
                     "micro_predicted_ms_per_step": pred_comm / 1000.0 if pred_comm is not None else None,
                     "prediction_method": how})
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
    s = a.sweep_summary or {}
    lv = a.levels
    out = {"knee_concurrency": pick(s, "knee_concurrency"), "plateau_output_tok_s": num(pick(s, "plateau_output_tok_s")),
           "c1_ttft_ms_median": num(pick(s, "c1_ttft_ms_median")),
           "c1_tpot_ms_median": num(pick(s, "c1_tpot_ms_median")), "died_at_level": pick(s, "died_at_level"),
           "knee_gain": num(pick(s, "knee_gain", default=0.10)),
           "client_bound_levels": [], "best_output_tok_s": None, "best_concurrency": None}
    if out["knee_concurrency"] is None:
        out["plateau_output_tok_s"] = None
    if lv is not None and "concurrency" in lv:
        c1 = lv[lv["concurrency"] == 1]
        if len(c1):
            if out["c1_ttft_ms_median"] is None and "ttft_ms_median" in c1:
                out["c1_ttft_ms_median"] = num(c1["ttft_ms_median"].iloc[0])
            if out["c1_tpot_ms_median"] is None and "tpot_ms_median" in c1:
                out["c1_tpot_ms_median"] = num(c1["tpot_ms_median"].iloc[0])
        closed = lv[lv["mode"] == "concurrency"] if "mode" in lv else lv
        if "output_throughput_tok_s" in closed and closed["output_throughput_tok_s"].notna().any():
            # The best measured level, never called a plateau: only stage 01's knee makes one.
            best = closed.loc[closed["output_throughput_tok_s"].astype(float).idxmax()]
            out["best_output_tok_s"] = num(best["output_throughput_tok_s"])
            out["best_concurrency"] = int(best["concurrency"]) if num(best["concurrency"]) is not None else None
        if "client_bound" in lv:
            cb = lv[lv["client_bound"].astype(str).str.lower().isin(["true", "1"])]
            out["client_bound_levels"] = [
                f"{r.get('mode', 'concurrency')} {r.get('concurrency') if pd.notna(r.get('concurrency')) else r.get('request_rate')}"
                + (f" (client CPU {_fmt(r['client_cpu_pct'])} %)" if pd.notna(r.get("client_cpu_pct")) else "")
                for _, r in cb.iterrows()]
    return out


# --------------------------------------------------------------------------- caveats


def caveats(a: RunArtifacts, macro: dict[str, Any], totals: dict[str, Any]) -> list[str]:
    """Data-quality caveats, each from a flag or a check on the artifacts."""
    out: list[str] = []
    ts = a.trace_summary or {}
    ranks = [r for r in ts.get("ranks") or [] if isinstance(r, dict)]
    if ranks:
        shares = [(num(r.get("other_share")), r) for r in ranks]
        shares = [(s, r) for s, r in shares if s is not None]
        if shares:
            worst, r = max(shares, key=lambda x: x[0])
            names = ", ".join(f"`{name_of(n)[:80]}`" for n in (r.get("other_top_names") or [])[:5]) \
                or "none listed"
            out.append(f"\"other\" holds at most {_fmt(100 * worst)} % of kernel time (rank {r.get('rank')}); "
                       f"its top names: {names}.")
        unattr = [(r.get("rank"), r.get("unattributed_events")) for r in ranks if r.get("unattributed_events")]
        if unattr:
            total = sum(int(n) for _, n in unattr)
            out.append(f"{total} device events were not attributed to any step "
                       f"(ranks {', '.join(str(r) for r, _ in unattr)}); they are left out of per-step figures.")
        else:
            out.append("Every device event was attributed to a step on every rank.")
        sources = sorted({str(r.get("step_source")) for r in ranks if r.get("step_source")})
        if sources:
            exact = all(s.startswith("annotation") for s in sources)
            out.append(f"Step boundaries come from: {', '.join(sources)}"
                       + (" (exact: the engine annotates each step)." if exact else
                          " — a fallback, so step counts and per-step figures are approximate."))
    cc = ts.get("collectives_check")
    if isinstance(cc, dict) and cc:
        match = cc.get("match")
        exp, obs = collective_counts(cc.get("expected")), collective_counts(cc.get("observed"))
        if match is None and exp and obs:
            match = all(obs.get(k) == v for k, v in exp.items())
        if match is False:
            out.append(f"Collectives per decode step do not match the architecture: expected "
                       f"{_kv(exp)}, observed {_kv(obs)}. {words(cc.get('explanation'))}".strip())
        elif not exp:
            out.append(f"Collectives per decode step were not checked against the architecture: "
                       f"{words(cc.get('explanation')) or 'no expectation given'}")
    for f in ts.get("flags") or []:
        if isinstance(f, dict) and f.get("message"):
            out.append(f"[05 {f.get('severity', 'info')}] {f.get('code', '')}: {f['message']}")
    for f in (a.sweep_summary or {}).get("flags") or []:
        msg = f.get("message") if isinstance(f, dict) else str(f)
        if msg:
            out.append(f"[01] {msg}")
    if macro.get("client_bound_levels"):
        out.append("The load generator may have been the bottleneck at "
                   + ", ".join(macro["client_bound_levels"]) + "; treat those levels' throughput as a lower bound.")
    if macro.get("died_at_level") is not None:
        msg = (a.sweep_summary or {}).get("died_message")
        out.append(f"The server died during the sweep at level {macro['died_at_level']}"
                   + (f" ({msg})" if msg else "") + "; later levels are absent.")
    n_fail = num((a.sweep_summary or {}).get("n_failures"))
    if n_fail:
        first = [f for f in (a.sweep_summary or {}).get("failures") or [] if isinstance(f, dict)][:3]
        ex = "; ".join(f"{f.get('level')}: {f.get('error') or f.get('http_status')}" for f in first)
        out.append(f"{int(n_fail)} sweep requests failed and are left out of the latency statistics"
                   + (f" (first: {ex})" if ex else "") + ".")
    cl = a.capture_latency or {}
    if num(cl.get("n_failed")):
        out.append(f"{int(num(cl['n_failed']))} of the capture's requests failed; its TPOT comes from the others.")
    man = a.manifest or {}
    if man.get("missing_ranks"):
        out.append(f"Ranks missing from the capture: {man['missing_ranks']}.")
    if (a.manifest or {}).get("partial"):
        out.append("The profiler capture is partial: not every rank's trace was complete (see the manifest).")
    for stage_id, title in STAGE_TITLES.items():
        if not a.stage_present(stage_id):
            status = ((a.run or {}).get("stages") or {}).get(stage_id) or {}
            why = status.get("status", "no artifacts")
            err = f": {status['error']}" if status.get("error") else ""
            out.append(f"Stage {stage_id} ({title}) was not measured ({why}{err}).")
        else:
            status = ((a.run or {}).get("stages") or {}).get(stage_id) or {}
            if status.get("status") == "failed":
                out.append(f"Stage {stage_id} ({title}) failed{': ' + str(status['error']) if status.get('error') else ''}; "
                           f"its artifacts may be incomplete.")
    for p in a.problems:
        out.append(f"Unreadable artifact: {p}")
    return out


def _kv(d: Any) -> str:
    if isinstance(d, dict):
        return ", ".join(f"{k} {_fmt(v) if isinstance(v, float) else v}" for k, v in d.items())
    return str(d)
