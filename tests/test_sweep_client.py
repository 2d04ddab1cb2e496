"""The sweep client and level runner against the fake SSE server (no model involved)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from stepscope.config import SweepParams
from stepscope.schema import ArtifactError
from stepscope.errors import ServerError, StageInputMissing
from stepscope.sweep.client import ServerInfo, load_server, parse_prometheus_gauges
from stepscope.testing.fake_server import FakeBehaviour, FakeServer
from stepscope.sweep.run import LEVEL_COLUMNS, find_knee, plan_levels, run_sweep

from conftest import wait_for


def _server(fake: FakeServer) -> ServerInfo:
    return ServerInfo(base_url=fake.base_url, served_model="fake", tp=2)


def test_plan_levels_request_counts():
    p = SweepParams(concurrency=(1, 8), request_rates=(2.5,), min_requests=10)
    assert [(lv.name, lv.n_requests) for lv in plan_levels(p)] == [("c0001", 10), ("c0008", 32), ("r2.5", 12)]


def test_clean_sweep_writes_levels_and_exact_metrics(tmp_path):
    b = FakeBehaviour(first_chunk_delay_s=0.05, chunk_delay_s=0.01)
    p = SweepParams(concurrency=(1, 2), input_len=7, output_len=5, min_requests=4, warmup_requests=1)
    with FakeServer(b) as fake:
        res = run_sweep(_server(fake), p, tmp_path)
        # warm-up: 1 request before c0001, a full wave of 2 before c0002
        assert fake.n_requests == (1 + 4) + (2 + 8)
    assert list(res.levels.columns) == LEVEL_COLUMNS
    assert res.levels["level"].tolist() == ["c0001", "c0002"]
    assert res.levels["n_completed"].tolist() == [4, 8] and res.levels["n_failed"].sum() == 0
    measured = [json.loads(x) for x in (tmp_path / "levels" / "c0001.jsonl").read_text().splitlines()]
    warm = [json.loads(x) for x in (tmp_path / "levels" / "c0002.warmup.jsonl").read_text().splitlines()]
    # the warm-ups in a file of their own (a full wave of 2 before c0002), the measured ones alone
    assert len(measured) == 4 and not any(x["warmup"] for x in measured)
    assert [x["warmup"] for x in warm] == [True, True]
    # exact lengths: the fake reports the prompt length it received and the tokens it sent
    assert {x["input_tokens"] for x in measured} == {7} and {x["output_tokens"] for x in measured} == {5}
    assert all(len(x["chunk_times_s"]) == 5 for x in measured)
    assert res.levels["merged_token_share"].tolist() == [0.0, 0.0]
    c1 = res.levels.iloc[0]
    assert c1["ttft_ms_median"] >= 50 and c1["tpot_ms_median"] >= 10
    assert c1["server_running_max"] == 1.0 and c1["kv_cache_usage_max"] == 0.25
    assert (tmp_path / "levels.csv").is_file()
    assert not list((tmp_path / "levels").glob("*.partial.jsonl"))  # replaced by the level's files
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["c1_ttft_ms_median"] == pytest.approx(c1["ttft_ms_median"])
    assert summary["died_at_level"] is None


def test_merged_tokens_are_measured_and_flagged(tmp_path):
    # Like vLLM when its API process falls behind: 6 tokens in 3 chunks of 2.
    b = FakeBehaviour(chunk_delay_s=0.002, tokens_per_chunk=2)
    p = SweepParams(concurrency=(1,), input_len=3, output_len=6, min_requests=3, warmup_requests=0)
    with FakeServer(b) as fake:
        res = run_sweep(_server(fake), p, tmp_path)
    lv = res.levels.iloc[0]
    assert lv["merged_token_share"] == pytest.approx(0.5)
    # TPOT divides by the usage count (6 tokens, 5 steps); ITL only sees 2 gaps per request.
    lines = [json.loads(x) for x in (tmp_path / "levels" / "c0001.jsonl").read_text().splitlines()]
    assert all(len(x["chunk_times_s"]) == 3 and x["output_tokens"] == 6 for x in lines)
    assert any("c0001: 50% of output tokens arrived merged" in f for f in res.summary["flags"])


def test_failures_are_recorded_with_messages_and_excluded(tmp_path):
    b = FakeBehaviour(fail_every=3, sse_error_every=5, reset_every=7)
    p = SweepParams(concurrency=(2,), input_len=4, output_len=4, min_requests=20, warmup_requests=0)
    with FakeServer(b) as fake:
        res = run_sweep(_server(fake), p, tmp_path)
    lv = res.levels.iloc[0]
    errors = res.failures["error"].tolist()
    assert any(e.startswith("HTTP 500") and "fake overload" in e for e in errors)
    assert any(e == "SSE error: fake engine error" for e in errors)
    # n=3,6,9,12,15,18 -> 500; 5,10,20 -> SSE error; 7,14 -> reset  (15 is a 500 first)
    assert lv["n_failed"] == 11 and lv["n_completed"] == 9
    assert lv["total_throughput_tok_s"] == pytest.approx(9 * 8 / lv["duration_s"])
    assert res.summary["n_failures"] == 11
    assert any("11 of 20 requests failed" in f for f in res.summary["flags"])


def test_timeout_is_a_failure(tmp_path):
    b = FakeBehaviour(hang_every=2, hang_s=2.0)
    p = SweepParams(concurrency=(1,), input_len=2, output_len=2, min_requests=2, warmup_requests=0,
                    request_timeout_s=0.3)
    with FakeServer(b) as fake:
        res = run_sweep(_server(fake), p, tmp_path)
    # 4 requests (4 x C); the fake stalls the 2nd and 4th
    assert res.failures["error"].tolist() == ["timeout after 0.3 s"] * 2
    assert res.levels["n_completed"].tolist() == [2]


def test_server_death_stops_the_sweep_and_resume_skips_done_levels(tmp_path):
    p = SweepParams(concurrency=(1, 2, 4), input_len=2, output_len=3, min_requests=4, warmup_requests=1)
    with FakeServer(FakeBehaviour(die_after=10)) as fake:
        res = run_sweep(_server(fake), p, tmp_path)
    assert res.summary["died_at_level"] == "c0002"
    assert "c0002" in res.summary["died_message"]
    assert (tmp_path / "levels" / "c0001.jsonl").is_file()
    assert (tmp_path / "levels" / "c0002.jsonl").is_file()  # what it got is kept
    assert not (tmp_path / "levels" / "c0004.jsonl").exists()
    assert bool(res.levels.set_index("level").loc["c0001", "complete"]) is True
    with pytest.raises(ServerError, match="c0002"):
        res.raise_if_died()
    # resume: c0001 is kept, c0002 re-measured, c0004 measured
    with FakeServer(FakeBehaviour()) as fake:
        res2 = run_sweep(_server(fake), p, tmp_path, resume=True)
        assert fake.n_requests == (2 + 8) + (4 + 16)  # warm-ups: a full wave
    assert res2.summary["died_at_level"] is None
    assert res2.levels["n_completed"].tolist() == [4, 8, 16]
    assert any("c0001: already measured" in m for m in res2.messages)


INTERRUPTED_SWEEP = """
import sys
from stepscope.config import SweepParams
from stepscope.sweep.client import ServerInfo
from stepscope.sweep.run import run_sweep
p = SweepParams(concurrency=(1, 2), input_len=2, output_len=4, min_requests=4, warmup_requests=0)
run_sweep(ServerInfo(base_url=sys.argv[1], served_model="fake", tp=2), p, sys.argv[2])
"""


def test_ctrl_c_mid_level_keeps_its_finished_requests(tmp_path):
    import signal
    import subprocess
    import sys

    # c0001 (4 requests) is quick; c0002 (8 requests, 2 at a time, ~2 s each) is interrupted once
    # two have finished, which leaves the interrupt about 6 s to land before the level would end.
    with FakeServer(FakeBehaviour()) as fast, FakeServer(FakeBehaviour(chunk_delay_s=0.5)) as slow:
        # Measure c0001 fast first; then the same sweep against the slow server resumes at c0002.
        run_sweep(_server(fast), SweepParams(concurrency=(1,), input_len=2, output_len=4, min_requests=4,
                                              warmup_requests=0), tmp_path)
        proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED_SWEEP, slow.base_url, str(tmp_path)],
                                stderr=subprocess.PIPE, text=True)
        partial = tmp_path / "levels" / "c0002.partial.jsonl"
        try:
            wait_for(lambda: partial.is_file() and len(partial.read_text().splitlines()) >= 2,
                     "two finished requests of c0002", timeout_s=120)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode != 0
    kept = [json.loads(x) for x in partial.read_text().splitlines()]
    assert 2 <= len(kept) < 8 and all(r["success"] and len(r["chunk_times_s"]) == 4 for r in kept)
    assert f"sweep interrupted during level c0002: its {len(kept)} finished requests are in {partial}" in err
    # The complete level stays complete and tabulated; the interrupted one is not in the table.
    assert pd.read_csv(tmp_path / "levels.csv")["level"].tolist() == ["c0001"]
    assert not (tmp_path / "levels" / "c0002.jsonl").exists()


def test_open_loop_rate_level(tmp_path):
    p = SweepParams(concurrency=(), request_rates=(50.0,), input_len=2, output_len=2,
                    min_requests=10, warmup_requests=0)
    with FakeServer(FakeBehaviour()) as fake:
        res = run_sweep(_server(fake), p, tmp_path)
    row = res.levels.iloc[0]
    assert row["mode"] == "rate" and row["request_rate"] == 50.0 and row["n_completed"] == 200


def test_prometheus_gauges_sum_over_labels():
    text = ('# HELP x\nvllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
            'vllm:num_requests_running{engine="1",model_name="m"} 2.0\n'
            'vllm:num_requests_waiting_by_reason{reason="capacity"} 9.0\n'
            'vllm:num_requests_waiting{engine="0"} 4.0\nvllm:kv_cache_usage_perc{engine="0"} 0.5\n')
    assert parse_prometheus_gauges(text) == {"running": 5.0, "waiting": 4.0, "kv_cache_usage": 0.5}


def _levels(conc, tput):
    return pd.DataFrame({"mode": "concurrency", "concurrency": conc, "complete": True,
                         "n_completed": 10, "output_throughput_tok_s": tput})


def test_knee_is_first_level_where_doubling_adds_little():
    k = find_knee(_levels([1, 2, 4, 8, 16], [100, 190, 300, 320, 330]), 0.10)
    assert k["knee_concurrency"] == 4 and k["plateau_output_tok_s"] == 330
    assert k["gains_per_doubling"][4] == pytest.approx(320 / 300 - 1)
    # a skipped level (4 -> 16) is scaled to one doubling: sqrt(1.15) - 1 < 10 %
    k = find_knee(_levels([1, 4, 16], [100, 300, 345]), 0.10)
    assert k["knee_concurrency"] == 4
    assert find_knee(_levels([1, 2], [100, 200]), 0.10)["knee_concurrency"] is None


def test_a_dip_before_throughput_climbs_again_is_no_knee():
    # Measured on the CPU demo: C=2 gained nothing over C=1, then C=16 gave 11x C=1.
    k = find_knee(_levels([1, 2, 4, 8, 16], [177, 175, 274, 239, 2033]), 0.10)
    assert k["knee_concurrency"] is None
    assert k["gains_per_doubling"][1] == pytest.approx(175 / 177 - 1)
    # A dip followed by a real plateau: the knee is where the plateau starts.
    k = find_knee(_levels([1, 2, 4, 8, 16], [100, 99, 200, 205, 208]), 0.10)
    assert k["knee_concurrency"] == 4 and k["plateau_output_tok_s"] == 208


def test_load_server_errors(tmp_path):
    with pytest.raises(StageInputMissing, match="server.json"):
        load_server(tmp_path)
    (tmp_path / "00_deploy").mkdir()
    (tmp_path / "00_deploy" / "server.json").write_text(json.dumps({"base_url": "http://x"}))
    with pytest.raises(ArtifactError, match="server.json.*missing required field `mode`"):
        load_server(tmp_path)
    record = {"mode": "attach", "engine": "vllm", "base_url": "http://x"}
    (tmp_path / "00_deploy" / "server.json").write_text(json.dumps(record))
    with pytest.raises(StageInputMissing, match="served_model"):
        load_server(tmp_path)
    (tmp_path / "00_deploy" / "server.json").write_text(json.dumps(
        {**record, "served_model": "m", "tp": 2, "api_key_env": "SS_TEST_KEY"}))
    s = load_server(tmp_path)
    assert s.tp == 2 and s.headers == {}
    import os
    os.environ["SS_TEST_KEY"] = "k1"
    try:
        assert s.headers == {"Authorization": "Bearer k1"}
    finally:
        del os.environ["SS_TEST_KEY"]


def test_all_requests_failing_fails_the_stage_with_the_first_error(tmp_path):
    p = SweepParams(concurrency=(1,), input_len=2, output_len=2, min_requests=2, warmup_requests=0)
    with FakeServer(FakeBehaviour(fail_every=1)) as fake:
        res = run_sweep(_server(fake), p, tmp_path)
    assert res.summary["died_at_level"] is None  # the server is alive, it refuses
    with pytest.raises(ServerError, match="every request of the sweep failed.*fake overload"):
        res.raise_if_died()


def test_without_tokenize_the_local_tokenizer_is_used_or_the_error_says_how(tmp_path, repo_root):
    p = SweepParams(concurrency=(1,), input_len=5, output_len=2, min_requests=2, warmup_requests=0)
    with FakeServer(FakeBehaviour(tokenize=False)) as fake:
        with pytest.raises(ServerError, match="/tokenize answered HTTP 404"):
            run_sweep(_server(fake), p, tmp_path / "a")
        model = repo_root / "outputs" / "models" / "tiny-llama"
        if not (model / "tokenizer_config.json").is_file():
            pytest.skip("tiny model not built here")
        server = ServerInfo(base_url=fake.base_url, served_model="fake", model_path=str(model))
        res = run_sweep(server, p, tmp_path / "b")
    assert res.levels["n_completed"].tolist() == [4]
    recs = [json.loads(x) for x in (tmp_path / "b" / "levels" / "c0001.jsonl").read_text().splitlines()]
    assert {r["input_tokens"] for r in recs} == {5}
