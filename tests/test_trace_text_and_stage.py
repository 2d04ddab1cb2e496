"""profiler_out text tables, stage-05 inputs from the run folder, figures, notebook."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from stepscope.errors import StageInputMissing
from stepscope.trace.analyze import analyze_traces, capture_tpot, trace_inputs_for_run
from stepscope.trace.text_table import check_text_tables, parse_text_table, parse_time_us


def test_parse_cpu_layout(real_traces: Path):
    df, footer = parse_text_table(real_traces / "vllm-cpu-tinyllama-tp2-rank0.profiler_out.txt")
    assert footer == {"self_cpu_total_us": 3.616e6}
    assert len(df) == 50 and (df["layout"] == "cpu").all()
    row = df[df["Name"] == "c10d::allreduce_"].iloc[0]
    assert row["calls"] == 60 and row["Self_CPU_us"] == pytest.approx(41978.0)
    assert row["CPU_time_avg_us"] == pytest.approx(699.635)
    assert df["truncated_name"].sum() > 0  # 55-column names cut to 52 + "..."
    assert df[df["Name"] == "threading.py(331): wait"]["Self CPU %"].iloc[0] == pytest.approx(49.99)


@pytest.mark.parametrize("text,us", [("1.808s", 1.808e6), ("401.135ms", 401135.0), ("2.011us", 2.011),
                                     ("--", None)])
def test_time_units(text, us):
    assert parse_time_us(text) == (pytest.approx(us) if us is not None else None)


GPU_TABLE = """\
-------------------------------------------------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------
                                                   Name    Self CPU %      Self CPU   CPU total %     CPU total  CPU time avg     Self CUDA   Self CUDA %    CUDA total  CUDA time avg    # of Calls
-------------------------------------------------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------
ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm...         0.00%       0.000us         0.00%       0.000us       0.000us       1.560ms        52.00%       1.560ms      78.000us            20
                                     vllm::all_reduce         1.00%     120.000us         2.00%     240.000us      12.000us       0.000us         0.00%      22.500ms       1.125ms            20
std::enable_if<!(false), void>::type internal::gemvx...         0.00%       0.000us         0.00%       0.000us       0.000us       1.440ms        48.00%       1.440ms      72.000us            20
-------------------------------------------------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------
Self CPU time total: 12.000ms
Self CUDA time total: 3.000ms
"""


def test_gpu_layout_cross_check_flags_over_one_percent(tmp_path: Path):
    p = tmp_path / "rank0.profiler_out.txt"
    p.write_text(GPU_TABLE)
    df, footer = parse_text_table(p)
    assert footer["self_cuda_total_us"] == 3000.0 and (df["layout"] == "gpu").all()
    # The CPU wrapper's "CUDA total" (22.5 ms) is its kernels plus blocking: never summed.
    assert df["Self_CUDA_us"].sum() == pytest.approx(3000.0)
    good = {0: SimpleNamespace(mode="gpu", totals={"kernel_sum_us": 3010.0})}
    _, checks = check_text_tables([p], good)
    assert "flag" not in checks[0] and checks[0]["rel_diff"] == pytest.approx(10 / 3000)
    bad = {0: SimpleNamespace(mode="gpu", totals={"kernel_sum_us": 3363.0})}
    _, checks = check_text_tables([p], bad)
    assert checks[0]["flag"]["code"] == "text_table_mismatch"


def test_stage_inputs(tmp_path: Path, real_traces: Path):
    params = SimpleNamespace(analysis=SimpleNamespace(trace_paths=()))
    with pytest.raises(StageInputMissing, match="04_profiler_capture/traces"):
        trace_inputs_for_run(tmp_path, params)
    d = tmp_path / "04_profiler_capture" / "traces"
    d.mkdir(parents=True)
    shutil.copy(real_traces / "vllm-cpu-tinyllama-tp2-rank1.pt.trace.json.gz", d)
    assert trace_inputs_for_run(tmp_path, params) == [d]
    assert capture_tpot(tmp_path) == (None, None)  # no capture_latency.json
    lat = tmp_path / "04_profiler_capture" / "capture_latency.json"
    lat.write_text('{"tpot_ms_median": 12.1}')
    assert capture_tpot(tmp_path) == (12.1, None)
    # The mean when there is one: it sits beside the per-step means in the report.
    lat.write_text('{"tpot_ms_mean": 13.4, "tpot_ms_median": 12.1}')
    assert capture_tpot(tmp_path) == (13.4, None)
    given = SimpleNamespace(analysis=SimpleNamespace(trace_paths=(str(real_traces),)))
    assert trace_inputs_for_run(tmp_path, given) == [real_traces]
    with pytest.raises(StageInputMissing, match="not found"):
        trace_inputs_for_run(tmp_path, SimpleNamespace(analysis=SimpleNamespace(trace_paths=("/nope",))))


def test_figures(real_traces: Path, tmp_path: Path):
    from stepscope.trace.plots import save_figures, stage_figures

    an = analyze_traces([real_traces / f"vllm-cpu-tinyllama-tp2-rank{r}.pt.trace.json.gz" for r in (0, 1)],
                        tmp_path / "05", progress=False, perfetto=False)
    figs = stage_figures(an)
    assert set(figs) == {"05_step_categories_rank0", "05_step_timeline_rank0",
                         "05_step_categories_distribution_rank0",
                         "05_step_categories_heatmap_rank0", "05_cross_rank_categories"}
    assert len(figs["05_step_categories_rank0"].axes[0].patches) == 10 * 7  # steps x categories
    paths = save_figures(figs, tmp_path)
    assert all(p.stat().st_size > 10_000 for p in paths)


@pytest.mark.slow
def test_notebook_runs_under_papermill(tmp_path: Path, real_traces: Path, repo_root: Path):
    run = tmp_path / "run"
    d = run / "04_profiler_capture" / "traces"
    d.mkdir(parents=True)
    for r in (0, 1):
        shutil.copy(real_traces / f"vllm-cpu-tinyllama-tp2-rank{r}.pt.trace.json.gz", d)
    nb = repo_root / "notebooks"
    cmd = [sys.executable, "-m", "papermill", str(nb / "05_categorize.ipynb"), str(tmp_path / "out.ipynb"),
           "-p", "params_file", str(repo_root / "params" / "cpu-demo.yaml"), "-p", "run_dir", str(run),
           "--cwd", str(nb)]
    subprocess.run(cmd, check=True, capture_output=True)
    s = json.loads((run / "05_categorize" / "summary.json").read_text())
    assert s["collectives_check"]["match"] is True
    assert (run / "figures" / "05_step_categories_rank0.png").is_file()
    # Without stage 04's traces the stage fails, naming what is missing.
    empty = tmp_path / "empty"
    empty.mkdir()
    cmd[cmd.index(str(run))] = str(empty)
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode != 0 and "StageInputMissing" in p.stdout + p.stderr
