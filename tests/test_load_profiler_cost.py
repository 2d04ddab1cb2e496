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
