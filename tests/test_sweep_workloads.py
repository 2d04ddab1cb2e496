"""Workload sources (stepscope.sweep.workloads) on the samples shipped in params/workloads/,
and the level table's length distributions and prefix-cache hit rate."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from stepscope.config import SweepParams, TinyModelParams, WorkloadParams, load_params, params_from_dict
from stepscope.errors import ParamsError
from stepscope.sweep.workloads import (WorkloadSource, load_mooncake, load_sharegpt, prefix_cache_hit_rate,
                                       workload_columns)

ROOT = Path(__file__).resolve().parents[1]
SHAREGPT = ROOT / "params" / "workloads" / "sharegpt_sample.json"
MOONCAKE = ROOT / "params" / "workloads" / "mooncake_sample.jsonl"
POOL = list(range(100, 400))


def test_sharegpt_sample_takes_the_first_human_turn_and_its_reply():
    convs = load_sharegpt(SHAREGPT)
    raw = json.loads(SHAREGPT.read_text())
    assert len(convs) == len(raw) == 24
    assert convs[0] == (raw[0]["conversations"][0]["value"], raw[0]["conversations"][1]["value"])


def test_sharegpt_output_lengths_come_from_the_reply_s_tokens(tmp_path):
    from transformers import AutoTokenizer

    from stepscope.serve import create_tiny_model

    tok = AutoTokenizer.from_pretrained(create_tiny_model(tmp_path / "m", TinyModelParams()))
    p = SweepParams(prompt_mode="sharegpt", workload=WorkloadParams(path=str(SHAREGPT)))
    src = WorkloadSource(p, POOL, "m", tokenizer=tok)
    first = src.payloads(24)
    reply0 = load_sharegpt(SHAREGPT)[0][1]
    assert first[0]["max_tokens"] == len(tok.encode(reply0, add_special_tokens=False))
    assert len({x["max_tokens"] for x in first}) > 10  # a distribution, not one length
    fixed = WorkloadSource(SweepParams(prompt_mode="sharegpt", output_len=7,
                                       workload=WorkloadParams(path=str(SHAREGPT), output_len_from="fixed")),
                           POOL, "m", tokenizer=tok)
    assert {x["max_tokens"] for x in fixed.payloads(5)} == {7}


def test_mooncake_sample_prompts_share_blocks_where_hash_ids_do():
    rows = load_mooncake(MOONCAKE)
    assert len(rows) == 40 and rows == sorted(rows, key=lambda r: r["timestamp_ms"])
    p = SweepParams(prompt_mode="mooncake", workload=WorkloadParams(path=str(MOONCAKE), hash_block_tokens=16))
    src = WorkloadSource(p, POOL, "m")
    pay = src.payloads(40)
    assert [len(x["prompt"]) for x in pay] == [r["input_length"] for r in rows]
    assert [x["max_tokens"] for x in pay] == [r["output_length"] for r in rows]
    # rows 0 and 1 share hash ids 0, 1, 2: their first 48 tokens are equal, the 4th block is not
    assert rows[1]["hash_ids"][:3] == rows[0]["hash_ids"][:3] and rows[1]["hash_ids"][3] != rows[0]["hash_ids"][3]
    assert pay[0]["prompt"][:48] == pay[1]["prompt"][:48] and pay[0]["prompt"][48:64] != pay[1]["prompt"][48:64]


def test_mooncake_replay_keeps_the_trace_s_timing_or_scales_it():
    p = SweepParams(prompt_mode="mooncake", workload=WorkloadParams(path=str(MOONCAKE), hash_block_tokens=16))
    src = WorkloadSource(p, POOL, "m")
    t = np.array([r["timestamp_ms"] for r in load_mooncake(MOONCAKE)]) / 1e3
    own = src.offsets_s(0, 40, None)
    np.testing.assert_allclose(own, t - t[0])
    at_10 = src.offsets_s(0, 40, 10.0)
    assert at_10[-1] == pytest.approx(39 / 10.0)  # 39 gaps at 10 req/s
    np.testing.assert_allclose(np.diff(at_10) / np.diff(own), at_10[-1] / own[-1])  # the pattern kept
    assert len(src.offsets_s(2, 60, 10.0)) == 60  # cycles past the trace's end


def test_shared_prefix_requests_share_one_of_n_prefixes_and_differ_after_it():
    p = SweepParams(prompt_mode="shared_prefix", input_len=40,
                    workload=WorkloadParams(num_prefixes=3, prefix_len=32))
    pay = WorkloadSource(p, POOL, "m").payloads(200)  # past the first pass, too
    prompts = [x["prompt"] for x in pay]
    assert {len(x) for x in prompts} == {40}
    assert len({tuple(x[:32]) for x in prompts}) == 3
    assert len({tuple(x[32:]) for x in prompts}) == 200


def test_bad_workload_files_name_the_file_and_the_fix(tmp_path):
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"timestamp": 1, "input_length": 5, "output_length": 2}\n{"timestamp": 2}\n')
    with pytest.raises(ParamsError, match=r"t.jsonl:2: is not a trace row .*input_length"):
        load_mooncake(bad)
    (tmp_path / "s.json").write_text('{"conversations": []}')
    with pytest.raises(ParamsError, match="s.json: is not a JSON list"):
        load_sharegpt(tmp_path / "s.json")
    with pytest.raises(ParamsError, match="sweep.workload.path"):
        params_from_dict({"run": {"name": "t"}, "sweep": {"prompt_mode": "mooncake"}})


def test_prefix_cache_hit_rate_differences_the_level_s_counters():
    samples = [{"prefix_cache_queries_total": 1000.0, "prefix_cache_hits_total": 100.0},
               {"prefix_cache_queries_total": 1500.0, "prefix_cache_hits_total": 400.0},
               {"prefix_cache_queries_total": 3000.0, "prefix_cache_hits_total": 1300.0}]
    assert prefix_cache_hit_rate(samples) == pytest.approx(1200 / 2000)
    assert math.isnan(prefix_cache_hit_rate([{"prefix_cache_queries_total": None}]))
    cols = workload_columns({"server_samples": samples}, np.array([10, 20, 30]), np.array([5, 5, 9]))
    assert cols["input_tokens_p50"] == 20 and cols["output_tokens_p90"] == pytest.approx(8.2)


def test_cpu_campaign_has_a_shared_prefix_variant():
    p = load_params(ROOT / "params" / "cpu-campaign.yaml")
    names = [v.name for v in p.campaign.variants]
    v = p.campaign.variants[names.index("tp2-shared-prefix")]
    assert v.overrides["sweep"]["prompt_mode"] == "shared_prefix"


def test_a_sweep_over_a_shared_prefix_workload_and_a_ramp(tmp_path):
    from stepscope.sweep.client import ServerInfo
    from stepscope.sweep.run import run_sweep
    from stepscope.testing.fake_server import FakeBehaviour, FakeServer

    p = params_from_dict({"run": {"name": "t"}, "sweep": {
        "concurrency": [2], "input_len": 24, "output_len": 3, "min_requests": 8, "warmup_requests": 0,
        "prompt_mode": "shared_prefix", "workload": {"num_prefixes": 2, "prefix_len": 16},
        "burstiness": 0.5, "ramp": {"strategy": "exponential", "start_rps": 20, "end_rps": 80, "n_requests": 12},
        "slo": {"ttft_ms": 5000}}}).sweep
    with FakeServer(FakeBehaviour()) as fake:
        res = run_sweep(ServerInfo(base_url=fake.base_url, served_model="fake"), p, tmp_path)
    lv = res.levels.set_index("level")
    assert list(lv.index) == ["c0002", "ramp-exp-20-80"]
    assert lv.loc["ramp-exp-20-80", "n_completed"] == 12 and lv.loc["ramp-exp-20-80", "mode"] == "ramp"
    assert (lv["input_tokens_p50"] == 24).all() and (lv["slo_met_share"] == 1.0).all()
    assert res.summary["slo"]["concurrency"]["boundary_level"] == "c0002"
    saved = pd.read_csv(tmp_path / "levels.csv")
    assert "goodput_tok_s" in saved and "prefix_cache_hit_rate" in saved


@pytest.mark.slow
def test_live_shared_prefix_is_served_by_the_prefix_cache(live_vllm_server, tmp_path):
    """On the real vLLM CPU server: prompts that share 64 of 96 tokens hit the prefix cache
    (vLLM's own /metrics counters), random token-ID prompts of the same length do not."""
    from stepscope.sweep import load_server
    from stepscope.sweep.run import run_sweep

    server = load_server(live_vllm_server.run_dir)
    base = {"concurrency": [2], "input_len": 96, "output_len": 4, "min_requests": 16, "warmup_requests": 0}
    shared = params_from_dict({"run": {"name": "t"}, "sweep": {
        **base, "prompt_mode": "shared_prefix", "workload": {"num_prefixes": 2, "prefix_len": 64}}}).sweep
    rand = params_from_dict({"run": {"name": "t"}, "sweep": base}).sweep
    hit = run_sweep(server, shared, tmp_path / "shared").levels.iloc[0]
    miss = run_sweep(server, rand, tmp_path / "random").levels.iloc[0]
    print(f"prefix cache hit rate: shared prefix {hit['prefix_cache_hit_rate']:.3f}, "
          f"random {miss['prefix_cache_hit_rate']:.3f}")
    assert hit["n_completed"] == 16 and hit["input_tokens_p50"] == 96
    # 64/96 of each prompt can hit, except in the first request of each of the 2 prefixes:
    # 64/96 x 14/16 = 0.583 (measured 2026-12-01: 0.583); a request racing its prefix's first
    # one before that is cached would miss too, hence the margin
    assert hit["prefix_cache_hit_rate"] == pytest.approx(64 / 96 * 14 / 16, abs=0.05)
    assert miss["prefix_cache_hit_rate"] < 0.05


def test_the_report_shows_length_spreads_and_the_prefix_cache_only_where_they_say_something(tmp_path):
    from stepscope.report import build_report
    from stepscope.testing.synthetic import make_synthetic_run, set_level_columns

    plain = make_synthetic_run(tmp_path / "plain")
    n = len(pd.read_csv(plain / "01_macro_sweep" / "levels.csv"))
    set_level_columns(plain, input_tokens_p50=[32] * n, input_tokens_p90=[32] * n, prefix_cache_hit_rate=[0.0] * n)
    md = build_report(plain, draw_figures=False)["markdown"].read_text()
    assert "prefix cache hit %" not in md and "input tok p50" not in md
    wl = make_synthetic_run(tmp_path / "wl")
    set_level_columns(wl, input_tokens_p50=[40] * n, input_tokens_p90=[150] * n, prefix_cache_hit_rate=[0.583] * n)
    md = build_report(wl, draw_figures=False)["markdown"].read_text()
    header = next(line for line in md.splitlines() if line.startswith("| concurrency") and "tok p50" in line)
    assert "input tok p50" in header and "input tok p90" in header and "prefix cache hit %" in header
    assert "output tok p50" not in header
    row = md.split(header, 1)[1].splitlines()[2]  # the first level's row of that table
    assert "| 58.3 |" in row
