"""The one parser for profiler file names: what a file is, its rank and its stage, so stages 04 and 05 can
never disagree about a file.

Knows vLLM's `rank0.<ns>.pt.trace.json.gz`, `dp0_pp0_tp3_..._rank3...` and older `-rank-0` names, its
`profiler_out` tables and front-end `*.async_llm.*` files, and SGLang's `{id}-TP-{tp}[-DECODE|-EXTEND]`. A
bare `tp<N>` is the rank only when every other parallel index is 0 (ranks number TP innermost, and the name
does not carry the TP size).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

TRACE_SUFFIXES = (".trace.json.gz", ".trace.json")

_RANK = re.compile(r"(?:^|[^a-z0-9])rank[-_]?(\d+)(?!\d)", re.I)
_SGLANG_TP = re.compile(r"(?:^|[^A-Za-z0-9])TP-(\d+)(?!\d)(?:-(DECODE|EXTEND)(?![A-Za-z]))?")
_TABLE_INDEX = re.compile(r"(?:^|[^a-z0-9])profiler_out_(\d+)(?!\d)", re.I)
_TP_INDEX = re.compile(r"(?:^|[^a-z0-9])tp[-_]?(\d+)(?!\d)", re.I)
_OTHER_INDEX = re.compile(r"(?:^|[^a-z0-9])(dp|pp|pcp)[-_]?(\d+)(?!\d)", re.I)


@dataclass(frozen=True)
class ProfilerFile:
    """What a file name says about a profiler output file."""

    name: str
    kind: str | None
    """trace, frontend_trace, profiler_table, frontend_table; None: not a profiler file
    (e.g. a trace a user renamed to `model.json.gz`: still readable, its kind unknown)."""
    rank: int | None
    stage: str | None = None
    """SGLang's DECODE / EXTEND split, when the name carries it."""
    rank_source: str | None = None
    """`rank`, `sglang TP`, `table index` or `tp index` (None when there is no rank)."""


def parse_name(name: str | Path) -> ProfilerFile:
    """Kind, rank and stage of a profiler file, from its name alone (any directory is dropped)."""
    name = Path(name).name
    kind = _kind(name)
    if kind in ("frontend_trace", "frontend_table"):
        return ProfilerFile(name, kind, None)
    stage = None
    if m := _RANK.search(name):
        rank, source = int(m.group(1)), "rank"
    elif m := _SGLANG_TP.search(name):
        rank, source = int(m.group(1)), "sglang TP"
    elif m := _TABLE_INDEX.search(name):
        rank, source = int(m.group(1)), "table index"
    elif (m := _TP_INDEX.search(name)) and not any(int(o.group(2)) for o in _OTHER_INDEX.finditer(name)):
        rank, source = int(m.group(1)), "tp index"
    else:
        rank, source = None, None
    if s := _SGLANG_TP.search(name):
        stage = s.group(2)
    return ProfilerFile(name, kind, rank, stage, source)


def _kind(name: str) -> str | None:
    is_trace = name.endswith(TRACE_SUFFIXES)
    is_table = name.endswith(".txt") and "profiler_out" in name
    if not (is_trace or is_table):
        return None
    if "async_llm" in name:
        return "frontend_trace" if is_trace else "frontend_table"
    return "trace" if is_trace else "profiler_table"


def rank_from_filename(path: str | Path) -> int | None:
    """The rank in a trace or table file name (see the module docstring), or None."""
    return parse_name(path).rank


def sglang_stage(path: str | Path) -> str | None:
    """`DECODE` / `EXTEND` for SGLang's per-stage traces, else None."""
    return parse_name(path).stage
