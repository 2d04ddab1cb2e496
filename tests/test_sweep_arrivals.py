"""Arrival shaping (stepscope.sweep.arrivals): gamma gaps with a burstiness factor and rate
ramps, as vLLM's benchmark defines them."""

from __future__ import annotations

import numpy as np
import pytest

from stepscope.sweep.arrivals import arrival_offsets_s, ramp_rates, scaled_trace_offsets_s

N = 20_000
"""Requests per sample. The sample CV's relative standard error is about
sqrt((kurtosis - 1) / (4 N)); a gamma of shape k has kurtosis 3 + 6/k, so at k = 0.25 (the
widest case here) it is sqrt(26 / 80 000) = 1.8 %. The 6 % tolerance is over 3 standard
errors there and over 8 at k = 1, so a correct generator does not fail by chance, while a
generator that ignored the shape (CV 1 instead of 2 or 0.5) is off by 50 % or more."""


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gaps_have_the_rate_s_mean_and_cv_one_over_sqrt_burstiness(burstiness):
    rate = 8.0
    offsets = arrival_offsets_s(N, rate, burstiness=burstiness, seed=3)
    gaps = np.diff(np.concatenate([[0.0], offsets]))
    # Rescaled as vLLM does: the level spans exactly N / rate.
    assert offsets[-1] == pytest.approx(N / rate, rel=1e-12)
    assert gaps.mean() == pytest.approx(1 / rate, rel=1e-12)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.06)
    assert np.all(gaps >= 0)


def test_the_same_seed_gives_the_same_arrivals_and_another_seed_does_not():
    a, b = arrival_offsets_s(50, 2.0, seed=7), arrival_offsets_s(50, 2.0, seed=7)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, arrival_offsets_s(50, 2.0, seed=8))


def test_ramp_rates_match_vllms_formula():
    serve = pytest.importorskip("vllm.benchmarks.serve")
    for strategy in ("linear", "exponential"):
        ours = ramp_rates(37, strategy, 1.0, 16.0)
        theirs = [serve._get_current_request_rate(strategy, 1, 16, i, 37, 99.0) for i in range(37)]
        np.testing.assert_allclose(ours, theirs, rtol=1e-12)
    assert ramp_rates(5, "exponential", 1.0, 16.0).tolist() == pytest.approx([1, 2, 4, 8, 16])


def test_a_ramp_s_gaps_follow_the_rate_in_force():
    rates = ramp_rates(N, "linear", 1.0, 9.0)
    gaps = np.diff(np.concatenate([[0.0], arrival_offsets_s(N, rates, seed=1)]))
    # No rescaling under a ramp; each tenth's mean gap is the mean of 1/rate over it. 2000
    # exponential gaps per tenth: a standard error of 1/sqrt(2000) = 2.2 %, tolerance 8 %.
    for part in np.array_split(np.arange(N), 10):
        assert gaps[part].mean() == pytest.approx(np.mean(1 / rates[part]), rel=0.08)


def test_a_trace_keeps_its_pattern_scaled_to_a_rate():
    t = np.array([5.0, 5.0, 6.0, 9.0])  # a burst of two, then gaps of 1 s and 3 s
    assert scaled_trace_offsets_s(t).tolist() == [0.0, 0.0, 1.0, 4.0]
    scaled = scaled_trace_offsets_s(t, rate_rps=3.0)  # 3 gaps in 1 s
    assert scaled.tolist() == pytest.approx([0.0, 0.0, 0.25, 1.0])


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="positive"):
        arrival_offsets_s(4, 1.0, burstiness=0.0)
    with pytest.raises(ValueError, match="linear or exponential"):
        ramp_rates(4, "step", 1.0, 2.0)
