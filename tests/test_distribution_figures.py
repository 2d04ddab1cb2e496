"""Distribution figures (seaborn): each draws exactly the samples its computing function gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import PathCollection, QuadMesh

from stepscope.sweep.distributions import latency_samples
from stepscope.sweep.metrics import RequestRecord
from stepscope.sweep.plots import FIGURE_NAMES, distribution_figures, plot_latency_distributions
from stepscope.sweep.run import Level, write_level
from stepscope.trace.plots import (decode_step_bars, plot_step_category_distribution, plot_step_category_heatmap,
                                   stage_figures, step_category_matrix)

TP2 = ["vllm-cpu-tinyllama-tp2-rank0.pt.trace.json.gz", "vllm-cpu-tinyllama-tp2-rank1.pt.trace.json.gz"]


def _record(i: int, gaps_s: list[float], warmup: bool = False) -> RequestRecord:
    chunks = list(0.1 + np.cumsum([0.0, *gaps_s]))
    return RequestRecord(start_s=0.0, chunk_times_s=chunks, end_s=chunks[-1], input_tokens=8,
                         output_tokens=len(chunks), success=True, request_id=i, warmup=warmup)


@pytest.fixture()
def sweep_dir(tmp_path: Path) -> Path:
    """Two closed-loop levels and one open-loop level, written by the sweep's own writer."""
    levels = {
        Level("concurrency", 1, None, 2): [_record(0, [0.010, 0.010, 0.010]), _record(1, [0.020, 0.020]),
                                           _record(9, [0.5, 0.5], warmup=True)],
        Level("concurrency", 4, None, 2): [_record(0, [0.030, 0.050]), _record(1, [0.040, 0.040, 0.040])],
        Level("rate", None, 2.0, 1): [_record(0, [0.001, 0.001])],
    }
    for level, records in levels.items():
        write_level(tmp_path, level, records, {"level": level.name, "mode": level.mode,
                                               "concurrency": level.concurrency,
                                               "request_rate": level.request_rate})
    return tmp_path


def test_latency_samples_are_per_request_tpot_and_per_gap_itl(sweep_dir):
    s = latency_samples(sweep_dir)
    assert sorted(s["concurrency"].unique()) == [1, 4]  # the open-loop level has no concurrency
    got = {(c, m): sorted(np.round(g["value_ms"], 6)) for (c, m), g in s.groupby(["concurrency", "metric"])}
    assert got[(1, "tpot")] == [10.0, 20.0]  # the warm-up request is not measured
    assert got[(1, "itl")] == [10.0, 10.0, 10.0, 20.0, 20.0]
    assert got[(4, "tpot")] == [40.0, 40.0]
    assert got[(4, "itl")] == [30.0, 40.0, 40.0, 40.0, 50.0]


def test_ecdf_draws_each_levels_samples(sweep_dir):
    s = latency_samples(sweep_dir)
    fig = plot_latency_distributions(s)
    tpot_ax, itl_ax = fig.axes[:2]
    for ax, metric in ((tpot_ax, "tpot"), (itl_ax, "itl")):
        drawn = [ln for ln in ax.lines if len(ln.get_xdata())]
        assert len(drawn) == 2, "one ECDF per concurrency level"
        # the step's start point sits at -inf (0 on the log axis): not a sample
        drawn_x = sorted(tuple(sorted({round(float(x), 6) for x in ln.get_xdata() if 0 < x < np.inf}))
                         for ln in drawn)
        want = sorted(tuple(sorted({round(float(x), 6) for x in g["value_ms"]}))
                      for _, g in s[s["metric"] == metric].groupby("concurrency"))
        assert drawn_x == want
        assert max(ln.get_ydata()[-1] for ln in drawn) == pytest.approx(1.0)
    legend = [t.get_text() for t in itl_ax.get_legend().get_texts()]
    assert legend == ["C=1 (n=5)", "C=4 (n=5)"]
    assert "4 requests over 2 levels" in tpot_ax.get_title()


def test_no_closed_loop_samples_no_figure(tmp_path):
    assert distribution_figures(latency_samples(tmp_path)) == {}


def test_distribution_figure_name_is_embedded_by_the_report():
    # build.py embeds every stage-01 PNG whose name starts with "sweep_".
    assert FIGURE_NAMES["distribution"].startswith("sweep_")


@pytest.fixture(scope="module")
def tp2_analysis(real_traces, tmp_path_factory):
    from stepscope.model import architecture_from_config
    from stepscope.trace.analyze import analyze_traces

    arch = architecture_from_config({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 128,
                                     "num_attention_heads": 4, "num_key_value_heads": 2,
                                     "intermediate_size": 256, "vocab_size": 2048})
    return analyze_traces([real_traces / n for n in TP2], tmp_path_factory.mktemp("tp2"), arch=arch, tp=2,
                          progress=False)


def test_step_category_matrix_holds_every_steps_category_union(tp2_analysis):
    ref = tp2_analysis.reference
    bars, _, which = decode_step_bars(ref.step_categories, tp2_analysis.steps, ref.rank)
    m = step_category_matrix(bars)
    assert which == "decode steps" and m.shape[1] == 10
    sc = ref.step_categories.groupby(["step_id", "category"])["union_us"].sum() / 1e3
    for (step, cat), ms in sc.items():
        if str(step) in m.columns:
            assert m.loc[cat, str(step)] == pytest.approx(ms)
    assert list(m.index)[0] == "all_reduce"  # palette order: communication first
    assert m.to_numpy().sum() == pytest.approx(bars["ms_per_step"].sum())


def test_box_and_strip_show_one_point_per_step_and_category(tp2_analysis):
    ref = tp2_analysis.reference
    bars, _, _ = decode_step_bars(ref.step_categories, tp2_analysis.steps, ref.rank)
    fig = plot_step_category_distribution(bars)
    ax = fig.axes[0]
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert sorted(ticks) == sorted(bars["category"].unique())
    strips = [np.asarray(c.get_offsets()) for c in ax.collections
              if isinstance(c, PathCollection) and len(c.get_offsets())]
    assert len(strips) == len(ticks)
    for i, cat in enumerate(ticks):
        pts = next(c for c in strips if abs(np.median(c[:, 0]) - i) < 0.5)
        assert sorted(pts[:, 1]) == pytest.approx(sorted(bars.loc[bars["category"] == cat, "ms_per_step"]))
    assert "across 10 decode steps" in ax.get_title()


def test_the_strip_jitter_is_the_same_every_time_and_leaves_numpy_alone(tp2_analysis):
    ref = tp2_analysis.reference
    bars, _, _ = decode_step_bars(ref.step_categories, tp2_analysis.steps, ref.rank)

    def offsets() -> list:
        ax = plot_step_category_distribution(bars).axes[0]
        return [np.asarray(c.get_offsets()).tolist() for c in ax.collections if isinstance(c, PathCollection)]

    np.random.seed(123)
    first = offsets()
    after_first = np.random.random()
    np.random.seed(123)
    assert offsets() == first
    assert np.random.random() == after_first


def test_heatmap_colours_are_the_matrix(tp2_analysis):
    ref = tp2_analysis.reference
    bars, _, _ = decode_step_bars(ref.step_categories, tp2_analysis.steps, ref.rank)
    m = step_category_matrix(bars)
    fig = plot_step_category_heatmap(m)
    mesh = next(c for c in fig.axes[0].collections if isinstance(c, QuadMesh))
    assert np.asarray(mesh.get_array()).reshape(m.shape) == pytest.approx(m.to_numpy())
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == list(m.index)


def test_stage_05_saves_both_under_the_name_the_report_embeds(tp2_analysis):
    names = set(stage_figures(tp2_analysis))
    assert {"05_step_categories_distribution_rank0", "05_step_categories_heatmap_rank0"} <= names


def test_report_embeds_the_distribution_figures_in_their_sections(tmp_path, sweep_dir):
    from stepscope.report.build import build_report
    from stepscope.runfolder import save_figures
    from stepscope.testing.synthetic import make_synthetic_run

    run = make_synthetic_run(tmp_path / "run")
    names = [FIGURE_NAMES["distribution"], "05_step_categories_distribution_rank0.png",
             "05_step_categories_heatmap_rank0.png"]
    samples = latency_samples(sweep_dir)
    save_figures({n: plot_latency_distributions(samples) for n in names}, run)
    md = build_report(run)["markdown"].read_text()
    for n in names:
        assert f"../figures/{n}" in md, n
    # stage 01's figure sits in the macro section, stage 05's with the per-step figures
    assert md.index(FIGURE_NAMES["distribution"]) < md.index("05_step_categories_distribution")
