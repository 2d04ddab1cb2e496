"""The report's step under load: trace-predicted beside measured throughput at each captured
concurrency, the anatomy figure, the per-category fits, and why a prediction misses.

Reads `05_categorize/load_anatomy.{csv,json}`, `01_macro_sweep/levels.csv` and
`01_macro_sweep/server_metrics.csv`; computes nothing stage 05 already wrote.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from stepscope import schema
from stepscope.report.noise import make_delta

SECTION_TITLE = "The step under load: anatomy against batch size"

GAP_SHARE = 0.9
"""Below this busy share of the period, the gaps between and inside steps are named."""


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


def read_load(run_dir: str | Path) -> tuple[pd.DataFrame, schema.LoadAnatomySummary] | None:
    """load_anatomy.csv and .json, or None when stage 05 captured no load level."""
    d = Path(run_dir) / "05_categorize"
    csv, js = d / "load_anatomy.csv", d / "load_anatomy.json"
    if not (csv.is_file() and js.is_file()):
        return None
    table = schema.check_frame(pd.read_csv(csv), schema.LoadAnatomyRow, str(csv))
    return table, schema.read(js, schema.LoadAnatomySummary)


def level_server_view(run_dir: str | Path, concurrency: int) -> dict:
    """The sweep level's /metrics at this concurrency: most requests waiting, most KV in use,
    preemptions over the level (01_macro_sweep/server_metrics.csv); empty when not scraped."""
    path = Path(run_dir) / "01_macro_sweep" / "server_metrics.csv"
    if not path.is_file():
        return {}
    sm = pd.read_csv(path)
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


def explain(lv: schema.LoadLevel, server: dict, client_bound: bool | None) -> list[str]:
    """Why the trace's throughput and the sweep's may differ, from what the data show."""
    out = []
    if lv.n_steps and lv.n_mixed_steps:
        out.append(f"{lv.n_mixed_steps} of the window's {lv.n_steps} steps were mixed (prefill chunks "
                   "beside decodes): a request that ends is replaced, and its prefill shares a step")
    if lv.busy_share is not None and lv.busy_share < GAP_SHARE:
        out.append(f"the steps' work covered {lv.busy_share:.0%} of their periods: the rest is gaps between "
                   "and inside steps (host scheduling, the API process)")
    if lv.decode_requests_mean is not None and lv.decode_requests_mean < 0.9 * lv.concurrency:
        out.append(f"the steps decoded {lv.decode_requests_mean:.1f} requests on average, fewer than the "
                   f"{lv.concurrency} in flight")
    if server.get("waiting_max"):
        out.append(f"requests queued at the scheduler during the sweep level (up to {server['waiting_max']:g} waiting)")
    if server.get("preemptions"):
        out.append(f"{server['preemptions']:g} preemptions during the sweep level (KV cache full)")
    if client_bound:
        out.append("the sweep's client used most of a core at this level: it may have been the bottleneck")
    if lv.capture_output_tok_s is not None and lv.measured_output_tok_s:
        out.append(f"the capture's own client saw {lv.capture_output_tok_s:.0f} tok/s over the profiled window, "
                   "under the profiler's overhead")
    return out


def compare_levels(run_dir: str | Path, summary: schema.LoadAnatomySummary,
                   levels: pd.DataFrame | None) -> list[LoadComparison]:
    """Each captured level's trace-predicted tok/s beside the sweep's, judged within the noise band
    (`report.noise.make_delta`: one run per side, so the fixed relative band)."""
    bound = {}
    if levels is not None and {"concurrency", "client_bound"} <= set(levels.columns):
        bound = {int(c): bool(b) for c, b in zip(levels["concurrency"].fillna(0), levels["client_bound"].fillna(False))}
    out = []
    for lv in summary.levels:
        d = make_delta("trace", "output tok/s", f"c={lv.concurrency}",
                       [lv.measured_output_tok_s] if lv.measured_output_tok_s is not None else [],
                       [lv.predicted_output_tok_s] if lv.predicted_output_tok_s is not None else [], True)
        agrees = None if d.delta is None else not d.real
        why = [] if agrees in (True, None) else explain(lv, level_server_view(run_dir, lv.concurrency),
                                                         bound.get(lv.concurrency))
        out.append(LoadComparison(lv.concurrency, lv.predicted_output_tok_s, lv.measured_output_tok_s,
                                  lv.capture_output_tok_s, d.band, d.band_source, agrees, lv.decode_requests_mean,
                                  lv.n_mixed_steps / lv.n_steps if lv.n_steps else None, why))
    return out


def fastest_sentence(summary: schema.LoadAnatomySummary) -> str:
    """The fit's reading in one sentence, rendered from the typed fits."""
    fits = {f.category: f for f in summary.fits}
    cat = summary.fastest_category
    if cat is None or cat not in fits:
        return ("No category's ms per decode step grows with the batch beyond twice its slope's standard "
                "error over the captured levels.")
    f = fits[cat]
    return (f"**{cat}** grows fastest with the batch: {f.slope_ms_per_request:.4f} ± {f.slope_se_ms:.4f} ms per "
            f"decode request (least squares over {f.n_steps} decode steps at {f.n_batches} batch sizes), "
            f"{f.ms_at_batch_min:.3f} ms per step at batch {f.batch_min} and {f.ms_at_batch_max:.3f} ms at "
            f"batch {f.batch_max}.")


def _comparison_table(rows: list[LoadComparison]) -> str:
    from stepscope.report.markdown_util import md_table

    df = pd.DataFrame([{"concurrency": r.concurrency, "decode_requests_mean": r.decode_requests_mean,
                        "mixed_share": r.mixed_share, "predicted": r.predicted_tok_s, "measured": r.measured_tok_s,
                        "capture": r.capture_tok_s, "band": r.band_tok_s,
                        "agrees": {True: "yes", False: "**no**", None: "–"}[r.agrees]} for r in rows])
    return md_table(df, [("concurrency", "concurrency"), ("decode_requests_mean", "decode requests per step (mean)"),
                         ("mixed_share", "mixed steps (share)"), ("predicted", "trace: tokens / period (tok/s)"),
                         ("measured", "sweep: measured (tok/s)"), ("capture", "capture client, window (tok/s)"),
                         ("band", "noise band (± tok/s)"), ("agrees", "within the band")])


def _fits_table(summary: schema.LoadAnatomySummary) -> str:
    from stepscope.report.markdown_util import md_table

    df = pd.DataFrame([{"category": f.category, "slope": f.slope_ms_per_request, "se": f.slope_se_ms,
                        "a": f.intercept_ms, "lo": f.ms_at_batch_min, "hi": f.ms_at_batch_max,
                        "batches": f"{f.batch_min}–{f.batch_max}"} for f in summary.fits])
    if df.empty:
        return ""
    return md_table(df, [("category", "category"), ("slope", "slope (ms per decode request)"), ("se", "± standard error"),
                         ("a", "intercept (ms)"), ("lo", "ms at smallest batch"), ("hi", "ms at largest batch"),
                         ("batches", "batch sizes")])


def section_load(run_dir: str | Path, levels: pd.DataFrame | None, figure_md: str | None = None) -> str:
    """The report's section on the step under load; '' when stage 05 captured no load level."""
    got = read_load(run_dir)
    if got is None:
        return ""
    _, summary = got
    rows = compare_levels(run_dir, summary, levels)
    text = f"## {SECTION_TITLE}\n\n"
    text += ("Stage 04 profiled a bounded window of engine steps at each captured concurrency while that many "
             "requests were in flight (`capture.concurrency`); stage 05 grouped the steps by what each one "
             "processed, from the engine's own step annotations. The trace's throughput is the tokens its "
             "decode and mixed steps generated over the summed step periods; the sweep's is measured "
             "client-side over a whole level.\n\n")
    text += _comparison_table(rows)
    for r in rows:
        if r.agrees is False:
            text += (f"\n*c={r.concurrency}: the trace predicts {r.predicted_tok_s:.0f} tok/s against "
                     f"{r.measured_tok_s:.0f} measured, beyond the band ({r.band_source}).*"
                     + ("" if not r.explanations else " What the data show: " + "; ".join(r.explanations) + ".")
                     + "\n")
    if figure_md:
        text += "\n" + figure_md + "\n"
    text += "\n" + fastest_sentence(summary) + "\n\n" + _fits_table(summary)
    for note in summary.notes:
        text += f"\n*{note}*\n"
    return text
