"""The figure defects issue 37 listed, each checked on the drawn figure through the renderer:
unique legend entries, tick labels apart, titles inside the figure, a latency axis that keeps
p50 readable beside p99, and heatmap text the page shows at its size."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg

from stepscope.config import WriteupParams
from stepscope.report import figures as fg
from stepscope.report.artifacts import load_run_artifacts
from stepscope.report.build import report_context
from stepscope.runfolder import FIGURE_DPI
from stepscope.sweep import plots as sp
from stepscope.testing.synthetic import make_synthetic_run
from stepscope.trace import plots as tp

REPORT_WIDTH_PX = 1100
"""The report page's width (markdown_util's CSS `max-width`): a wider figure is shrunk to it."""


def _renderer(fig):
    if not hasattr(fig.canvas, "get_renderer"):
        FigureCanvasAgg(fig)
    fig.draw_without_rendering()
    return fig.canvas.get_renderer()


def _inside(fig, artist) -> bool:
    box, page = artist.get_window_extent(_renderer(fig)), fig.bbox
    return box.x0 >= page.x0 - 1 and box.x1 <= page.x1 + 1 and box.y1 <= page.y1 + 1


def test_whatif_has_one_line_per_draft_cost(tmp_path):
    # A 13.33 ms step turns 0.1 into 0.09999999999999999 on the way back from ms: the legend
    # said "draft 10 %" twice, each line holding some of the points.
    run = make_synthetic_run(tmp_path / "run")
    p = run / "05_categorize" / "summary.json"
    s = json.loads(p.read_text())
    s["decode"]["period_ms"]["mean"] = 13.33
    p.write_text(json.dumps(s))
    a = load_run_artifacts(run)
    ctx = report_context(a, WriteupParams(acceptance_lengths=(1.5, 2.0, 3.0), draft_cost_fractions=(0.1, 0.2)))
    assert ctx.whatif.baseline.step_ms == 13.33
    assert sorted(ctx.whatif.curves["draft_cost_fraction"].unique()) == [0.1, 0.2]
    fig = fg.plot_speculative_whatif(ctx.whatif.curves, ctx.whatif.baseline.step_ms)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert labels == ["draft 10 % of a step per drafted token", "draft 20 % of a step per drafted token",
                      "measured: 13.3 ms"]
    assert all(len(line.get_xdata()) == 3 for line in fig.axes[0].get_lines()[:2])


def _samples() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = [{"concurrency": c, "metric": m, "value_ms": v}
            for c in (1, 4, 16) for m, lo, hi in (("tpot", 1.0, 30.0), ("itl", 0.05, 800.0))
            for v in np.exp(rng.uniform(np.log(lo), np.log(hi), 300))]
    return pd.DataFrame(rows)


def test_itl_ticks_over_four_decades_do_not_overlap():
    fig = sp.plot_latency_distributions(_samples())
    itl = fig.axes[1]
    assert not tp.tick_labels_overlap(itl)
    shown = [t.get_text() for t in [*itl.get_xticklabels(), *itl.get_xticklabels(minor=True)] if t.get_text()]
    assert "0.05" not in shown and "0.1" in shown  # the 2s and 5s go where the axis spans decades


def _levels() -> pd.DataFrame:
    return pd.DataFrame({"mode": "concurrency", "concurrency": [1, 2, 4, 8, 16], "n_completed": 100,
                         "ttft_ms_median": [30.0, 31, 40, 42, 80], "ttft_ms_p99": [180.0, 170, 230, 150, 700],
                         "tpot_ms_median": [0.0, 0.0, 1.6, 1.5, 5.3], "tpot_ms_p99": [5.0, 6.5, 6.6, 7.7, 10.6]})


def test_ttft_p50_is_not_flattened_by_p99():
    fig = sp.plot_latency_vs_concurrency(_levels())
    ttft, tpot = fig.axes
    assert ttft.get_yscale() == "log"      # p50 30 ms and p99 700 ms each span a readable height
    assert tpot.get_yscale() == "symlog"   # a TPOT of 0 (bunched delivery) stays on the axis
    lo, hi = ttft.get_ylim()
    assert np.log10(31 / lo) / np.log10(hi / lo) > 0.05


def test_per_gpu_title_stays_inside_the_figure():
    lv = pd.read_csv(make_synthetic_run_levels())
    from stepscope.sweep.goodput import per_gpu_points

    summary = {"slo": {"min_share": 0.9, "bounds_ms": {"tpot_ms": 50.0}}, "knee_concurrency": 4}
    fig = sp.plot_per_gpu_vs_per_user(per_gpu_points(lv, 8), 8, summary)
    assert _inside(fig, fig.axes[0].title)


def make_synthetic_run_levels():
    import tempfile
    from pathlib import Path

    return make_synthetic_run(Path(tempfile.mkdtemp()) / "run", stages=("01_macro_sweep",)) / "01_macro_sweep" / "levels.csv"


def test_load_anatomy_labels_do_not_overlap():
    labels = ["c=1, batch 1 (n=155)", "c=4, batch 4 (n=6)", "c=16, batch 13 (n=1)", "c=16, batch 15 (n=1)",
              "c=16, batch 16 (n=4)", "c=32, batch 30 (n=2)", "c=32, batch 32 (n=6)"]
    bars = pd.DataFrame([{"label": lbl, "category": c, "ms_per_step": 1.0} for lbl in labels
                         for c in ("all_reduce", "attention", "framework")])
    fig = tp.plot_category_bars(bars, {"step period": [3.0] * len(labels)}, title="anatomy",
                                xlabel="captured concurrency, decode requests per step")
    assert not tp.tick_labels_overlap(fig.axes[0])
    assert _inside(fig, fig.axes[0].title)


def test_heatmap_text_is_legible_on_the_page():
    matrix = pd.DataFrame(np.ones((7, 155)), index=[f"cat{i}" for i in range(7)], columns=range(1, 156))
    fig = tp.plot_step_category_heatmap(matrix)
    width_px = fig.get_figwidth() * FIGURE_DPI
    assert width_px <= REPORT_WIDTH_PX  # shown at its own size, not shrunk
    ax = fig.axes[0]
    sizes = {t.get_fontsize() for t in [*ax.get_xticklabels(), *ax.get_yticklabels()] if t.get_text()}
    # 9 pt at 110 dpi is 14 px on the page; the old 18-inch figure, shrunk, showed 7 pt as 5 px
    assert min(sizes) * FIGURE_DPI / 72 >= 12
    assert not tp.tick_labels_overlap(ax)
