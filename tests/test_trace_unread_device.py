"""Device work in a category stepscope does not read (issue 35, class 6): a Meta MTIA trace records
its accelerator's work only as `mtia_ccp_events`. It is counted and flagged, and the analysis makes
no device claim as if that work were absent."""

from __future__ import annotations

import gzip
import json

import pytest

from stepscope.trace.analyze import analyze_traces

MTIA = "hta-mtia-inference.json.gz"


def _independent_counts(path) -> tuple[int, float, int]:
    """(mtia_ccp_events, their summed dur µs, kernel events), with plain gzip + json."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    ccp = [e for e in events if e.get("cat") == "mtia_ccp_events" and e.get("ph") == "X"]
    return len(ccp), sum(float(e["dur"]) for e in ccp), sum(e.get("cat") == "kernel" for e in events)


def test_unread_device_work_is_counted_flagged_and_withdraws_device_claims(real_traces, tmp_path):
    n, dur_us, n_kernels = _independent_counts(real_traces / MTIA)
    assert (n, n_kernels) == (1313, 0)
    an = analyze_traces([real_traces / MTIA], tmp_path / "out", perfetto=False, progress=False)
    flag, = [f for f in an.summary.flags if f.code == "unread_device_work"]
    top, = flag.top_names
    assert (flag.rank, flag.cpu, top.name, top.count) == (0, True, "mtia_ccp_events", n)
    assert top.sum_us == pytest.approx(dur_us, rel=1e-12)
    assert "1,313 device events in 'mtia_ccp_events' (812.1 ms)" in flag.message
    assert "claims nothing of the device" in flag.message
    # The evidence the report's device_work_recorded guard reads: no lever, boundness or
    # communication claim rests on host ops of an accelerator job.
    evidence = an.summary.trace_info.host_only_of_gpu_job
    assert evidence[0] == "1,313 device events in 'mtia_ccp_events' (812.1 ms) not read"


def test_a_trace_without_unread_device_work_gets_no_such_flag(real_traces, tmp_path):
    an = analyze_traces([real_traces / "hta-cpu-only.json.gz"], tmp_path / "out", perfetto=False,
                        progress=False)
    assert not [f for f in an.summary.flags if f.code == "unread_device_work"]


@pytest.mark.parametrize("odd", [{"cat": "a_new_category"}, {"cat": "cpu_op", "ts": "7"}],
                         ids=["unknown-category", "string-timestamp"])
def test_unread_device_work_is_counted_on_the_parser_slow_paths_too(tmp_path, odd):
    """A chunk the tagged decoder refuses (an unknown category, a field of another type) is read by
    the generic paths, which count the unread device events the same way."""
    from stepscope.trace.parse import parse_trace

    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5},
              {"ph": "X", "name": "x", "pid": 1, "tid": 1, "ts": 20, "dur": 1, **odd},
              {"ph": "X", "cat": "mtia_ccp_events", "name": "dma_request", "pid": 2, "tid": 3, "ts": 1, "dur": 100},
              {"ph": "X", "cat": "mtia_ccp_events", "name": "op", "pid": 2, "tid": 3, "ts": 200, "dur": 50.5}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert parse_trace(path).stats["unread_device"] == {"mtia_ccp_events": {"n_events": 2, "dur_us": 150.5}}
