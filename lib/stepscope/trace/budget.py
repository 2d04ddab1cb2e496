"""The analysis's memory budget: stage 05's peak is estimated before any trace is parsed, and over the budget
the stage stops with a message instead of being OOM-killed part way (docs/faults.md).

The estimate is linear in JSON bytes (per event for CPU traces); the gzip trailer is trusted only when even
the most the files could hold fits, else the streams are counted.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from stepscope.errors import StepscopeError
from stepscope.thresholds import MEMORY_BUDGET_AVAILABLE_SHARE
from stepscope.trace import split

PEAK_BYTES_PER_JSON_BYTE = 2.0
"""Stage 05's peak RSS above its imports per byte of JSON on a kernel-dense trace: 0.43-0.59 measured
(benchmarks/trace_load.py --kernels N --analysis), kept at 2.0 for denser traces and heap spread."""
CPU_WORK_BYTES_PER_EVENT = 1_800
"""Stage 05's peak per event of a trace with no device event (its ops are its work): ~1,500-1,700 bytes
measured on tiny cpu_op events (benchmarks/hostile_traces.py), rounded up."""
WORST_BYTES_PER_JSON_BYTE = 24.0
"""The most any trace measured costs per byte of JSON (tiny ops of ~80 bytes at
CPU_WORK_BYTES_PER_EVENT each, rounded up): a budget that holds this needs no count of events."""
log = logging.getLogger(__name__)

MMAP_THRESHOLD_BYTES = 256 << 10
"""Allocations from this size are mapped on their own and unmapped when freed (glibc's
`M_MMAP_THRESHOLD`, fixed: `return_freed_arrays`)."""

IMPORTS_BYTES = 256 << 20
"""The interpreter with numpy, pandas, msgspec and stepscope imported (145 MB measured) and
the rules and tables that do not grow with the trace, rounded up."""


class MemoryBudgetExceeded(StepscopeError):
    """The traces' estimated analysis peak is over the memory budget (exit code EXIT_OVER_BUDGET)."""


@dataclass(frozen=True)
class BudgetCheck:
    json_bytes: int
    estimate_bytes: int
    budget_bytes: int
    budget_source: str  # "analysis.memory_budget_gb" or the share of available memory
    cpu_work_events: int | None = None
    """Events of the traces with no device event, when they were counted and set the estimate."""
    counted: bool = False
    """The JSON bytes were counted in the decompressed streams, not read from the gzip trailers."""
    stopped: tuple[tuple[str, int, int], ...] = ()
    """(file, bytes counted, bytes its gzip trailer says) of each file whose count stopped once
    past what the budget allows: a gzip bomb, or a trace over 4 GiB whose trailer wrapped."""

    @property
    def over(self) -> bool:
        return self.estimate_bytes > self.budget_bytes


def default_budget_bytes() -> int:
    """MEMORY_BUDGET_AVAILABLE_SHARE of the memory available now (psutil)."""
    import psutil

    return int(psutil.virtual_memory().available * MEMORY_BUDGET_AVAILABLE_SHARE)


def estimate_peak_bytes(json_bytes: int) -> int:
    return int(IMPORTS_BYTES + PEAK_BYTES_PER_JSON_BYTE * json_bytes)


MAX_DEFLATE_RATIO = 1032
"""The most deflate expands (zlib's stated bound, 1032:1): a .gz file, all its members together,
holds at most this times its own size of JSON, whatever its trailer says."""
COUNT_CHUNK_BYTES = 8 << 20
_DEVICE_CAT_RE = re.compile(rb'"cat": ?"(?:kernel|gpu_memcpy|gpu_memset)"')


@dataclass(frozen=True)
class StreamCount:
    """One pass over a trace's decompressed stream: bytes and events counted, no JSON decoded."""

    json_bytes: int
    events: int
    """`"ph"` keys: one an event."""
    has_device: bool
    """A device event (kernel, memcpy, memset) was seen."""
    complete: bool = True
    """False: the pass stopped once past its byte limit, so `json_bytes` is a floor."""
    damaged: str | None = None
    """Why the stream could not be read to its end (truncated or corrupt gzip): the parse names it."""


def count_stream(path: Path, stop_after_bytes: int | None = None) -> StreamCount:
    """Count a trace's decompressed bytes and events, stopping once past `stop_after_bytes`, so a gzip bomb is
    refused in the time its budget's worth takes."""
    import zlib

    from isal.isal_zlib import error as isal_error

    from stepscope.trace.parse import open_stream

    n = nbytes = 0
    dev, tail = False, b""
    try:
        with open_stream(Path(path)) as fh:
            while chunk := fh.read(COUNT_CHUNK_BYTES):
                nbytes += len(chunk)
                buf = tail + chunk  # a mark cut by the chunk's edge is whole here; the tail's own were counted
                n += buf.count(b'"ph"') - tail.count(b'"ph"')
                dev = dev or _DEVICE_CAT_RE.search(buf) is not None
                tail = buf[-32:]
                if stop_after_bytes is not None and nbytes > stop_after_bytes and fh.read(1):  # not at its end
                    return StreamCount(nbytes + 1, n, dev, complete=False)
    except (OSError, EOFError, ValueError, zlib.error, isal_error) as exc:  # truncated or corrupt gzip
        log.debug("%s: stream read to byte %d only (%s)", path, nbytes, exc)
        return StreamCount(nbytes, n, True, damaged=str(exc))  # a damaged file gets the per-byte estimate
    return StreamCount(nbytes, n, dev)


_COUNTS: dict[tuple[str, int, int], StreamCount] = {}
"""count_stream's passes by file version: `analyze` checks the budget before stage 05 and stage
05 again in the same process, and a pass costs about a second per GB of JSON."""


def _counted(path: Path, stop_after_bytes: int) -> StreamCount:
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    hit = _COUNTS.get(key)
    if hit is not None and (hit.complete or hit.json_bytes > stop_after_bytes):
        return hit
    if len(_COUNTS) >= 64:
        _COUNTS.pop(next(iter(_COUNTS)))
    c = _COUNTS[key] = count_stream(path, stop_after_bytes)
    return c


def _most_json_bytes(path: Path) -> int:
    """The most JSON a file can hold: its size, or MAX_DEFLATE_RATIO times it for a gzip file."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        return size * MAX_DEFLATE_RATIO if fh.read(2) == b"\x1f\x8b" else size


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def check_budget(paths: list[Path], budget_gb: float | None) -> BudgetCheck:
    """The estimate for analysing `paths` together against the budget (GB = 2**30 bytes; None: the default
    share of available memory). The gzip trailer decides only when MAX_DEFLATE_RATIO times the file fits; else
    every stream is counted. Paths that are no regular file are left to the load."""
    paths = [Path(p) for p in paths if _regular(Path(p))]
    if budget_gb is None:
        budget, source = default_budget_bytes(), (f"{MEMORY_BUDGET_AVAILABLE_SHARE:.0%} of the memory "
                                                  "available when the stage started")
    else:
        budget, source = int(budget_gb * 2**30), "analysis.memory_budget_gb"
    sizes = [split.json_size_estimate(p) for p in paths]
    most = [_most_json_bytes(p) for p in paths]
    if all(map(int.__le__, sizes, most)) and max(  # a trailer saying more than its file can hold is no reading
            estimate_peak_bytes(sum(most)), IMPORTS_BYTES + WORST_BYTES_PER_JSON_BYTE * sum(sizes)) <= budget:
        return BudgetCheck(sum(sizes), estimate_peak_bytes(sum(sizes)), budget, source)
    allowed = max(0, int((budget - IMPORTS_BYTES) / PEAK_BYTES_PER_JSON_BYTE))
    counts = [_counted(p, allowed) for p in paths]
    json_bytes = sum(c.json_bytes for c in counts)
    estimate = estimate_peak_bytes(json_bytes)
    cpu_events = sum(c.events for c in counts if not c.has_device) or None
    if cpu_events:  # per-byte for the traces with device events, per event for those without
        gpu_json = sum(c.json_bytes for c in counts if c.has_device)
        estimate = max(estimate, int(IMPORTS_BYTES + PEAK_BYTES_PER_JSON_BYTE * gpu_json
                                     + CPU_WORK_BYTES_PER_EVENT * cpu_events))
    stopped = tuple((str(p), c.json_bytes, size) for p, c, size in zip(paths, counts, sizes) if not c.complete)
    return BudgetCheck(json_bytes, estimate, budget, source, cpu_events, counted=True, stopped=stopped)


def require_budget(paths: list[Path], budget_gb: float | None) -> BudgetCheck:
    """check_budget, raising MemoryBudgetExceeded when the estimate is over the budget."""
    c = check_budget(paths, budget_gb)
    if c.over:
        gb = 2**30
        about = "more than" if c.stopped else "about"
        raise MemoryBudgetExceeded(
            f"analysing {len(paths)} trace file(s) would peak at {about} {c.estimate_bytes / gb:.2f} GB "
            f"({_how(c)} + {IMPORTS_BYTES >> 20} MB for the interpreter), over the memory budget of "
            f"{c.budget_bytes / gb:.2f} GB ({c.budget_source}); nothing was parsed{_stopped(c)}",
            where=", ".join(map(str, paths)),
            hint="raise the budget: params analysis.memory_budget_gb (stepscope run) or "
                 "`stepscope analyze --memory-budget-gb N`; or analyse fewer ranks at once, on a machine "
                 "with more free memory")
    return c


def _how(c: BudgetCheck) -> str:
    if c.cpu_work_events and not c.stopped:
        return (f"{CPU_WORK_BYTES_PER_EVENT:,} bytes for each of {c.cpu_work_events:,} events of traces with no "
                f"device event, whose ops are their work")
    where = "counted in the decompressed streams" if c.counted else "read from the gzip trailers"
    return f"{PEAK_BYTES_PER_JSON_BYTE:g} x their {c.json_bytes / 2**20:,.0f} MB of JSON, {where}"


def _stopped(c: BudgetCheck) -> str:
    """Each file whose count stopped once over the budget: its bytes counted and its trailer's."""
    return "".join(f"; {f} decompresses to more than {n:,} bytes (counting stopped there; its gzip trailer "
                   f"says {t:,})" for f, n, t in c.stopped)


@functools.lru_cache(maxsize=None)
def return_freed_arrays() -> bool:
    """Fix glibc's mmap threshold at MMAP_THRESHOLD_BYTES so freed large arrays go back to the system: its
    raising kept 200-300 MB of freed columns in the heap. True when set."""
    libc = _libc()
    try:
        return libc is not None and bool(libc.mallopt(-3, MMAP_THRESHOLD_BYTES))  # -3: M_MMAP_THRESHOLD
    except AttributeError:
        return False


def give_back_free_heap() -> bool:
    """Hand the C heap's free pages back to the system (glibc's `malloc_trim`) between phases; True when it
    ran, elsewhere a no-op."""
    libc = _libc()
    if libc is None:
        return False
    try:
        libc.malloc_trim(0)
    except AttributeError:  # a C library without it (musl, macOS)
        return False
    return True


@functools.lru_cache(maxsize=None)
def _libc():
    """The C library (ctypes), loaded once; None where it cannot be."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
