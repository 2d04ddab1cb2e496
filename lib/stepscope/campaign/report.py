"""`campaign_report.md` and `.html`: every variant beside the baseline, and the baseline's predictions
beside what the variants measured; rendering only, from `campaign.analysis`'s values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from stepscope.campaign import analysis as ca
from stepscope.campaign import plots as cp
from stepscope.report.compare import KERNEL_CATEGORIES_COMPARED, compare_kernels
from stepscope.report.deltas import verdict_fields
from stepscope.report.markdown_util import code_names, markdown_to_html, md_table, missing_box
from stepscope.wording import fmt_num as f
from stepscope.report.prose import verdict_sentences
from stepscope.redaction import scrub
from stepscope.runfolder import save_figure
from stepscope.thresholds import (BUNCHED_FLAG_SHARE, CHANGE_NOISE_REL, NOISE_BAND_SIGMAS, READINGS_AGREE_REL,
                                  STALL_GAP_S, STALLED_LEVEL_SHARE, TPOT_GAP_SHARE)
from stepscope.wording import HEADLINE_MARK, figure_text, md_code, md_text

FIG_THROUGHPUT = "campaign_output_tok_s_vs_concurrency.png"
FIG_CATEGORIES = "campaign_decode_ms_per_step_by_category.png"


_INTS = {k: (lambda v: f(int(v)) if pd.notna(v) else f(v)) for k in ("concurrency", "n_runs", "n_steps")}


def _x(v: float | None) -> str:
    return "–" if v is None else f"{f(v)}×"


def _signed(v: float | None) -> str:
    return f"+{f(v)}" if v is not None and v > 0 else f(v)


def _setup(c: ca.Campaign) -> str:
    rec = c.record
    rows = []
    for r in rec.runs:
        rows.append({"run": r.key, "variant": r.variant, "description": r.description or "",
                     "folder": md_code(f"{r.run_dir}/"), "status": r.status, "wall_s": r.wall_s,
                     "reused": ", ".join(f"{k[:2]} from {v}" for k, v in r.reused.items()) or "–"})
    text = "## Variants and runs\n\n"
    text += (f"Campaign {md_code(rec.campaign_id)}: baseline **{md_text(c.baseline)}** and {len(c.variants) - 1} variant(s), "
             f"{f(rec.repeats)} run(s) each, interleaved (every variant once, then again). "
             f"Wall time {f(rec.wall_s)} s. Each run is an ordinary run folder with its own server and its "
             "own report (`06_writeup/report.html`).\n\n")
    text += md_table(pd.DataFrame(rows), [("run", "run"), ("variant", "variant"), ("description", "description"),
                                          ("folder", "folder"), ("status", "status"), ("wall_s", "wall time (s)"),
                                          ("reused", "stages reused (same inputs)")], md_columns=("folder",))
    reused = [r for r in rec.runs if r.reused]
    if reused:
        text += ("\nReused stages were not measured again: their inputs (the params keys their entries in "
                 "`stepscope.stages` declare) were the same as in the run named, so their "
                 "artifacts were copied from it (`<stage>/reused_from.json` says so in the run folder).\n")
    return text + "\n"


def _macro(c: ca.Campaign, figs: dict[str, str]) -> str:
    text = "## Throughput and latency per concurrency\n\n"
    levels = {v: lv for v in c.variants if (lv := ca.levels_table(c.runs.get(v) or [])) is not None}
    if not levels:
        return text + missing_box("The sweep comparison", ["01_macro_sweep/levels.csv"]) + "\n"
    if FIG_THROUGHPUT in figs:
        text += f"![output tok/s against concurrency, every variant]({figs[FIG_THROUGHPUT]})\n\n"
    for v, lv in levels.items():
        text += f"### {v}\n\n" + md_table(lv, [("concurrency", "concurrency"),
                                                ("output_throughput_tok_s", "output tok/s"),
                                                ("tpot_ms_median", "TPOT median (ms)"),
                                                ("ttft_ms_median", "TTFT median (ms)"),
                                                ("bunched_pct_max", "chunks bunched % (max over runs)"),
                                                ("stall_pct_max", "stalled % of level (max over runs)"),
                                                ("n_runs", "runs")], formats=_INTS) + "\n"
    notes = []
    if any("bunched_pct_max" in lv for lv in levels.values()):
        notes.append(f"Above {f(100 * BUNCHED_FLAG_SHARE)} % of token chunks bunched (arrived with the previous one), "
                     "a level's TPOT and TTFT measure delivery, not decode: they are not compared below.")
    if any("stall_pct_max" in lv for lv in levels.values()):
        notes.append(f"A level that lost over {f(100 * STALLED_LEVEL_SHARE)} % of its time to server-wide stalls "
                     f"(every stream silent at once for over {f(STALL_GAP_S)} s) reads low by up to that share: "
                     "none of its readings are compared below.")
    return text + (" ".join(notes) + "\n\n" if notes else "")


def _categories(c: ca.Campaign, cats: pd.DataFrame, figs: dict[str, str]) -> str:
    text = "## Decode step time by category\n\n"
    if cats.empty:
        return text + missing_box("The per-category comparison", ["05_categorize/decode_categories.csv"]) + "\n"
    if FIG_CATEGORIES in figs:
        text += f"![decode ms per step by category and variant]({figs[FIG_CATEGORIES]})\n\n"
    df = cats.reset_index()
    text += "Mean ms per decode step on the reference rank (union of each category's work), mean over runs.\n\n"
    text += md_table(df, [("category", "category")] + [(v, f"{v} (ms)") for v in cats.columns]) + "\n"
    rows = [{"variant": v, "step_ms": ca._mean([ca.step_ms(r) for r in c.runs[v]]),
             "basis": c.runs[v][0].ctx.totals.get("step_basis"),
             "n_steps": c.runs[v][0].ctx.totals.get("n_decode_steps"),
             "tpot": ca._mean([ca.capture_tpot(r) for r in c.runs[v]])} for v in c.variants if c.runs.get(v)]
    text += md_table(pd.DataFrame(rows), [("variant", "variant"), ("step_ms", "decode step (ms)"),
                                          ("basis", "step measured as"), ("n_steps", "decode steps (run 1)"),
                                          ("tpot", "capture TPOT, batch 1 (ms)")], formats=_INTS) + "\n"
    return text


def _kernel_changes(c: ca.Campaign) -> str:
    """Per variant, the kernels that ran in it or in the baseline only (first runs): another
    backend, a fusion or a graph shows as names coming and going."""
    text = "## Kernels that came or went\n\n"
    base = c.first(c.baseline)
    rows, lacking = [], []
    for v in c.variants:
        r = c.first(v)
        if v == c.baseline or r is None or base is None:
            continue
        k = compare_kernels(base.artifacts, r.artifacts)
        if k is None:
            lacking.append(v)
            continue
        for _, x in k[k["presence"].str.endswith("only")].iterrows():
            ran = c.baseline if x["presence"] == "A only" else v
            rows.append({"variant": v, "category": x["category"], "name": x["name"],
                         "ran": f"{ran} only", "ms": x["a"] if ran == c.baseline else x["b"]})
    if lacking:
        text += (f"Not compared for {md_text(', '.join(lacking))}: `05_categorize/category_kernels.csv` is missing in its "
                 f"first run or the baseline's.\n\n")
    if not rows:
        return text + ("No kernel of the largest categories ran in one run only.\n\n" if not lacking else "")
    text += (f"Among the largest kernels of the {KERNEL_CATEGORIES_COMPARED} categories with the most time "
             f"(first run of each variant against the baseline's; all of them: `stepscope compare`):\n\n")
    table = pd.DataFrame(rows)
    table["name"] = code_names(table["name"])
    return text + md_table(table, [("variant", "variant"), ("category", "category"), ("name", "kernel"),
                                                ("ran", "ran in"), ("ms", "summed ms per step")],
                            md_columns=("name",)) + "\n"


def _verdicts(c: ca.Campaign) -> str:
    text = "## Verdicts\n\n"
    digests = {v: c.runs[v][0].ctx.verdict for v in c.variants if c.runs.get(v)}
    if not digests:
        return text + missing_box("The verdicts", ["05_categorize/summary.json"]) + "\n"
    fields = {v: verdict_fields(d) for v, d in digests.items()}
    rows = [{"variant": v, **f, "x": _x(f["biggest_lever_x"])} for v, f in fields.items()]
    text += ("Each variant's structured verdict (its first run), field by field; its own report words it in full.\n\n"
             + md_table(pd.DataFrame(rows), [("variant", "variant"), ("dominant", "largest category"),
                                             ("dominant_share_pct", "% of step"), ("communication", "communication"),
                                             ("bound", "bound by"), ("biggest_lever", "biggest lever"),
                                             ("x", "its Amdahl ceiling")]) + "\n")
    base = digests.get(c.baseline)
    for v, d in digests.items():
        if v == c.baseline or base is None:
            continue
        ch = ca.verdict_changes(base, d)
        text += (f"- **{md_text(v)}**: " + ("; ".join(f"{md_text(k)} {md_text(a)} → {md_text(b)}" for k, a, b in ch) if ch
                                   else "the same verdict as the baseline") + ".\n")
    text += "\n"
    for v in digests:
        r = c.runs[v][0]
        # The run's own words where its stage 06 wrote them (verdict.json), else rendered here alike.
        sents = [x.text for x in r.artifacts.verdict.sentences] if r.artifacts.verdict is not None \
            else verdict_sentences(r.ctx.verdict)
        if sents:
            text += f"**{md_text(v)}, the verdict in words:** " + " ".join(sents) + "\n\n"
    return text


def _deltas(ds: list[ca.Delta]) -> str:
    text = "## Changes against the baseline\n\n"
    text += (f"**Noise:** with repeats, a delta's band is {f(NOISE_BAND_SIGMAS)} standard errors of the difference "
             f"of the two means; with one run, a category's band comes from its step-to-step spread "
             f"((p90 − median)/1.28 over √steps), and a single reading without a spread gets a fixed "
             f"{f(100 * CHANGE_NOISE_REL)} % band. A change counts only outside its band.\n\n")
    if not ds:
        return text + missing_box("The deltas", ["two finished runs: the baseline and a variant"]) + "\n"
    df = ca.deltas_frame(ds)
    for v, g in df.groupby("variant", sort=False):
        real = g[g["real"]]
        cats = real[real["metric"] == "category_ms_per_step"]
        text += f"### {v}\n\n"
        if len(cats):
            text += ("Categories that moved beyond noise: " + ", ".join(
                f"{md_text(r['where'])} {f(r['baseline'])} → {f(r['value'])} ms" for _, r in cats.iterrows()) + ".\n\n")
        else:
            text += "No category moved beyond noise.\n\n"
        flag = [f"not compared: {why}" if isinstance(why, str) else ("**real**" if real else "within noise")
                for real, why in zip(g["real"], g["not_comparable"])]
        g = g.assign(flag=flag, ratio_txt=g["ratio"].map(_x))
        text += md_table(g, [("metric", "metric"), ("where", "where"), ("baseline", "baseline"),
                             ("value", v), ("delta", "Δ"), ("ratio_txt", "ratio"), ("band", "noise band ±"),
                             ("band_source", "band from"), ("flag", "change?")], md_columns=("flag",)) + "\n"
    return text


def _spec(c: ca.Campaign, preds: list[ca.SpecPrediction]) -> str:
    text = "## Speculative decoding: acceptance and verify steps\n\n"
    st = ca.spec_table(c)
    if st is None:
        return text + "No variant speculated (no draft counted in `/metrics`, no verify step in a trace).\n\n"
    text += ("Acceptance is read from the server's `/metrics` counters over the batch-1 capture (stage 04): "
             "*counters over* says whether they span exactly the profiled requests (read just inside "
             "`/start_profile` and `/stop_profile`, as the trace does) or the whole stage, its warm-up requests "
             "included. Verify steps (a decode step that scores more tokens than it has requests) are counted "
             "from the trace's step annotations. *Tokens per decode step* counts every decode step, those "
             "where the proposer found no draft included.\n\n")
    text += md_table(st, [("run", "run"), ("window", "counters over"), ("drafts", "drafts"),
                          ("draft_tokens", "draft tokens"),
                          ("accepted", "accepted"), ("acceptance_rate", "accepted / drafted"),
                          ("per_position", "accepted by position"),
                          ("tokens_per_verify_step", "tokens per verify step"),
                          ("tokens_per_decode_step", "tokens per decode step"),
                          ("counter_decode_steps", "decode steps (counters)"),
                          ("trace_decode_steps", "decode steps (trace)"),
                          ("trace_verify_steps", "verify steps (trace)"), ("trace_plain_steps", "plain steps (trace)"),
                          ("trace_scored_tokens_per_step", "scored tokens per step (trace)"),
                          ("verify_step_ms", "verify step (ms)"), ("plain_step_ms", "plain step (ms)"),
                          ("trace_ms_per_token", "trace: step / tokens per step (ms)"),
                          ("capture_tpot_ms", "capture TPOT (ms)")]) + "\n"
    text += _step_counts(st) + _tpot_readings(st)
    return text


def _step_counts(st: pd.DataFrame) -> str:
    """Two counts of the capture's decode steps: the server's counters and the trace's."""
    out = ""
    for _, r in st.iterrows():
        n_counted, n_traced = r.get("counter_decode_steps"), r.get("trace_decode_steps")
        if pd.isna(n_counted) or pd.isna(n_traced) or not n_traced or \
                abs(n_counted / n_traced - 1.0) <= READINGS_AGREE_REL:
            continue
        why = ("they span the whole stage, its warm-up requests included, and the trace only the profiled ones"
               if r["window"] == "whole stage" else "both span the profiled requests")
        out += (f"**{r['run']}: the counters and the trace count different decode steps** ({f(int(n_counted))} "
                f"against {f(int(n_traced))}, beyond ±{f(100 * READINGS_AGREE_REL)} %): {why}. Acceptance and "
                "tokens per step describe the counters' steps.\n\n")
    return out


def _tpot_readings(st: pd.DataFrame) -> str:
    """Two readings of one TPOT: the trace's step time per token and the client's; flag a gap."""
    out = ""
    for _, r in st.iterrows():
        t, m = r.get("trace_ms_per_token"), r.get("capture_tpot_ms")
        if pd.isna(t) or pd.isna(m) or not m:
            continue
        gap = t / m - 1.0
        if abs(gap) > TPOT_GAP_SHARE:
            out += (f"**{r['run']}: the two TPOT readings disagree.** The trace's decode step over the tokens per step "
                    f"gives {f(t)} ms per token; the client measured {f(m)} ms ({f(100 * gap)} %, beyond "
                    f"±{f(100 * TPOT_GAP_SHARE)} %). The step times in this section carry that gap; the "
                    "prediction below is set against the client's TPOT.\n\n")
    return out


def _predictions(preds: list[ca.SpecPrediction], ceilings: list[ca.CeilingCheck]) -> str:
    text = "## Prediction against measurement\n\n"
    if not preds and not ceilings:
        return text + ("No variant to test a prediction on: none speculated, and none removed a category the "
                       "baseline ran.\n\n")
    if preds:
        text += ("### Speculative decoding: the baseline's what-if, fed the measured acceptance\n\n"
                 "The baseline's what-if model (`report.whatif.predict_spec_decode_tpot`, on the baseline's "
                 f"measured decode step, {f(preds[0].baseline_step_ms)} ms by its {preds[0].baseline_step_basis}) "
                 "gets the acceptance the variant measured (tokens per decode step), the variant's drafted tokens "
                 "per draft (k) and each draft cost it was given; its predicted TPOT stands beside the TPOT the "
                 "variant measured in the same batch-1 capture: the client's, or, where that measures delivery (the "
                 "tokens came in bursts, or the stream stalled), the trace's decode step over the tokens per "
                 "step.\n\n")
        rows = [{"variant": p.variant, "acc": p.acceptance, "k": p.draft_tokens, "frac": p.draft_cost_fraction,
                 "pred": p.predicted_tpot_ms, "meas": p.measured_tpot_ms, "as": p.measured_as,
                 "ratio": _x(p.ratio), "band": p.band_ms,
                 "agree": {True: "yes", False: "**no**", None: "–"}[p.agrees]} for p in preds]
        text += md_table(pd.DataFrame(rows), [("variant", "variant"), ("acc", "tokens per decode step (measured)"),
                                              ("k", "k (drafted per draft)"),
                                              ("frac", "draft cost per token (× step, assumed)"),
                                              ("pred", "predicted TPOT (ms)"),
                                              ("meas", "measured TPOT (ms)"), ("as", "measured as"),
                                              ("ratio", "measured / predicted"),
                                              ("band", "noise band ± (ms)"), ("agree", "within noise?")],
                         formats={"k": lambda v: f(int(v))}, md_columns=("agree",)) + "\n"
        if preds[0].model_assumptions:
            text += "The model's own stated assumptions: " + "; ".join(preds[0].model_assumptions) + ".\n\n"
        text += _gap_table(preds)
        for p in preds:
            text += _gap_sentence(p)
        text += "\n"
    if ceilings:
        text += ("### Removing a category: the baseline's Amdahl ceiling against the measured speed-up\n\n"
                 "A ceiling assumes everything else in the step stays as it was; the measured speed-up is the "
                 "baseline's decode step over the variant's.\n\n")
        rows = [{"variant": k.variant, "removed": ", ".join(k.removed), "ceiling": _x(k.ceiling_x),
                 "measured": _x(k.measured_x), "band": k.band_x, "src": k.band_source} for k in ceilings]
        text += md_table(pd.DataFrame(rows), [("variant", "variant"), ("removed", "categories removed"),
                                              ("ceiling", "Amdahl ceiling (baseline)"),
                                              ("measured", "measured speed-up"), ("band", "noise band ± (×)"),
                                              ("src", "band from")]) + "\n"
        for k in ceilings:
            text += _ceiling_sentence(k)
    return text + "\n"


def _gap_table(preds: list[ca.SpecPrediction]) -> str:
    rows = [{"variant": p.variant, "frac": p.draft_cost_fraction, "what": k.assumption, "assumed": k.assumed,
             "measured": k.measured, "unit": k.unit, "effect": k.effect_ms_per_token,
             "judged": {True: "**beyond noise**", False: "within noise", None: "–"}[k.contradicted]}
            for p in preds for k in p.checks]
    if not rows:
        return ""
    return ("#### Where each gap comes from\n\n"
            "Each assumption of the model is given the value the variant measured, in turn (those above it "
            "already given theirs), and moves the predicted TPOT by its effect; the effects of a prediction add "
            "up to measured − predicted TPOT. An assumption is beyond noise when its effect exceeds the measured "
            "TPOT's band, the same test the prediction itself passes or fails: getting it right would have "
            "changed the verdict.\n\n"
            + md_table(pd.DataFrame(rows), [("variant", "variant"), ("frac", "draft cost (× step)"),
                                            ("what", "assumption"), ("assumed", "assumed"),
                                            ("measured", "measured"), ("unit", "unit"),
                                            ("effect", "moves the prediction by (ms per token)"),
                                            ("judged", "effect")], md_columns=("judged",)) + "\n")


def _effects(checks: list[ca.AssumptionCheck]) -> str:
    return "; ".join(f"*{k.assumption}* ({_signed(k.effect_ms_per_token)} ms per token)" for k in checks)


def _gap_sentence(p: ca.SpecPrediction) -> str:
    """What a prediction's effects say: which assumptions missed when it disagrees, and that an
    agreement is luck when errors beyond noise offset each other. Nothing for a plain agreement."""
    bad = [k for k in p.checks if k.contradicted]
    measured = f"measured {f(p.measured_tpot_ms)} ms ({p.measured_as})"
    if p.offsetting:
        text = (f"{measured} agrees with the predicted {f(p.predicted_tpot_ms)} ms within the ±{f(p.band_ms)} ms "
                f"band, but only because errors beyond noise offset each other: {_effects(bad)}. The agreement "
                "does not show the model right.")
    elif p.agrees is False:
        worse = "slower" if p.gap_ms > 0 else "faster"
        text = (f"{measured} is {worse} than the predicted {f(p.predicted_tpot_ms)} ms by {f(abs(p.gap_ms))} ms "
                f"per token, beyond the ±{f(p.band_ms)} ms band. "
                + (f"The data contradict these assumptions, each moving the prediction beyond the band: "
                   f"{_effects(bad)}." if bad else
                   "No single assumption moves the prediction beyond the band; the gap is the sum of their effects."))
        held = [k for k in p.checks if k.contradicted is False]
        text += f" Held: {_effects(held)}." if held else ""
    else:
        return ""
    return f"\n**{p.variant}, draft cost {f(p.draft_cost_fraction)}:** {text}{_beside_steps(p)}\n"


def _beside_steps(p: ca.SpecPrediction) -> str:
    rel = p.beside_steps_rel
    if rel is None or rel > 0:
        return ""
    if -rel > TPOT_GAP_SHARE:
        return (f" The time beside the decode steps came out negative: the measured TPOT is {f(-100 * rel)} % "
                "shorter than the trace's decode steps account for, beyond the "
                f"{f(100 * TPOT_GAP_SHARE)} % the two readings of TPOT may differ; they disagree (acceptance table).")
    return (f" The measured TPOT leaves no time beside the trace's decode steps ({f(100 * rel)} % of them, within "
            f"the {f(100 * TPOT_GAP_SHARE)} % the two readings of TPOT may differ): the draft, if it costs anything, "
            "runs inside the steps, where the verify and plain steps' effects count it.")


def _ceiling_sentence(k: ca.CeilingCheck) -> str:
    head = f"- **{md_text(k.variant)}** removes {md_text(', '.join(k.removed))}: "
    if k.within is None:
        return head + "no noise band, so no judgement.\n"
    if k.reaches:
        return head + f"the measured {_x(k.measured_x)} reaches the {_x(k.ceiling_x)} ceiling within noise.\n"
    if k.within:
        grew = "; ".join(f"{md_text(c)} {f(a)} → {f(b)} ms" for c, a, b in k.moved_up)
        return head + (f"the measured {_x(k.measured_x)} stays below the {_x(k.ceiling_x)} ceiling. The ceiling "
                       "assumes the rest of the step is unchanged" + (f"; here other categories grew: {grew}." if grew
                                                                       else "; no single other category grew beyond "
                                                                            "noise, so the loss is spread thin.")) + "\n"
    shrank = "; ".join(f"{md_text(c)} {f(a)} → {f(b)} ms" for c, a, b in k.moved_down)
    text = head + (f"the measured {_x(k.measured_x)} exceeds the {_x(k.ceiling_x)} ceiling, which the model says "
                   "cannot happen: the ceiling assumes the rest of the step is unchanged"
                   + (f", but other categories shrank: {shrank}." if shrank else
                      ", yet no category shrank beyond noise."))
    saved = k.base_step_ms - k.variant_step_ms
    if saved > 0 and k.unexplained_ms > 0.5 * saved:
        text += (f" Of the {f(saved)} ms saved per step ({f(k.base_step_ms)} → {f(k.variant_step_ms)} ms), the removed "
                 f"categories' exposed time explains {f(k.removed_exposed_ms)} ms and the categories that shrank "
                 f"{f(saved - k.removed_exposed_ms - k.unexplained_ms)} ms; {f(k.unexplained_ms)} ms lay outside the "
                 "counted work (idle between kernels or between steps, host-side time), which the ceiling does not "
                 "model.")
    return text + "\n"


def _trace_step_clause(c: ca.Campaign, v: str, ds: list[ca.Delta]) -> str:
    """What the trace says instead of a burst-delivered TPOT: per token for a variant that speculates
    (its step scores several tokens), per decode step otherwise."""
    st = next((x for x in ds if x.variant == v and x.metric == "decode_step_ms"), None)
    spec = ca.trace_per_token_delta(c, v)
    if spec is not None and spec[0].value is not None:
        tok, per_step = spec
        judged = (f"beyond its ±{f(tok.band)} ms band" if tok.real else f"within its ±{f(tok.band)} ms band"
                  ) if tok.band is not None else "no noise band"
        return (f"; from the trace, its time per token (decode step / {f(per_step)} tokens per step) went "
                f"{f(tok.baseline)} → {f(tok.value)} ms ({_x(tok.ratio)}, {judged}).")
    if st is not None and st.value is not None:
        return f"; its decode step went {f(st.baseline)} → {f(st.value)} ms ({_x(st.ratio)})."
    return "."


def _headline(c: ca.Campaign, ds: list[ca.Delta], preds: list[ca.SpecPrediction],
              ceilings: list[ca.CeilingCheck]) -> list[str]:
    out = []
    for v in c.variants:
        if v == c.baseline:
            continue
        why = next((w for r in c.runs.get(v) or [] if (w := ca.capture_delivery_why(r))), None)
        if why:
            out.append(f"**{v}**'s client-side TPOT in the capture does not measure decode ({why})"
                       + _trace_step_clause(c, v, ds))
            continue
        d = next((x for x in ds if x.variant == v and x.metric == "tpot_capture_ms"), None)
        if d is None or d.value is None:
            continue
        if d.real:
            out.append(f"**{v}** changes the batch-1 TPOT {f(d.baseline)} → {f(d.value)} ms ({_x(d.ratio)}), "
                       f"beyond its ±{f(d.band)} ms band.")
        else:
            out.append(f"**{v}** leaves the batch-1 TPOT within noise ({f(d.baseline)} → {f(d.value)} ms, "
                       f"band ±{f(d.band)} ms).")
    for k in ceilings:
        out.append(f"{md_text(k.variant)} removes {md_text(', '.join(k.removed))}: the baseline's Amdahl ceiling was {_x(k.ceiling_x)}, "
                   f"the measured speed-up of the decode step is {_x(k.measured_x)}.")
    for p in preds[:1]:
        if p.measured_tpot_ms is None:
            out.append(f"For {p.variant}, the what-if predicted {f(p.predicted_tpot_ms)} ms at the measured "
                       f"{f(p.acceptance)} tokens per step; no TPOT was measured to check it against.")
            continue
        by = "" if p.measured_as == ca.MEASURED_BY_CLIENT else f", by the {p.measured_as}"
        luck = (", within noise only through errors that offset each other (Prediction against measurement)"
                if p.offsetting else "")
        out.append(f"For {p.variant}, the what-if predicted {f(p.predicted_tpot_ms)} ms at the measured "
                   f"{f(p.acceptance)} tokens per step; it measured {f(p.measured_tpot_ms)} ms ({_x(p.ratio)}{by})"
                   f"{luck}.")
    return out


def render(c: ca.Campaign, figs: dict[str, str]) -> tuple[str, list[str]]:
    """The report's markdown and its "In short" sentences (what the CLI prints, never re-read from the markdown)."""
    ds = ca.deltas(c)
    preds = ca.spec_predictions(c)
    ceilings = ca.ceiling_checks(c, ds)
    cats = ca.category_table(c)
    text = f"# Campaign {md_text(c.record.campaign_id)}: did the change help, and as predicted?\n\n"
    short = _headline(c, ds, preds, ceilings)
    if short:
        text += HEADLINE_MARK + " ".join(short) + "\n\n"
    text += ("*Written by stepscope from the campaign's run folders alone. Every variant is read through the same "
             "artifact schema as a single run's report; units are in every column header.*\n\n[TOC]\n\n")
    text += _setup(c) + _macro(c, figs) + _categories(c, cats, figs) + _kernel_changes(c) + _verdicts(c) + _deltas(ds)
    text += _spec(c, preds) + _predictions(preds, ceilings)
    text += "## Method\n\nThe campaign method, the noise bands and the models tested here: `docs/campaigns.md`.\n"
    return text, short


def make_figures(c: ca.Campaign, out: Path) -> dict[str, str]:
    figs: dict[str, str] = {}
    levels = {v: lv for v in c.variants if (lv := ca.levels_table(c.runs.get(v) or [])) is not None
              and "output_throughput_tok_s" in lv}
    if levels:
        fig = cp.plot_throughput_by_variant(levels, {v: len(c.runs.get(v) or []) for v in levels})
        save_figure(fig, out / "figures" / FIG_THROUGHPUT)
        figs[FIG_THROUGHPUT] = f"figures/{FIG_THROUGHPUT}"
    cats = ca.category_table(c)
    if not cats.empty:
        steps = {v: ca._mean([ca.step_ms(r) for r in c.runs[v]]) for v in cats.columns}
        n = {v: c.runs[v][0].ctx.totals.get("n_decode_steps") for v in cats.columns}
        shown = cats.rename(index=figure_text)  # a `$` in a category name would start mathtext
        save_figure(cp.plot_category_by_variant(shown, steps, n), out / "figures" / FIG_CATEGORIES)
        figs[FIG_CATEGORIES] = f"figures/{FIG_CATEGORIES}"
    return figs


def build_campaign_report(campaign_dir: str | Path) -> dict[str, Any]:
    """Write campaign_report.md and .html into the campaign folder; return their paths and the
    headline's sentences (`headline`)."""
    campaign_dir = Path(campaign_dir)
    c = ca.load_campaign(campaign_dir)
    figs = make_figures(c, campaign_dir)
    text, headline = render(c, figs)
    md = campaign_dir / "campaign_report.md"
    md.write_text(scrub(text))
    html = campaign_dir / "campaign_report.html"
    html.write_text(scrub(markdown_to_html(scrub(text), campaign_dir, f"stepscope campaign {c.record.campaign_id}")))
    return {"markdown": md, "html": html, "figures": figs, "headline": [scrub(x) for x in headline]}
