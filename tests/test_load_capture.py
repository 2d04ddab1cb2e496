"""Stage 04 under load: the bounded window's body per engine, the levels, and the client's
view of exactly the profiled window."""

from __future__ import annotations

import pytest

from stepscope.capture_load import load_body, load_levels, window_client_metrics
from stepscope.config import CaptureParams
from stepscope.sweep.metrics import RequestRecord


def test_batch_one_alone_is_todays_capture():
    assert load_levels(CaptureParams()) == []
    assert load_levels(CaptureParams(concurrency=(16, 1, 4, 4))) == [4, 16]


def test_vllm_bounds_the_window_by_engine_steps():
    body, how = load_body("vllm", CaptureParams(load_steps=20, load_delay_steps=2), "/x")
    # vLLM's StartProfileRequest fields (vllm/entrypoints/serve/profile/api_router.py, 0.32)
    assert (body, how) == ({"delay_iterations": 2, "max_iterations": 20}, "max_iterations")


def test_sglang_bounds_it_by_num_steps_into_its_folder():
    body, how = load_body("sglang", CaptureParams(load_steps=12), "/traces")
    assert how == "num_steps" and body["num_steps"] == 12 and body["output_dir"] == "/traces"


def _rec(i: int, start: float, chunks: list[float]) -> RequestRecord:
    r = RequestRecord(start_s=start, request_id=i, input_tokens=32)
    r.chunk_times_s.extend(chunks)
    r.end_s, r.success = chunks[-1], True
    return r


def test_the_client_window_counts_only_chunks_inside_it():
    recs = [_rec(0, 0.0, [0.5, 1.0, 1.5, 2.0]), _rec(1, 1.2, [1.4, 1.6, 3.5]), _rec(2, 4.0, [4.5])]
    w = window_client_metrics(recs, 1.0, 2.0, 2)
    assert w["token_chunks"] == 5  # 1.0, 1.5, 2.0 and 1.4, 1.6
    assert w["capture_output_tok_s"] == pytest.approx(5.0)
    assert (w["requests_overlapping"], w["requests_failed"]) == (2, 0)


def test_each_captured_load_level_gets_one_console_line():
    """Issue 38 item 2: a profiled load level in one line, as the sweep's levels: the window of
    the demo's c=4 capture (cpu-moe-check1's load_window.json), its traces and what is missing."""
    from stepscope.capture_load import capture_level_line

    window = {"concurrency": 4, "window_s": 0.467923490999965, "token_chunks": 39,
              "capture_output_tok_s": 83.34695895830312, "requests_overlapping": 5, "requests_failed": 0,
              "window_method": "max_iterations", "notes": []}
    assert capture_level_line(window, [0, 1], 2) == (
        "  capture c=4: 468 ms window (max_iterations), 39 token chunks (83.3 /s under the profiler), "
        "5 requests in flight, 0 failed; traces of 2 of 2 rank(s)")
    assert capture_level_line({**window, "notes": ["timed"]}, [0], 2).endswith(
        "traces of 1 of 2 rank(s), missing [1]; 1 note(s) in load_window.json")
