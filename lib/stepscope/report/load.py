"""The report's step under load: trace-predicted beside measured throughput at each captured
concurrency, the anatomy figure, the per-category fits, and why a prediction misses.

Reads stage 05's load anatomy and reconciliation and stage 01's levels through `RunArtifacts`,
and `01_macro_sweep/server_metrics.csv`; computes nothing stage 05 already wrote.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from stepscope import schema
from stepscope.report.appendix import appendix_link, appendix_table
from stepscope.report.artifacts import RunArtifacts
from stepscope.report.noise import make_delta
from stepscope.schema.verdict import LevelAnatomy, LoadGrowth
from stepscope.thresholds import LOAD_LEVER_SHIFT
from stepscope.trace.account import ceiling_x
from stepscope.trace.load_anatomy import EXPERTS_CATEGORY
from stepscope.trace.load_reconcile import unexplained_within
from stepscope.trace.micro_curve import KEPT_PARTS, SCALED_WITH_BATCH  # noqa: F401 (report.verdict reads it here)
from stepscope.wording import fmt_num, fmt_pct, md_code, md_text

SECTION_TITLE = "The step under load: anatomy against batch size"
RECONCILIATION_HEADING = "Each captured sweep level's wall time, part by part (stage 05)"
MICRO_CURVE_HEADING = "Micro-benchmarks against the whole sweep"
FITS_HEADING = "Growth with the batch per category (stage 05's fits of the load captures)"
"""The appendix's headings of this section's tables, which the report links by anchor."""



@dataclass(frozen=True)
class LoadComparison:
    """One captured concurrency: the trace's throughput beside the sweep's."""

    concurrency: int
    predicted_tok_s: float | None
    measured_tok_s: float | None
    capture_tok_s: float | None
    band_tok_s: float | None
    band_source: str
    agrees: bool | None
    decode_requests_mean: float | None
    mixed_share: float | None
    explanations: list[str] = field(default_factory=list)


def level_server_view(sm: pd.DataFrame | None, concurrency: int) -> dict:
    """The sweep level's /metrics at this concurrency: most requests waiting, most KV in use,
    preemptions over the level (`RunArtifacts.server_metrics`); empty when not scraped."""
    if sm is None or "level" not in sm:
        return {}
    g = sm[sm["level"] == f"c{concurrency:04d}"]
    if g.empty:
        return {}
    pre = g["preemptions_total"].dropna()
    return {"waiting_max": _max(g["requests_waiting"]), "running_max": _max(g["requests_running"]),
            "kv_cache_usage_max": _max(g["kv_cache_usage"]),
            "preemptions": float(pre.iloc[-1] - pre.iloc[0]) if len(pre) > 1 else None}


def _max(col: pd.Series) -> float | None:
    v = col.dropna()
    return float(v.max()) if len(v) else None


PART_WORDS = {"decode_steps": "decode steps", "prefill_mixed_steps": "prefill and mixed steps",
              "stalls": "server-wide stalls", "client_overhead": "no request waiting for a token (the client's own time)",
              "ramp_up": "ramp-up", "turnaround": "turnaround between requests", "drain": "drain",
              "unexplained": "unexplained"}
"""How the report names each part of a level's time (trace.load_reconcile.PART_ORDER)."""


def reconciliation_sentence(rec: schema.LoadReconciliationLevel, n: int = 3) -> str:
    """Where the level's time went, its largest measured parts first, then what is left
    unexplained when it does not add up, then its steps beside the trace's; every number from `rec`."""
    top = sorted(((k, v) for k, v in rec.parts.items() if k != "unexplained"), key=lambda kv: -kv[1])[:n]
    parts = ", ".join(f"{PART_WORDS.get(k, k)} {fmt_num(v)} s ({fmt_pct(v / rec.level_s)})" for k, v in top)
    left = rec.parts.get("unexplained", 0.0)
    tail = ("" if unexplained_within(left, rec.level_s) else
            f"; {'+' if left > 0 else ''}{fmt_num(left)} s ({fmt_pct(rec.unexplained_share, signed=True)}) is left unexplained")
    return f"of the sweep level's {fmt_num(rec.level_s)} s, the largest parts were {parts}{tail}{steps_clause(rec)}{trace_clause(rec)}"


def steps_clause(rec: schema.LoadReconciliationLevel) -> str:
    """The engine's own iteration count against the steps the level's streams showed, said where
    they differ beyond the tolerance (the steps' parts then miss or split steps)."""
    if rec.steps_agree is not False:
        return ""
    return (f"; vLLM counted {fmt_num(rec.engine_iterations)} iterations where the level's streams showed "
            f"{fmt_num(rec.steps_found)} steps, so the steps' parts are not the engine's")


def trace_clause(rec: schema.LoadReconciliationLevel) -> str:
    """The level's steps beside its trace's: the level's tokens priced at the trace's steps against
    the steps' two parts, and why they differ (each kind's period, the prefills a step holds)."""
    if rec.traced_steps_s is None:
        return ""
    took = rec.parts.get("decode_steps", 0.0) + rec.parts.get("prefill_mixed_steps", 0.0)
    why = []
    if rec.level_decode_period_ms and rec.decode_period_ms:
        prof = (f", whose profiler cost {fmt_num(rec.profiler_cost_ms_per_step)} ms a step at batch 1"
                if rec.profiler_cost_ms_per_step else "")
        why.append(f"a decode step took {fmt_num(rec.level_decode_period_ms)} ms in the level and "
                   f"{fmt_num(rec.decode_period_ms)} ms in the trace{prof}")
    if (rec.level_prefills_per_step and rec.prefills_per_step and not rec.prefill_steps_borrowed
            and fmt_num(rec.level_prefills_per_step) != fmt_num(rec.prefills_per_step)):
        why.append(f"a prefill or mixed step held {fmt_num(rec.level_prefills_per_step)} prefills in the level and "
                   f"{fmt_num(rec.prefills_per_step)} in the trace")
    return (f"; priced at the trace's steps its tokens take {fmt_num(rec.traced_steps_s)} s of steps against the "
            f"{fmt_num(took)} s they took" + (f" ({'; '.join(why)})" if why else ""))


def explain(lv: schema.LoadLevel, server: dict, client_bound: bool | None,
            rec: schema.LoadReconciliationLevel | None = None) -> list[str]:
    """Why the trace's throughput and the sweep's may differ, from what the data show: first the
    level's time part by part (`load_reconciliation.json`), when stage 05 wrote it; then what the
    server and the client flagged. The mixed steps and the capture's own client are the table's
    columns: said in words only where no reconciliation counts the prefill's time."""
    out = [reconciliation_sentence(rec)] if rec is not None else []
    if rec is None and lv.n_steps and lv.n_mixed_steps:
        out.append(f"{lv.n_mixed_steps} of the window's {lv.n_steps} steps were mixed (prefill chunks "
                   "beside decodes): a request that ends is replaced, and its prefill shares a step")
    if lv.decode_requests_mean is not None and lv.decode_requests_mean < 0.9 * lv.concurrency:
        out.append(f"the steps decoded {fmt_num(lv.decode_requests_mean)} requests on average, fewer than the "
                   f"{lv.concurrency} in flight")
    if server.get("waiting_max"):
        out.append(f"requests queued at the scheduler during the sweep level (up to {server['waiting_max']:g} waiting)")
    if server.get("preemptions"):
        out.append(f"{server['preemptions']:g} preemptions during the sweep level (KV cache full)")
    if client_bound:
        out.append("the sweep's client used most of a core at this level: it may have been the bottleneck")
    if rec is None and lv.capture_output_tok_s is not None and lv.measured_output_tok_s:
        out.append(f"the capture's own client saw {fmt_num(lv.capture_output_tok_s)} tok/s over the profiled window, "
                   "under the profiler's overhead")
    return out


def compare_levels(a: RunArtifacts) -> list[LoadComparison]:
    """Each captured level's trace-predicted tok/s beside the sweep's, judged within the noise band
    (`report.noise.make_delta`: one run per side, so the fixed relative band); [] without load captures."""
    summary, levels, rec = a.load_summary, a.levels, a.load_reconciliation
    if summary is None:
        return []
    bound = {}
    if levels is not None and {"concurrency", "client_bound"} <= set(levels.columns):
        bound = {int(c): bool(b) for c, b in zip(levels["concurrency"].fillna(0), levels["client_bound"].fillna(False))}
    recs = {r.concurrency: r for r in (rec.levels if rec is not None else [])}
    out = []
    for lv in summary.levels:
        d = make_delta("trace", "output tok/s", f"c={lv.concurrency}",
                       [lv.measured_output_tok_s] if lv.measured_output_tok_s is not None else [],
                       [lv.predicted_output_tok_s] if lv.predicted_output_tok_s is not None else [], True)
        agrees = None if d.delta is None else not d.real
        why = [] if agrees in (True, None) else explain(lv, level_server_view(a.server_metrics, lv.concurrency),
                                                         bound.get(lv.concurrency), recs.get(lv.concurrency))
        out.append(LoadComparison(lv.concurrency, lv.predicted_output_tok_s, lv.measured_output_tok_s,
                                  lv.capture_output_tok_s, d.band, d.band_source, agrees, lv.decode_requests_mean,
                                  lv.n_mixed_steps / lv.n_steps if lv.n_steps else None, why))
    return out


def fastest_sentence(summary: schema.LoadAnatomySummary, experts: bool = True, lead: bool = True) -> str:
    """`fastest_paragraphs` as one paragraph."""
    return " ".join(fastest_paragraphs(summary, experts, lead))


def fastest_paragraphs(summary: schema.LoadAnatomySummary, experts: bool = True, lead: bool = True) -> list[str]:
    """The fit's reading in one sentence (with `lead`), rendered from the typed fits (a collective
    by its transfer: its wait is rank skew), then what each collective's wait and (with `experts`)
    the routed experts did: one paragraph each, so no paragraph runs long."""
    fits = {f.category: f for f in summary.fits if f.measure != "wait"}
    cat = summary.fastest_category
    if not lead:
        text = ""
    elif cat is None or cat not in fits:
        text = ("No category's ms per decode step grows with the batch beyond twice its slope's standard "
                "error over the captured levels.")
    else:
        f = fits[cat]
        what = " (its transfer, last arrival to completion)" if f.measure == "transfer" else ""
        text = (f"**{md_text(cat)}**{what} grows fastest with the batch: {fmt_num(f.slope_ms_per_request)} ± "
                f"{fmt_num(f.slope_se_ms)} ms per decode request (least squares over {f.n_steps} decode steps at "
                f"{f.n_batches} batch sizes), {fmt_num(f.ms_at_batch_min)} ms per step at batch {f.batch_min} and "
                f"{fmt_num(f.ms_at_batch_max)} ms at batch {f.batch_max}.")
    return [t for t in [text, *skew_sentences(summary),
                        *([experts_sentence(summary.experts)] if summary.experts and experts else [])] if t]


def skew_sentences(summary: schema.LoadAnatomySummary) -> list[str]:
    """A collective whose wait grows while its transfer does not: rank skew, said as such."""
    out = []
    transfer = {f.category: f for f in summary.fits if f.measure == "transfer"}
    for w in (f for f in summary.fits if f.measure == "wait"):
        t = transfer.get(w.category)
        if t is None or not _grows(w):
            continue
        out.append(f"{md_text(w.category)}'s wait for the other ranks goes from {fmt_num(w.ms_at_batch_min)} to "
                   f"{fmt_num(w.ms_at_batch_max)} ms per step (batch {w.batch_min} to {w.batch_max}) while its transfer "
                   f"goes from {fmt_num(t.ms_at_batch_min)} to {fmt_num(t.ms_at_batch_max)} ms: that is rank skew (the ranks "
                   "arriving apart), not the collective growing.")
    return out


def _grows(f: schema.LoadFit) -> bool:
    from stepscope.thresholds import LOAD_SLOPE_SIGMAS

    return (f.slope_ms_per_request is not None and f.slope_se_ms is not None and f.slope_ms_per_request > 0
            and f.slope_ms_per_request > LOAD_SLOPE_SIGMAS * f.slope_se_ms)


def experts_sentence(e: schema.ExpertGrowth) -> str:
    """The routed experts beside D(M): the cost per layer per distinct expert at each level."""
    per = "; ".join(f"c={lv.concurrency}: D(M) {fmt_num(lv.expert_layers / e.n_moe_layers)} per layer, "
                    f"{fmt_num(lv.ms_mean)} ms, {_pm(lv.us_per_expert_layer, lv.us_per_expert_layer_se)} µs"
                    for lv in e.by_level)
    verdict = {True: "the same at every level within its spread: the experts' time follows the distinct "
                     "experts touched, D(M), not the tokens",
               False: "not the same at every level within its spread: the experts' time does not follow "
                      "D(M) alone (more rows per expert, or a noisy level)",
               None: "too few levels with a spread to say whether it follows D(M)"}[e.follows_distinct_experts]
    slope = _pm(None if e.slope_ms_per_expert_layer is None else 1e3 * e.slope_ms_per_expert_layer,
                None if e.slope_se_ms is None else 1e3 * e.slope_se_ms)
    return (f"The routed experts (**{md_text(e.category)}**, {e.n_routed_experts} experts, top-{e.top_k}, "
            f"{e.n_moe_layers} MoE layers) per decode step against D(M) = E·(1 − (1 − k/E)^M) distinct experts "
            f"per layer: {per} per layer per distinct expert; least squares on D(M)·layers gives {slope} µs "
            f"per layer per distinct expert. The cost per distinct expert is {verdict}.")


def _pm(v: float | None, se: float | None) -> str:
    if v is None:
        return "–"
    return fmt_num(v) if se is None else f"{fmt_num(v)} ± {fmt_num(se)}"


def _comparison_table(rows: list[LoadComparison]) -> str:
    from stepscope.report.markdown_util import md_table

    df = pd.DataFrame([{"concurrency": r.concurrency, "decode_requests_mean": r.decode_requests_mean,
                        "mixed_share": r.mixed_share, "predicted": r.predicted_tok_s, "measured": r.measured_tok_s,
                        "capture": r.capture_tok_s, "band": r.band_tok_s,
                        "agrees": {True: "yes", False: "**no**", None: "–"}[r.agrees]} for r in rows])
    return md_table(df, [("concurrency", "concurrency"), ("decode_requests_mean", "decode requests per step (mean)"),
                         ("mixed_share", "mixed steps (share)"), ("predicted", "trace: tokens / period (tok/s)"),
                         ("measured", "sweep: measured (tok/s)"), ("capture", "capture client, window (tok/s)"),
                         ("band", "noise band (± tok/s)"), ("agrees", "within the band")], md_columns=("agrees",))


def fits_table(summary: schema.LoadAnatomySummary | None) -> str:
    """Each category's least-squares growth with the batch (stage 05's fits), for the appendix; ''
    without load captures."""
    from stepscope.report.markdown_util import compact_table

    if summary is None:
        return ""
    df = pd.DataFrame([{"category": f.category if f.measure == "union" else f"{f.category} ({f.measure})",
                        "slope": f.slope_ms_per_request, "se": f.slope_se_ms,
                        "a": f.intercept_ms, "lo": f.ms_at_batch_min, "hi": f.ms_at_batch_max,
                        "batches": f"{f.batch_min}–{f.batch_max}"} for f in summary.fits])
    if df.empty:
        return ""
    return compact_table(df, [("category", "category"), ("slope", "slope (ms per decode request)"),
                              ("se", "± standard error"), ("a", "intercept (ms)"), ("lo", "ms at smallest batch"),
                              ("hi", "ms at largest batch"), ("batches", "batch sizes")], keys=("category",))


def reconciliation_section(rec: schema.LoadReconciliation | None) -> str:
    """Each captured level's time, part by part (seconds), as a table with its method."""
    from stepscope.report.markdown_util import compact_table

    if rec is None or not rec.levels:
        return ""
    names = list(dict.fromkeys(k for lv in rec.levels for k in lv.parts))
    df = pd.DataFrame([{"concurrency": lv.concurrency, "level_s": lv.level_s, **lv.parts,
                        "adds_up": "yes" if lv.adds_up else "**no**",
                        "iterations": f"{fmt_num(lv.engine_iterations)} / {fmt_num(lv.steps_found)}",
                        "decode_ms": f"{fmt_num(lv.level_decode_period_ms)} / {fmt_num(lv.decode_period_ms)}",
                        "mix": f"{fmt_num(lv.level_prefills_per_step)} / {fmt_num(lv.prefills_per_step)}",
                        "traced_steps_s": lv.traced_steps_s} for lv in rec.levels])
    cols = [("concurrency", "concurrency"), ("level_s", "level (s)"),
            *[(k, f"{PART_WORDS.get(k, k)} (s)") for k in names], ("adds_up", f"within {fmt_pct(rec.tolerance_share)}"),
            ("iterations", "steps: vLLM's / the streams'"), ("decode_ms", "decode step (ms): level / trace"),
            ("mix", "prefills per prefill step: level / trace"), ("traced_steps_s", "steps priced at the trace (s)")]
    borrowed = [lv.concurrency for lv in rec.levels if lv.prefill_steps_borrowed]
    note = (f"\n*c={', '.join(map(str, borrowed))}: the capture window held no prefill or mixed step; the "
            "prefill's cost is another captured level's (its prefill steps' period less its decode steps').*\n"
            if borrowed else "")
    return ("\n" + appendix_table(RECONCILIATION_HEADING, "Where each captured sweep level's wall time went (`load_reconciliation.json`): the level's "
            "own steps, as its streams saw them (one step's chunks arrive together, one per request), each owning "
            "the time since the step before it; ramp-up, turnaround and drain are time with fewer requests "
            "waiting than the concurrency. The engine's own iteration count checks the steps found. Beside them, "
            "the trace's: its decode period, the prefills its prefill steps held, and the level's tokens priced at "
            "its steps.\n\n"
            + compact_table(df, cols, keys=("concurrency",), formats={k: fmt_num for k in ["level_s", "traced_steps_s", *names]},
                            md_columns=("adds_up",)) + note))


def section_load(a: RunArtifacts, figure_md: str | None = None, growth: "LoadGrowth | None" = None,
                 micro: list[schema.MicroCurveLevel] | None = None) -> str:
    """The report's section on the step under load; '' when stage 05 captured no load level."""
    summary = a.load_summary
    if summary is None or a.load_anatomy is None:
        return ""
    rows = compare_levels(a)
    text = f"## {SECTION_TITLE}\n\n"
    text += ("At each captured concurrency (`capture.concurrency`), the trace's throughput (its decode and mixed "
             "steps' tokens over their summed periods) beside the sweep's (the client's, over a whole level); "
             "method: `docs/methods.md`, \"The step under load\".\n\n")
    text += _comparison_table(rows)
    off = [r for r in rows if r.agrees is False]
    if off:  # the table holds both rates: said once, then what the data show at each level
        text += (f"\n*The trace's throughput is beyond the band ({'; '.join(dict.fromkeys(r.band_source for r in off))}) "
                 f"of the sweep's at {', '.join(f'c={r.concurrency}' for r in off)}.*\n")
    text += _what_the_data_show([r for r in off if r.explanations], a.load_reconciliation)
    if figure_md:
        text += "\n" + figure_md.rstrip("\n") + "\n"
    # what the plateau's bullets below say (the fastest-growing category, the experts beside D(M)) is said there once
    said = fastest_paragraphs(summary, experts=not _says_experts(growth), lead=not _says_fastest(growth, summary))
    fits = [f"Every category's fit is in the {appendix_link(FITS_HEADING)}."] if summary.fits else []
    if said and fits:  # the pointer closes the last paragraph
        said, fits = [*said[:-1], f"{said[-1]} {fits[0]}"], []
    text += "".join(f"\n{p}\n" for p in said + fits)
    for note in summary.notes:
        text += f"\n*{note}*\n"
    if growth is not None:  # one finding per bullet: a paragraph of them is not read
        text += "\n### The plateau, step by step\n\n" + "".join(f"- {x}\n" for x in growth_sentences(growth))
    return text + micro_curve_line(micro or [])


def _what_the_data_show(off: list[LoadComparison], rec: schema.LoadReconciliation | None) -> str:
    """Each level beyond the band, one line of why (its largest parts first), linking the table of
    every level's parts; the link alone where no level needs a why."""
    link = appendix_link(RECONCILIATION_HEADING) if rec is not None and rec.levels else ""
    if not off:
        return f"\nEach captured sweep level's wall time, part by part: {link}.\n" if link else ""
    lead = f"*What the data show*{f' (each level part by part: {link})' if link else ''}:"
    return f"\n{lead}\n\n" + "".join(f"- c={r.concurrency}: " + "; ".join(r.explanations) + ".\n" for r in off)


def load_appendix(a: RunArtifacts, micro: list[schema.MicroCurveLevel]) -> str:
    """The step under load's tables in full, for the appendix: each level's time part by part, the
    micro-predicted curve and each level rebuilt from it, every category's fit; '' without any."""
    fits = fits_table(a.load_summary)
    return (reconciliation_section(a.load_reconciliation) + micro_curve_section(micro, a.micro_curve)
            + ("\n" + appendix_table(FITS_HEADING, fits) if fits else ""))


def _says_fastest(growth: "LoadGrowth | None", summary: schema.LoadAnatomySummary) -> bool:
    """Whether the plateau's bullets name the fastest-growing category as the fit does: a
    collective read by its transfer is not (the bullets give its busy time, waits included)."""
    fit = next((f for f in summary.fits if f.category == summary.fastest_category and f.measure != "wait"), None)
    return (growth is not None and growth.category == summary.fastest_category
            and (fit is None or fit.measure != "transfer"))


def _says_experts(growth: "LoadGrowth | None") -> bool:
    """Whether the plateau's bullets (`growth_sentences`) set the routed experts beside D(M)."""
    return growth is not None and growth.category == EXPERTS_CATEGORY and growth.experts is not None




def level_ceiling_x(lv: LevelAnatomy, category: str) -> float | None:
    """The level's decode step's Amdahl ceiling were `category`'s time zero; None without both."""
    ms, period = lv.category_ms.get(category), lv.period_ms
    return ceiling_x(period, ms) if ms is not None and period else None


def _level_anatomy(sm: pd.DataFrame | None, table: pd.DataFrame, c: int) -> LevelAnatomy:
    t = table[(table["concurrency"] == c) & (table["step_kind"] == "decode")]
    n = t.drop_duplicates("decode_requests").set_index("decode_requests")["n_steps"]
    w = t["decode_requests"].map(n) / n.sum() if len(n) else t["n_steps"]
    cats = (t["ms_per_step"] * w).groupby(t["category"]).sum().to_dict()
    g = t.drop_duplicates("decode_requests")
    period = float((g["period_ms"] * g["n_steps"]).sum() / g["n_steps"].sum()) if len(g) else None
    return LevelAnatomy(c, period, {k: float(v) for k, v in cats.items()}, level_server_view(sm, c))


def load_growth(a: RunArtifacts, knee_concurrency: int | None) -> LoadGrowth | None:
    """The plateau's reading from the load anatomy; None without two captured decode levels."""
    table, summary = a.load_anatomy, a.load_summary
    if table is None or summary is None:
        return None
    levels = sorted(set(table.loc[table["step_kind"] == "decode", "concurrency"].astype(int)))
    if len(levels) < 2:
        return None
    lo, hi = levels[0], levels[-1]
    if knee_concurrency is not None:
        lo = max([c for c in levels if c <= knee_concurrency], default=lo)
        hi = min([c for c in levels if c > lo], default=hi)
    below, above = _level_anatomy(a.server_metrics, table, lo), _level_anatomy(a.server_metrics, table, hi)
    fit = next((f for f in summary.fits if f.category == summary.fastest_category and f.measure != "wait"), None)
    shifted = []
    for cat in sorted(set(below.category_ms) | set(above.category_ms)):
        a = below.category_ms.get(cat, 0.0) / below.period_ms if below.period_ms else None
        b = above.category_ms.get(cat, 0.0) / above.period_ms if above.period_ms else None
        if a and b and max(a, b) / min(a, b) >= LOAD_LEVER_SHIFT and max(a, b) >= 0.05:
            shifted.append((cat, a, b))
    return LoadGrowth(summary.fastest_category, fit.slope_ms_per_request if fit else None,
                      fit.slope_se_ms if fit else None, below, above, knee_concurrency, tuple(shifted), summary.experts)


def growth_sentences(g: LoadGrowth) -> list[str]:
    """The plateau finding in words, every number from `g`."""
    lo, hi = g.below, g.above
    where = (f"either side of the knee at concurrency {g.knee_concurrency}" if g.knee_concurrency is not None
             else "at the lowest and highest captured levels")
    out = [f"The decode step's period goes from {fmt_num(lo.period_ms)} ms at c={lo.concurrency} to "
           f"{fmt_num(hi.period_ms)} ms at c={hi.concurrency} ({where})."]
    if g.category is not None:
        what = " (the routed experts)" if g.category == EXPERTS_CATEGORY else ""
        out.append(f"The category that grows fastest with the batch is **{md_text(g.category)}**{what} "
                   f"({fmt_num(g.slope_ms_per_request)} ± {fmt_num(g.slope_se_ms)} ms per decode request): "
                   f"{fmt_num(lo.category_ms.get(g.category, 0.0))} ms per step at c={lo.concurrency}, "
                   f"{fmt_num(hi.category_ms.get(g.category, 0.0))} ms at c={hi.concurrency}; removing it would speed "
                   f"the step up at most {_x(level_ceiling_x(lo, g.category))} at c={lo.concurrency} and "
                   f"{_x(level_ceiling_x(hi, g.category))} at c={hi.concurrency}.")
        if g.category == EXPERTS_CATEGORY and g.experts is not None:
            out.append(experts_sentence(g.experts))
    else:
        out.append("No category's growth with the batch clears its spread, so none is named as the one "
                   "that takes the step there.")
    seen = [(c, s) for c, s in ((lo.concurrency, lo.server), (hi.concurrency, hi.server)) if s]
    if seen:  # both levels in one line, each reading "low and high"
        def both(key: str, fmt) -> str:
            return " and ".join(fmt(s.get(key)) for _, s in seen)
        out.append(f"At {' and '.join(f'c={c}' for c, _ in seen)} the server reported at most "
                   f"{both('running_max', _g)} requests running, {both('waiting_max', _g)} waiting, KV cache "
                   f"{both('kv_cache_usage_max', fmt_pct)} used, {both('preemptions', _g)} preemptions.")
    for cat, a, b in g.shifted_levers:
        size = "large at the lower level and small at the higher" if a > b else "small at the lower level and large at the higher"
        out.append(f"{cat} is a lever whose size depends on the batch: {fmt_pct(a)} of the period at "
                   f"c={lo.concurrency}, {fmt_pct(b)} at c={hi.concurrency} ({size}).")
    return out


def _whole(v) -> str:
    return "–" if v is None or pd.isna(v) else str(int(v))


def _x(v: float | None) -> str:
    return f"{fmt_num(v)}×" if v is not None else "–"


def _g(v: float | None) -> str:
    return f"{v:g}" if v is not None else "–"


def compare_load(run_a: RunArtifacts, run_b: RunArtifacts) -> pd.DataFrame | None:
    """Per captured concurrency both runs hold: ms per decode step by category (mean over the
    level's decode steps) and the decode period, A against B with the noise band of
    `report.noise.make_delta` (one run per side: the fixed relative band). None unless both
    runs captured load levels."""
    ta, tb = run_a.load_anatomy, run_b.load_anatomy
    if ta is None or tb is None:
        return None
    both = sorted(set(ta["concurrency"].astype(int)) & set(tb["concurrency"].astype(int)))
    rows = []
    for c in both:
        la_, lb_ = _level_anatomy(run_a.server_metrics, ta, c), _level_anatomy(run_b.server_metrics, tb, c)
        pairs = {"decode period": (la_.period_ms, lb_.period_ms)}
        for cat in sorted(set(la_.category_ms) | set(lb_.category_ms)):
            pairs[cat] = (la_.category_ms.get(cat, 0.0), lb_.category_ms.get(cat, 0.0))
        for what, (x, y) in pairs.items():
            d = make_delta("B", "ms_per_decode_step", f"c={c}", [x] if x is not None else [],
                           [y] if y is not None else [], False)
            rows.append({"concurrency": c, "quantity": what, "a": x, "b": y,
                         "diff": y - x if x is not None and y is not None else None,
                         "ratio_b_over_a": y / x if x and y is not None else None,
                         "band": d.band, "beyond_noise": d.real})
    return pd.DataFrame(rows, columns=["concurrency", "quantity", "a", "b", "diff", "ratio_b_over_a", "band",
                                       "beyond_noise"])


# --------------------------------------------------------------------------- micro-predicted curve

MICRO_REBUILT_HEADING = "Each captured sweep level's time rebuilt from the micro-predicted step (stage 05)"
"""The appendix's heading of the reconciled micro-predicted levels, which the report links by anchor."""

COMPONENT_WORDS = {"gemm": "GEMM", "comm": "collectives", "attention_kv": "attention + KV writes", "rest": "rest"}
"""How the report names each component of the predicted step (trace.micro_curve.COMPONENTS and `rest`)."""

REBUILT_WORDS = {"prefill_mixed_steps": "prefill and mixed steps", "stalls": "stalls", "client_overhead": "client",
                 "ramp_up": "ramp-up", "turnaround": "turnaround", "drain": "drain",
                 "decode_steps_predicted": "decode steps × predicted step",
                 **{f"error_{k}": f"error: {v}" for k, v in COMPONENT_WORDS.items()},
                 "level_pace": "the level's pace against the trace's", "unexplained": "unexplained"}
"""How the rebuilt levels' table heads each part (MicroCurveReconciled.parts); trace.micro_curve.KEPT_PARTS
are load_reconciliation.json's parts (PART_WORDS names them in full)."""


def micro_curve(a: RunArtifacts) -> list[schema.MicroCurveLevel]:
    """Stage 05's micro-predicted curve (`micro_curve.json`), one entry per closed-loop sweep level;
    [] where stage 05 wrote none."""
    return list(a.micro_curve.levels) if a.micro_curve is not None else []


def _signed_ms(v: float) -> str:
    return f"{'+' if v > 0 else ''}{fmt_num(v)}"


def rebuilt_sentence(p: schema.MicroCurveLevel, n: int = 3) -> str:
    """Where a reconciled level's time went beside the predicted step: its largest measured parts
    other than the decode steps, then the decode steps' traced period against the predicted step
    with the error by component (largest first); every number from stage 05's record."""
    r = p.reconciled
    if r is None or p.step_ms is None:
        return ""
    kept = sorted(((k, r.parts[k]) for k in KEPT_PARTS if r.parts.get(k)), key=lambda kv: -abs(kv[1]))[:n]
    said = [f"{fmt_num(v)} s of {PART_WORDS[k]}" for k, v in kept]
    spent = (", ".join(said[:-1]) + " and " if len(said) > 1 else "") + said[-1] if said else "none"
    errors = sorted(r.error_ms.items(), key=lambda kv: -abs(kv[1]))
    batch = (f" of {fmt_num(r.decode_tokens_per_step)} requests (not {p.concurrency})"
             if r.decode_tokens_per_step is not None and r.decode_tokens_per_step < p.concurrency else "")
    left = r.parts.get("unexplained", 0.0)
    return (f"of the level's {fmt_num(r.level_s)} s, outside its decode steps: {spent}; its "
            f"{fmt_num(r.decode_steps)} decode steps{batch} took {fmt_num(r.trace_step_ms)} ms each in the trace "
            f"against {fmt_num(p.step_ms)} ms predicted ({_signed_ms(r.trace_step_ms - p.step_ms)} ms: "
            + ", ".join(f"{COMPONENT_WORDS.get(k, k)} {_signed_ms(v)}" for k, v in errors)
            + f" ms){_agreement_clause(r)}{_pace_words(r.parts.get('level_pace', 0.0))}"
            + (f"; the reconciliation leaves {fmt_num(left)} s unexplained"
               if not unexplained_within(left, r.level_s) else ""))


def _pace_words(pace_s: float) -> str:
    """The level's decode steps at its own pace against the trace's period, in words."""
    if not pace_s:
        return ""
    return (f"; at the level's own pace its decode steps took {fmt_num(abs(pace_s))} s "
            f"{'less' if pace_s < 0 else 'more'} than at the trace's period")


def _agreement_clause(r: schema.MicroCurveReconciled) -> str:
    """An agreeing step named an offsetting agreement when its components are off both ways."""
    if r.offsetting:
        off = ", ".join(COMPONENT_WORDS.get(k, k) for k in r.off_components)
        return f", an **offsetting agreement**: the step agrees only because {off} are off both ways"
    return ""


def micro_curve_line(points: list[schema.MicroCurveLevel]) -> str:
    """The micro-predicted curve's top reconciled level (else its top level with a measurement) in
    one sentence with where the level's time went, linking the tables."""
    both = [p for p in points if p.predicted_tok_s is not None and p.measured_tok_s]
    if not points:
        return ""
    link = appendix_link(MICRO_CURVE_HEADING)
    if not both:
        return f"\nThe micro-benchmarks' prediction of each sweep level, before any load trace: {link}.\n"
    p = next((q for q in reversed(both) if q.reconciled is not None), both[-1])
    why = rebuilt_sentence(p)
    return (f"\nBefore any load trace, the micro-benchmarks predict {fmt_num(p.predicted_tok_s)} tok/s at "
            f"c={p.concurrency} against {fmt_num(p.measured_tok_s)} measured "
            f"({fmt_num(p.predicted_tok_s / p.measured_tok_s)}×){f': {why}' if why else ''}. Every sweep level, "
            f"with the method: {link}" + (f"; each captured level rebuilt from the prediction: "
                                           f"{appendix_link(MICRO_REBUILT_HEADING)}" if why else "") + ".\n")


def micro_curve_section(points: list[schema.MicroCurveLevel], curve: schema.MicroCurve | None = None) -> str:
    """The micro-predicted curve beside the measured one, then each reconciled level rebuilt from
    it, as tables with their method."""
    from stepscope.report.markdown_util import md_table

    if not points:
        return ""
    df = pd.DataFrame([{k: getattr(p, k) for k in p.__struct_fields__ if k != "reconciled"} for p in points])
    note = ""
    if any(p.comm_from_batch is not None and p.comm_from_batch < p.concurrency for p in points):
        note = ("\n*The collectives were timed at a smaller batch than some levels (`comm from batch`); "
                "their time is held there, which assumes latency-bound collectives (true for small messages, "
                "not for large ones). Set `micro.collectives.burst_batch_sizes` to the sweep's concurrencies.*\n")
    impl = ""
    if curve is not None and curve.comm_implementation:
        why = ("the trace ran another implementation, which stage 03 did not time" if curve.comm_matches_trace is False
               else curve.comm_implementation_reason)
        impl = f" Collectives: stage 03's {md_code(curve.comm_implementation)}" + (f" ({md_text(why)})" if why else "") + "."
    return ("\n" + appendix_table(MICRO_CURVE_HEADING, "Before any load trace (`micro_curve.json`): the decode step "
            "at each sweep concurrency M predicted as stage 02's GEMM time at M + stage 03's collectives at M + the "
            "batch-1 trace's attention and KV writes × M + the rest of the batch-1 period unchanged; "
            f"throughput = M / step.{impl}\n\n"
            + md_table(df.astype({"comm_from_batch": "Int64"}), [("concurrency", "concurrency"), ("gemm_ms", "GEMM (ms)"), ("comm_ms", "collectives (ms)"),
                            ("comm_from_batch", "comm from batch"), ("attention_kv_ms", "attention + KV (ms)"),
                            ("rest_ms", "rest (ms)"), ("step_ms", "step (ms)"),
                            ("predicted_tok_s", "micro-predicted (tok/s)"), ("measured_tok_s", "measured (tok/s)")],
                       formats={"concurrency": _whole, "comm_from_batch": _whole})
            + note) + rebuilt_section(points))


def rebuilt_section(points: list[schema.MicroCurveLevel]) -> str:
    """Each reconciled level's time rebuilt from the predicted step, part by part (seconds), as a
    table with its method; '' where no level was reconciled."""
    from stepscope.report.markdown_util import compact_table

    rec = [p for p in points if p.reconciled is not None]
    if not rec:
        return ""
    names = list(dict.fromkeys(k for p in rec for k in p.reconciled.parts))
    df = pd.DataFrame([{"concurrency": p.concurrency, "level_s": p.reconciled.level_s,
                        "trace_ms": p.reconciled.trace_step_ms, "step_ms": p.step_ms, **p.reconciled.parts,
                        "predicted_level_s": p.reconciled.predicted_level_s,
                        "agreement": ("**offsetting**" if p.reconciled.offsetting else
                                      "yes" if p.reconciled.agree else "no")} for p in rec])
    cols = [("concurrency", "concurrency"), ("level_s", "level (s)"), ("trace_ms", "traced decode period (ms)"),
            ("step_ms", "predicted step (ms)"), *[(k, f"{REBUILT_WORDS.get(k, k)} (s)") for k in names],
            ("predicted_level_s", "level at the predicted step (s)"), ("agreement", "step agrees")]
    return ("\n" + appendix_table(MICRO_REBUILT_HEADING, "Each captured sweep level's time (`micro_curve.json`, "
            "from `load_reconciliation.json`): its measured parts other than its decode steps as they were; its "
            "decode steps × the predicted step; (traced decode period − predicted step) × decode steps, the "
            "prediction's error, by component from the level's own trace (each component's categories, mean over "
            "the level's decode steps; the rest is the traced period less them); the level's own decode steps' "
            "time less decode steps × the traced period (the level's pace against the trace's); and the "
            "reconciliation's unexplained part. The parts sum to the level's time.\n\n"
            + compact_table(df, cols, keys=("concurrency",), md_columns=("agreement",),
                            formats={"concurrency": _whole, **{k: fmt_num for k in [
                                "level_s", "trace_ms", "step_ms", "predicted_level_s", *names]}})))
