"""Interactive step explorer: pick a rank, a step and a category; see its table and timeline.

The first render reads stage 05's saved artifacts only, so the notebook stays cheap under papermill;
another rank or step loads its events through stage 05's own loader and cache (same attribution).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stepscope.report.artifacts import load_run_artifacts
from stepscope.trace.plots import plot_decode_step_timeline
from stepscope.wording import fmt_num, html_text, step_label

WINDOW_ROWS = 25
"""Events listed under the timeline: the first ones in the time window."""
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


def window_events(events: pd.DataFrame, lo_us: float, hi_us: float, n: int = WINDOW_ROWS) -> pd.DataFrame:
    """The events that overlap [lo_us, hi_us] (µs since the step's first event), in start order:
    start, duration, lane, category and name, at most `n` rows."""
    cols = [c for c in ("start_us", "dur_us", "stream", "category", "name") if c in events]
    if events is None or not len(events):
        return pd.DataFrame(columns=cols)
    start = events["start_us"].astype(float) - float(events["start_us"].min())
    inside = (start <= hi_us) & (start + events["dur_us"].astype(float) >= lo_us)
    out = events.assign(start_us=start)[inside].sort_values("start_us", kind="stable")
    return out[cols].head(n).reset_index(drop=True)


def step_span_us(events: pd.DataFrame | None) -> float:
    """First start to last end of a step's events, µs (0 without events)."""
    if events is None or not len(events):
        return 0.0
    start = events["start_us"].astype(float)
    return float((start + events["dur_us"].astype(float)).max() - start.min())


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
    """True in a batch run, where a widget reaches no one (and once hung the run): an IPython shell with
    no kernel, or a kernel the runner started for papermill."""
    from stepscope.runfolder import batch_run

    if batch_run():
        return True
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    sh = get_ipython()
    return sh is not None and getattr(sh, "kernel", None) is None


def _note(text: str) -> Any:
    from IPython.display import HTML

    return HTML(f"<p><b>Step explorer:</b> {text}</p>")


def step_explorer(run_dir: str | Path, extra_rules: tuple = ()) -> Any:
    """An ipywidgets explorer for the run's steps, or a one-line note when there is nothing
    to explore (stage 05 not run) or ipywidgets is missing."""
    if _batch_shell():
        return _note("interactive, so not built in this batch run (no one to click it). Open this notebook with "
                     f"<code>stepscope lab {html_text(run_dir)}</code> and run this cell to use it.")
    ex = StepExplorer(run_dir, extra_rules)
    if not ex.available:
        return _note("not available: stage 05 (05_categorize/steps.csv, timeline_rank0_step.csv) has not been "
                     "run for this run folder.")
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return _note("needs ipywidgets (pip install ipywidgets).")
    return _ExplorerWidget(ex).box


class _ExplorerWidget:
    """The widgets and their wiring: rank, step kind, step (slider, or a typed id), category,
    and the timeline's time window."""

    def __init__(self, ex: StepExplorer):
        import ipywidgets as w

        self.ex = ex
        rank0, step0 = ex.default_selection()
        steps0 = ex.step_ids(rank0) or [step0]
        self.rank = w.Dropdown(options=ex.ranks(), value=rank0, description="rank")
        self.kind = w.Dropdown(options=["decode", "prefill", "mixed", "all"], value="decode", description="steps")
        self.step = w.SelectionSlider(options=steps0, value=step0 if step0 in steps0 else steps0[0],
                                      description="step", continuous_update=False,
                                      layout=w.Layout(width="420px"))
        self.goto = w.IntText(value=self.step.value, description="go to step", continuous_update=False,
                              layout=w.Layout(width="180px"))
        self.cat = w.Dropdown(options=["(all)"], value="(all)", description="category")
        self.window = w.FloatRangeSlider(value=(0.0, 1.0), min=0.0, max=1.0, step=0.1, description="window µs",
                                         continuous_update=False, readout_format=",.1f",
                                         layout=w.Layout(width="600px"))
        self.out, self.plot = w.Output(), w.Output()
        self.events: pd.DataFrame | None = None
        self._busy = False
        self.rank.observe(self.on_rank_or_kind, "value")
        self.kind.observe(self.on_rank_or_kind, "value")
        self.step.observe(self.render, "value")
        self.goto.observe(self.on_goto, "value")
        self.cat.observe(self.render, "value")
        self.window.observe(self.draw, "value")
        self.box = w.VBox([w.HBox([self.rank, self.kind, self.cat]), w.HBox([self.step, self.goto]), self.out,
                           self.window, self.plot])
        self.render()

    @contextlib.contextmanager
    def _quiet(self):
        """Set widget values without their observers redrawing (the caller draws once, after)."""
        self._busy = True
        try:
            yield
        finally:
            self._busy = False

    def on_rank_or_kind(self, *_) -> None:
        ids = self.ex.step_ids(self.rank.value, self.kind.value) or [0]
        with self._quiet():
            self.step.options, self.step.value = ids, ids[len(ids) // 2]
        self.render()

    def on_goto(self, *_) -> None:
        """A typed step id: that step, or the nearest one of the chosen kind."""
        if self._busy:
            return
        nearest = min(self.step.options, key=lambda s: abs(s - self.goto.value))
        if nearest != self.step.value:
            self.step.value = nearest  # renders, and shows the id in the box
        elif nearest != self.goto.value:
            with self._quiet():
                self.goto.value = nearest

    def render(self, *_) -> None:
        """The chosen step: its category table, the chosen category's top names, the timeline."""
        from IPython.display import HTML, display

        from stepscope.notebook import table_html

        if self._busy:
            return
        ex, rank, step = self.ex, self.rank.value, self.step.value
        with self._quiet():
            self.goto.value = step
        ev = self.events = ex.step_events(rank, step)
        with self.out:
            self.out.clear_output(wait=True)
            if ev is None or not len(ev):
                display(HTML(f"<p>No device events for rank {rank}, step {step}. "
                             + html_text("; ".join(ex.notes[-1:])) + "</p>"))
                self.plot.clear_output()
                return
            cats = ["(all)"] + sorted(ev["category"].astype(str).unique())
            if list(self.cat.options) != cats:
                with self._quiet():
                    self.cat.options, self.cat.value = cats, self.cat.value if self.cat.value in cats else "(all)"
            display(HTML(table_html(step_category_table(ev))))
            if self.cat.value != "(all)":
                display(HTML(f"<b>{html_text(self.cat.value)}</b>: top kernels in this step"
                             + table_html(category_top_names(ev, self.cat.value))))
        span = max(step_span_us(ev), 1.0)
        with self._quiet():
            self.window.max, self.window.step = span, max(span / 1000.0, 0.01)
            self.window.value = (0.0, span)
        self.draw()

    def draw(self, *_) -> None:
        """The timeline of the window, and the events in it (what a hover would name)."""
        from IPython.display import HTML, Image, display

        from stepscope.notebook import table_html

        ev = self.events
        if self._busy:
            return
        with self.plot:
            self.plot.clear_output(wait=True)
            if ev is None or not len(ev):
                return
            lo, hi = self.window.value
            chosen = None if self.cat.value == "(all)" else self.cat.value
            fig = plot_decode_step_timeline(ev, title_note=f"(rank {self.rank.value}, step {self.step.value})",
                                            highlight=chosen, lane=self.ex.lane, step_label=step_label(self.kind.value))
            fig.axes[0].set_xlim(lo, hi if hi > lo else lo + 1.0)
            display(Image(data=_png(fig)))
            import matplotlib.pyplot as plt

            plt.close(fig)
            rows = window_events(ev, lo, hi)
            display(HTML(f"<b>In the window {fmt_num(lo)}–{fmt_num(hi)} µs</b> (first {WINDOW_ROWS} {self.ex.lane} events)"
                         + table_html(rows)))
