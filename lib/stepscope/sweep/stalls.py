"""Server-wide stalls: stretches when every stream in flight was silent at once.

One pause of a second can halve a short level, so throughput is trusted only once stalls are counted: a gap
between token-bearing chunks over `STALL_GAP_S` with a request in flight throughout (docs/faults.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from stepscope.sweep.metrics import RequestRecord, _as_records
from stepscope.thresholds import STALL_GAP_S


@dataclass(frozen=True)
class Stall:
    start_s: float
    """perf_counter time of the last chunk before the silence."""
    dur_s: float
    n_open: int
    """Requests in flight for the whole gap (every one of them silent)."""


def find_stalls(records: Iterable[RequestRecord | Mapping[str, Any]],
                threshold_s: float = STALL_GAP_S) -> list[Stall]:
    """Every server-wide silence longer than `threshold_s` among the measured requests."""
    recs = [r for r in _as_records(records) if not r.warmup]
    chunks = [np.asarray(r.chunk_times_s, dtype=float) for r in recs if r.chunk_times_s]
    if not chunks:
        return []
    times = np.sort(np.concatenate(chunks))
    gaps = np.diff(times)
    starts = np.array([r.start_s for r in recs], dtype=float)
    ends = np.array([r.end_s if r.end_s is not None else math.inf for r in recs], dtype=float)
    out = []
    for i in np.flatnonzero(gaps > threshold_s):
        a, b = times[i], times[i + 1]
        n_open = int(np.sum((starts <= a) & (ends >= b)))
        if n_open:
            out.append(Stall(start_s=float(a), dur_s=float(b - a), n_open=n_open))
    return out


def stall_metrics(records: Iterable[RequestRecord | Mapping[str, Any]], duration_s: float,
                  threshold_s: float = STALL_GAP_S) -> dict[str, float | int]:
    """levels.csv's stall columns: count, total and longest stall (s), and the share of the
    level's duration spent stalled."""
    stalls = find_stalls(records, threshold_s)
    total = float(sum(s.dur_s for s in stalls))
    return {"stall_count": len(stalls), "stall_total_s": total,
            "stall_max_s": max((s.dur_s for s in stalls), default=0.0),
            "stall_share": total / duration_s if duration_s and duration_s > 0 else math.nan}
