"""The report's number formatter, re-exported from its one home on the bottom floor.

`stepscope.wording` (which the report, stage 05 and the figures all import) holds `fmt_num`
and `NUMBER_RE`; this module keeps the report's old import path.
"""

from __future__ import annotations

from stepscope.wording import NUMBER_RE, fmt_num

__all__ = ["NUMBER_RE", "fmt_num"]
