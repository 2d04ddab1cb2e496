"""One trace parsed by several processes gives exactly what one process gives."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

import stepscope.trace.load as load
import stepscope.trace.parse as parse
import stepscope.trace.split as split
from stepscope.errors import TraceError


@pytest.fixture
def split_small(monkeypatch):
    # Small traces and chunks, so a shared trace is cut into dozens of chunks and split.
    monkeypatch.setattr(split, "SPLIT_MIN_JSON_BYTES", 0)
    monkeypatch.setattr(parse, "CHUNK_BYTES", 16384)


def _same(a: load.ParsedTrace, b: load.ParsedTrace) -> None:
    assert a.columns.keys() == b.columns.keys()
    for k in a.columns:
        np.testing.assert_array_equal(a.columns[k], b.columns[k], err_msg=k)
    assert a.names == b.names and a.collectives == b.collectives
    assert a.stats == b.stats and a.top == b.top


@pytest.mark.parametrize("name", ["hf-h100-qwen1.5-0.5b-eager.json.gz", "hta-a100-ddp-nccl.json.gz",
                                  "vllm-mi300x-gptoss-decode-fullgraph.json.gz",
                                  "vllm-cpu-tinyllama-tp2-rank0.pt.trace.json.gz"])
def test_split_parse_equals_one_process(real_traces: Path, split_small, monkeypatch, name: str):
    one = load.parse_trace(real_traces / name, processes=1)
    splits = _record_splits(monkeypatch)
    three = load.parse_trace(real_traces / name, processes=3)
    _same(one, three)
    assert len(one.columns["ts"]) > 100
    # Each process decoded its own chunks (no fallback to one process).
    assert splits == ["split"]


def _record_splits(monkeypatch) -> list[str]:
    """'split' or 'fallback' for each parse that tried several processes."""
    seen: list[str] = []
    real = split.parse_split

    def spy(*a):
        out = real(*a)
        seen.append("fallback" if out is None else "split")
        return out

    monkeypatch.setattr(split, "parse_split", spy)
    return seen


def _events_with_nested_args(n: int) -> list[dict]:
    ev = []
    for i in range(n):
        ev.append({"ph": "X", "cat": "kernel", "name": f"k{i % 7}", "pid": "GPU 0", "tid": f"stream {i % 3}",
                   "ts": float(i), "dur": 0.5, "args": {"correlation": i, "stream": i % 3,
                                                         "x": [{"a": 1}, {"b": [{"c": 2}, {"d": 3}]}]}})
    return ev


def test_cut_inside_nested_objects_falls_back_to_one_process(tmp_path: Path, split_small, monkeypatch):
    monkeypatch.setattr(parse, "CHUNK_BYTES", 1000)
    p = tmp_path / "rank0.json.gz"
    with gzip.open(p, "wt") as fh:
        json.dump({"distributedInfo": {"rank": 0}, "traceEvents": _events_with_nested_args(400)}, fh)
    splits = _record_splits(monkeypatch)
    got = load.parse_trace(p, processes=2)
    assert splits == ["fallback"]  # a cut fell inside nested args; one process read it
    df = load.ParsedTrace.frame(got)
    assert df["ts"].tolist() == [float(i) for i in range(400)]
    # String pids/tids get stable negative ids ("GPU 0" first seen, then the streams).
    assert df["pid"].unique().tolist() == [-2] and sorted(df["tid"].unique().tolist()) == [-5, -4, -3]


def test_string_ids_are_renumbered_across_processes(tmp_path: Path, split_small, monkeypatch):
    monkeypatch.setattr(parse, "CHUNK_BYTES", 2000)
    ev = [dict(e, args={"correlation": e["args"]["correlation"]}) for e in _events_with_nested_args(300)]
    # Later chunks meet the ids in another order than the first ones.
    for e in ev[150:]:
        e["pid"], e["tid"] = e["tid"], e["pid"]
    p = tmp_path / "rank0.json.gz"
    with gzip.open(p, "wt") as fh:
        json.dump({"distributedInfo": {"rank": 0}, "traceEvents": ev}, fh)
    splits = _record_splits(monkeypatch)
    _same(load.parse_trace(p, processes=1), load.parse_trace(p, processes=3))
    assert splits == ["split"]


def test_truncated_trace_in_split_mode(real_traces: Path, tmp_path: Path, split_small):
    data = (real_traces / "hta-a100-ddp-nccl.json.gz").read_bytes()
    p = tmp_path / "rank0.pt.trace.json.gz"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match="truncated") as exc:
        load.parse_trace(p, processes=2)
    assert str(p) in str(exc.value) and "fix:" in str(exc.value)


def test_rank_processes_split_their_traces_when_cores_are_left(real_traces: Path, tmp_path: Path,
                                                               split_small, monkeypatch):
    import os

    # 4 cores, 2 ranks: each rank's process forks one more to parse its trace in two.
    names = [f"vllm-cpu-tinyllama-tp2-rank{r}.pt.trace.json.gz" for r in (0, 1)]
    serial, _ = load.load_ranks([real_traces / n for n in names], workers=1, progress=False)
    monkeypatch.setattr(split, "usable_cores", lambda: 4)
    real = split.parse_split

    def marked_split(path, n, *a):
        # Runs in the rank processes (forked): leave a mark the test can see.
        (tmp_path / f"split-{os.getpid()}-{n}").write_text(str(path))
        return real(path, n, *a)

    monkeypatch.setattr(split, "parse_split", marked_split)
    nested, flags = load.load_ranks([real_traces / n for n in names], workers=2, progress=False)
    assert not flags and [r.rank for r in nested] == [0, 1]
    marks = sorted(tmp_path.glob("split-*"))
    assert len(marks) == 2 and all(m.name.endswith("-2") for m in marks)
    assert {m.name.split("-")[1] for m in marks}.isdisjoint({str(os.getpid())})
    for a, b in zip(serial, nested):
        assert a.events.equals(b.events)


def _share_or_die(path, share, of, keep_cpu_ops, progress):
    """Share 0 parses; the other process dies as if killed for memory."""
    import os

    if share:
        os._exit(9)
    return parse.parse_share(path, 0, 1, keep_cpu_ops, progress)


def test_a_parsing_process_that_dies_is_a_named_error(real_traces: Path):
    """A share's columns come through a pipe (issue 26); a process killed before sending its
    share is reported with the trace's path, not a broken pool."""
    p = real_traces / "hta-a100-ddp-nccl.json.gz"
    with pytest.raises(TraceError, match="ended before sending its share") as exc:
        split.parse_split(p, 2, _share_or_die, None, None)
    assert str(p) in str(exc.value)


def test_shares_sent_through_pipes_equal_one_process(real_traces: Path):
    p = real_traces / "hta-a100-ddp-nccl.json.gz"
    one = parse.parse_share(p, 0, 1, None, None)
    shares = split.parse_split(p, 1 + 1, lambda *a: parse.parse_share(p, 0, 1, None, None), None, None)
    assert len(shares) == 2
    for sh in shares:
        assert sh.arrays.keys() == one.arrays.keys() and sh.names == one.names
        for col, a in one.arrays.items():
            assert sh.arrays[col].dtype == a.dtype and np.array_equal(sh.arrays[col], a), col


def _kernels_widening(n: int) -> list[dict]:
    """Kernels whose pids, streams, correlations and sizes need wider ints as the trace goes on
    (one byte, then two, four and eight): each share narrows its own columns."""
    big = [5, 300, 70_000, 5_000_000_000]
    ev = []
    for i in range(n):
        w = big[min(4 * i // n, 3)]
        ev.append({"ph": "X", "cat": "kernel", "name": f"k{i % 5}", "pid": w + i % 2, "tid": 7, "ts": float(i),
                   "dur": 0.5, "args": {"correlation": w + i, "stream": 7 + i % 3, "In msg nelems": -1 if i % 4 else w}})
    return ev


def test_shares_of_different_widths_merge_into_the_widest(tmp_path: Path, split_small, monkeypatch):
    monkeypatch.setattr(parse, "CHUNK_BYTES", 2000)
    ev = _kernels_widening(400)
    p = tmp_path / "rank0.json.gz"
    with gzip.open(p, "wt") as fh:
        json.dump({"distributedInfo": {"rank": 0}, "traceEvents": ev}, fh)
    splits = _record_splits(monkeypatch)
    one, three = load.parse_trace(p, processes=1), load.parse_trace(p, processes=3)
    assert splits == ["split"]
    _same(one, three)
    for col in ("pid", "correlation", "msg_nelems"):  # the values as written, in int64 where one needs it
        assert one.columns[col].dtype == three.columns[col].dtype == np.int64, col
    assert one.columns["pid"].tolist() == [e["pid"] for e in ev]
    assert one.columns["correlation"].tolist() == [e["args"]["correlation"] for e in ev]
    assert one.columns["stream"].dtype == three.columns["stream"].dtype == np.int8  # 7..9 throughout
    assert one.columns["tid"].dtype == np.int8 and set(one.columns["tid"].tolist()) == {7}


def test_a_column_is_collected_as_narrow_as_its_values_allow(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(parse, "CHUNK_BYTES", 2000)
    ev = _kernels_widening(400)[:200]  # one and two bytes only
    ev.append(dict(ev[0], ts=500.0, args={"correlation": 2**63, "stream": 7}))  # beyond int64: no id (-1), counted
    p = tmp_path / "rank0.json.gz"
    with gzip.open(p, "wt") as fh:
        json.dump({"distributedInfo": {"rank": 0}, "traceEvents": ev}, fh)
    got = load.parse_trace(p, processes=1)
    assert got.columns["pid"].dtype == got.columns["correlation"].dtype == np.int16
    assert got.columns["pid"].tolist() == [e["pid"] for e in ev]
    assert got.columns["correlation"].tolist() == [e["args"]["correlation"] for e in ev[:-1]] + [-1]
    assert got.stats["n_huge_ids"] == 1
    assert got.columns["name"].dtype == np.int8 and got.columns["collective"].dtype == np.int8
