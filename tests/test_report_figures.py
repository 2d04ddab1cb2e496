"""Palette and figures: one colour per category everywhere; figures show what their names say."""

from __future__ import annotations

import os

import matplotlib.colors as mcolors
import pandas as pd
import pytest

from stepscope.palette import CATEGORY_COLORS, CATEGORY_ORDER, category_sort_key, color_for
from stepscope.report.explorer import StepExplorer, category_top_names, step_category_table
from stepscope.testing.synthetic import make_synthetic_run
from stepscope.trace import plots as cat

# The issue's list, its "quantized_gemm" spelled as rules.yaml writes it (quant_gemm).
ISSUE_CATEGORIES = ["all_reduce", "all_gather", "other_collective", "communication", "quant_gemm",
                    "dense_gemm", "fused_moe", "moe_routing", "attention", "kv_cache_write", "norm",
                    "activation", "rotary", "quantize", "sampling", "elementwise", "memcpy", "memset", "other"]
ALIASES = {"communication": "all_reduce"}


def test_every_category_has_a_distinct_colour():
    assert set(ISSUE_CATEGORIES) <= set(CATEGORY_COLORS)
    assert set(CATEGORY_ORDER) == set(CATEGORY_COLORS)
    primary = {c: v for c, v in CATEGORY_COLORS.items() if c not in ALIASES}
    assert len(set(primary.values())) == len(primary)
    for alias, target in ALIASES.items():
        assert CATEGORY_COLORS[alias] == CATEGORY_COLORS[target]


def test_unknown_category_colour_is_stable_and_valid():
    c = color_for("my_custom_kernels")
    assert c == color_for("my_custom_kernels") and mcolors.is_color_like(c)
    assert c not in CATEGORY_COLORS.values()
    assert color_for("Attention") == CATEGORY_COLORS["attention"]


def test_sort_puts_other_last():
    cats = ["other", "zz_user", "attention", "all_reduce"]
    assert sorted(cats, key=category_sort_key) == ["all_reduce", "attention", "zz_user", "other"]


def _facecolors(ax) -> dict[str, str]:
    return {p.get_label(): mcolors.to_hex(p.patches[0].get_facecolor()) for p in ax.containers}


def test_stacked_bars_use_the_palette():
    bars = pd.DataFrame({"label": ["rank 0", "rank 0", "rank 1", "rank 1"],
                         "category": ["attention", "all_reduce", "attention", "all_reduce"],
                         "ms_per_step": [1.0, 2.0, 1.5, 2.5]})
    fig = cat.plot_decode_category_time_stacked(bars, {"span": 4.0}, n_steps=10)
    ax = fig.axes[0]
    colors = _facecolors(ax)
    assert colors == {"all_reduce": CATEGORY_COLORS["all_reduce"], "attention": CATEGORY_COLORS["attention"]}
    # stack heights: all_reduce drawn first (communication first), attention on top
    tops = [p.get_y() + p.get_height() for p in ax.containers[1].patches]
    assert tops == pytest.approx([3.0, 4.0])


def test_timeline_has_one_lane_per_stream():
    tl = pd.DataFrame({"stream": [7, 7, 13], "category": ["dense_gemm", "all_reduce", "memcpy"],
                       "start_us": [100.0, 120.0, 105.0], "dur_us": [10.0, 30.0, 2.0]})
    fig = cat.plot_decode_step_timeline(tl)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["stream 7", "stream 13"]
    assert ax.get_xlim()[1] == pytest.approx(50 * 1.01)  # shifted to start at 0, ends at 150-100
    assert "3 device events on 2 stream(s), 50 µs span" in ax.get_title()


def test_step_category_table_counts_overlap_once():
    ev = pd.DataFrame({"category": ["dense_gemm", "dense_gemm", "all_reduce"], "name": ["a", "b", "nccl"],
                       "start_us": [0.0, 5.0, 20.0], "dur_us": [10.0, 10.0, 20.0]})
    t = step_category_table(ev).set_index("category")
    assert t.loc["dense_gemm", "sum_us"] == 20.0 and t.loc["dense_gemm", "union_us"] == 15.0
    assert t.loc["all_reduce", "share_of_span_pct"] == pytest.approx(50.0)
    assert list(category_top_names(ev, "dense_gemm")["name"]) == ["a", "b"]


def test_explorer_starts_from_saved_artifacts(tmp_path):
    run = make_synthetic_run(tmp_path / "run")
    ex = StepExplorer(run)
    assert ex.ranks() == list(range(8))
    assert ex.default_selection() == (0, 7)
    assert len(ex.step_ids(0)) == 155 and len(ex.step_ids(0, "prefill")) == 10
    ev = ex.step_events(0, 7)
    assert len(ev) == 41 and set(ev["stream"]) == {7, 13}
    # another step needs the rank's trace, which the synthetic run does not have: said, not raised
    assert ex.step_events(3, 50) is None and "not reachable" in ex.notes[-1]


def test_explorer_widget_builds(tmp_path, monkeypatch):
    pytest.importorskip("ipywidgets")
    from stepscope.report import explorer, step_explorer

    # another test may have started the in-process batch shell in this process; a kernel here
    monkeypatch.setattr(explorer, "_batch_shell", lambda: False)
    w = step_explorer(make_synthetic_run(tmp_path / "run"))
    assert type(w).__name__ == "VBox"
    w2 = step_explorer(make_synthetic_run(tmp_path / "bare", stages=("00_deploy",)))
    assert "not available" in w2.data


def test_explorer_not_built_in_a_batch_shell(tmp_path):
    """`stepscope analyze` runs cells in an IPython shell with no kernel: no widget, a note
    saying how to open it instead."""
    from stepscope.inprocess import run_cell, shell

    sh = shell()
    if sh is None:
        pytest.skip("an IPython shell with a kernel owns this process")
    run = make_synthetic_run(tmp_path / "run")
    out = run_cell(sh, f"from stepscope.report import step_explorer\nstep_explorer({str(run)!r})", 1)
    assert out.error is None
    html = out.outputs[-1]["data"]["text/html"]
    assert "not built in this batch run" in html and f"stepscope lab {run}" in html


def test_explorer_not_built_in_a_kernel_the_runner_started(tmp_path, monkeypatch):
    """papermill's kernels get runfolder.BATCH_RUN_ENV: a widget cell there once hung a whole
    campaign (kernel idle, nbclient waiting), twice at this cell, so the note stands in."""
    from stepscope.report import step_explorer
    from stepscope.runfolder import BATCH_RUN_ENV, batch_run_environment

    run = make_synthetic_run(tmp_path / "run")
    monkeypatch.delenv(BATCH_RUN_ENV, raising=False)
    with batch_run_environment():
        assert os.environ[BATCH_RUN_ENV] == "1"
        note = step_explorer(run)
    assert BATCH_RUN_ENV not in os.environ  # restored
    assert "not built in this batch run" in note.data and f"stepscope lab {run}" in note.data


@pytest.mark.slow
def test_the_runners_papermill_kernel_builds_no_widget(tmp_path):
    """Stage 06 through the runner's papermill executor, on a synthetic run: the explorer's
    cell holds the note, not a widget view."""
    import json

    from stepscope.stages import STAGE_BY_ID
    from stepscope.runner import execute_notebook

    run = make_synthetic_run(tmp_path / "run")
    nb = json.loads(execute_notebook(STAGE_BY_ID["06_writeup"], run / "params.yaml", run, progress=False).read_text())
    last = [c for c in nb["cells"] if c["cell_type"] == "code"][-1]
    assert "step_explorer(" in "".join(last["source"])
    data = last["outputs"][-1]["data"]
    assert "not built in this batch run" in "".join(data["text/html"])
    assert "application/vnd.jupyter.widget-view+json" not in data
