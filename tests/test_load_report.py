"""The report's step under load, rendered from a run folder holding stage 05's load anatomy of
the real c=16 load trace (tests/data/traces/README.md) and a sweep level beside it."""

from __future__ import annotations

import pandas as pd
import pytest

from stepscope import schema
from stepscope.report import load as rl
from stepscope.report.artifacts import load_run_artifacts
from stepscope.trace import load_anatomy as la
from stepscope.trace.analyze import analyze_traces
from stepscope.trace.load_plots import load_bars
from stepscope.wording import fmt_num


@pytest.fixture(scope="module")
def run_dir(real_traces, tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    an = analyze_traces(sorted(real_traces.glob("vllm-cpu-tinyllama-tp2-c16-rank*.pt.trace.json.gz")),
                        run / "scratch", progress=False, perfetto=False)
    r = an.reference
    (run / "01_macro_sweep").mkdir()
    # a sweep level well below the trace's 891 tok/s, with requests waiting at the scheduler
    pd.DataFrame([{"mode": "concurrency", "concurrency": 16, "output_throughput_tok_s": 600.0,
                   "client_bound": False}]).to_csv(run / "01_macro_sweep" / "levels.csv", index=False)
    pd.DataFrame([{"level": "c0016", "phase": "measure", "t_s": float(i), "scrape_ms": 15.0,
                   "requests_running": 16.0, "requests_waiting": w, "kv_cache_usage": 0.01,
                   "preemptions_total": 0.0} for i, w in enumerate([0.0, 3.0, 1.0])]
                 ).to_csv(run / "01_macro_sweep" / "server_metrics.csv", index=False)
    table, summary = la.build([(16, "04_profiler_capture/c16/traces", r.steps_tot, r.step_categories)], run, rank=0)
    (run / "05_categorize").mkdir()
    schema.write_table(table, run / "05_categorize" / "load_anatomy.csv", schema.LoadAnatomyRow)
    schema.write(run / "05_categorize" / "load_anatomy.json", summary, schema.LoadAnatomySummary)
    return run


def test_trace_and_sweep_are_set_side_by_side_and_the_gap_explained(run_dir):
    summary = load_run_artifacts(run_dir).load_summary
    (c,) = rl.compare_levels(load_run_artifacts(run_dir))
    assert c.concurrency == 16 and c.measured_tok_s == 600.0
    assert c.predicted_tok_s == pytest.approx(summary.levels[0].predicted_output_tok_s)
    assert c.band_tok_s == pytest.approx(0.05 * 600.0)  # one run per side: the fixed band
    assert c.agrees is False
    text = " ".join(c.explanations)
    assert "7 of the window's 20 steps were mixed" in text
    assert "up to 3 waiting" in text
    # the gaps inside a step are inside its period on both sides: no reason for the rate gap
    # (the level's parts are, from load_reconciliation.json: tests/test_load_moe.py)
    assert "covered" not in text and "gaps between and inside steps" not in text


def test_the_section_renders_from_the_typed_values(run_dir, tmp_path):
    a = load_run_artifacts(run_dir)
    md = rl.section_load(a, "![fig](x.png)")
    assert md.startswith(f"## {rl.SECTION_TITLE}\n")
    assert "| 16 | 14.5 | 0.350 | 891 | 600 | – | 30 | **no** |" in md
    assert "beyond the band" in md and "![fig](x.png)" in md
    assert rl.fastest_sentence(a.load_summary) in md
    assert rl.section_load(load_run_artifacts(tmp_path)) == ""


def test_the_figure_has_one_bar_per_level_and_batch_with_its_period(run_dir):
    table = load_run_artifacts(run_dir).load_anatomy
    bars, periods, n = load_bars(table)
    assert list(dict.fromkeys(bars["label"])) == ["c=16, batch 14 (n=4)", "c=16, batch 15 (n=9)"]
    assert n == 13 and len(periods) == 2
    mixed = load_bars(table, "mixed")
    assert mixed[2] == 7


def test_the_plateau_finding_reads_the_levels_either_side_of_the_knee(run_dir, tmp_path):
    a = load_run_artifacts(run_dir)
    table, summary = a.load_anatomy, a.load_summary
    # a second level built from the real one: c=4 with half the all-reduce time per step
    low = table.assign(concurrency=4)
    low.loc[low["category"] == "all_reduce", "ms_per_step"] *= 0.5
    (tmp_path / "05_categorize").mkdir()
    pd.concat([low, table]).to_csv(tmp_path / "05_categorize" / "load_anatomy.csv", index=False)
    schema.write(tmp_path / "05_categorize" / "load_anatomy.json",
                 {**schema.to_builtins(summary), "fastest_category": "all_reduce"}, schema.LoadAnatomySummary)
    g = rl.load_growth(load_run_artifacts(tmp_path), knee_concurrency=8)
    assert (g.below.concurrency, g.above.concurrency, g.category) == (4, 16, "all_reduce")
    dec = table[(table["step_kind"] == "decode") & (table["category"] == "all_reduce")]
    want_hi = float((dec["ms_per_step"] * dec["n_steps"]).sum() / dec["n_steps"].sum())
    assert g.above.category_ms["all_reduce"] == pytest.approx(want_hi)
    assert g.below.category_ms["all_reduce"] == pytest.approx(want_hi / 2)
    p = g.above.period_ms
    assert rl.level_ceiling_x(g.above, "all_reduce") == pytest.approx(p / (p - want_hi))
    words = " ".join(rl.growth_sentences(g))
    assert "either side of the knee at concurrency 8" in words and "**all_reduce**" in words
    assert f"{fmt_num(want_hi)} ms at c=16" in words
    assert rl.load_growth(a, None) is None  # one captured level: nothing to compare


def test_compare_shows_the_anatomy_change_per_captured_concurrency(run_dir, tmp_path):
    import shutil

    from stepscope.report.artifacts import load_run_artifacts
    from stepscope.report.compare import label_rows, load_section
    from stepscope.report.setups import compare_setups, is_communication

    b = tmp_path / "b"
    shutil.copytree(run_dir, b)
    t = pd.read_csv(b / "05_categorize" / "load_anatomy.csv")
    t.loc[t["category"] == "all_reduce", "ms_per_step"] *= 0.5
    t.to_csv(b / "05_categorize" / "load_anatomy.csv", index=False)
    ra, rb = load_run_artifacts(run_dir), load_run_artifacts(b)
    cmp = rl.compare_load(ra, rb)
    changed = cmp[cmp["beyond_noise"]]
    assert list(changed["quantity"]) == ["all_reduce"] and list(changed["concurrency"]) == [16]
    assert changed["ratio_b_over_a"].iloc[0] == pytest.approx(0.5)
    labelled = label_rows(cmp, compare_setups(ra, rb), cmp["quantity"].map(is_communication))
    ar = labelled[labelled["quantity"] == "all_reduce"]
    assert ar.loc[ar["concurrency"] == 16, "flag"].tolist() == ["changed"]  # same setup: a change, not a switch
    section = load_section(labelled)
    assert "## The step under load, per captured concurrency" in section and "**changed**" in section
    (tmp_path / "no-load").mkdir()
    assert rl.compare_load(ra, load_run_artifacts(tmp_path / "no-load")) is None and load_section(None) == ""


def test_stage_05_reads_its_load_anatomy_back_typed(run_dir):
    """The notebook's reader gives the schema's record, as the report's RunArtifacts does."""
    table, summary = la.read_outputs(run_dir / "05_categorize")
    assert isinstance(summary, schema.LoadAnatomySummary) and summary == load_run_artifacts(run_dir).load_summary
    assert list(la.levels_table(summary).index) == [16] and set(table["concurrency"]) == {16}
    assert la.read_outputs(run_dir / "nothing-here") is None


@pytest.mark.parametrize("measure, lead_kept", [("union", False), ("transfer", True)])
def test_the_fastest_category_is_said_once_unless_the_fit_reads_its_transfer(measure, lead_kept):
    """Issue 37: the plateau's bullets name the fastest-growing category with the fit's slope, so
    the paragraph above leaves its lead out; a collective fitted by its transfer keeps it (the
    bullets give its busy time, waits included). The pointer to every fit closes the paragraph."""
    from stepscope.report.load import LevelAnatomy, LoadGrowth, _says_fastest, fastest_paragraphs

    fit = schema.LoadFit(category="all_gather", measure=measure, n_steps=171, n_batches=3, slope_ms_per_request=0.000278,
                         slope_se_ms=0.0000714, ms_at_batch_min=0.00327, ms_at_batch_max=0.0075, batch_min=1,
                         batch_max=16)
    summary = schema.LoadAnatomySummary(fits=[fit], fastest_category="all_gather")
    growth = LoadGrowth("all_gather", 0.000278, 0.0000714, LevelAnatomy(1, 3.82, {"all_gather": 0.0236}),
                        LevelAnatomy(16, 4.5, {"all_gather": 0.209}), None)
    assert _says_fastest(growth, summary) is not lead_kept
    said = fastest_paragraphs(summary, lead=not _says_fastest(growth, summary))
    what = " (its transfer, last arrival to completion)" if measure == "transfer" else ""
    assert said == ([f"**all_gather**{what} grows fastest with the batch: 0.000278 ± 0.0000714 ms per decode "
                     "request (least squares over 171 decode steps at 3 batch sizes), 0.00327 ms per step at batch 1 "
                     "and 0.00750 ms at batch 16."] if lead_kept else [])
    assert not _says_fastest(None, summary)
