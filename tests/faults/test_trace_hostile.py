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

from stepscope.paths import REPO_ROOT
from stepscope.runner import EXIT_INTERRUPTED


def _benchmark(name: str):
    """A module of benchmarks/, whose trace generators the tests share."""
    spec = importlib.util.spec_from_file_location(f"{name}_bench", REPO_ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _bench():
    """benchmarks/trace_load.py: the kernel-dense trace generator."""
    return _benchmark("trace_load")


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


def test_an_interrupted_stepscope_exits_without_waiting_on_its_children(tmp_path: Path):
    """After an interrupt is recorded, `stepscope` leaves at once: the interpreter's own exit
    would join every child and pool thread, and a parse worker forked just before the Ctrl-C
    (idle, waiting for a task) held the exit for ever. Here a child that would sleep a minute
    stands in for it: the program exits 130 within seconds and the child is gone."""
    from faultkit import running

    pid_file = tmp_path / "child.pid"
    script = f"""
import multiprocessing, os, time
from pathlib import Path
import stepscope.cli as cli
child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
child.start()
Path({str(pid_file)!r}).write_text(str(child.pid))
cli.main = lambda argv=None: 130
cli.console()
"""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "lib")}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=50)
    assert proc.returncode == EXIT_INTERRUPTED, proc.stderr
    assert time.monotonic() - t0 < 20.0
    child = int(pid_file.read_text())
    assert not running(child)  # gone, or a zombie waiting to be reaped


# --------------------------------------------------------------------------- hostile traces

_HOSTILE = _benchmark("hostile_traces")
_HEAD, _ev, _BASE = _HOSTILE.HEAD, _HOSTILE.event, _HOSTILE.BASE
"""The trace head, one event and 2,000 kernels of 2 µs (one hostile event among them stays
under thresholds.BAD_EVENT_SHARE_LIMIT), shared with benchmarks/hostile_traces.py."""


def _write(path: Path, *parts: bytes | str) -> Path:
    """A .json.gz written piece by piece, so a large hostile run is never held whole."""
    return _HOSTILE.write_gz(path, parts)


def _with(one: str) -> str:
    return _HOSTILE.with_one(one)[0]


@pytest.mark.parametrize("dur,ts", [("NaN", 10.0), ("Infinity", 10.0), ("-Infinity", 10.0), ("1e400", 10.0),
                                    ("1e308", 10.0), (2.0, -5.0), (2.0, "1e300"), (2.0, "NaN")])
def test_unusable_dur_or_ts_drops_the_event_and_keeps_the_rank(tmp_path: Path, dur, ts):
    from stepscope.trace.load import load_rank

    rt = load_rank(_write(tmp_path / "rank0.json.gz", _with(_ev(ts=ts, dur=dur))))
    assert len(rt.events) == 2000
    assert rt.events["dur"].sum() == 4000.0  # the 2,000 good kernels, nothing else
    assert [f.code for f in rt.flags] == ["bad_durations"]
    assert "dropped 1 work events" in rt.flags[0].message


def test_keys_after_trace_events_are_read(tmp_path: Path):
    from stepscope.trace.load import load_rank

    tail = '], "deviceProperties2": [{"a": 1}, {"b": 2}], "traceName": "x", "meta": {"y": [1, 2]}}'
    rt = load_rank(_write(tmp_path / "rank0.json.gz", _HEAD + ",".join(_BASE) + tail))
    assert len(rt.events) == 2000 and rt.flags == []
    assert rt.meta["device_name"] == "NVIDIA H100"


@pytest.mark.parametrize("where", ["among the events", "the last event"])
def test_deep_nesting_is_a_named_error(tmp_path: Path, where: str):
    from stepscope.errors import TraceError
    from stepscope.trace.load import load_rank

    deep = _ev(args='{"x": ' + "[" * 200_000 + "]" * 200_000 + "}")
    body = _with(deep) if where == "among the events" else _HEAD + ",".join(_BASE + [deep]) + "]}"
    p = _write(tmp_path / "rank0.json.gz", body)
    with pytest.raises(TraceError, match="nested deeper than the parser's limit") as err:
        load_rank(p)
    assert str(p) in str(err.value) and "bug" not in str(err.value)


@pytest.mark.parametrize("big", [2 ** 63, 2 ** 64, 10 ** 30])
def test_an_id_beyond_int64_reads_as_no_id(tmp_path: Path, big: int):
    from stepscope.trace.load import load_rank

    rt = load_rank(_write(tmp_path / "rank0.json.gz", _with(_ev(args='{"correlation": %d}' % big))))
    assert len(rt.events) == 2001
    assert (rt.events["correlation"] == -1).sum() == 1
    assert [f.code for f in rt.flags] == ["ids_out_of_range"]


def test_ints_are_collected_narrow_until_one_needs_more():
    """The loader collects ids as int8 (issue 26) and widens a column a step at a time the first
    time a value needs more (int16, int32, int64), keeping every value read before and after
    exactly."""
    from stepscope.trace.parse import _Collector

    col = _Collector()
    col._ints_into("corr", [1, -1, 127], col._huge_id)
    assert col.corr.typecode == "b"
    col._ints_into("corr", [300], col._huge_id)
    assert col.corr.typecode == "h"
    col._ints_into("corr", [2 ** 31 - 1], col._huge_id)
    assert col.corr.typecode == "i"
    col._ints_into("corr", [2 ** 40, 5], col._huge_id)
    col._ints_into("corr", [2 ** 63, 7], col._huge_id)  # beyond int64: no id, counted
    assert col.corr.typecode == "q" and col.n_huge_ids == 1
    assert list(col.corr) == [1, -1, 127, 300, 2 ** 31 - 1, 2 ** 40, 5, -1, 7]
    col._ints_into("pid", [3, "Spans", 2 ** 31], col._id)  # a string pid gets a negative id
    assert list(col.pid) == [3, -2, 2 ** 31] and col.pid.typecode == "q"
    # a share that kept no event hands on narrow empty columns (the merge skips empty shares' widths)
    assert {c: str(a.dtype) for c, a in _Collector().share([], None).arrays.items()} == {
        "cat": "int8", "name": "int8", "pid": "int8", "tid": "int8", "ts": "float64", "dur": "float64",
        "correlation": "int8", "stream": "int8", "collective": "int8", "msg_nelems": "int8"}


def test_an_id_beyond_int32_is_kept_exactly(tmp_path: Path):
    from stepscope.trace.load import load_rank

    rt = load_rank(_write(tmp_path / "rank0.json.gz", _with(_ev(args='{"correlation": %d}' % 2 ** 40))))
    assert rt.events["correlation"].dtype == "int64" and (rt.events["correlation"] == 2 ** 40).sum() == 1
    assert rt.flags == []


def test_a_huge_name_is_cut_flagged_and_fast(tmp_path: Path):
    from stepscope.trace.analyze import analyze_rank
    from stepscope.trace.categorize import make_rules
    from stepscope.trace.load import NAME_CAP_CHARS, load_rank

    mb = 20  # a 1 MB name took 10.7 s in the rules before the cut
    p = _write(tmp_path / "rank0.json.gz", _HEAD + ",".join(_BASE) + ',{"ph": "X", "cat": "kernel", "name": "',
               *([b"a" * (1 << 20)] * mb), '", "pid": 0, "tid": 7, "ts": 20.0, "dur": 1.0},',
               '{"ph": "X", "cat": "python_function", "name": "x.py(1): ', *([b"b" * (1 << 20)] * mb),
               '", "pid": 0, "tid": 8, "ts": 20.0, "dur": 1.0}]}')
    t0 = time.monotonic()
    rt = load_rank(p)
    analyze_rank(rt, make_rules())
    took = time.monotonic() - t0
    names = rt.events["name"].astype(str)
    assert names.str.len().max() < NAME_CAP_CHARS + 40
    assert f"{mb << 20:,} chars" in names[names.str.startswith("aaaa")].iloc[0]
    assert [f.code for f in rt.flags] == ["names_capped"]
    assert took < 10.0, f"{took:.1f} s"


_RSS_CHILD = r"""
import resource, sys
from stepscope.trace.parse import parse_trace
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
p = parse_trace(sys.argv[1])
print(len(p.columns["ts"]), (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) // 1024)
"""


def test_a_whitespace_run_is_not_buffered(tmp_path: Path):
    mb = 300  # a 4.3 GB run cost 4.3 GB of RSS before
    p = _write(tmp_path / "rank0.json.gz", _HEAD + ",".join(_BASE[:10]) + ",", *([b" \n" * (1 << 19)] * mb),
               ",".join(_BASE[10:]) + "]}")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "lib")}
    got = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(p)], capture_output=True, text=True, env=env,
                         timeout=120)
    assert got.returncode == 0, got.stderr
    rows, grew_mb = map(int, got.stdout.split())
    assert rows == 2000
    assert grew_mb < 60, f"parsing grew RSS by {grew_mb} MB over a {mb} MB whitespace run"


def test_the_json_size_comes_from_the_gzip_trailer_not_a_ratio(tmp_path: Path):
    from stepscope.trace.split import json_size_estimate

    # 24 MB of repeated events compresses ~45x: the old 12x rule said a quarter of the JSON.
    text = _HEAD + ",".join(_BASE * 80) + "]}"
    p = _write(tmp_path / "rank0.json.gz", text)
    assert p.stat().st_size * 30 < len(text)
    assert json_size_estimate(p) == len(text)


# --------------------------------------------------------------------------- not regular files (issue 39)

_AS_LIMIT = r"""
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # the old code read /dev/zero to MemoryError
from stepscope.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _analyze_capped(path: Path, out: Path) -> subprocess.CompletedProcess:
    """`stepscope analyze path` under a 3 GB address-space cap and a 60 s timeout: a FIFO hung it
    silently, /dev/zero was read until memory ran out."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "lib")}
    try:
        return subprocess.run([sys.executable, "-c", _AS_LIMIT, "analyze", str(path), "--out", str(out),
                               "--no-progress"], env=env, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"analyze {path} still running after 60 s")


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "a link to /dev/zero"])
def test_a_path_that_is_no_regular_file_is_refused_up_front(tmp_path: Path, kind: str):
    from stepscope.runner import EXIT_BAD_INPUT

    if kind == "fifo":
        path = tmp_path / "rank0.json"
        os.mkfifo(path)
        said = "it is a FIFO (named pipe)"
    elif kind == "/dev/zero":
        path, said = Path("/dev/zero"), "it is a character device"
    else:
        path = tmp_path / "rank0.json.gz"
        path.symlink_to("/dev/zero")
        said = "not a trace file (a link to /dev/zero): it is a character device"
    t0 = time.monotonic()
    p = _analyze_capped(path, tmp_path / "out")
    text = p.stdout + p.stderr
    assert p.returncode == EXIT_BAD_INPUT == 2, text
    assert f"error: {path}: " in text and said in text and "fix:" in text
    assert "bug" not in text and "Traceback" not in text and "MemoryError" not in text
    assert time.monotonic() - t0 < 30.0
    assert not (tmp_path / "out").exists()


def test_a_fifo_among_rank_traces_is_a_rank_unreadable_flag_not_a_hang(tmp_path: Path):
    """In stage 05 (a folder or a params list) the others are still read: the FIFO is never
    opened, by the budget nor the cache key."""
    from stepscope.trace.load import load_ranks

    def hung(*_):
        raise TimeoutError("load_ranks still waiting on the FIFO after 30 s")

    good = _write(tmp_path / "rank0.json.gz", _HEAD + ",".join(_BASE) + "]}")
    os.mkfifo(tmp_path / "rank1.json")
    before = signal.signal(signal.SIGALRM, hung)  # open() of a FIFO blocks until a writer comes
    signal.alarm(30)
    try:
        ranks, flags = load_ranks([good, tmp_path / "rank1.json"], cache_dir=tmp_path / "cache", workers=1,
                                  progress=False)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
    assert [r.rank for r in ranks] == [0]
    flag, = flags
    assert flag.code == "rank_unreadable" and "rank1.json: not a trace file: it is a FIFO" in flag.message
