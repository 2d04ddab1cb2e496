"""Interactive step explorer: pick a rank, a step and a category; see its table and timeline.

The first render uses stage 05's saved artifacts only (steps.csv and the representative
step in timeline_rank0_step.csv), so running the notebook under papermill is cheap and
keeps the executed notebook small. Choosing another rank or step loads that rank's events
lazily through stage 05's own loader and Parquet cache (the same code, so the same
categories and step attribution as the report).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stepscope.report.artifacts import load_run_artifacts
from stepscope.trace.plots import plot_decode_step_timeline
from stepscope.wording import html_text, step_label

EXPLORER_DPI = 72
"""Low resolution keeps each rendered timeline around 30 kB in a saved notebook."""
TOP_NAMES = 8


def _union_us(starts: np.ndarray, ends: np.ndarray) -> float:
    from stepscope.trace.account import union_length

    return float(union_length(starts, ends))


def step_category_table(events: pd.DataFrame) -> pd.DataFrame:
    """Per category within one step: calls, summed µs, busy (union) µs and share of the span."""
    if events is None or not len(events):
        return pd.DataFrame(columns=["category", "calls", "sum_us", "union_us", "share_of_span_pct"])
    start = events["start_us"].to_numpy(float)
    end = start + events["dur_us"].to_numpy(float)
    span = float(end.max() - start.min()) or 1.0
    rows = []
    for cat, g in events.groupby("category"):
        s = g["start_us"].to_numpy(float)
        rows.append({"category": cat, "calls": int(len(g)), "sum_us": float(g["dur_us"].sum()),
                     "union_us": _union_us(s, s + g["dur_us"].to_numpy(float))})
    df = pd.DataFrame(rows)
    df["share_of_span_pct"] = 100.0 * df["union_us"] / span
    return df.sort_values("union_us", ascending=False).reset_index(drop=True)


def category_top_names(events: pd.DataFrame, category: str, n: int = TOP_NAMES) -> pd.DataFrame:
    g = events[events["category"] == category]
    if not len(g) or "name" not in g:
        return pd.DataFrame(columns=["name", "calls", "sum_us"])
    out = g.groupby("name")["dur_us"].agg(calls="count", sum_us="sum").sort_values("sum_us", ascending=False)
    return out.head(n).reset_index()


class StepExplorer:
    """Data behind the widget: steps per rank, and each step's device events on demand."""

    def __init__(self, run_dir: str | Path, extra_rules: tuple = ()):
        self.run_dir = Path(run_dir)
        a = load_run_artifacts(self.run_dir)
        self.steps = a.steps
        self.timeline = a.timeline
        self.extra_rules = extra_rules
        self.files: dict[int, Path] = {}
        for r in a.ranks:
            self.files[r.rank] = Path(r.file)
        for f in a.manifest.files if a.manifest is not None else []:
            if f.rank is not None and f.kind == "trace":
                p = Path(f.path)
                self.files.setdefault(f.rank, p if p.is_absolute() else self.run_dir / "04_profiler_capture" / p)
        self.lane = "thread" if a.ranks and a.ranks[0].mode == "cpu" else "stream"
        self._work: dict[int, pd.DataFrame] = {}
        self.notes: list[str] = []

    @property
    def available(self) -> bool:
        return self.steps is not None or self.timeline is not None

    def ranks(self) -> list[int]:
        if self.steps is not None and "rank" in self.steps:
            return sorted(int(r) for r in self.steps["rank"].unique())
        if self.timeline is not None and "rank" in self.timeline:
            return sorted(int(r) for r in self.timeline["rank"].unique())
        return [0]

    def step_ids(self, rank: int, label: str = "decode") -> list[int]:
        st = self.steps
        if st is None or "step_id" not in st:
            if self.timeline is not None and "step_id" in self.timeline:
                return sorted(int(s) for s in self.timeline["step_id"].unique())
            return [0]
        st = st[st["rank"] == rank] if "rank" in st else st
        if "n_events" in st:
            st = st[st["n_events"] > 0]
        if label != "all" and "label" in st:
            st = st[st["label"].astype(str) == label]
        return [int(s) for s in st["step_id"]]

    def default_selection(self) -> tuple[int, int]:
        """The representative step stage 05 saved (no trace loading needed to show it)."""
        tl = self.timeline
        if tl is not None and {"rank", "step_id"} <= set(tl.columns) and len(tl):
            return int(tl["rank"].iloc[0]), int(tl["step_id"].iloc[0])
        ranks = self.ranks()
        ids = self.step_ids(ranks[0])
        return ranks[0], (ids[len(ids) // 2] if ids else 0)

    def step_events(self, rank: int, step_id: int) -> pd.DataFrame | None:
        tl = self.timeline
        if tl is not None and {"rank", "step_id"} <= set(tl.columns):
            hit = tl[(tl["rank"] == rank) & (tl["step_id"] == step_id)]
            if len(hit):
                return hit.reset_index(drop=True)
        work = self._rank_work(rank)
        if work is None:
            return None
        w = work[work["step_id"] == step_id]
        if not len(w):
            return w
        return w.assign(start_us=w["start_us"] - w["start_us"].min()).reset_index(drop=True)

    def _rank_work(self, rank: int) -> pd.DataFrame | None:
        if rank in self._work:
            return self._work[rank]
        path = self.files.get(rank)
        if path is None or not path.exists():
            self.notes.append(f"rank {rank}: its trace file is not reachable from here "
                              f"({path or 'not listed'}); only the saved representative step can be shown")
            self._work[rank] = None
            return None
        from stepscope.trace.analyze import analyze_rank
        from stepscope.trace.categorize import make_rules
        from stepscope.trace.load import load_rank

        rt = load_rank(path, rank=rank, cache_dir=self.run_dir / "05_categorize" / "cache")
        self._work[rank] = analyze_rank(rt, make_rules(self.extra_rules), consume=True).work
        return self._work[rank]


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=EXPLORER_DPI)
    return buf.getvalue()


def _batch_shell() -> bool:
    """True in a batch run, where a widget reaches no one: an IPython shell with no kernel
    behind it (`stepscope analyze` runs the notebook cells in-process), or a kernel the runner
    started for papermill (`runfolder.batch_run`; a widget cell there was seen to hang the run).
    Plain Python (tests, scripts) and JupyterLab's kernels build the widget."""
    from stepscope.runfolder import batch_run

    if batch_run():
        return True
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    sh = get_ipython()
    return sh is not None and getattr(sh, "kernel", None) is None


def step_explorer(run_dir: str | Path, extra_rules: tuple = ()) -> Any:
    """An ipywidgets explorer for the run's steps, or a one-line note when there is nothing
    to explore (stage 05 not run) or ipywidgets is missing."""
    from IPython.display import HTML, Image, display

    if _batch_shell():
        return HTML("<p><b>Step explorer:</b> interactive, so not built in this batch run (no one to "
                    "click it). Open this notebook with <code>stepscope lab "
                    f"{html_text(run_dir)}</code> and run this cell to use it.</p>")
    ex = StepExplorer(run_dir, extra_rules)
    if not ex.available:
        return HTML("<p><b>Step explorer:</b> not available: stage 05 (05_categorize/steps.csv, "
                    "timeline_rank0_step.csv) has not been run for this run folder.</p>")
    try:
        import ipywidgets as w
    except ImportError:
        return HTML("<p><b>Step explorer:</b> needs ipywidgets (pip install ipywidgets).</p>")

    rank0, step0 = ex.default_selection()
    rank_dd = w.Dropdown(options=ex.ranks(), value=rank0, description="rank")
    kind_dd = w.Dropdown(options=["decode", "prefill", "mixed", "all"], value="decode", description="steps")
    steps0 = ex.step_ids(rank0) or [step0]
    step_dd = w.Dropdown(options=steps0, value=step0 if step0 in steps0 else steps0[0], description="step")
    cat_dd = w.Dropdown(options=["(all)"], value="(all)", description="category")
    out = w.Output()

    def render(*_):
        with out:
            out.clear_output(wait=True)
            ev = ex.step_events(rank_dd.value, step_dd.value)
            if ev is None or not len(ev):
                display(HTML(f"<p>No device events for rank {rank_dd.value}, step {step_dd.value}. "
                             + html_text("; ".join(ex.notes[-1:])) + "</p>"))
                return
            cats = ["(all)"] + sorted(ev["category"].astype(str).unique())
            if list(cat_dd.options) != cats:
                keep = cat_dd.value if cat_dd.value in cats else "(all)"
                cat_dd.unobserve(render, "value")
                cat_dd.options, cat_dd.value = cats, keep
                cat_dd.observe(render, "value")
            chosen = None if cat_dd.value == "(all)" else cat_dd.value
            tab = step_category_table(ev)
            display(HTML(tab.to_html(index=False, float_format=lambda v: f"{v:,.1f}")))
            if chosen:
                display(HTML(f"<b>{html_text(chosen)}</b>: top kernels in this step"
                             + category_top_names(ev, chosen).to_html(index=False,
                                                                      float_format=lambda v: f"{v:,.1f}")))
            fig = plot_decode_step_timeline(ev, title_note=f"(rank {rank_dd.value}, step {step_dd.value})",
                                            highlight=chosen, lane=ex.lane, step_label=step_label(kind_dd.value))
            display(Image(data=_png(fig)))

    def on_rank_or_kind(*_):
        ids = ex.step_ids(rank_dd.value, kind_dd.value) or [0]
        step_dd.unobserve(render, "value")
        step_dd.options = ids
        step_dd.value = ids[len(ids) // 2]
        step_dd.observe(render, "value")
        render()

    rank_dd.observe(on_rank_or_kind, "value")
    kind_dd.observe(on_rank_or_kind, "value")
    step_dd.observe(render, "value")
    cat_dd.observe(render, "value")
    render()
    return w.VBox([w.HBox([rank_dd, kind_dd, step_dd, cat_dd]), out])
