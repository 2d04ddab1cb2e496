"""Hostile traces (issue 26, item 4) and Ctrl-C in `stepscope analyze` (item 5).

Every trace here is generated in the test, small enough to build in a second, and each
case checks the outcome (analysed with a flag, or refused with a named message), the
exit code where a subprocess runs, and a bound on time or memory.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stepscope.runfolder import REPO_ROOT
from stepscope.runner import EXIT_INTERRUPTED


def _bench():
    """benchmarks/trace_load.py, whose kernel-dense trace generator the tests share."""
    spec = importlib.util.spec_from_file_location("trace_load_bench", REPO_ROOT / "benchmarks" / "trace_load.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cli(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "lib")}
    return subprocess.Popen([sys.executable, "-m", "stepscope.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


# --------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_in_analyze_exits_130_at_once_and_writes_no_report(tmp_path: Path):
    # 400k kernels: ~78 MB of JSON, over the size parsed by two processes, and several
    # seconds of analysis on this machine: the interrupt lands mid-stage-05.
    gz, _, _ = _bench().build_kernel_dense(400_000, tmp_path)
    out = tmp_path / "out"
    proc = _cli("analyze", str(gz), "--out", str(out), "--no-progress")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (out / "notebooks" / "05_categorize.ipynb").is_file():
        time.sleep(0.05)
    time.sleep(1.5)  # inside the parse (or just after it)
    assert proc.poll() is None, "the analysis finished before it could be interrupted: use a larger trace"
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        text, _ = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("analyze still running 20 s after Ctrl-C")
    took = time.monotonic() - t0
    assert proc.returncode == EXIT_INTERRUPTED, text
    assert took < 3.0, f"analyze took {took:.1f} s to react to Ctrl-C"
    stages = json.loads((out / "run.json").read_text())["stages"]
    assert stages["05_categorize"]["status"] == "interrupted", stages
    assert "06_writeup" not in stages and not (out / "06_writeup").exists(), text
    assert "KeyboardInterrupt" not in text and "FAILED" not in text, text
    nb = json.loads((out / "notebooks" / "05_categorize.ipynb").read_text())
    assert any(c.get("metadata", {}).get("papermill", {}).get("status") == "interrupted" for c in nb["cells"])
