"""Noise bands: when a difference between two runs is a change, judged by `make_delta` for every
comparison alike (docs/campaigns.md#noise-bands).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stepscope.thresholds import CHANGE_NOISE_REL, NOISE_BAND_SIGMAS

_P90_Z = 1.2816  # p90 - median of a normal distribution, in standard deviations


@dataclass(frozen=True)
class Delta:
    """One quantity, baseline against variant, with its noise band."""

    variant: str
    metric: str
    where: str
    """The sweep level (`c=4`), the category, or `capture` / `step`."""
    baseline: float | None
    value: float | None
    band: float | None
    band_source: str
    higher_is_better: bool
    not_comparable: str | None = None
    """Why the two readings do not measure the same thing (a run's tokens arrived in bursts, so
    its TPOT and TTFT measure delivery): then no change is claimed either way. Rendered from
    `reason` by `stepscope.wording`."""
    reason: str | None = None
    """The code behind `not_comparable` (`report.deltas.REASONS`), what a consumer tests on."""
    unit: str = ""

    @property
    def delta(self) -> float | None:
        return None if self.baseline is None or self.value is None else self.value - self.baseline

    @property
    def ratio(self) -> float | None:
        return self.value / self.baseline if self.baseline and self.value is not None else None

    @property
    def real(self) -> bool:
        """Outside the noise band (a quantity present in one run only counts as a change), and
        comparable at all."""
        if self.not_comparable is not None:
            return False
        if (self.baseline is None) != (self.value is None):
            return True
        if self.delta is None or self.band is None:
            return False
        return abs(self.delta) > self.band

    @property
    def better(self) -> bool | None:
        if not self.real or self.delta is None:
            return None
        return (self.delta > 0) == self.higher_is_better

    @property
    def judgement(self) -> str:
        """One code for the verdict on this delta: `not_comparable`, `one_side_only`,
        `within_noise`, `better` or `worse`; every consumer renders this one."""
        if self.not_comparable is not None:
            return "not_comparable"
        if (self.baseline is None) != (self.value is None):
            return "one_side_only"
        if not self.real or self.better is None:
            return "within_noise"
        return "better" if self.better else "worse"


def mean_of(xs: list[float | None]) -> float | None:
    """The mean of the finite values, or None when there is none."""
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return float(np.mean(xs)) if xs else None


def repeat_band(base: list[float], var: list[float]) -> float | None:
    """NOISE_BAND_SIGMAS x the standard error of the difference of two means over repeats."""
    b = [x for x in base if x is not None and math.isfinite(x)]
    v = [x for x in var if x is not None and math.isfinite(x)]
    if len(b) < 2 or len(v) < 2:
        return None
    return NOISE_BAND_SIGMAS * math.sqrt(np.var(b, ddof=1) / len(b) + np.var(v, ddof=1) / len(v))


def step_spread_se(median: float | None, p90: float | None, n: int | None) -> float | None:
    """Standard error of a per-step mean from its step-to-step spread (p90 - median)."""
    if median is None or p90 is None or not n:
        return None
    return max(p90 - median, 0.0) / _P90_Z / math.sqrt(n)


def make_delta(variant: str, metric: str, where: str, base: list[float], var: list[float],
               higher_is_better: bool, se: tuple[float | None, float | None] = (None, None)) -> Delta:
    """The delta of two means with the best noise band the data allow (see the module doc)."""
    b, v = mean_of(base), mean_of(var)
    band = repeat_band(base, var)
    if band is not None:
        source = f"repeats (n={len(base)}, {len(var)})"
    elif se[0] is not None and se[1] is not None:
        # Never below the fixed band: the spread is within one run, and runs also differ from each other.
        band = NOISE_BAND_SIGMAS * math.sqrt(se[0] ** 2 + se[1] ** 2)
        floor = CHANGE_NOISE_REL * abs(b) if b is not None else 0.0
        source = "step-to-step spread" if band >= floor else f"fixed {100 * CHANGE_NOISE_REL:g} % (above the step spread)"
        band = max(band, floor)
    else:
        band = CHANGE_NOISE_REL * abs(b) if b is not None else None
        source = f"fixed {100 * CHANGE_NOISE_REL:g} % (one run, no spread)"
    return Delta(variant, metric, where, b, v, band, source, higher_is_better)
