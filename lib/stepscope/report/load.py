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
from stepscope.thresholds import LOAD_GAP_SHARE, LOAD_LEVER_SHIFT
from stepscope.wording import md_text

SECTION_TITLE = "The step under load: anatomy against batch size"



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
    if lv.busy_share is not None and lv.busy_share < LOAD_GAP_SHARE:
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
    return (f"**{md_text(cat)}** grows fastest with the batch: {f.slope_ms_per_request:.4f} ± {f.slope_se_ms:.4f} ms per "
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
                         ("band", "noise band (± tok/s)"), ("agrees", "within the band")], md_columns=("agrees",))


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


def section_load(run_dir: str | Path, levels: pd.DataFrame | None, figure_md: str | None = None,
                 growth: "LoadGrowth | None" = None, micro: list | None = None) -> str:
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
    if growth is not None:
        text += "\n### The plateau, step by step\n\n" + " ".join(growth_sentences(growth)) + "\n"
    return text + micro_curve_section(micro or [])




@dataclass(frozen=True)
class LevelAnatomy:
    """One captured level's decode steps, as the plateau finding reads them."""

    concurrency: int
    period_ms: float | None
    category_ms: dict[str, float]
    """ms per decode step by category, mean over the level's decode steps."""
    server: dict = field(default_factory=dict)
    """The sweep level's /metrics at this concurrency (level_server_view)."""

    def ceiling_x(self, category: str) -> float | None:
        """Amdahl: the decode step's speed-up were this category's time zero (period / rest)."""
        ms, p = self.category_ms.get(category), self.period_ms
        return p / (p - ms) if ms is not None and p and p > ms else None


@dataclass(frozen=True)
class LoadGrowth:
    """What the step does between the levels either side of the knee (or the lowest and highest
    captured): the category that grows, its ms there, the server's state, the levers' ceilings."""

    category: str | None
    slope_ms_per_request: float | None
    slope_se_ms: float | None
    below: LevelAnatomy
    above: LevelAnatomy
    knee_concurrency: int | None
    shifted_levers: tuple[tuple[str, float, float], ...] = ()
    """(category, share of the period below, above) for shares that moved by LOAD_LEVER_SHIFT or more."""


def _level_anatomy(run_dir, table: pd.DataFrame, c: int) -> LevelAnatomy:
    t = table[(table["concurrency"] == c) & (table["step_kind"] == "decode")]
    n = t.drop_duplicates("decode_requests").set_index("decode_requests")["n_steps"]
    w = t["decode_requests"].map(n) / n.sum() if len(n) else t["n_steps"]
    cats = (t["ms_per_step"] * w).groupby(t["category"]).sum().to_dict()
    g = t.drop_duplicates("decode_requests")
    period = float((g["period_ms"] * g["n_steps"]).sum() / g["n_steps"].sum()) if len(g) else None
    return LevelAnatomy(c, period, {k: float(v) for k, v in cats.items()}, level_server_view(run_dir, c))


def load_growth(run_dir, knee_concurrency: int | None) -> LoadGrowth | None:
    """The plateau's reading from the load anatomy; None without two captured decode levels."""
    got = read_load(run_dir)
    if got is None:
        return None
    table, summary = got
    levels = sorted(set(table.loc[table["step_kind"] == "decode", "concurrency"].astype(int)))
    if len(levels) < 2:
        return None
    lo, hi = levels[0], levels[-1]
    if knee_concurrency is not None:
        lo = max([c for c in levels if c <= knee_concurrency], default=lo)
        hi = min([c for c in levels if c > lo], default=hi)
    below, above = _level_anatomy(run_dir, table, lo), _level_anatomy(run_dir, table, hi)
    fit = next((f for f in summary.fits if f.category == summary.fastest_category), None)
    shifted = []
    for cat in sorted(set(below.category_ms) | set(above.category_ms)):
        a = below.category_ms.get(cat, 0.0) / below.period_ms if below.period_ms else None
        b = above.category_ms.get(cat, 0.0) / above.period_ms if above.period_ms else None
        if a and b and max(a, b) / min(a, b) >= LOAD_LEVER_SHIFT and max(a, b) >= 0.05:
            shifted.append((cat, a, b))
    return LoadGrowth(summary.fastest_category, fit.slope_ms_per_request if fit else None,
                      fit.slope_se_ms if fit else None, below, above, knee_concurrency, tuple(shifted))


def growth_sentences(g: LoadGrowth) -> list[str]:
    """The plateau finding in words, every number from `g`."""
    lo, hi = g.below, g.above
    where = (f"either side of the knee at concurrency {g.knee_concurrency}" if g.knee_concurrency is not None
             else "at the lowest and highest captured levels")
    out = [f"The decode step's period goes from {lo.period_ms:.2f} ms at c={lo.concurrency} to "
           f"{hi.period_ms:.2f} ms at c={hi.concurrency} ({where})."]
    if g.category is not None:
        out.append(f"The category that grows fastest with the batch is **{md_text(g.category)}** "
                   f"({g.slope_ms_per_request:.4f} ± {g.slope_se_ms:.4f} ms per decode request): "
                   f"{lo.category_ms.get(g.category, 0.0):.3f} ms per step at c={lo.concurrency}, "
                   f"{hi.category_ms.get(g.category, 0.0):.3f} ms at c={hi.concurrency}; removing it would speed "
                   f"the step up at most {_x(lo.ceiling_x(g.category))} at c={lo.concurrency} and "
                   f"{_x(hi.ceiling_x(g.category))} at c={hi.concurrency}.")
    else:
        out.append("No category's growth with the batch clears its spread, so none is named as the one "
                   "that takes the step there.")
    for c, s in ((lo.concurrency, lo.server), (hi.concurrency, hi.server)):
        if s:
            out.append(f"At c={c} the server reported at most {_g(s.get('running_max'))} requests running, "
                       f"{_g(s.get('waiting_max'))} waiting, KV cache {_pct(s.get('kv_cache_usage_max'))} used, "
                       f"{_g(s.get('preemptions'))} preemptions.")
    for cat, a, b in g.shifted_levers:
        size = "large at the lower level and small at the higher" if a > b else "small at the lower level and large at the higher"
        out.append(f"{cat} is a lever whose size depends on the batch: {a:.0%} of the period at "
                   f"c={lo.concurrency}, {b:.0%} at c={hi.concurrency} ({size}).")
    return out


def _whole(v) -> str:
    return "–" if v is None or pd.isna(v) else str(int(v))


def _x(v: float | None) -> str:
    return f"{v:.2f}×" if v is not None else "–"


def _g(v: float | None) -> str:
    return f"{v:g}" if v is not None else "–"


def _pct(v: float | None) -> str:
    return f"{100 * v:.1f} %" if v is not None else "–"


def compare_load(run_a, run_b) -> pd.DataFrame | None:
    """Per captured concurrency both runs hold: ms per decode step by category (mean over the
    level's decode steps) and the decode period, A against B with the noise band of
    `report.noise.make_delta` (one run per side: the fixed relative band). None unless both
    runs captured load levels."""
    got_a, got_b = read_load(run_a), read_load(run_b)
    if got_a is None or got_b is None:
        return None
    ta, tb = got_a[0], got_b[0]
    both = sorted(set(ta["concurrency"].astype(int)) & set(tb["concurrency"].astype(int)))
    rows = []
    for c in both:
        la_, lb_ = _level_anatomy(run_a, ta, c), _level_anatomy(run_b, tb, c)
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

SCALED_WITH_BATCH = ("attention", "kv_cache_write")
"""Categories scaled from the batch-1 trace by the batch (each request reads its own KV cache
and writes its own new entry; the sweep's context length is the same at every level)."""


@dataclass(frozen=True)
class MicroPoint:
    """The decode step predicted at one sweep concurrency from the micro-benchmarks, before any
    load trace: stage 02's GEMM time at that M, stage 03's all-reduces at that M (or at batch 1
    when the burst was timed there only), attention and KV writes from the batch-1 trace times
    M, and the rest of the batch-1 period held constant."""

    concurrency: int
    gemm_ms: float | None
    comm_ms: float | None
    comm_from_batch: int | None
    """The batch the all-reduce burst was timed at (1 when only batch 1 was timed)."""
    attention_kv_ms: float
    rest_ms: float
    step_ms: float | None
    predicted_tok_s: float | None
    """concurrency / step: every request in flight decodes one token per step."""
    measured_tok_s: float | None


def _interp(curve: dict[str, float], m: int) -> float | None:
    import numpy as np

    pts = sorted((int(k), float(v)) for k, v in curve.items() if v is not None)
    if not pts:
        return None
    xs, ys = zip(*pts)
    return float(np.interp(m, xs, ys))  # clamped at the grid's edges, as stage 02's own sum is


def micro_curve(gemm: schema.GemmPrediction | None, comm: schema.CommPrediction | None,
                decode: pd.DataFrame | None, levels: pd.DataFrame | None) -> list[MicroPoint]:
    """One MicroPoint per closed-loop sweep level; [] without the batch-1 trace's categories."""
    from stepscope.palette import COMMUNICATION_CATEGORIES, GEMM_CATEGORIES

    if decode is None or decode.empty or levels is None or "share_of_period" not in decode:
        return []
    ms = dict(zip(decode["category"], decode["union_ms_mean"].astype(float)))
    shares = decode["share_of_period"].astype(float)
    period = float((decode["union_ms_mean"] / shares)[shares > 0].median()) if (shares > 0).any() else None
    if not period:
        return []
    attn1 = sum(ms.get(c, 0.0) for c in SCALED_WITH_BATCH)
    replaced = set(SCALED_WITH_BATCH) | GEMM_CATEGORIES | COMMUNICATION_CATEGORIES
    rest = period - sum(v for c, v in ms.items() if c in replaced)
    by_batch = {int(k): v.comm_us_per_decode_step for k, v in (comm.by_batch if comm else {}).items()}
    lv = levels[levels["mode"] == "concurrency"].sort_values("concurrency")
    out = []
    for c, tok in zip(lv["concurrency"].astype(int), lv["output_throughput_tok_s"]):
        g = _interp(gemm.gemm_us_per_decode_step, c) if gemm else None
        at = max([b for b in by_batch if b <= c], default=None)
        cm = by_batch[at] / 1e3 if at is not None and by_batch[at] is not None else None
        step = None if g is None or cm is None else rest + g / 1e3 + cm + attn1 * c
        out.append(MicroPoint(c, g / 1e3 if g is not None else None, cm, at, attn1 * c, rest, step,
                              1e3 * c / step if step else None, None if pd.isna(tok) else float(tok)))
    return out


def micro_curve_section(points: list[MicroPoint]) -> str:
    """The micro-predicted curve beside the measured one, as a table with its method."""
    from stepscope.report.markdown_util import md_table

    if not points:
        return ""
    df = pd.DataFrame([p.__dict__ for p in points])
    note = ""
    if any(p.comm_from_batch is not None and p.comm_from_batch < p.concurrency for p in points):
        note = ("\n*The all-reduce burst was timed at a smaller batch than some levels (`comm from batch`); "
                "its time is held there, which assumes latency-bound all-reduces (true for small messages, "
                "not for large ones). Set `micro.collectives.burst_batch_sizes` to the sweep's concurrencies.*\n")
    return ("\n### Micro-benchmarks against the whole sweep\n\nBefore any load trace: the decode step at each "
            "sweep concurrency M predicted as stage 02's GEMM time at M + stage 03's all-reduces at M + the "
            "batch-1 trace's attention and KV writes × M + the rest of the batch-1 period unchanged; "
            "throughput = M / step.\n\n"
            + md_table(df.astype({"comm_from_batch": "Int64"}), [("concurrency", "concurrency"), ("gemm_ms", "GEMM (ms)"), ("comm_ms", "all-reduce (ms)"),
                            ("comm_from_batch", "comm from batch"), ("attention_kv_ms", "attention + KV (ms)"),
                            ("rest_ms", "rest (ms)"), ("step_ms", "step (ms)"),
                            ("predicted_tok_s", "micro-predicted (tok/s)"), ("measured_tok_s", "measured (tok/s)")],
                       formats={"concurrency": _whole, "comm_from_batch": _whole})
            + note)
