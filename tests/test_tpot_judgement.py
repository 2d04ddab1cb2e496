"""TPOT against the trace's step is judged once (`trace.tpot`): stage 05's flags, the report's
reconciliation and the verdict's TPOT gap read the one judgement, so on the same numbers they
cannot disagree, at the TPOT_GAP_SHARE boundary included."""

from __future__ import annotations

import pytest

from stepscope.report import analysis as an
from stepscope.report import verdict as vd
from stepscope.thresholds import TPOT_GAP_SHARE
from stepscope.trace.analyze import _tpot_flags
from stepscope.trace.tpot import tpot_against_step

DECODE = vd.TraceIdentity(kind="decode", step_label="decode step", source="test")

# (TPOT, period, span) in ms, and the judgement expected: against the period where there is one.
CASES = [
    (10.0, 10.5, 9.0, "period", "agree"),
    (10.0, 10.0 - 10.0 * TPOT_GAP_SHARE, 8.0, "period", "agree"),   # on the boundary: agree
    (10.0, 8.9, 8.0, "period", "tpot_above"),
    (10.0, 11.1, 9.0, "period", "tpot_below"),
    (10.0, None, 9.5, "span", "agree"),
    (10.0, None, 7.0, "span", "tpot_above"),
    (10.0, None, 12.0, "span", "tpot_below"),
]


def _times(tpot, period, span):
    return {"tpot_capture_ms": tpot, "span_ms": {"mean": span}, "kernel_sum_ms": {"mean": 0.5 * span},
            "period_ms": {"mean": period} if period else None}


@pytest.mark.parametrize("tpot, period, span, reference, code", CASES)
def test_one_judgement_read_by_stage05_the_reconciliation_and_the_verdict(tpot, period, span, reference, code):
    j = tpot_against_step(tpot, period, span)
    assert (j.reference, j.code) == (reference, code)
    flags = {f.code for f in _tpot_flags(_times(tpot, period, span), cpu=False)}
    # stage 05 flags the period disagreeing either way, and TPOT above the span
    assert ("period_tpot_mismatch" in flags) == (reference == "period" and code != "agree")
    span_j = tpot_against_step(tpot, None, span)
    assert ("span_below_tpot" in flags) == (span_j.code == "tpot_above")
    # the reconciliation says the judgement's sentence (finding, sentence), and the verdict
    # names a gap exactly when TPOT is above the step
    totals = {"tpot_capture_ms": tpot, "period_ms": period, "span_ms": span, "union_ms": 0.9 * span,
              "kernel_sum_ms": 0.9 * span}
    assert an._tpot_sentence(j) in an.reconciliation(totals)
    gap = vd.tpot_gap(totals, DECODE)
    assert (gap is not None) == (code == "tpot_above")
    if gap is not None:
        assert (gap.step_ms, gap.denominator, gap.gap_ms) == (j.step_ms, reference, pytest.approx(j.gap_ms))


def test_no_judgement_without_a_tpot_or_a_step():
    assert tpot_against_step(None, 10.0, 9.0) is None and tpot_against_step(10.0, None, None) is None
    assert tpot_against_step(0.0, 10.0, 9.0) is None
