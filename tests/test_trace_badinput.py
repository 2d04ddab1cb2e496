"""Every kind of bad trace gets a clear TraceError; one bad rank never stops the others."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from stepscope.errors import TraceError
from stepscope.trace.analyze import analyze_traces
from stepscope.trace.load import load_rank, load_ranks

GOOD = "vllm-cpu-tinyllama-tp2-rank0.pt.trace.json.gz"


def _trace(events, **top) -> dict:
    return {"schemaVersion": 1, "distributedInfo": {"rank": top.pop("rank", 0)},
            "traceEvents": events, **top}


def _kernel(ts, dur, name="ampere_sgemm_128x64_nn", corr=1):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "stream": 7}}


def _write(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj) if not isinstance(obj, str) else obj)
    return path


def test_truncated_gzip(real_traces: Path, tmp_path: Path):
    data = (real_traces / GOOD).read_bytes()
    p = tmp_path / "rank0.pt.trace.json.gz"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match="truncated") as exc:
        load_rank(p)
    assert str(p) in str(exc.value)


def test_truncated_plain_json(tmp_path: Path):
    text = json.dumps(_trace([_kernel(1.0, 2.0), _kernel(5.0, 1.0)]))
    p = _write(tmp_path / "rank0.json", text[: text.index("_kernel") if "_kernel" in text else -40])
    with pytest.raises(TraceError, match="truncated|not valid JSON"):
        load_rank(p)


def test_invalid_json(tmp_path: Path):
    text = json.dumps(_trace([_kernel(1.0, 2.0), _kernel(5.0, 1.0)])).replace('"dur": 2.0', '"dur" 2.0')
    with pytest.raises(TraceError, match="not valid JSON"):
        load_rank(_write(tmp_path / "rank0.json", text))


@pytest.mark.parametrize("obj,match", [({"hello": 1}, "no traceEvents"),
                                        ("just text", "not a JSON trace")])
def test_json_that_is_not_a_trace(tmp_path: Path, obj, match):
    with pytest.raises(TraceError, match=match):
        load_rank(_write(tmp_path / "rank0.json", obj))


def test_empty_trace_events(tmp_path: Path):
    with pytest.raises(TraceError, match="empty"):
        load_rank(_write(tmp_path / "rank0.json", _trace([])))


def test_no_device_events(tmp_path: Path):
    ev = [{"ph": "X", "cat": "user_annotation", "name": "x", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0}]
    with pytest.raises(TraceError, match="no device events"):
        load_rank(_write(tmp_path / "rank0.json", _trace(ev)))


def test_negative_and_missing_durations(tmp_path: Path):
    bad = [_kernel(1.0, -3.0, corr=1), {**_kernel(2.0, 1.0, corr=2)}]
    del bad[1]["dur"]
    with pytest.raises(TraceError, match="missing or negative duration"):
        load_rank(_write(tmp_path / "rank0.json", _trace(bad + [_kernel(9.0, 1.0, corr=3)])))
    # One bad event among many is dropped and flagged, not fatal.
    many = [_kernel(float(i * 10), 5.0, corr=i) for i in range(2000)] + [_kernel(1e6, -1.0, corr=9999)]
    rt = load_rank(_write(tmp_path / "rank1.json", _trace(many, rank=1)))
    assert len(rt.events) == 2000
    assert rt.flags[0].code == "bad_durations"


def test_unknown_event_category(tmp_path: Path):
    ev = [{**_kernel(1.0, 2.0), "cat": "gpu_kernel_v9"}]
    with pytest.raises(TraceError, match="unknown event categories 'gpu_kernel_v9'"):
        load_rank(_write(tmp_path / "rank0.json", _trace(ev)))
    rt = load_rank(_write(tmp_path / "rank1.json", _trace(ev + [_kernel(5.0, 1.0)], rank=1)))
    assert rt.flags[0].code == "unknown_event_category"


def test_duplicate_rank_and_bad_rank_do_not_stop_the_others(real_traces: Path, tmp_path: Path):
    dup = tmp_path / "copy_rank0.pt.trace.json.gz"
    dup.write_bytes((real_traces / GOOD).read_bytes())
    broken = tmp_path / "rank5.json"
    broken.write_text("{not json")
    ranks, flags = load_ranks([real_traces / GOOD, dup, broken,
                               real_traces / "vllm-cpu-tinyllama-tp2-rank1.pt.trace.json.gz"],
                              workers=1, progress=False)
    assert [r.rank for r in ranks] == [0, 1]
    codes = sorted(f.code for f in flags)
    assert codes == ["duplicate_rank", "rank_unreadable"]
    assert any("copy_rank0" in f.message for f in flags if f.code == "duplicate_rank")


def test_analyze_reports_bad_rank_in_flags(real_traces: Path, tmp_path: Path):
    broken = tmp_path / "rank7.json.gz"
    broken.write_bytes(gzip.compress(b'{"traceEvents": [')[:-6])
    an = analyze_traces([real_traces / GOOD, broken], tmp_path / "out", progress=False,
                        perfetto=False)
    assert [r.rank for r in an.summary.ranks] == [0]
    assert any(f.code == "rank_unreadable" and "rank7.json.gz" in f.message
               for f in an.summary.flags)
