"""The step kinds side by side (stage 05's kind_categories.csv): each kind besides the judged one gets
its own reading (`kinds_apart`) and column, never averaged with the others.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from stepscope import schema
from stepscope.report.artifacts import RunArtifacts
from stepscope.schema.verdict import KindApart, KindCategory
from stepscope.wording import fmt_num, md_text, plural

KIND_TABLE = "05_categorize/kind_categories.csv"
"""Stage 05's per-kind table (`schema.KindCategoryRow`), relative to the run folder."""
TOP_PER_KIND = 2
"""Categories each other kind's verdict line names, largest first."""


def kind_table(run_dir: str | Path, rank: int | None) -> pd.DataFrame | None:
    """The per-kind rows of `rank` (every rank's when None), or None where stage 05 wrote none
    (older runs) or the file is empty."""
    p = Path(run_dir) / KIND_TABLE
    if not p.is_file() or not p.stat().st_size:
        return None
    df = schema.check_frame(pd.read_csv(p), schema.KindCategoryRow, str(p))
    df = df[df["rank"] == rank] if rank is not None else df
    return df if len(df) else None


def kinds_apart(table: pd.DataFrame | None, judged_kind: str | None) -> tuple[KindApart, ...]:
    """Every kind but the judged one, the most steps first: its largest categories and their
    shares of its own span. Empty with one kind only."""
    if table is None or table["kind"].nunique() < 2:
        return ()
    out = []
    for kind, g in _kinds_in_order(table, judged_kind):
        if kind == judged_kind:
            continue
        span = float(g["span_ms_mean"].iloc[0])
        top = g.sort_values("union_ms_mean", ascending=False, kind="stable").head(TOP_PER_KIND)
        out.append(KindApart(kind=str(kind), n_steps=int(g["n_steps"].iloc[0]), span_ms=span,
                             top=tuple(KindCategory(str(r.category), float(r.union_ms_mean),
                                                    100 * float(r.union_ms_mean) / span if span else None)
                                       for r in top.itertuples())))
    return tuple(out)


def _kinds_in_order(table: pd.DataFrame, judged_kind: str | None) -> list[tuple[str, pd.DataFrame]]:
    """(kind, its rows): the judged kind first, then by steps, most first."""
    groups = list(table.groupby("kind", sort=True))
    return sorted(groups, key=lambda kg: (kg[0] != judged_kind, -int(kg[1]["n_steps"].iloc[0])))


def judged_kind(a: RunArtifacts) -> str | None:
    """The step kind the per-step figures describe (stage 05's `trace_info.judged_kind`)."""
    info = a.trace_summary.trace_info if a.trace_summary is not None else None
    return info.judged_kind if info is not None else None


KINDS_HEADING = "Step kinds side by side (stage 05)"
"""The appendix's heading of the per-kind table (`kinds_appendix`), which `kinds_section` links."""


def kinds_section(table: pd.DataFrame | None, step_label: str) -> str:
    """The report's line on the other step kinds (`table`: `kind_table`'s rows): what the tables
    describe, and a link to the kinds side by side in the appendix; "" where the trace holds one kind of step."""
    from stepscope.report.appendix import appendix_link

    if table is None or table["kind"].nunique() < 2:
        return ""
    return (f"\nThis section and the verdict describe the {md_text(step_label)}s only (every step kind, side by side: "
            f"{appendix_link(KINDS_HEADING)}).\n")


def kinds_appendix(table: pd.DataFrame | None, judged: str | None, step_label: str) -> str:
    """The step kinds as columns of one table (ms per step over its own steps) under `KINDS_HEADING`;
    "" where the trace holds one kind."""
    from stepscope.report.appendix import appendix_table
    from stepscope.report.markdown_util import md_table

    if table is None or table["kind"].nunique() < 2:
        return ""
    kinds = _kinds_in_order(table, judged)
    cols = {kind: f"{md_text(kind)} ms/step ({fmt_num(int(g['n_steps'].iloc[0]))} {plural('step', int(g['n_steps'].iloc[0]))})"
            for kind, g in kinds}
    wide = table.pivot_table(index="category", columns="kind", values="union_ms_mean", aggfunc="first")
    order = wide.max(axis=1).sort_values(ascending=False, kind="stable").index
    # a kind that never ran a category: NaN, printed as a dash
    rows = [{"category": md_text(str(c)), **{cols[k]: float(wide.loc[c].get(k, float("nan"))) for k, _ in kinds}}
            for c in order]
    for name, col in (("**busy** (all categories)", "busy_ms_mean"), ("**span** (first to last work)", "span_ms_mean")):
        rows.append({"category": name, **{cols[k]: float(g[col].iloc[0]) for k, g in kinds}})
    lead = (f"Each column is one kind's own steps (ms per step, the category's busy time), never averaged with "
            f"another's; the report's tables and verdict describe the {md_text(step_label)}s only; a dash is a "
            "category the kind never ran.\n\n")
    return appendix_table(KINDS_HEADING, lead + md_table(pd.DataFrame(rows), [("category", "category")]
                                                         + [(c, c) for c in cols.values()], md_columns=("category",)))
