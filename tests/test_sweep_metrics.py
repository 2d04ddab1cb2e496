"""Serving metrics: hand-computed values, and agreement with vLLM's own metric code."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stepscope.sweep.metrics import RequestRecord, failures_table, level_metrics, request_table


def _records():
    # Two completed requests and one failure, times in seconds.
    a = RequestRecord(start_s=10.0, chunk_times_s=[10.1, 10.2, 10.4], end_s=10.41,
                      input_tokens=5, output_tokens=3, success=True, request_id=0)
    b = RequestRecord(start_s=10.0, chunk_times_s=[10.3, 10.5], end_s=10.6,
                      input_tokens=5, output_tokens=2, success=True, request_id=1)
    c = RequestRecord(start_s=10.5, end_s=10.7, success=False, error="HTTP 500: boom",
                      http_status=500, request_id=2)
    w = RequestRecord(start_s=1.0, chunk_times_s=[1.5], end_s=1.6, output_tokens=1,
                      success=True, warmup=True)
    return [w, a, b, c]


def test_hand_computed_level_metrics():
    m = level_metrics(_records())
    assert m["n_requests"] == 3 and m["n_completed"] == 2 and m["n_failed"] == 1
    assert m["duration_s"] == pytest.approx(0.7)  # 10.0 -> 10.7 (the failure's end counts)
    assert m["ttft_ms_mean"] == pytest.approx((100 + 300) / 2)
    # TPOT: a (400-100)/2 = 150 ms, b (500-300)/1 = 200 ms
    assert m["tpot_ms_mean"] == pytest.approx(175)
    assert m["tpot_ms_median"] == pytest.approx(175)
    # ITL pooled: 100, 200, 200
    assert m["itl_ms_mean"] == pytest.approx(500 / 3)
    assert m["itl_ms_p90"] == pytest.approx(np.percentile([100, 200, 200], 90))
    assert m["e2el_ms_p99"] == pytest.approx(np.percentile([400, 500], 99))
    assert m["output_throughput_tok_s"] == pytest.approx(5 / 0.7)
    assert m["total_throughput_tok_s"] == pytest.approx(15 / 0.7)
    assert m["request_throughput_rps"] == pytest.approx(2 / 0.7)
    assert m["littles_concurrency"] == pytest.approx(0.9 / 0.7)
    assert m["peak_output_tok_s_1s"] == pytest.approx(5)


def test_failures_excluded_and_reported():
    t = request_table(_records())
    assert len(t) == 3  # warm-up left out
    assert math.isnan(t.loc[t.request_id == 2, "ttft_ms"].item())
    f = failures_table(_records())
    assert f["error"].tolist() == ["HTTP 500: boom"]


def test_success_without_tokens_is_a_failure():
    r = RequestRecord(start_s=0.0, end_s=1.0, success=True, output_tokens=0)
    m = level_metrics([r])
    assert m["n_failed"] == 1 and m["n_completed"] == 0 and math.isnan(m["ttft_ms_mean"])
    assert "without a token" in failures_table([r])["error"].item()


def test_multi_token_chunks_weigh_the_peak():
    # 8 tokens in 2 chunks in the same second: the peak counts tokens, not chunks.
    r = RequestRecord(start_s=0.0, chunk_times_s=[0.2, 0.4], end_s=0.5, output_tokens=8, success=True)
    assert level_metrics([r])["peak_output_tok_s_1s"] == pytest.approx(8)


def test_agrees_with_vllm_calculate_metrics():
    serve = pytest.importorskip("vllm.benchmarks.serve")
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

    rng = np.random.default_rng(0)
    records, outputs = [], []
    t = 100.0
    for i in range(40):
        start = t + rng.uniform(0, 3)
        n_out = int(rng.integers(1, 30))
        gaps = rng.exponential(0.02, size=n_out)
        gaps[0] += rng.uniform(0.05, 0.5)  # the prefill
        chunks = list(start + np.cumsum(gaps))
        fail = i % 9 == 4
        rec = RequestRecord(start_s=start, chunk_times_s=[] if fail else chunks,
                            end_s=(start + 0.1) if fail else chunks[-1] + 0.001,
                            input_tokens=int(rng.integers(10, 100)),
                            output_tokens=None if fail else n_out, success=not fail,
                            error="reset" if fail else None, request_id=i)
        records.append(rec)
        o = RequestFuncOutput(success=not fail, prompt_len=rec.input_tokens, start_time=start)
        if not fail:
            o.ttft = chunks[0] - start
            o.itl = list(np.diff(chunks))
            o.latency = chunks[-1] - start
            o.output_tokens = n_out
        outputs.append(o)

    ours = level_metrics(records)
    theirs, _ = serve.calculate_metrics(
        input_requests=[], outputs=outputs, dur_s=ours["duration_s"], tokenizer=None,
        selected_percentiles=[50.0, 90.0, 99.0], goodput_config_dict={})

    assert ours["n_completed"] == theirs.completed and ours["n_failed"] == theirs.failed
    for ours_key, theirs_val in [
        ("request_throughput_rps", theirs.request_throughput),
        ("output_throughput_tok_s", theirs.output_throughput),
        ("total_throughput_tok_s", theirs.total_token_throughput),
        ("peak_output_tok_s_1s", theirs.max_output_tokens_per_s),
    ]:
        assert ours[ours_key] == pytest.approx(theirs_val, rel=1e-9), ours_key
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert ours[f"{name}_ms_mean"] == pytest.approx(getattr(theirs, f"mean_{name}_ms"), rel=1e-9)
        assert ours[f"{name}_ms_median"] == pytest.approx(getattr(theirs, f"median_{name}_ms"), rel=1e-9)
        pct = dict(getattr(theirs, f"percentiles_{name}_ms"))
        assert ours[f"{name}_ms_p90"] == pytest.approx(pct[90.0], rel=1e-9)
        assert ours[f"{name}_ms_p99"] == pytest.approx(pct[99.0], rel=1e-9)


def test_bunched_chunks_are_measured_and_flagged():
    import pandas as pd

    from stepscope.sweep.run import summarize

    # 3 of 4 gaps are zero: the chunks were held back and delivered in one read.
    bunched = RequestRecord(start_s=0.0, chunk_times_s=[0.1, 0.3, 0.3, 0.3, 0.3], end_s=0.31,
                            output_tokens=5, success=True)
    steady = RequestRecord(start_s=0.0, chunk_times_s=[0.1, 0.11, 0.12], end_s=0.13,
                           output_tokens=3, success=True)
    assert level_metrics([bunched])["bunched_chunk_share"] == pytest.approx(0.75)
    assert level_metrics([steady])["bunched_chunk_share"] == 0.0
    levels = pd.DataFrame([{"level": "c0002", "mode": "concurrency", "concurrency": 2, "request_rate": None,
                            "complete": True, "n_completed": 1, "n_failed": 0, "n_requests": 1,
                            "output_throughput_tok_s": 10.0, "client_bound": False, "client_cpu_pct": 1.0,
                            "ttft_ms_median": 100.0, "tpot_ms_median": 0.0, "bunched_chunk_share": 0.75}])
    flags = summarize(levels, pd.DataFrame(), 0.1)["flags"]
    assert any("c0002: 75% of token chunks arrived together" in f for f in flags)
