"""Compare two runs side by side: baseline A against variant B.

Typical use: another all-reduce backend, or speculative decoding switched on. Each table
shows A, B, B − A and B / A, and flags the rows whose change is beyond noise.

Noise criterion (stated in the report too), the regression gate's and the campaign's
(`report.noise`): a per-category decode time is beyond noise when |B − A| exceeds
`NOISE_BAND_SIGMAS` standard errors of the difference of the two means, each from its
step-to-step spread ((p90 − median) / 1.28 over √steps); a single number without a spread
(one sweep level, a step reading) when |B / A − 1| > `NOISE_REL` (5 %), above the
few-percent run-to-run scatter of a serving benchmark. The table beside the gate and the gate
therefore agree. (Until 2026-12-01 a category had to move by more than the step-to-step
spread itself, so an all-reduce 3.4x slower over 183 steps read "within noise" while the
gate failed on it.)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stepscope.report.load import compare_load
from stepscope.report import analysis as an
from stepscope.report import figures as fg
from stepscope.report import verdict as vd
from stepscope.report.artifacts import RunArtifacts, load_run_artifacts, num
from stepscope.report.noise import make_delta, step_spread_se
from stepscope.report.markdown_util import code_names, fmt_num, markdown_to_html, md_table, missing_box
from stepscope.palette import category_sort_key, color_for
from stepscope.thresholds import BUNCHED_FLAG_SHARE, CHANGE_NOISE_REL, NOISE_BAND_SIGMAS, STALLED_LEVEL_SHARE
from stepscope.trace.account import KERNELS_PER_CATEGORY
from stepscope.wording import capture_delivery

NOISE_REL = CHANGE_NOISE_REL  # one threshold for "beyond noise" (stepscope.thresholds)

MACRO_METRICS = ("output_throughput_tok_s", "goodput_tok_s", "total_throughput_tok_s", "request_throughput_rps",
                 "goodput_rps",
                 "ttft_ms_median", "ttft_ms_p99", "tpot_ms_median", "tpot_ms_p99", "itl_ms_median",
                 "e2el_ms_median")


def _diff_ratio(df: pd.DataFrame) -> pd.DataFrame:
    """`df` (columns a, b) with B − A and B / A."""
    a = pd.to_numeric(df["a"], errors="coerce")
    b = pd.to_numeric(df["b"], errors="coerce")
    df = df.copy()
    df["diff"] = b - a
    df["ratio_b_over_a"] = np.where((a != 0) & a.notna(), b / a.where(a != 0, np.nan), np.nan)
    return df


def _with_diff(df: pd.DataFrame) -> pd.DataFrame:
    """B − A, B / A and the beyond-noise flag of a single number without a spread: |B/A − 1| >
    NOISE_REL (make_delta's fixed band, in ratio form)."""
    df = _diff_ratio(df)
    a, b = pd.to_numeric(df["a"], errors="coerce"), pd.to_numeric(df["b"], errors="coerce")
    beyond = (df["ratio_b_over_a"] - 1.0).abs() > NOISE_REL
    # A quantity present in one run only is a change by definition.
    beyond |= a.isna() != b.isna()
    if "not_comparable" in df:  # readings that measure different things are no change either way
        beyond &= df["not_comparable"].isna()
    df["beyond_noise"] = beyond.astype(bool)
    return df


def compare_macro(a: RunArtifacts, b: RunArtifacts) -> pd.DataFrame | None:
    """Per sweep level and metric: A, B, difference, ratio, beyond-noise flag."""
    if a.levels is None or b.levels is None:
        return None
    keys = [k for k in ("mode", "concurrency", "request_rate") if k in a.levels and k in b.levels]
    la, lb = a.levels.copy(), b.levels.copy()
    for df in (la, lb):
        for k in keys:
            df[k] = df[k].astype(str)
        for share in ("bunched_chunk_share", "stall_share"):
            if share not in df:  # older folders: both sides get the column, so it is suffixed
                df[share] = np.nan
    rows = []
    merged = la.merge(lb, on=keys, how="outer", suffixes=("_a", "_b"))
    other_slo = _other_slo(a, b)
    for _, r in merged.iterrows():
        stalled, bunched = _stalled(r), _bunched(r)
        for m in MACRO_METRICS:
            if m.startswith("goodput") and pd.isna(r.get(f"{m}_a")) and pd.isna(r.get(f"{m}_b")):
                continue  # neither run set an SLO
            if f"{m}_a" in merged or f"{m}_b" in merged:
                why = stalled or (bunched if m in DELIVERY_METRICS else None) or (other_slo if m.startswith("goodput") else None)
                rows.append({"level": _level_label(r, keys), "metric": m, "a": r.get(f"{m}_a"),
                             "b": r.get(f"{m}_b"), "not_comparable": why})
    return _with_diff(pd.DataFrame(rows)) if rows else None


def _other_slo(a: RunArtifacts, b: RunArtifacts) -> str | None:
    """Why goodput is not compared: the two runs counted it under different SLOs."""
    sa, sb = ((x.sweep_summary.slo.bounds_ms if x.sweep_summary is not None and x.sweep_summary.slo else None)
              for x in (a, b))
    return None if sa == sb else f"the runs' SLOs differ (A {sa or 'none'}, B {sb or 'none'})"


DELIVERY_METRICS = frozenset({"ttft_ms_median", "ttft_ms_p99", "tpot_ms_median", "tpot_ms_p99", "itl_ms_median"})
"""Per-token latencies that measure delivery, not decode, at a level whose chunks arrived bunched."""


def _runs_above(r: pd.Series, share: str, limit: float) -> list[tuple[str, float]]:
    """("A" or "B", value) for each run of a merged row whose `share` column exceeds `limit`."""
    return [(run, float(r[col])) for run, col in (("A", f"{share}_a"), ("B", f"{share}_b"))
            if pd.notna(r.get(col)) and float(r[col]) > limit]


def _bunched(r: pd.Series) -> str | None:
    """Why a merged level's latencies are not compared: a run's chunks bunched beyond the sweep's flag."""
    runs = [run for run, _ in _runs_above(r, "bunched_chunk_share", BUNCHED_FLAG_SHARE)]
    return f"{' and '.join(runs)} delivered in bursts (chunks bunched)" if runs else None


def _stalled(r: pd.Series) -> str | None:
    """Why none of a merged level's readings are compared: server-wide stalls took more than
    STALLED_LEVEL_SHARE of a run's level (its throughput reads low, its latencies carry the pauses)."""
    runs = [f"{run} ({100 * x:.0f} %)" for run, x in _runs_above(r, "stall_share", STALLED_LEVEL_SHARE)]
    return f"{' and '.join(runs)} lost that share of the level to server-wide stalls" if runs else None


def _level_label(r: pd.Series, keys: list[str]) -> str:
    rate = r.get("request_rate")
    if str(r.get("mode")) == "ramp":  # neither one concurrency nor one rate: its level name says it
        return str(r.get("level_a") if pd.notna(r.get("level_a")) else r.get("level_b"))
    if str(r.get("mode", "concurrency")).startswith("conc") or rate in (None, "inf", "nan"):
        return f"c={r.get('concurrency')}".replace(".0", "")
    return f"rate={rate} req/s"


def compare_headlines(a: RunArtifacts, b: RunArtifacts) -> pd.DataFrame:
    ha, hb = an.macro_headlines(a), an.macro_headlines(b)
    ta, tb = an.decode_step_totals(a), an.decode_step_totals(b)
    c1 = _bunched(pd.Series({"bunched_chunk_share_a": ha.get("c1_bunched_share"),
                             "bunched_chunk_share_b": hb.get("c1_bunched_share")}))
    capture = "; ".join(f"{name}'s capture TPOT measures delivery, not decode: {capture_delivery(x.capture_latency)}"
                        for name, x in (("A", a), ("B", b)) if an.capture_tpot_is_delivery(x)) or None
    plateau = _stalled(pd.Series({"stall_share_a": ha.get("plateau_stall_share"),
                                  "stall_share_b": hb.get("plateau_stall_share")}))
    rows = [{"metric": k, "a": num(ha.get(k)), "b": num(hb.get(k)),
             "not_comparable": c1 if k.startswith("c1_") else plateau}
            for k in ("knee_concurrency", "plateau_output_tok_s", "c1_tpot_ms_median", "c1_ttft_ms_median")]
    rows += [{"metric": f"decode {k}", "a": ta.get(k), "b": tb.get(k),
              "not_comparable": capture if k == "tpot_capture_ms" else None}
             for k in ("kernel_sum_ms", "union_ms", "span_ms", "tpot_capture_ms")]
    df = pd.DataFrame(rows)
    df = df[df["a"].notna() | df["b"].notna()]
    return _with_diff(df)


def compare_decode_categories(a: RunArtifacts, b: RunArtifacts) -> pd.DataFrame | None:
    """Per category: ms per decode step (mean) in A and B, judged with the regression gate's
    band (`report.noise.make_delta`: the step-to-step spread's standard error of each mean)."""
    ta, tb = an.decode_step_totals(a), an.decode_step_totals(b)
    da, db = an.decode_category_table(a, ta), an.decode_category_table(b, tb)
    if da is None or db is None:
        return None

    def prep(d: pd.DataFrame, n_steps) -> pd.DataFrame:
        out = d[["category", "ms_per_step_mean"]].copy()
        out["se"] = [step_spread_se(num(m), num(p), int(n_steps) if n_steps else None)
                     for m, p in zip(d["ms_per_step_median"], d["ms_per_step_p90"])]
        out["calls"] = d["calls_per_step"]
        return out

    m = prep(da, ta.get("n_decode_steps")).merge(prep(db, tb.get("n_decode_steps")), on="category", how="outer",
                                                 suffixes=("_a", "_b"))
    m = _diff_ratio(m.rename(columns={"ms_per_step_mean_a": "a", "ms_per_step_mean_b": "b"}))
    # A category one run lacks is 0 ms there, known exactly (as in the campaign's deltas).
    deltas = [make_delta("B", "category_ms_per_step", c, [0.0 if pd.isna(x) else x], [0.0 if pd.isna(y) else y],
                         False, (0.0 if pd.isna(x) else num(sa), 0.0 if pd.isna(y) else num(sb)))
              for c, x, y, sa, sb in zip(m["category"], m["a"], m["b"], m["se_a"], m["se_b"])]
    m["band"], m["band_from"] = [d.band for d in deltas], [d.band_source for d in deltas]
    m["beyond_noise"] = [d.real for d in deltas]
    return m.sort_values("category", key=lambda s: s.map(category_sort_key)).reset_index(drop=True)


KERNEL_CATEGORIES_COMPARED = 4
KERNELS_COMPARED = 4


def _fully_listed(k: pd.DataFrame, other: pd.DataFrame) -> set[str]:
    """Categories whose every kernel is in `k` (under the cap), or that did not run at all."""
    return set(k.loc[k["n_names"] <= KERNELS_PER_CATEGORY, "category"]) | (set(other["category"]) - set(k["category"]))


def compare_kernels(a: RunArtifacts, b: RunArtifacts) -> pd.DataFrame | None:
    """The largest kernels of the categories that take the most time in either run: summed ms
    per step in A and B. A kernel that ran in one run only reads 0 in the other (`A only`,
    `B only`): another backend or fusion shows up as names coming and going."""
    ka, kb = a.category_kernels, b.category_kernels
    if ka is None or kb is None:
        return None
    cols = ["category", "name", "sum_ms_per_step"]
    m = ka[cols].merge(kb[cols], on=["category", "name"], how="outer", suffixes=("_a", "_b"))
    m = m.rename(columns={"sum_ms_per_step_a": "a", "sum_ms_per_step_b": "b"})
    complete_a, complete_b = _fully_listed(ka, kb), _fully_listed(kb, ka)
    only_b, only_a = m["a"].isna(), m["b"].isna()
    m["presence"] = np.select([only_b, only_a], ["B only", "A only"], "both")
    m.loc[only_b & m["category"].isin(complete_a), "a"] = 0.0
    m.loc[only_a & m["category"].isin(complete_b), "b"] = 0.0
    unknown = m["a"].isna() | m["b"].isna()
    m.loc[unknown, "presence"] = np.where(m.loc[unknown, "a"].isna(), f"below A's top {KERNELS_PER_CATEGORY}",
                                          f"below B's top {KERNELS_PER_CATEGORY}")
    totals = m.groupby("category")[["a", "b"]].sum().max(axis=1)
    top = list(totals.nlargest(KERNEL_CATEGORIES_COMPARED).index)
    m = m[m["category"].isin(top)].assign(
        order=lambda d: d["category"].map({c: i for i, c in enumerate(top)}),
        change=lambda d: (d["b"].fillna(0) - d["a"].fillna(0)).abs())
    m = m.sort_values(["order", "change"], ascending=[True, False], kind="stable")
    m = m.groupby("category", sort=False).head(KERNELS_COMPARED)
    out = _with_diff(m[["category", "name", "a", "b", "presence"]].reset_index(drop=True))
    out.loc[out["presence"].str.endswith("only"), "beyond_noise"] = True  # came or went: a change
    out.loc[out["presence"].str.startswith("below"), "beyond_noise"] = False  # unknown, not changed
    return out


def _collectives_per_step(x: RunArtifacts) -> dict[str, float]:
    """Stage 05's medians over decode steps, on the reference (first) rank."""
    if not x.ranks:
        return {}
    return {k: float(v) for k, v in x.ranks[0].collectives_per_decode_step.items() if num(v) is not None}


def compare_collectives(a: RunArtifacts, b: RunArtifacts) -> pd.DataFrame | None:
    ca, cb = _collectives_per_step(a), _collectives_per_step(b)
    if not ca and not cb:
        return None
    rows = [{"collective": k, "a": ca.get(k), "b": cb.get(k)} for k in dict.fromkeys(list(ca) + list(cb))]
    return _with_diff(pd.DataFrame(rows))


def plot_category_comparison(cats: pd.DataFrame, name_a: str, name_b: str, step_label: str = "decode step"):
    """Paired horizontal bars: ms per step per category, A (hatched) against B."""
    df = cats.iloc[::-1]
    fig, ax = fg._new(8.5, max(2.8, 0.45 * len(df) + 1.4))
    y = np.arange(len(df))
    colors = [color_for(c) for c in df["category"]]
    ax.barh(y + 0.2, pd.to_numeric(df["a"], errors="coerce").fillna(0), 0.4, color=colors, alpha=0.45,
            hatch="//", edgecolor="black", linewidth=0.3, label=f"A: {name_a}")
    ax.barh(y - 0.2, pd.to_numeric(df["b"], errors="coerce").fillna(0), 0.4, color=colors,
            edgecolor="black", linewidth=0.3, label=f"B: {name_b}")
    ax.set_yticks(y, df["category"])
    ax.set_xlabel(f"ms per {step_label} (mean over {step_label}s)")
    ax.set_title(f"Category time per {step_label}, A against B")
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    return fig


def _fmt_table(df: pd.DataFrame, first: list[tuple[str, str]]) -> str:
    d = df.copy()
    d["ratio_txt"] = d["ratio_b_over_a"].map(lambda v: f"{v:.3f}×" if v is not None and math.isfinite(v) else "–")
    why = d["not_comparable"] if "not_comparable" in d else pd.Series(None, index=d.index, dtype=object)
    d["flag"] = [f"not compared: {w}" if isinstance(w, str) else ("**changed**" if v else "no")
                 for v, w in zip(d["beyond_noise"], why)]
    return md_table(d, first + [("a", "A"), ("b", "B"), ("diff", "B − A"), ("ratio_txt", "B / A"),
                                ("band", "noise band ±"), ("band_from", "band from"), ("flag", "beyond noise?")])


def _kernels_section(kernels: pd.DataFrame | None, step: str) -> str:
    text = f"## The largest kernels of the largest categories (summed ms per {step})\n\n"
    if kernels is None or not len(kernels):
        return text + ("Not compared: `05_categorize/category_kernels.csv` is missing in one run (written by "
                       "stepscope since its kernel tables; run stage 05 again).\n\n")
    k = kernels.assign(name=code_names(kernels["name"]))
    text += (f"Up to {KERNELS_COMPARED} kernels (ops on a CPU trace) of the {KERNEL_CATEGORIES_COMPARED} categories "
             f"with the most time in either run, largest change first. A kernel that ran in one run only reads 0 "
             f"in the other: another backend or a fusion shows as names coming and going.\n\n")
    return text + _fmt_table(k, [("category", "category"), ("name", "kernel"), ("presence", "ran in")]) + "\n"


def _lacking(a: RunArtifacts, b: RunArtifacts, attr: str, file: str, name_a: str, name_b: str) -> list[str]:
    """The file a comparison needs, naming the run(s) that lack it."""
    missing = [f"A `{name_a}`" for x in (a,) if getattr(x, attr, None) is None]
    missing += [f"B `{name_b}`" for x in (b,) if getattr(x, attr, None) is None]
    return [f"{file} (missing in {' and '.join(missing) or 'neither run, but unreadable'})"]


def _engine(x: RunArtifacts) -> str | None:
    if x.server is None:
        return None
    return f"{x.server.engine} {x.server.engine_version or '(version unknown)'}"


def _same_setup_note(a: RunArtifacts, b: RunArtifacts) -> str:
    """An A/A comparison calibrates the bands: with the same params on the same engine, whatever
    comes out 'changed' is run-to-run variation that one run's step spread does not cover."""
    engine = _engine(a)
    setup_a, setup_b = ({k: v for k, v in (x.params or {}).items() if k != "run"} for x in (a, b))
    if not setup_a or setup_a != setup_b or engine is None or engine != _engine(b):
        return ""  # the run section only names the run and where it is written
    return (f"> **A and B ran identical params on the same engine ({engine}).** If nothing else changed "
            "between them, every change listed below is run-to-run variation on this machine, which the bands "
            f"(one run's step-to-step spread, or a fixed {100 * NOISE_REL:g} %) do not cover; repeats (`stepscope "
            "campaign --repeats N`) give bands that do.\n\n")


def _load_changes(load: pd.DataFrame | None) -> list[str]:
    if load is None:
        return []
    return [f"{r['quantity']} at c={r['concurrency']} (load capture): {fmt_num(r['a'])} → {fmt_num(r['b'])} ms"
            for _, r in load[load["beyond_noise"]].iterrows()]


def load_section(load: pd.DataFrame | None) -> str:
    """The step under load, A against B per captured concurrency; '' unless both captured load levels."""
    if load is None or load.empty:
        return ""
    return ("## The step under load, per captured concurrency (ms)\n\n"
            "Each run's load captures (`capture.concurrency`) at the concurrencies both hold: the mean ms per "
            "decode step of each category and the decode period (stage 05's `load_anatomy.csv`).\n\n"
            + _fmt_table(load, [("concurrency", "concurrency"), ("quantity", "quantity")]) + "\n")


def compare_runs(run_a: str | Path, run_b: str | Path, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Write compare.md and compare.html for baseline A against variant B; return their paths.

    `out_dir` defaults to `<run_b>/06_writeup/compare_vs_<run_a name>/`.
    """
    a, b = load_run_artifacts(run_a), load_run_artifacts(run_b)
    ident_a, ident_b = vd.trace_identity(a), vd.trace_identity(b)
    kind_a, kind_b, step = ident_a.kind, ident_b.kind, ident_a.step_label
    name_a = a.run.run_id if a.run is not None else a.run_dir.name
    name_b = b.run.run_id if b.run is not None else b.run_dir.name
    out = Path(out_dir) if out_dir else b.run_dir / "06_writeup" / f"compare_vs_{a.run_dir.name}"
    out.mkdir(parents=True, exist_ok=True)
    tables = {"headlines": compare_headlines(a, b), "macro": compare_macro(a, b),
              "decode_categories": compare_decode_categories(a, b), "collectives": compare_collectives(a, b),
              "kernels": compare_kernels(a, b), "load": compare_load(a.run_dir, b.run_dir)}
    text = (f"# Run comparison: A `{name_a}` against B `{name_b}`\n\n"
            f"Differences are B − A; ratios B / A. **Noise criterion** (the regression gate's): a per-category "
            f"time changes when |B − A| exceeds {fmt_num(NOISE_BAND_SIGMAS)} standard errors of the difference of "
            f"the two means (each from its step-to-step spread, (p90 − median)/1.28 over √steps); a single number "
            f"without a spread when |B/A − 1| > {100 * NOISE_REL:g} %. Each row states its band. Quantities present "
            f"in one run only are flagged.\n\n")
    if "unknown" not in (kind_a, kind_b) and kind_a != kind_b:
        text += (f"> **⚠ Different kinds of trace:** A is a {kind_a} trace and B a {kind_b} trace, so their "
                 f"per-step figures measure different work; they are set side by side, not compared.\n\n")
    text += _same_setup_note(a, b)
    changed = _load_changes(tables["load"])  # the load captures' changes, per concurrency, first
    n_macro_changed = 0
    for key, df in tables.items():
        if key in ("kernels", "load"):
            continue  # kernels: their categories are listed; load: listed already, per concurrency
        if key == "macro" and df is not None:
            # Per-level rows would drown the list; count them here, they are all in the table below.
            n_macro_changed = int(df["beyond_noise"].sum())
            continue
        if df is not None and len(df):
            label_col = {"headlines": "metric", "macro": "metric", "decode_categories": "category",
                         "collectives": "collective"}[key]
            for _, r in df[df["beyond_noise"]].iterrows():
                lvl = f" at {r['level']}" if key == "macro" else ""
                changed.append(f"{r[label_col]}{lvl}: {fmt_num(r['a'])} → {fmt_num(r['b'])}"
                               + (f" ({r['ratio_b_over_a']:.3f}×)" if pd.notna(r["ratio_b_over_a"]) else ""))
    if n_macro_changed:
        changed.append(f"macro sweep: {n_macro_changed} of {len(tables['macro'])} per-level metrics "
                       f"(see the last table)")
    text += "## Changes beyond noise\n\n" + ("\n".join(f"- {c}" for c in changed) if changed
                                             else "None: every compared quantity is within noise.") + "\n\n"
    text += "## Headline numbers\n\n" + _fmt_table(tables["headlines"], [("metric", "metric")]) + "\n"
    text += f"## Per-category time per {step} (ms)\n\n"
    dc = tables["decode_categories"]
    if dc is not None:
        text += _fmt_table(dc, [("category", "category")])
        fig = plot_category_comparison(dc, name_a, name_b, step)
        fg.save_figure(fig, out / "compare_decode_category_ms_per_step.png")
        text += f"\n![category time per {step}, A against B](compare_decode_category_ms_per_step.png)\n\n"
    else:
        text += missing_box("Per-category comparison",
                            _lacking(a, b, "decode_categories", "05_categorize/decode_categories.csv",
                                     name_a, name_b)) + "\n"
    text += _kernels_section(tables["kernels"], step)
    text += f"## Collectives per {step}\n\n"
    cc = tables["collectives"]
    text += (_fmt_table(cc, [("collective", "collective")]) if cc is not None
             else missing_box("Collective counts", _lacking(a, b, "trace_summary", "05_categorize/summary.json",
                                                           name_a, name_b))) + "\n"
    text += load_section(tables["load"]) + "## Macro sweep, per level\n\n"
    mc = tables["macro"]
    text += (_fmt_table(mc, [("level", "level"), ("metric", "metric")]) if mc is not None
             else missing_box("Sweep comparison", _lacking(a, b, "levels", "01_macro_sweep/levels.csv",
                                                          name_a, name_b))) + "\n"
    md_path = out / "compare.md"
    md_path.write_text(text)
    html_path = out / "compare.html"
    html_path.write_text(markdown_to_html(text, out, f"stepscope compare: {name_a} vs {name_b}"))
    result: dict[str, Any] = {"markdown": md_path, "html": html_path}
    for key, df in tables.items():
        if df is not None:
            p = out / f"compare_{key}.csv"
            df.to_csv(p, index=False)
            result[f"csv_{key}"] = p
    return result
