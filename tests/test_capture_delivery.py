"""A capture whose tokens arrived in bursts: its client-side TPOT measures delivery, not decode.

On the CPU demo (2 cores, TP=2, the profiler on) the API process starves and every measured
request's 32 chunks arrive in one instant: TTFT = E2EL and TPOT = (E2EL - TTFT)/31 = 0 ms. The
report used to show "TPOT mean 0 ms", set 0 ms beside the step readings and, with no reading
left to compare, claim there was no span. Stage 04 now records the chunk bunching, stage 05
flags the TPOT instead of using it, and the report and the campaign never quote it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepscope import schema
from stepscope.capture import _write_requests_and_latency
from stepscope.config import CaptureParams
from stepscope.report.analysis import reconciliation
from stepscope.wording import fmt_num
from stepscope.sweep.metrics import RequestRecord
from stepscope.trace.analyze import capture_tpot

RECORDS = Path(__file__).parent / "data" / "capture" / "vllm-cpu-tinyllama-tp2-bunched.capture_requests.jsonl"
STALLED = RECORDS.with_name("vllm-cpu-tinyllama-tp2-ngram-stalled.capture_requests.jsonl")


def _records(path: Path = RECORDS) -> list[RequestRecord]:
    return [RequestRecord.from_dict(json.loads(line)) for line in path.read_text().splitlines()]


def _capture(run_dir: Path, records: list[RequestRecord]) -> schema.CaptureLatency:
    out = run_dir / "04_profiler_capture"
    out.mkdir(parents=True)
    run = {"warm": [r for r in records if r.warmup], "records": [r for r in records if not r.warmup]}
    _write_requests_and_latency(run, CaptureParams(), out)
    return schema.read(out / "capture_latency.json", schema.CaptureLatency)


def test_real_bunched_capture_is_flagged_not_used(tmp_path: Path):
    lat = _capture(tmp_path, _records())
    assert lat.n_completed == 5 and lat.tpot_ms_mean == 0.0
    assert lat.bunched_chunk_share == 1.0 and lat.merged_token_share == 0.0
    assert lat.ttft_ms_median == lat.e2el_ms_median == pytest.approx(214.04, abs=0.01)
    assert lat.tpot_is_delivery()
    tpot, flag = capture_tpot(tmp_path)
    assert tpot is None
    assert flag.code == "capture_tpot_is_delivery" and flag.severity == "warning"
    assert "(mean 0.000 ms) measures delivery, not decode" in flag.message
    assert "100 % of token chunks arrived together" in flag.message
    assert f"median TTFT {fmt_num(lat.ttft_ms_median)} of {fmt_num(lat.e2el_ms_median)} ms" in flag.message


def test_real_request_with_spaced_chunks_keeps_its_tpot(tmp_path: Path):
    first = _records()[0]  # the first warm-up: a chunk every 3-7 ms
    chunks = first.chunk_times_s
    lat = _capture(tmp_path, [RequestRecord.from_dict({**first.to_dict(), "warmup": False})])
    assert lat.bunched_chunk_share == 0.0 and not lat.tpot_is_delivery()
    expected_ms = 1e3 * (chunks[-1] - chunks[0]) / (first.output_tokens - 1)  # E2EL - TTFT, to the last chunk
    assert lat.tpot_ms_mean == pytest.approx(expected_ms)
    assert capture_tpot(tmp_path) == (pytest.approx(expected_ms), None)


def test_older_capture_without_chunk_share_is_judged_by_ttft(tmp_path: Path):
    d = tmp_path / "04_profiler_capture"
    d.mkdir()
    (d / "capture_latency.json").write_text(json.dumps(
        {"tpot_ms_mean": 0.5, "ttft_ms_median": 204.0, "e2el_ms_median": 221.0}))
    assert capture_tpot(tmp_path)[0] is None
    (d / "capture_latency.json").write_text(json.dumps(
        {"tpot_ms_mean": 6.5, "ttft_ms_median": 20.0, "e2el_ms_median": 221.0}))
    assert capture_tpot(tmp_path) == (6.5, None)


def test_unreadable_capture_latency_is_named(tmp_path: Path):
    d = tmp_path / "04_profiler_capture"
    d.mkdir()
    (d / "capture_latency.json").write_text('{"tpot_ms_mean": "fast"')
    tpot, flag = capture_tpot(tmp_path)
    assert tpot is None and flag.code == "capture_latency_unreadable"
    assert str(d / "capture_latency.json") in flag.message


def test_reconciliation_claims_no_missing_span_for_a_zero_tpot():
    totals = {"mode": "cpu", "kernel_sum_ms": 1.90, "union_ms": 1.90, "span_ms": 3.68, "tpot_capture_ms": 0.0}
    text = " ".join(reconciliation(totals))
    assert "span of 3.68 ms" in text
    assert "TPOT" not in text and "without a span" not in text
    no_span = reconciliation({"mode": "cpu", "kernel_sum_ms": 1.90, "tpot_capture_ms": 4.0})
    assert no_span == ["The capture's TPOT is 4.00 ms against 1.90 ms of summed op time per step; "
                       "without a span the gap cannot be split into overlap and idle time."]


def test_real_capture_that_stalled_mid_stream_is_flagged_not_used(tmp_path: Path):
    """The n-gram variant of the 2026-12-01 09:51 CPU campaign: one of 3 requests stopped for
    1.15 s. The client's mean TPOT (6.05 ms) carries the stall; the trace's steps gave 2.52 ms
    per token. The stall is counted by the sweep's rule and the TPOT set aside."""
    recs = _records(STALLED)
    lat = _capture(tmp_path, recs)
    assert lat.n_completed == 3 and lat.tpot_ms_mean == pytest.approx(6.05, abs=0.01)
    assert lat.tpot_ms_median == pytest.approx(2.98, abs=0.01)
    measured = [r for r in recs if not r.warmup]
    wall_s = max(r.end_s for r in measured) - min(r.start_s for r in measured)
    assert lat.stall_total_s == pytest.approx(1.15, abs=0.005)
    assert lat.stall_share == pytest.approx(lat.stall_total_s / wall_s)
    assert lat.stalled() and not lat.bunched() and lat.tpot_is_delivery()
    tpot, flag = capture_tpot(tmp_path)
    assert tpot is None and flag.code == "capture_tpot_is_delivery"
    assert (f"the stream stopped for {fmt_num(lat.stall_total_s)} s in all, {fmt_num(100 * lat.stall_share)} % of "
            "the capture") in flag.message
