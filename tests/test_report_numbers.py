"""The report's one number formatter and its percent beside it: a share prints as the report
writes percents elsewhere (a space before "%"), to two significant figures."""

from __future__ import annotations

import math

from stepscope.report import load as rl
from stepscope.wording import fmt_num, fmt_pct


def test_a_share_prints_as_a_percent_with_a_space():
    assert [fmt_pct(x) for x in (0.906, 0.045, 0.0163, 1.0, 0.0)] == ["91 %", "4.5 %", "1.6 %", "100 %", "0 %"]
    assert fmt_pct(0.0163, digits=3) == f"{fmt_num(1.63)} %" == "1.63 %"


def test_a_signed_share_says_its_direction_and_a_missing_one_a_dash():
    assert (fmt_pct(0.12, signed=True), fmt_pct(-0.12, signed=True), fmt_pct(0.0, signed=True)) == ("+12 %", "-12 %", "0 %")
    assert fmt_pct(None) == fmt_pct(math.nan) == "–"


def test_the_load_sections_ceiling_prints_through_fmt_num():
    """A ceiling beside the plateau finding has three significant figures, as every other number of
    the report: 12.345× reads "12.3×", where the inline format wrote "12.35×"."""
    assert rl._x(2.3456) == "2.35×" and rl._x(12.345) == "12.3×" and rl._x(None) == "–"
