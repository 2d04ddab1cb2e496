"""`06_writeup/verdict.json`: the report's findings as data, for the CLI and other readers.

Stage 06 writes it beside the report (`stepscope.report.verdict.verdict_file`). The
terminal's closing lines and `stepscope analyze`'s exit code are read from here, not from the
report's markdown or stage 05's summary. Times are ms, ceilings are × (Amdahl: how many times
faster a step gets at most), shares are %.
"""

from __future__ import annotations

from stepscope.schema._base import Record
from stepscope.schema.categorize import Flag


class VerdictSentence(Record, kw_only=True):
    finding: str
    """The finding a sentence was written from: `dominant`, `lever`, `between_steps`,
    `gap_lever`, `caveat:<code>`, or another finding's name (`boundness`, `communication`, ...)."""
    text: str
    """The sentence as the report prints it (markdown: `**` marks emphasis)."""


class DominantCost(Record, kw_only=True):
    """The category that takes the most exposed time per step."""

    category: str
    ms_per_step: float
    share_pct: float | None = None
    """Of the step basis (`step_ms`, `denominator`); None when the basis is unknown."""
    step_ms: float | None = None
    denominator: str | None = None
    """`period`, `span`, `union` or `capture TPOT`."""
    n_steps: int | None = None


class BiggestLeverRecord(Record, kw_only=True):
    """The lever with the highest Amdahl ceiling of all."""

    name: str
    """A category, `time between steps`, or the short or long gaps inside the step."""
    kind: str
    """`category`, `between steps`, `short gaps` or `long gaps`."""
    ceiling_x: float
    """How many times faster a step gets at most with the lever's time removed."""
    removable_ms: float | None = None
    """The time per step the ceiling removes (a category's exposed time, the gap, the idle)."""


class CaveatRecord(Record, kw_only=True):
    """The one caveat the headline says: the first of the verdict's caveats, in this order."""

    code: str
    """`not_analysed`, `host_only`, `not_decode`, `claims_withdrawn`, `ranks_missing`, `low_confidence`, `tpot_gap`,
    `prediction_disagrees`, `overlap`, `plateau_stalls`, `spec_decode`."""
    text: str


class RanksRecord(Record, kw_only=True):
    """Which ranks' traces stage 05 analysed (what `stepscope analyze`'s exit code says)."""

    analysed: int
    """Ranks in stage 05's summary (0 when stage 05 wrote none)."""
    not_analysed: list[Flag] = []
    """Stage 05's flags of trace files it could not read, analyse, or that repeated a rank."""


class VerdictFile(Record, kw_only=True):
    """The verdict of one run: its headline, what it rests on, and every sentence of it."""

    kind: str
    """What the trace holds: `decode`, `mixed`, `prefill`, `training`, ... (`unknown` without one)."""
    step_label: str
    """What a step is called in the sentences (`decode step`, `step`)."""
    headline: list[VerdictSentence]
    """The report's "In short": at most three sentences (dominant cost, biggest lever with
    its ceiling, the caveat that matters most), each with the finding it came from."""
    dominant: DominantCost | None = None
    biggest_lever: BiggestLeverRecord | None = None
    caveat: CaveatRecord | None = None
    ranks: RanksRecord
    sentences: list[VerdictSentence] = []
    """The report's verdict section, in order."""
