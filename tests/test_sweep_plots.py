"""Sweep figures: they draw what the table says, the knee included."""

from __future__ import annotations

import pandas as pd

from stepscope.sweep.plots import FIGURE_NAMES, save_figures, sweep_figures


def _levels():
    return pd.DataFrame({
        "mode": "concurrency", "concurrency": [1, 2, 4, 8], "n_completed": [8, 8, 16, 32],
        "output_throughput_tok_s": [100.0, 190.0, 300.0, 310.0], "peak_output_tok_s_1s": [110, 200, 320, 330],
        "client_bound": [False, False, False, True],
        "ttft_ms_median": [10, 12, 20, 40], "ttft_ms_p99": [15, 20, 30, 80],
        "tpot_ms_median": [5, 6, 7, 12], "tpot_ms_p99": [6, 7, 9, 20],
    })


def test_figures_show_knee_and_save(tmp_path):
    figs = sweep_figures(_levels(), {"knee_concurrency": 4, "plateau_output_tok_s": 310.0})
    ax = figs[FIGURE_NAMES["throughput"]].axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "knee: C=4" in labels and any("client may be" in t for t in labels)
    assert list(ax.lines[0].get_ydata()) == [100.0, 190.0, 300.0, 310.0]
    paths = save_figures(figs, tmp_path)
    assert sorted(p.name for p in paths) == sorted(v for k, v in FIGURE_NAMES.items()
                                                   if k not in ("capture", "by_source", "distribution"))
    assert all(p.stat().st_size > 1000 for p in paths)


def test_by_source_has_one_line_per_source():
    from stepscope.sweep.plots import plot_throughput_by_source

    a = _levels().assign(source="stepscope")
    b = _levels().assign(source="vllm bench serve: x.json", output_throughput_tok_s=[1.0, 2.0, 3.0, 4.0])
    fig = plot_throughput_by_source(pd.concat([a, b]))
    ax = fig.axes[0]
    assert len(ax.lines) == 2 and list(ax.lines[1].get_ydata()) == [1.0, 2.0, 3.0, 4.0]
