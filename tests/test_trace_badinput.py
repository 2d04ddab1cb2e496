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


# --------------------------------------------------------------------------- one bad event (issue 39)

FULLGRAPH = Path(__file__).parent / "data" / "traces" / "vllm-mi300x-gptoss-decode-fullgraph.json.gz"


def _fullgraph_with(tmp_path: Path, bad_kernels: int, value: str = "NaN") -> tuple[Path, list[float]]:
    """The real mi300x decode trace with the `dur` of its first `bad_kernels` kernels replaced
    by `value` (written raw: JSON has no NaN); returns the file and the durations replaced."""
    with gzip.open(FULLGRAPH, "rt") as fh:
        doc = json.load(fh)
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    lost = []
    for e in kernels[10:10 + bad_kernels]:  # inside the decode step, not its first kernel
        lost.append(e["dur"])
        e["dur"] = "BAD_DUR"
    p = tmp_path / "rank0.json.gz"
    with gzip.open(p, "wt") as fh:
        fh.write(json.dumps(doc).replace('"BAD_DUR"', value))
    return p, lost


@pytest.mark.parametrize("value", ["NaN", '"many"'])
def test_one_bad_event_of_a_real_trace_is_dropped_and_flagged_and_the_rank_kept(tmp_path: Path, value: str):
    """One NaN (or non-numeric) `dur` among the 434 work events of a real decode trace refused
    the whole rank as damaged (0.23 % over a 0.1 % tolerance): it is dropped, flagged with its
    count and share, and every other number is the trace's own."""
    from stepscope.thresholds import BAD_EVENT_SHARE_LIMIT

    bad, (lost_us,) = _fullgraph_with(tmp_path, 1, value)
    full = analyze_traces(FULLGRAPH, tmp_path / "full", perfetto=False, progress=False)
    one = analyze_traces(bad, tmp_path / "bad", perfetto=False, progress=False)
    assert [r.rank for r in one.summary.ranks] == [0]
    flag, = [f for f in one.summary.flags if f.code == "bad_durations"]
    assert (flag.rank, flag.n_events, flag.limit_share) == (0, 1, BAD_EVENT_SHARE_LIMIT)
    assert flag.share == pytest.approx(1 / 434)
    assert "dropped 1 work events (0.23% of them; a rank is refused above 1%)" in flag.message
    rf, rb = full.summary.ranks[0], one.summary.ranks[0]
    assert (rf.n_device_events, rb.n_device_events) == (434, 433)
    assert rb.kernel_sum_us == pytest.approx(rf.kernel_sum_us - lost_us, rel=1e-12)
    assert (rb.step_source, rb.step_kinds, rb.n_steps) == (rf.step_source, rf.step_kinds, rf.n_steps)
    assert rb.span_us == rf.span_us
    written = json.loads((tmp_path / "bad" / "summary.json").read_text())
    assert {"code": "bad_durations", "n_events": 1, "share": pytest.approx(1 / 434)}.items() <= \
        next(f for f in written["flags"] if f["code"] == "bad_durations").items()


def test_bad_events_over_the_share_refuse_the_rank_naming_the_share_and_the_limit(tmp_path: Path):
    bad, _ = _fullgraph_with(tmp_path, 5)  # 5 of 434: 1.15 %, over 1 %
    with pytest.raises(TraceError) as err:
        load_rank(bad)
    msg = str(err.value)
    assert "5 of 434 work events (1.15%) have a missing or negative duration" in msg
    assert "over the 1% of its work events a rank may lose (thresholds.BAD_EVENT_SHARE_LIMIT)" in msg
    assert str(bad) in msg
    assert load_rank(_fullgraph_with(tmp_path, 4)[0]).flags[0].n_events == 4  # 0.92 %: kept
