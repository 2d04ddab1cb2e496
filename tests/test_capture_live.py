"""A real TP=2 profiler capture from a vLLM CPU server (slow)."""

from __future__ import annotations

import json

import pytest

from stepscope.capture import capture_profile, gzip_complete
from stepscope.config import CaptureParams
from stepscope.sweep import load_server
from stepscope.thresholds import BUNCHED_TTFT_SHARE

pytestmark = pytest.mark.slow


def test_live_capture_tp2(live_vllm_server, tmp_path):
    server = load_server(live_vllm_server.run_dir)
    cap = CaptureParams(warmup_requests=1, requests=2, input_len=16, output_len=8, wait_timeout_s=300)
    res = capture_profile(server, cap, tmp_path)
    m = res.manifest
    assert m["partial"] is False and m["ranks_found"] == list(range(live_vllm_server.tp))
    traces = [f for f in m["files"] if f["kind"] == "trace"]
    assert len(traces) == live_vllm_server.tp
    for f in traces:
        complete, rank = gzip_complete(tmp_path / f["path"])
        assert complete and rank == f["rank"]
    assert {f["kind"] for f in m["files"]} >= {"trace", "profiler_table"}
    lat = json.loads((tmp_path / "capture_latency.json").read_text())
    assert lat["n_completed"] == 2 and lat["tpot_ms_median"] >= 0
    # TPOT is 0 only when the (loaded) CPU server delivered the tokens in one burst, which the
    # campaign's bunched rule then recognises: first token late in the request's life.
    if lat["tpot_ms_median"] == 0:
        assert lat["ttft_ms_median"] > BUNCHED_TTFT_SHARE * lat["e2el_ms_median"], lat
    # a second capture must collect only its own files
    res2 = capture_profile(server, cap, tmp_path / "again")
    names1 = {f["path"] for f in traces}
    names2 = {f["path"] for f in res2.manifest["files"] if f["kind"] == "trace"}
    assert names1.isdisjoint(names2) and len(names2) == live_vllm_server.tp
