"""TPOT against the trace's step: the one judgement of whether the client's time per token and the engine's
decode step agree (within `TPOT_GAP_SHARE`). Stage 05's flag, the report and the verdict all read it, so they
cannot disagree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stepscope.thresholds import TPOT_GAP_SHARE

TpotCode = Literal["agree", "tpot_above", "tpot_below"]


@dataclass(frozen=True)
class TpotAgainstStep:
    """The client's TPOT against the trace's step (both ms per token at batch 1)."""

    tpot_ms: float
    step_ms: float
    reference: Literal["period", "span"]
    """Which reading of the step `step_ms` is."""
    code: TpotCode
    """`agree` within TPOT_GAP_SHARE; `tpot_above`: time per token passes outside the steps; `tpot_below`:
    tokens arrived in bursts or the steps overlap."""

    @property
    def gap_ms(self) -> float:
        """TPOT − step (positive: TPOT above the step)."""
        return self.tpot_ms - self.step_ms

    @property
    def gap_share(self) -> float:
        """|TPOT − step| as a share of TPOT."""
        return abs(self.gap_ms) / self.tpot_ms


def tpot_against_step(tpot_ms: float | None, period_ms: float | None,
                      span_ms: float | None = None) -> TpotAgainstStep | None:
    """The judgement, against the period where there is one, else the span; None without a
    TPOT or a step to set it against."""
    reference: Literal["period", "span"] = "period" if period_ms else "span"
    step = period_ms or span_ms
    if not tpot_ms or tpot_ms <= 0 or not step:
        return None
    gap = tpot_ms - step
    code: TpotCode = "agree" if abs(gap) <= TPOT_GAP_SHARE * tpot_ms else "tpot_above" if gap > 0 else "tpot_below"
    return TpotAgainstStep(float(tpot_ms), float(step), reference, code)
