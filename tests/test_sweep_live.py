"""The sweep against a real vLLM CPU server (slow): exact lengths, usage counts, vLLM agreement."""

from __future__ import annotations

import json

import pytest

from stepscope.config import SweepParams
from stepscope.sweep import load_server, run_sweep

pytestmark = pytest.mark.slow


def test_live_sweep_two_levels(live_vllm_server, tmp_path):
    server = load_server(live_vllm_server.run_dir)
    assert server.base_url == live_vllm_server.base_url and server.tp == live_vllm_server.tp
    p = SweepParams(concurrency=(1, 2), input_len=16, output_len=8, min_requests=4, warmup_requests=1)
    res = run_sweep(server, p, tmp_path)
    lv = res.levels.set_index("level")
    assert lv["n_completed"].tolist() == [4, 8] and lv["n_failed"].sum() == 0
    recs = [json.loads(x) for x in (tmp_path / "levels" / "c0002.jsonl").read_text().splitlines()]
    measured = [r for r in recs if not r["warmup"]]
    # the server's own usage confirms the exact lengths
    assert {r["input_tokens"] for r in measured} == {16}
    assert {r["output_tokens"] for r in measured} == {8}
    # One chunk per token, unless vLLM coalesced outputs because its API process fell
    # behind (it does on a busy 2-core machine); the level measures how often.
    n_chunks = [len(r["chunk_times_s"]) for r in measured]
    assert all(1 <= n <= 8 for n in n_chunks)
    assert lv.loc["c0002", "merged_token_share"] == pytest.approx((8 * 8 - sum(n_chunks)) / (8 * 8))
    assert lv.loc["c0001", "ttft_ms_median"] > 0
    # TPOT is 0 for a request whose tokens all came in its first chunk (the API process starved
    # on a loaded 2-core machine: seen in a fresh-clone run); with more than one chunk each, above 0
    c1 = [len(json.loads(x)["chunk_times_s"]) for x in (tmp_path / "levels" / "c0001.jsonl").read_text().splitlines()]
    assert lv.loc["c0001", "tpot_ms_median"] > 0 if min(c1) > 1 else lv.loc["c0001", "tpot_ms_median"] >= 0
    # /metrics was read around and during the level (a sub-second level may miss the
    # running gauge while it is non-zero, so only its presence is certain).
    meta = json.loads((tmp_path / "levels" / "c0002.meta.json").read_text())
    assert len(meta["server_metrics"]) >= 2
    assert lv.loc["c0002", "server_running_max"] >= 0
    assert res.summary["c1_tpot_ms_median"] == pytest.approx(lv.loc["c0001", "tpot_ms_median"])

    # vLLM's metric code on the same live records
    serve = pytest.importorskip("vllm.benchmarks.serve")
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput
    import numpy as np

    outs = []
    for r in measured:
        t = r["chunk_times_s"]
        outs.append(RequestFuncOutput(success=True, ttft=t[0] - r["start_s"], latency=t[-1] - r["start_s"],
                                      itl=list(np.diff(t)), output_tokens=r["output_tokens"],
                                      prompt_len=r["input_tokens"], start_time=r["start_s"]))
    theirs, _ = serve.calculate_metrics([], outs, lv.loc["c0002", "duration_s"], None, [99.0], {})
    assert lv.loc["c0002", "tpot_ms_mean"] == pytest.approx(theirs.mean_tpot_ms, rel=1e-9)
    assert lv.loc["c0002", "itl_ms_p99"] == pytest.approx(dict(theirs.percentiles_itl_ms)[99.0], rel=1e-9)
    assert lv.loc["c0002", "output_throughput_tok_s"] == pytest.approx(theirs.output_throughput, rel=1e-9)
