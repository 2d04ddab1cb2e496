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
    from stepscope.trace.budget import CPU_WORK_BYTES_PER_EVENT, IMPORTS_BYTES, check_budget, count_stream

    spec = importlib.util.spec_from_file_location("hostile_bench", REPO_ROOT / "benchmarks" / "hostile_traces.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    tiny = bench.write_gz(tmp_path / "tiny.json.gz", bench.tiny_events(300_000))
    n = count_stream(tiny)
    assert (n.events, n.has_device, n.complete) == (300_000, False, True)
    c = check_budget([tiny], 0.4)  # 3x its 24 MB of JSON would fit; 300,000 ops at 1,800 B do not
    assert c.cpu_work_events == 300_000 and c.over
    assert c.estimate_bytes == IMPORTS_BYTES + CPU_WORK_BYTES_PER_EVENT * 300_000
    p = _cli("analyze", str(tiny), "--out", str(tmp_path / "out"), "--no-progress", "--memory-budget-gb", "0.4")
    text = p.stdout + p.stderr
    assert p.returncode == EXIT_OVER_BUDGET, text
    assert "1,800 bytes for each of 300,000 events of traces with no device event" in text
    assert count_stream(FULLGRAPH).has_device and check_budget([FULLGRAPH], 0.4).cpu_work_events is None


# --------------------------------------------------------------------------- gzip trailers (issue 39)

_BOMB_MB = 200
"""A JSON string of this many MB: ~210 KB of gzip, which could hold ~217 MB (deflate's 1032:1)."""


def _member(*parts: bytes, repeat_mb: int = 0) -> bytes:
    """One gzip member of `parts`, then `repeat_mb` MB of the letter a (isal: 200 MB in 0.03 s)."""
    from isal import isal_zlib

    z = isal_zlib.compressobj(1, isal_zlib.DEFLATED, 31)
    out = [z.compress(p) for p in parts] + [z.compress(b"a" * (1 << 20)) for _ in range(repeat_mb)]
    return b"".join(out) + z.flush()


def _isize(data: bytes, isize: int) -> bytes:
    """`data` with its gzip trailer's size field (the decompressed size modulo 4 GiB) set to `isize`."""
    return data[:-4] + (isize % 2**32).to_bytes(4, "little")


def _head() -> bytes:
    return b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "'


def _refused_quickly(path: Path, budget_gb: float) -> str:
    import time

    from stepscope.trace.budget import MemoryBudgetExceeded, require_budget

    t0 = time.monotonic()
    with pytest.raises(MemoryBudgetExceeded) as err:
        require_budget([path], budget_gb)
    took = time.monotonic() - t0
    assert took < 10.0, f"{took:.1f} s to refuse"
    return str(err.value)


def test_a_gzip_bomb_whose_trailer_understates_is_counted_and_refused(tmp_path: Path):
    """A trace over 4 GiB has a trailer that wrapped (8 MB holding one 8 GiB string passed the
    budget and ran stage 05 for 300 s at 4 GB): here the same at small scale, a 200 MB string
    whose trailer was written to say 1 MB. The stream is counted, stopped once past what the
    budget allows (128 MiB of JSON at 2x under 0.5 GB), and refused naming the bytes counted."""
    bomb = tmp_path / "rank0.json.gz"
    bomb.write_bytes(_isize(_member(_head(), repeat_mb=_BOMB_MB), 1 << 20))
    assert bomb.stat().st_size < 1 << 20  # the trailer's 1 MB is more than the file's size: plausible alone
    msg = _refused_quickly(bomb, 0.5)
    assert str(bomb) in msg and "counted in the decompressed streams" in msg
    assert f"{bomb} decompresses to more than 142,606,337 bytes (counting stopped there; its gzip trailer " \
           "says 1,048,576)" in msg
    assert "--memory-budget-gb" in msg and "analysis.memory_budget_gb" in msg


def test_concatenated_gzip_members_are_counted_whole(tmp_path: Path):
    """The trailer sizes only the last member: a small last member hid a 200 MB first one."""
    tail = b'", "pid": 0, "tid": 7, "ts": 1.0, "dur": 1.0}]}' + b" " * (1 << 20)
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(_member(_head(), repeat_mb=_BOMB_MB) + _member(tail))
    from stepscope.trace.split import json_size_estimate

    assert json_size_estimate(p) == len(tail)  # what the budget read before
    assert "decompresses to more than 142,606,337 bytes" in _refused_quickly(p, 0.5)
    from stepscope.trace.budget import count_stream

    whole = count_stream(p)  # with no limit, to the end of the last member
    assert whole.json_bytes == len(_head()) + (_BOMB_MB << 20) + len(tail) and whole.complete


@pytest.mark.parametrize("isize", [3 << 30, 1000])
def test_a_trailer_that_disagrees_with_the_file_is_not_believed(tmp_path: Path, isize: int):
    """A size over 1032x the compressed one (deflate cannot expand more), or under it (read as
    wrapped: 4 GiB more), refused a 33 KB trace as over a 1 GB budget. The stream is counted
    instead, and the load then names what is wrong with the file."""
    from stepscope.errors import TraceError
    from stepscope.trace.budget import check_budget
    from stepscope.trace.load import load_rank

    p = tmp_path / "rank0.json.gz"
    p.write_bytes(_isize(FULLGRAPH.read_bytes(), isize))
    c = check_budget([p], 1.0)
    assert c.counted and not c.over
    assert c.json_bytes < len(gzip.decompress(FULLGRAPH.read_bytes()))  # read until the length check failed
    with pytest.raises(TraceError, match="cannot decompress: Incorrect length of data produced"):
        load_rank(p)


def test_analyze_refuses_a_gzip_bomb_in_seconds_with_exit_5(tmp_path: Path):
    import time

    from stepscope.runner import EXIT_OVER_BUDGET

    bomb = tmp_path / "rank0.json.gz"
    bomb.write_bytes(_isize(_member(_head(), repeat_mb=_BOMB_MB), 1 << 20))
    t0 = time.monotonic()
    p = _cli("analyze", str(bomb), "--out", str(tmp_path / "out"), "--no-progress", "--memory-budget-gb", "0.5",
             timeout=120)
    took = time.monotonic() - t0
    text = p.stdout + p.stderr
    assert p.returncode == EXIT_OVER_BUDGET, text
    assert "decompresses to more than 142,606,337 bytes" in text and "--memory-budget-gb" in text
    assert took < 30.0, f"{took:.1f} s"
    assert not (tmp_path / "out" / "05_categorize").exists()
