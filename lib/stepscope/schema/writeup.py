"""`06_writeup/`: the report's file names, and `guards.json`, the invariants the report's verdict
rests on (`report.guards`)."""

from __future__ import annotations

from stepscope.schema._base import Record, Setting

REPORT_MD, REPORT_HTML = "report.md", "report.html"
APPENDIX_MD, APPENDIX_HTML = "appendix.md", "appendix.html"
"""The report and its appendix, side by side in 06_writeup/ and linked to each other: the markdown
pair by their .md names, the HTML pair by their .html names."""


class GuardResult(Record, kw_only=True):
    """One invariant, checked before any sentence of the verdict was written."""

    invariant: str
    """`kind_takes_verdict`, `share_at_most_step`, `busy_at_most_period`, `below_peak`,
    `clocks_agree`, `classes_add_up`, `communication_has_collectives`, `steady_state`,
    `lever_coherent`, `steps_match_architecture`, `device_work_recorded`, `steps_apart` (docs/verdict.md#guards)."""
    holds: bool
    subject: str | None = None
    """What the check was about when it is one of several (a category)."""
    values: dict[str, Setting] = {}
    """The numbers it was judged on, units in the names (`busy_ms`, `share_pct`)."""
    withdrawn: list[str] = []
    """Claims withdrawn because it failed: verdict fields (`levers`, `comm_split`, ...) or
    `lever:<category>`, `roofline:<category>`, `transfer`."""
    reason: str | None = None
    """Why, as the report says it (failed checks only)."""


class GuardsFile(Record, kw_only=True):
    kind: str
    """The trace's kind the verdict was given for (`trace_info.kind`)."""
    guards: list[GuardResult] = []
    n_failed: int = 0
    withdrawn: list[str] = []
    """Every claim withdrawn, over all failed checks."""
