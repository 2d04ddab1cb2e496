"""`benchmarks/gpu_check.sh` and its helper, on this CPU machine: the summary renders real
stage 02/03 outputs, and the script without a GPU says so, exits 3 and still writes it."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest

from stepscope.config import deep_merge, load_params, params_from_dict, params_to_dict
from stepscope.micro import collectives, gemm
from stepscope.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import gpu_check  # noqa: E402


def test_summary_renders_the_stage_tables(tmp_path, monkeypatch):
    over = {"micro": {"gemm": {"m_values": [1, 64], "dtypes": ["float32"], "presets": [], "repeats": 3},
                      "collectives": {"iters": 5, "burst_repeats": 3}}}
    p = params_from_dict(deep_merge(params_to_dict(load_params(REPO_ROOT / "params" / "cpu-demo.yaml")), over))
    gemm.run_stage(p, tmp_path / "02_gemm_micro", progress=False)
    collectives.run_stage(p, tmp_path / "03_nccl_burst", progress=False)
    (tmp_path / "steps.tsv").write_text("device\t3\t1\ntests\t124\t240\n")
    monkeypatch.setattr(gpu_check, "GEMM_M", [1, 64])
    assert gpu_check.main(["summary", str(tmp_path)]) == 0
    md = (tmp_path / "summary.md").read_text()
    assert "No CUDA device" in md
    assert "| tests | FAIL (timed out) | 240 |" in md and "| device | skipped (no CUDA device) | 1 |" in md
    t = pd.read_csv(tmp_path / "02_gemm_micro" / "gemm.csv")
    row = t[(t["status"] == "ok") & (t["m"] == 64)].iloc[0]
    assert f"| {row['gemm']} | torch | 64 | {row['time_us_median']:.1f} | - | - | - |" in md
    b = pd.read_csv(tmp_path / "03_nccl_burst" / "burst.csv")
    eager = b[(b["mode"] == "eager") & (b["status"] == "ok")].iloc[0]
    assert f"({eager['mode']}): {eager['per_op_us']:.1f} µs per op" in md
    assert "pytest.xml missing" in md


@pytest.mark.slow
def test_script_without_a_gpu_exits_3_with_a_summary(tmp_path):
    out = tmp_path / "check"
    # The interpreter running the tests: a clone in an empty folder (CI's) has no .venv of its own.
    env = {**os.environ, "PYTHON": sys.executable}
    r = subprocess.run(["bash", str(REPO_ROOT / "benchmarks" / "gpu_check.sh"), str(out)], capture_output=True, env=env,
                       text=True, timeout=400)
    assert r.returncode == 3, r.stdout + r.stderr
    md = (out / "summary.md").read_text()
    assert "No CUDA device" in md
    assert "| tests | pass |" in md  # the CPU-side checks (oracle, argv) ran and passed
    assert "skipped | no CUDA device" in md
