"""The profiler's cost per step beside the load reconciliation: the batch-1 capture's client TPOT
(profiled) less the sweep's c=1 TPOT (not profiled), from a run's own files. Figures from the MoE
demo run moe-quiet1 (2026-12-05, a quiet 2-core machine): 19.697 ms profiled, 17.512 ms not."""

import pandas as pd
import pytest

from stepscope import schema
from stepscope.trace import load_reconcile as lr


def _run(tmp_path, profiled_ms: float, sweep_c1_ms: float | None):
    (tmp_path / "04_profiler_capture").mkdir()
    (tmp_path / "01_macro_sweep").mkdir()
    schema.write(tmp_path / "04_profiler_capture" / "capture_latency.json",
                 {"n_requests": 5, "n_completed": 5, "n_failed": 0, "input_len": 32, "output_len": 32,
                  "tpot_ms_mean": profiled_ms}, schema.CaptureLatency)
    rows = [{"mode": "concurrency", "concurrency": 4, "tpot_ms_mean": 30.3}]
    if sweep_c1_ms is not None:
        rows.append({"mode": "concurrency", "concurrency": 1, "tpot_ms_mean": sweep_c1_ms})
    pd.DataFrame(rows).to_csv(tmp_path / "01_macro_sweep" / "levels.csv", index=False)
    return tmp_path


def test_the_profilers_cost_is_the_profiled_tpot_less_the_sweeps(tmp_path):
    assert lr.profiler_cost_ms(_run(tmp_path, 19.697, 17.512)) == pytest.approx(2.185)


def test_a_profiled_run_that_was_faster_shows_no_cost(tmp_path):
    assert lr.profiler_cost_ms(_run(tmp_path, 17.0, 17.512)) == 0.0


def test_without_a_c1_level_the_cost_is_unknown(tmp_path):
    assert lr.profiler_cost_ms(_run(tmp_path, 19.697, None)) is None
    assert lr.profiler_cost_ms(tmp_path / "nowhere") is None


def test_the_engines_own_iteration_count_checks_the_parts_steps(tmp_path):
    """moe-quiet1's c=4 level: vLLM counted 494 iterations (3,175 -> 3,669 across its scrapes), the
    parts counted 496.7 steps; 15.48 s of busy time over 494 is 31.3 ms per iteration against
    the traced 27.5 ms: the level ran 14 % slower than the capture, which is its remainder."""
    (tmp_path / "01_macro_sweep").mkdir()
    pd.DataFrame({"level": ["c0001", "c0004", "c0004", "c0004"], "phase": ["measure"] * 4,
                  "iteration_tokens_count": [100.0, 3175.0, 3400.0, 3669.0]}).to_csv(
        tmp_path / "01_macro_sweep" / "server_metrics.csv", index=False)
    assert lr.engine_iterations(tmp_path, 4) == 494.0
    assert lr.engine_iterations(tmp_path, 1) is None        # one scrape: no difference
    row = {"level_s": 15.58, "decode_steps": 436.7, "prefill_mixed_steps": 60.0,
           "parts": {"decode_steps": 10.55, "prefill_mixed_steps": 3.09, "stalls": 0.0, "client_overhead": 0.1}}
    check = lr.pace_check(row, 494.0)
    assert check["traced_step_ms"] == pytest.approx(1e3 * 13.64 / 496.7)
    assert check["level_iteration_ms"] == pytest.approx(1e3 * 15.48 / 494)
    assert lr.pace_check(row, None)["level_iteration_ms"] is None


def _level(**over):
    base = {"concurrency": 4, "level_s": 15.58, "unexplained_share": 0.118, "adds_up": False, "n_requests": 60,
            "prefills": 60.0, "decode_tokens": 1860.0, "decode_steps": 436.7, "prefill_mixed_steps": 60.0,
            "parts": {"decode_steps": 10.55, "prefill_mixed_steps": 3.09, "stalls": 0.0, "client_overhead": 0.0,
                      "ramp_up": 0.0, "turnaround": 0.08, "drain": 0.02, "unexplained": 1.83},
            "profiler_cost_ms_per_step": 2.19, "engine_iterations": 494.0, "traced_step_ms": 27.47,
            "level_iteration_ms": 31.53, "records": "01_macro_sweep/levels/c0004.jsonl"}
    return schema.convert({**base, **over}, schema.LoadReconciliationLevel, "test")


def test_the_report_says_a_remainder_is_the_engines_pace_when_the_counts_agree():
    from stepscope.report.load import pace_clause

    assert pace_clause(_level()) == (
        ": vLLM counted 494 iterations where the parts count 497, but the level kept 31.5 ms per iteration "
        "against the traced 27.5 ms (+15 %): the engine ran at another pace in the sweep than in the capture; "
        "the profiler's own cost, measured at batch 1, is 2.19 ms a step")
    # a count off by more than the tolerance is a miscount, whatever the pace
    assert pace_clause(_level(engine_iterations=560.0)).endswith("so the step model misses steps")
    assert pace_clause(_level(engine_iterations=None)) == ""
