"""Bounded work on any trace (issue 26, item 4): the memory budget, a kernel-only trace, and
errors said once.

Every trace here is a real one from tests/data/traces (or cut from one in the test)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.paths import REPO_ROOT
from stepscope.runner import EXIT_NO_RANK
from stepscope.trace.analyze import analyze_traces

TRACES = REPO_ROOT / "tests" / "data" / "traces"
FULLGRAPH = TRACES / "vllm-mi300x-gptoss-decode-fullgraph.json.gz"  # vLLM annotation, 20 launches


def _without_runtime(src: Path, dst: Path) -> Path:
    """`src` with its runtime (launch) events and their flow arrows removed: a kernel-only
    export, as some tools write, that still keeps the engine's step annotation."""
    with gzip.open(src, "rt") as fh:
        doc = json.load(fh)
    doc["traceEvents"] = [e for e in doc["traceEvents"]
                          if e.get("cat") not in ("cuda_runtime", "cuda_driver", "ac2g")]
    with gzip.open(dst, "wt") as fh:
        json.dump(doc, fh)
    return dst


def test_a_trace_without_launch_events_is_read_by_kernel_time(tmp_path: Path):
    # Before: every kernel was taken as launched "before the capture" (no launch had a lower
    # correlation id than +inf), no step kept any work, and stage 05 died on KeyError 'span_us'.
    full = analyze_traces(FULLGRAPH, tmp_path / "full", perfetto=False, progress=False)
    bare = analyze_traces(_without_runtime(FULLGRAPH, tmp_path / "bare.json.gz"), tmp_path / "bare",
                          perfetto=False, progress=False)
    rf, rb = full.summary.ranks[0], bare.summary.ranks[0]
    assert rb.step_source == rf.step_source == "annotation:vllm"
    assert rb.attribution == {"work_time": rb.n_device_events}
    assert rb.n_device_events == rf.n_device_events == 434
    assert rb.kernel_sum_us == pytest.approx(rf.kernel_sum_us, rel=1e-12)
    assert rb.step_kinds == rf.step_kinds
    codes = {f.code: f.message for f in bare.flags}
    assert "unattributed" not in codes
    assert "434 are placed in steps by their own start time" in codes["no_launch_events"]
    assert "no_launch_events" not in {f.code for f in full.flags}


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "lib")}
    return subprocess.run([sys.executable, "-m", "stepscope.cli", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_a_rank_refused_by_stage_05_is_named_once(tmp_path: Path):
    # Before: stage 05's FAILED line printed the error and report_unanalysed_ranks printed
    # it again under "no rank was analysed:" (issue 26: "printed twice").
    with gzip.open(FULLGRAPH, "rt") as fh:
        doc = json.load(fh)
    # first, not last: the last event goes through parse._decode_last, which (2026-12-01) still
    # says "unexpected RecursionError" for it
    doc["traceEvents"].insert(0, {"ph": "X", "cat": "cpu_op", "name": "deep", "pid": 1, "tid": 1,
                               "ts": 1.0, "dur": 1.0, "args": "DEEP"})
    text = json.dumps(doc).replace('"DEEP"', '{"x": ' + "[" * 200_000 + "]" * 200_000 + "}")
    bad = tmp_path / "rank0.json.gz"
    with gzip.open(bad, "wt") as fh:
        fh.write(text)
    p = _cli("analyze", str(bad), "--out", str(tmp_path / "out"), "--no-progress")
    out = p.stdout + p.stderr
    assert p.returncode == EXIT_NO_RANK, out
    assert out.count("nested deeper than the parser's limit") == 1, out
    assert "no rank was analysed: stage 05_categorize failed (its error is above)" in out


# --------------------------------------------------------------------------- memory budget


def test_the_estimate_reads_the_json_size_from_the_gzip_trailer():
    from stepscope.trace.budget import IMPORTS_BYTES, PEAK_BYTES_PER_JSON_BYTE, check_budget

    json_bytes = len(gzip.decompress(FULLGRAPH.read_bytes()))
    c = check_budget([FULLGRAPH, FULLGRAPH], 1.0)
    assert c.json_bytes == 2 * json_bytes  # every rank is loaded before the first is analysed
    assert c.estimate_bytes == int(IMPORTS_BYTES + PEAK_BYTES_PER_JSON_BYTE * 2 * json_bytes)
    assert c.budget_bytes == 2**30 and not c.over


def test_over_budget_the_stage_stops_before_parsing_with_the_numbers(tmp_path: Path, monkeypatch):
    from stepscope.trace import load
    from stepscope.trace.budget import MemoryBudgetExceeded

    def no_parse(*a, **k):
        raise AssertionError("a trace was loaded over budget")

    monkeypatch.setattr("stepscope.trace.analyze.load_ranks", no_parse)
    assert load.load_ranks is not no_parse
    with pytest.raises(MemoryBudgetExceeded) as err:
        analyze_traces(FULLGRAPH, tmp_path / "out", memory_budget_gb=0.1, progress=False)
    msg = str(err.value)
    assert str(FULLGRAPH) in msg
    assert "peak at about 0.25 GB" in msg and "memory budget of 0.10 GB (analysis.memory_budget_gb)" in msg
    assert "--memory-budget-gb" in msg and "nothing was parsed" in msg


def test_analyze_over_budget_exits_5_naming_file_estimate_and_budget(tmp_path: Path):
    from stepscope.runner import EXIT_OVER_BUDGET

    out = tmp_path / "out"
    p = _cli("analyze", str(FULLGRAPH), "--out", str(out), "--no-progress", "--memory-budget-gb", "0.05")
    text = p.stdout + p.stderr
    assert p.returncode == EXIT_OVER_BUDGET == 5, text
    assert str(FULLGRAPH) in text and "over the memory budget of 0.05 GB" in text
    assert text.count("would peak at about") == 1
    assert not (out / "05_categorize").exists()  # refused before stage 05 started
    # a budget that fits analyses as before
    ok = _cli("analyze", str(FULLGRAPH), "--out", str(tmp_path / "ok"), "--no-progress", "--memory-budget-gb", "4")
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_a_budget_of_zero_is_refused_by_the_params_check(tmp_path: Path):
    from stepscope.config import params_from_dict
    from stepscope.errors import ParamsError

    with pytest.raises(ParamsError, match="analysis.memory_budget_gb.*greater than 0"):
        params_from_dict({"run": {"name": "t"}, "analysis": {"memory_budget_gb": 0}}, source="test")


def test_a_dense_trace_of_tiny_ops_is_estimated_per_event(tmp_path: Path):
    """The second fault probe's 30 M tiny events passed the per-byte estimate (3x the JSON)
    under an 8 GB budget and grew past 12 GB: with no device event its ops are its work, at
    about 1.5 KB each (18-21x the JSON). When the budget could not hold the worst case, the
    events are counted and such a trace is refused per event, before anything is parsed; a
    GPU trace under the same budget keeps its per-byte estimate."""
    import importlib.util

    from stepscope.runner import EXIT_OVER_BUDGET
    from stepscope.trace.budget import CPU_WORK_BYTES_PER_EVENT, IMPORTS_BYTES, check_budget, count_events

    spec = importlib.util.spec_from_file_location("hostile_bench", REPO_ROOT / "benchmarks" / "hostile_traces.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    tiny = bench.write_gz(tmp_path / "tiny.json.gz", bench.tiny_events(300_000))
    assert count_events(tiny) == (300_000, 0)
    c = check_budget([tiny], 0.4)  # 3x its 24 MB of JSON would fit; 300,000 ops at 1,800 B do not
    assert c.cpu_work_events == 300_000 and c.over
    assert c.estimate_bytes == IMPORTS_BYTES + CPU_WORK_BYTES_PER_EVENT * 300_000
    p = _cli("analyze", str(tiny), "--out", str(tmp_path / "out"), "--no-progress", "--memory-budget-gb", "0.4")
    text = p.stdout + p.stderr
    assert p.returncode == EXIT_OVER_BUDGET, text
    assert "1,800 bytes for each of 300,000 events of traces with no device event" in text
    assert count_events(FULLGRAPH)[1] > 0 and check_budget([FULLGRAPH], 0.4).cpu_work_events is None
