"""Compare two runs side by side, baseline A against variant B: `report.deltas`' judgements laid out
as tables (docs/campaigns.md)."""

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
from stepscope.report.deltas import (MACRO_METRICS, VERDICT_FIELDS, bunched_reason, run_deltas, same_setup,
                                     stalled_reason, verdict_changes, verdict_fields)
from stepscope.report.noise import Delta
from stepscope.report.setups import SetupComparison, compare_setups, is_communication, setting_names, setup_table_rows
from stepscope.redaction import scrub
from stepscope.report.markdown_util import code_names, markdown_to_html, md_table, missing_box
from stepscope.palette import category_sort_key, color_for
from stepscope.thresholds import CHANGE_NOISE_REL, NOISE_BAND_SIGMAS
from stepscope.wording import Md, figure_text, fmt_num, md_code, md_text
from stepscope.trace.account import KERNELS_PER_CATEGORY

NOISE_REL = CHANGE_NOISE_REL  # one threshold for "beyond noise" (stepscope.thresholds)

def _diff_ratio(df: pd.DataFrame) -> pd.DataFrame:
    """`df` (columns a, b) with B − A and B / A."""
    a = pd.to_numeric(df["a"], errors="coerce")
    b = pd.to_numeric(df["b"], errors="coerce")
    df = df.copy()
    df["diff"] = b - a
    df["ratio_b_over_a"] = np.where((a != 0) & a.notna(), b / a.where(a != 0, np.nan), np.nan)
    return df


def _with_diff(df: pd.DataFrame) -> pd.DataFrame:
    """B − A, B / A and |B/A − 1| > NOISE_REL, for the rows the engine does not carry (kernels, collectives)."""
    df = _diff_ratio(df)
    a, b = pd.to_numeric(df["a"], errors="coerce"), pd.to_numeric(df["b"], errors="coerce")
    beyond = (df["ratio_b_over_a"] - 1.0).abs() > NOISE_REL
    beyond |= a.isna() != b.isna()  # present in one run only: flagged, as "only in A/B" (`label_rows`)
    if "not_comparable" in df:  # readings that measure different things are no change either way
        beyond &= df["not_comparable"].isna()
    df["beyond_noise"] = beyond.astype(bool)
    return df


def _delta_rows(ds: list[Delta], label: str) -> pd.DataFrame:
    """The engine's deltas as compare's table: B − A, B / A, band and judgement as the engine made them."""
    rows = [{label: d.where if label == "level" else d.metric, "metric": d.metric, "a": d.baseline, "b": d.value,
             "not_comparable": d.not_comparable, "reason": d.reason, "unit": d.unit, "band": d.band,
             "band_from": d.band_source, "beyond_noise": d.real, "judgement": d.judgement} for d in ds]
    return _diff_ratio(pd.DataFrame(rows))


def compare_deltas(a: RunArtifacts, b: RunArtifacts) -> list[Delta]:
    """The one engine's deltas of B against A (`report.deltas.run_deltas`)."""
    return run_deltas("B", [a], [b], base_name="A")


def compare_macro(a: RunArtifacts, b: RunArtifacts, ds: list[Delta] | None = None) -> pd.DataFrame | None:
    """Per sweep level and metric: A, B, difference, ratio, beyond-noise flag (the engine's)."""
    if a.levels is None or b.levels is None:
        return None
    ds = compare_deltas(a, b) if ds is None else ds
    level = [d for d in ds if d.metric in MACRO_METRICS or d.metric == "stall_pct"]
    return _delta_rows(level, "level") if level else None


HEADLINE_TOTALS = {"decode_step_ms": "decode step_ms (step period)", "kernel_sum_ms": "decode kernel_sum_ms",
                   "union_ms": "decode union_ms", "span_ms": "decode span_ms",
                   "tpot_capture_ms": "decode tpot_capture_ms"}
"""The engine's step deltas the headline table shows, under their row names: the step period
(`decode_step_ms`, what shares divide by and TPOT measures) first, as it leads the table."""


def compare_headlines(a: RunArtifacts, b: RunArtifacts, ds: list[Delta] | None = None) -> pd.DataFrame:
    """The engine's deltas of the decode step (its period first, then its totals and the capture
    TPOT), then the sweep's headline numbers (knee, plateau, batch 1), judged by the engine's rules."""
    ha, hb = an.macro_headlines(a), an.macro_headlines(b)
    c1 = bunched_reason([("A", _finite(ha.get("c1_bunched_share"))), ("B", _finite(hb.get("c1_bunched_share")))], "c=1")
    plateau = stalled_reason([("A", _finite(ha.get("plateau_stall_share"))),
                              ("B", _finite(hb.get("plateau_stall_share")))], "plateau")
    rows = [{"metric": k, "a": num(ha.get(k)), "b": num(hb.get(k)),
             "not_comparable": c1 if k.startswith("c1_") else plateau}
            for k in ("knee_concurrency", "plateau_output_tok_s", "c1_tpot_ms_median", "c1_ttft_ms_median")]
    df = _with_diff(pd.DataFrame(rows))
    df = df[df["a"].notna() | df["b"].notna()]
    ds = compare_deltas(a, b) if ds is None else ds
    totals = _delta_rows([d for d in ds if d.metric in HEADLINE_TOTALS and (d.baseline, d.value) != (None, None)],
                         "metric")
    if len(totals):
        totals["metric"] = totals["metric"].map(HEADLINE_TOTALS)
        totals = totals.set_index("metric").loc[[m for m in HEADLINE_TOTALS.values() if m in set(totals["metric"])]]
        df = pd.concat([totals.reset_index(), df], ignore_index=True)
    return df.reset_index(drop=True)


def _finite(x) -> list[float]:
    x = num(x)
    return [float(x)] if x is not None and math.isfinite(x) else []


def compare_decode_categories(a: RunArtifacts, b: RunArtifacts, ds: list[Delta] | None = None) -> pd.DataFrame | None:
    """Per category: ms per decode step (mean) in A and B, judged by the engine (the regression
    gate's band, `report.noise.make_delta`: the step-to-step spread's standard error of each mean)."""
    ta, tb = an.decode_step_totals(a), an.decode_step_totals(b)
    da, db = an.decode_category_table(a, ta), an.decode_category_table(b, tb)
    if da is None or db is None:
        return None
    ds = compare_deltas(a, b) if ds is None else ds
    judged = {d.where: d for d in ds if d.metric == "category_ms_per_step"}
    calls = da[["category", "calls_per_step"]].merge(db[["category", "calls_per_step"]], on="category", how="outer",
                                                       suffixes=("_a", "_b"))
    m = _diff_ratio(calls.assign(a=calls["category"].map(lambda c: _present(da, c)),
                                 b=calls["category"].map(lambda c: _present(db, c))))
    m = m.rename(columns={"calls_per_step_a": "calls_a", "calls_per_step_b": "calls_b"})
    m["band"] = [judged[c].band for c in m["category"]]
    m["band_from"] = [judged[c].band_source for c in m["category"]]
    m["beyond_noise"] = [judged[c].real for c in m["category"]]
    m["judgement"] = [judged[c].judgement for c in m["category"]]
    return m.sort_values("category", key=lambda s: s.map(category_sort_key)).reset_index(drop=True)


def _present(d: pd.DataFrame, cat: str) -> float | None:
    """A category's mean ms per step in one run, None where it did not run (the table shows '–')."""
    sel = d.loc[d["category"] == cat, "ms_per_step_mean"]
    return float(sel.iloc[0]) if len(sel) else None


KERNEL_CATEGORIES_COMPARED = 4
KERNELS_COMPARED = 4


def _fully_listed(k: pd.DataFrame, other: pd.DataFrame) -> set[str]:
    """Categories whose every kernel is in `k` (under the cap), or that did not run at all."""
    return set(k.loc[k["n_names"] <= KERNELS_PER_CATEGORY, "category"]) | (set(other["category"]) - set(k["category"]))


def compare_kernels(a: RunArtifacts, b: RunArtifacts) -> pd.DataFrame | None:
    """The largest kernels of the costliest categories in either run, ms per step in A and B; one that ran
    in one run only reads 0 in the other (`A only`, `B only`)."""
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
    out.loc[out["presence"].str.endswith(" only"), "beyond_noise"] = True  # came or went: a change
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
            hatch="//", edgecolor="black", linewidth=0.3, label=f"A: {figure_text(name_a)}")
    ax.barh(y - 0.2, pd.to_numeric(df["b"], errors="coerce").fillna(0), 0.4, color=colors,
            edgecolor="black", linewidth=0.3, label=f"B: {figure_text(name_b)}")
    ax.set_yticks(y, [figure_text(c) for c in df["category"]])
    ax.set_xlabel(f"ms per {step_label} (mean over {step_label}s)")
    ax.set_title(f"Category time per {step_label}, A against B")
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    return fig


CHANGED, UNCHANGED = "changed", "no"
"""`flag` values of a judged row; the others say why a row is not judged as a change:
`not compared: …`, `different implementation: A …, B …`, `only in A`/`only in B`, `setup differs: …`."""


def _presence(df: pd.DataFrame) -> pd.Series:
    """`only in A`, `only in B` or '' per row: the table's own `presence` (kernels), else a reading
    that one run lacks."""
    if "presence" in df:  # kernels: `A only`, `B only` (the campaign report reads these too)
        return df["presence"].map({"A only": "only in A", "B only": "only in B"}).fillna("")
    a, b = pd.to_numeric(df["a"], errors="coerce"), pd.to_numeric(df["b"], errors="coerce")
    return pd.Series(np.select([a.isna() & b.notna(), b.isna() & a.notna()], ["only in B", "only in A"], ""),
                     index=df.index)


def label_rows(df: pd.DataFrame | None, setups: SetupComparison, communication: pd.Series | None = None,
               total: pd.Series | bool = False) -> pd.DataFrame | None:
    """`df` with each row's `flag` (the first of: `not compared: …`, `different implementation`,
    `only in A`/`only in B`, `setup differs: …`, `changed`, `no`) and `setup_change`."""
    if df is None:
        return None
    d = df.copy()
    comm = communication if communication is not None else pd.Series(False, index=d.index)
    totals = total if isinstance(total, pd.Series) else pd.Series(total, index=d.index)
    why = d["not_comparable"] if "not_comparable" in d else pd.Series(None, index=d.index, dtype=object)
    impl = setups.implementation_changed()
    flags, causes = [], []
    for i, presence in _presence(d).items():
        explaining = setups.explaining(bool(comm.loc[i]), bool(totals.loc[i]))
        if isinstance(why.loc[i], str):
            flag, cause = f"not compared: {why.loc[i]}", ""
        elif impl is not None and comm.loc[i]:
            flag, cause = f"different implementation: A {impl[0]}, B {impl[1]}", setting_names(["collectives"])
        elif presence:
            flag, cause = presence, ""
        elif d.loc[i, "beyond_noise"] and explaining:
            flag, cause = f"setup differs: {setting_names(explaining)}", setting_names(explaining)
        else:
            flag, cause = (CHANGED if d.loc[i, "beyond_noise"] else UNCHANGED), ""
        flags.append(flag)
        causes.append(cause)
    return d.assign(flag=flags, setup_change=causes)


def _flag_cell(flag: str) -> Md:
    return Md(f"**{CHANGED}**") if flag == CHANGED else md_text(flag)


def _fmt_table(df: pd.DataFrame, first: list[tuple[str, str]]) -> str:
    d = df.copy()
    d["ratio_txt"] = d["ratio_b_over_a"].map(lambda v: f"{fmt_num(v)}×" if v is not None and math.isfinite(v) else "–")
    d["flag"] = d["flag"].map(_flag_cell)
    return md_table(d, first + [("a", "A"), ("b", "B"), ("diff", "B − A"), ("ratio_txt", "B / A"),
                                ("band", "noise band ±"), ("band_from", "band from"), ("flag", "judgement")],
                    md_columns=("name", "flag"))


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


def _lacking(a: RunArtifacts, b: RunArtifacts, attr: str, file: str, name_a: str, name_b: str) -> list[Md]:
    """The file a comparison needs, naming the run(s) that lack it."""
    missing = [f"A {md_code(name_a)}" for x in (a,) if getattr(x, attr, None) is None]
    missing += [f"B {md_code(name_b)}" for x in (b,) if getattr(x, attr, None) is None]
    return [Md(f"{md_code(file)} (missing in {' and '.join(missing) or 'neither run, but unreadable'})")]


def _same_setup_note(a: RunArtifacts, b: RunArtifacts) -> str:
    """An A/A comparison calibrates the bands (`report.deltas.same_setup`): with the same params on
    the same engine, whatever comes out 'changed' is run-to-run variation one run's spread misses."""
    engine = same_setup(a, b)
    if engine is None:
        return ""  # the run section only names the run and where it is written
    return (f"> **A and B ran identical params on the same engine ({md_text(engine)}).** If nothing else changed "
            "between them, every change listed below is run-to-run variation on this machine, which the bands "
            f"(one run's step-to-step spread, or a fixed {100 * NOISE_REL:g} %) do not cover; repeats (`stepscope "
            "campaign --repeats N`) give bands that do.\n\n")


def load_section(load: pd.DataFrame | None) -> str:
    """The step under load, A against B per captured concurrency; '' unless both captured load levels."""
    if load is None or load.empty:
        return ""
    return ("## The step under load, per captured concurrency (ms)\n\n"
            "Each run's load captures (`capture.concurrency`) at the concurrencies both hold: the mean ms per "
            "decode step of each category and the decode period (stage 05's `load_anatomy.csv`).\n\n"
            + _fmt_table(load, [("concurrency", "concurrency"), ("quantity", "quantity")]) + "\n")


GROUPS = {"changed": "Changes beyond noise", "setup": "Differences that come with a setup difference",
          "only": "Quantities in one run only"}
"""compare's three lists of rows, by their `flag` (`label_rows`), under their headings."""


def _group(flag: str) -> str | None:
    if flag == CHANGED:
        return "changed"
    if flag.startswith(("different implementation", "setup differs")):
        return "setup"
    return "only" if flag.startswith("only in") else None


def _item(r: pd.Series, label: str, group: str, unit: str = "") -> str:
    if group == "only":
        side = r["b"] if r["flag"] == "only in B" else r["a"]
        return f"{label}: {md_text(r['flag'])} ({fmt_num(side)}{unit})"
    ratio = f" ({fmt_num(r['ratio_b_over_a'])}×)" if pd.notna(r["ratio_b_over_a"]) else ""
    said = f"; {md_text(r['flag'])}" if group == "setup" else ""
    return f"{label}: {fmt_num(r['a'])} → {fmt_num(r['b'])}{unit}{ratio}{said}"


def _changes(tables: dict[str, pd.DataFrame | None]) -> dict[str, list[str]]:
    """The bullet lists, by group (`GROUPS`): load captures per concurrency first, then each
    table's rows; the macro sweep's per-level rows only counted, the kernels left to their table."""
    out: dict[str, list[str]] = {g: [] for g in GROUPS}
    labels = {"load": "quantity", "headlines": "metric", "decode_categories": "category", "collectives": "collective"}
    for key in ("load", "headlines", "decode_categories", "collectives"):
        df = tables.get(key)
        for _, r in (df.iterrows() if df is not None else ()):
            group = _group(r["flag"])
            if group is not None:
                where = f" at c={md_text(r['concurrency'])} (load capture)" if key == "load" else ""
                out[group].append(_item(r, f"{md_text(r[labels[key]])}{where}", group, " ms" if key == "load" else ""))
    macro = tables.get("macro")
    if macro is not None:  # per-level rows would drown the lists; counted, all in the table below
        for group, n in macro["flag"].map(_group).value_counts().items():
            out[group].append(f"macro sweep: {n} of {len(macro)} per-level metrics (see the last table)")
    return out


def _changes_text(changes: dict[str, list[str]]) -> str:
    text = "## Changes beyond noise\n\n" + ("\n".join(f"- {c}" for c in changes["changed"]) if changes["changed"]
                                            else "None: every compared quantity is within noise.") + "\n\n"
    for group in ("setup", "only"):
        if changes[group]:
            text += f"## {GROUPS[group]}\n\n" + "\n".join(f"- {c}" for c in changes[group]) + "\n\n"
    return text


def result_line(tables: dict[str, pd.DataFrame | None], setups: SetupComparison) -> str:
    """The comparison in one console line: the step period, output tok/s at the highest level both
    runs measured, how many rows changed beyond noise, and the setup differences."""
    parts = []
    head = tables.get("headlines")
    step = head[head["metric"] == HEADLINE_TOTALS["decode_step_ms"]] if head is not None else head
    for label, rows, unit in (("decode step", step, " ms"), ("output tok/s", _top_level_tput(tables.get("macro")), "")):
        if rows is not None and len(rows) and pd.notna(rows.iloc[0]["a"]) and pd.notna(rows.iloc[0]["b"]):
            r = rows.iloc[0]
            where = f" at {r['level']}" if "level" in r else ""
            ratio = f" ({fmt_num(r['ratio_b_over_a'])}×)" if pd.notna(r["ratio_b_over_a"]) else ""
            parts.append(f"{label}{where} {fmt_num(r['a'])} → {fmt_num(r['b'])}{unit}{ratio}")
    flags = [df["flag"].map(_group) for key, df in tables.items() if df is not None and key != "kernels" and "flag" in df]
    n, of = sum(int(f.eq("changed").sum()) for f in flags), sum(len(f) for f in flags)
    said = (f"B vs A: {', '.join(parts) or 'no step period or sweep level in both'}; "
            f"{n} of {of} compared readings changed beyond noise")
    return said + (f"; the setups differ in {setting_names(setups.differing)}" if setups.differing else "")


def _top_level_tput(macro: pd.DataFrame | None) -> pd.DataFrame | None:
    """The output tok/s row of the last level both runs measured (the macro table's order)."""
    if macro is None:
        return None
    rows = macro[(macro["metric"] == "output_throughput_tok_s") & macro["a"].notna() & macro["b"].notna()]
    return rows.iloc[-1:]


def setup_section(setups: SetupComparison) -> str:
    """The setups side by side, what differs named first: the table every number below is read against."""
    differing = setups.differing
    said = (f"**The setups differ in {md_text(setting_names(differing))}.** A row such a difference explains says "
            "so (`different implementation`, `setup differs`) instead of being judged a change: its ratio compares "
            "other work, not the same work made faster or slower."
            if differing else "The setups agree in every setting both runs record.")
    return ("## The setups, A against B\n\n" + said + " A setting one run does not record, or that the two "
            "record in different files, reads `unknown`.\n\n"
            + md_table(pd.DataFrame(setup_table_rows(setups)), [("setting", "setting"), ("a", "A"), ("b", "B"),
                                                                ("status", "A against B")],
                       md_columns=("a", "b", "status")) + "\n")


def verdict_section(a: RunArtifacts, b: RunArtifacts, name_a: str, name_b: str) -> str:
    """Each run's findings from its `06_writeup/verdict.json`, side by side, with the named ones
    that changed (`report.deltas.verdict_changes`)."""
    text = "## The verdicts, A against B\n\n"
    if a.verdict is None or b.verdict is None:
        return text + missing_box("Verdict comparison", _lacking(a, b, "verdict", "06_writeup/verdict.json",
                                                                 name_a, name_b)) + "\n"
    fa, fb = verdict_fields(a.verdict), verdict_fields(b.verdict)
    rows = pd.DataFrame([{"finding": k, "a": fa[k], "b": fb[k]} for k in VERDICT_FIELDS])
    changes = verdict_changes(a.verdict, b.verdict)
    said = ("; ".join(f"{md_text(k)}: {md_text(fmt_num(x))} → {md_text(fmt_num(y))}" for k, x, y in changes) if changes
            else "the same dominant cost, biggest lever and caveat")
    return (text + f"Read from each run's `06_writeup/verdict.json` (stage 06). Changed: {said}.\n\n"
            + md_table(rows, [("finding", "finding"), ("a", "A"), ("b", "B")]) + "\n")


def compare_tables(a: RunArtifacts, b: RunArtifacts, setups: SetupComparison) -> dict[str, pd.DataFrame | None]:
    """Every table of the comparison, each row labelled against the setups (`label_rows`)."""
    ds = compare_deltas(a, b)  # the one engine's judgements, which every table below renders
    dc, kernels, load = compare_decode_categories(a, b, ds), compare_kernels(a, b), compare_load(a, b)

    def comm(df: pd.DataFrame | None, col: str) -> pd.Series | None:
        return df[col].map(is_communication) if df is not None else None

    return {"headlines": label_rows(compare_headlines(a, b, ds), setups, total=True),
            "macro": label_rows(compare_macro(a, b, ds), setups, total=True),
            "decode_categories": label_rows(dc, setups, comm(dc, "category")),
            "collectives": label_rows(compare_collectives(a, b), setups),
            "kernels": label_rows(kernels, setups, comm(kernels, "category")),
            "load": label_rows(load, setups, comm(load, "quantity"),
                               total=load["quantity"] == "decode period" if load is not None else False)}


def _intro(name_a: str, name_b: str) -> str:
    return (f"# Run comparison: A {md_code(name_a)} against B {md_code(name_b)}\n\n"
            f"The setups first, then the numbers. Differences are B − A; ratios B / A. **Noise criterion** (the "
            f"regression gate's): a per-category time changes when |B − A| exceeds {fmt_num(NOISE_BAND_SIGMAS)} "
            f"standard errors of the difference of the two means (each from its step-to-step spread, (p90 − "
            f"median)/1.28 over √steps); a single number without a spread when |B/A − 1| > {100 * NOISE_REL:g} %. "
            f"Each row states its band. A quantity present in one run only says so (`only in A`, `only in B`).\n\n")


def _tables_text(a: RunArtifacts, b: RunArtifacts, tables: dict, names: tuple[str, str], step: str, out: Path) -> str:
    name_a, name_b = names
    text = "## Headline numbers\n\n" + _fmt_table(tables["headlines"], [("metric", "metric")]) + "\n"
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
    return text + (_fmt_table(mc, [("level", "level"), ("metric", "metric")]) if mc is not None
                   else missing_box("Sweep comparison", _lacking(a, b, "levels", "01_macro_sweep/levels.csv",
                                                                name_a, name_b))) + "\n"


def compare_runs(run_a: str | Path, run_b: str | Path, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Write compare.md and .html for A against B (default `<run_b>/06_writeup/compare_vs_<run_a>/`)."""
    a, b = load_run_artifacts(run_a), load_run_artifacts(run_b)
    ident_a, ident_b = vd.trace_identity(a), vd.trace_identity(b)
    kind_a, kind_b, step = ident_a.kind, ident_b.kind, ident_a.step_label
    name_a = a.run.run_id if a.run is not None else a.run_dir.name
    name_b = b.run.run_id if b.run is not None else b.run_dir.name
    out = Path(out_dir) if out_dir else b.run_dir / "06_writeup" / f"compare_vs_{a.run_dir.name}"
    out.mkdir(parents=True, exist_ok=True)
    setups = compare_setups(a, b)
    tables = compare_tables(a, b, setups)
    text = _intro(name_a, name_b)
    if "unknown" not in (kind_a, kind_b) and kind_a != kind_b:
        text += (f"> **⚠ Different kinds of trace:** A is a {md_text(kind_a)} trace and B a {md_text(kind_b)} trace, so their "
                 f"per-step figures measure different work; they are set side by side, not compared.\n\n")
    text += setup_section(setups) + _same_setup_note(a, b) + _changes_text(_changes(tables))
    text += verdict_section(a, b, name_a, name_b) + _tables_text(a, b, tables, (name_a, name_b), step, out)
    md_path = out / "compare.md"
    md_path.write_text(scrub(text))
    html_path = out / "compare.html"
    html_path.write_text(scrub(markdown_to_html(scrub(text), out, f"stepscope compare: {name_a} vs {name_b}", figure_dirs=(out,))))
    result: dict[str, Any] = {"markdown": md_path, "html": html_path, "line": result_line(tables, setups)}
    for key, df in tables.items():
        if df is not None:
            p = out / f"compare_{key}.csv"
            df.to_csv(p, index=False)
            result[f"csv_{key}"] = p
    return result
