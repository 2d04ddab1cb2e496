"""Open-loop arrival times: gamma-distributed gaps with a burstiness factor, and rate ramps.

Both follow `vllm bench serve` (`get_request`, `_get_current_request_rate`); the formulas are in
docs/workloads.md#arrival-shaping. Without a ramp the offsets are rescaled so the level's mean rate is the one
asked for, as vLLM does.
"""

from __future__ import annotations

import math

import numpy as np


def ramp_rates(n: int, strategy: str, start_rps: float, end_rps: float) -> np.ndarray:
    """The request rate (req/s) in force for each of n requests of a ramp."""
    p = np.arange(n) / max(n - 1, 1)
    if strategy == "linear":
        return start_rps + (end_rps - start_rps) * p
    if strategy == "exponential":
        return start_rps * (end_rps / start_rps) ** p
    raise ValueError(f"unknown ramp strategy {strategy!r}: use linear or exponential")


def arrival_offsets_s(n: int, rate_rps: float | np.ndarray, *, burstiness: float = 1.0,
                      seed: int = 0, rescale: bool | None = None) -> np.ndarray:
    """Send times (s after the level starts) of n requests at `rate_rps` (one rate, or one per
    request for a ramp). `rescale` defaults to True for one rate, False for a ramp."""
    if n <= 0:
        return np.zeros(0)
    rates = np.broadcast_to(np.asarray(rate_rps, dtype=float), (n,))
    if burstiness <= 0 or not np.all(rates > 0):
        raise ValueError(f"burstiness ({burstiness}) and every rate must be positive")
    rng = np.random.default_rng(seed)
    if math.isinf(burstiness):
        gaps = 1.0 / rates
    else:
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (rates * burstiness))
    offsets = np.cumsum(gaps)
    if (np.ndim(rate_rps) == 0 if rescale is None else rescale) and offsets[-1] > 0:
        offsets *= (n / float(rates[0])) / offsets[-1]
    return offsets


def scaled_trace_offsets_s(timestamps_s: np.ndarray, rate_rps: float | None = None) -> np.ndarray:
    """A trace's own send times from its first request; with `rate_rps`, its gaps scaled so
    the mean rate (requests after the first over the span) is that rate, keeping its bursts."""
    t = np.asarray(timestamps_s, dtype=float)
    if not t.size:
        return t
    t = t - t.min()
    span = float(t.max())
    if rate_rps is None or span <= 0 or t.size < 2:
        return t
    return t * ((t.size - 1) / rate_rps) / span
