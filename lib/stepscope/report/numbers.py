"""The one number formatter of the report, and the pattern that finds its numbers again.

Every number the report prints goes through `fmt_num`, so a test can format a structured
value the same way and find it in the text (`NUMBER_RE` reads the numbers back out).
"""

from __future__ import annotations

import math
import re
from typing import Any

NUMBER_RE = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?")
"""A number as `fmt_num` writes it (thousands separators, optional decimals)."""


def fmt_num(v: Any, digits: int = 3) -> str:
    """Human number: integers with separators, floats to about `digits` significant figures."""
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int,)) and not isinstance(v, bool):
        return f"{v:,}"
    try:
        f = float(v)
    except (TypeError, ValueError):
        s = str(v)
        return "–" if s.lower() in ("nan", "none", "") else s
    if math.isnan(f):
        return "–"
    if math.isinf(f):
        return "∞"
    a = abs(f)
    if a >= 10 ** digits:
        return f"{f:,.0f}"
    if a == 0:
        return "0"
    decimals = max(0, digits - 1 - int(math.floor(math.log10(a))))
    return f"{f:,.{decimals}f}"
