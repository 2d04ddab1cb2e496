"""The analysis's memory budget (issue 26): stage 05's peak is estimated before any trace is
parsed, and over the budget the stage stops with a message naming the files, the estimate,
the budget and how to raise it, instead of being OOM-killed part way.

The estimate is linear in the traces' JSON bytes (read from the gzip trailer,
`split.json_size_estimate`, so nothing is decompressed), with the slope of a kernel-dense
trace (benchmarks/trace_load.py --kernels --analysis), whose device events each cost stage 05
a work-table row. A trace with no device event is different: its ops are its work, and a
dense one of tiny ops costs 18-21x its JSON. So when the budget could not hold even that worst
case, the events are counted in the decompressed stream (no JSON decoded) and such a trace is
estimated per event. Every rank is loaded before the first is analysed, so the ranks add up.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path

from stepscope.errors import StepscopeError
from stepscope.thresholds import MEMORY_BUDGET_AVAILABLE_SHARE
from stepscope.trace import split

PEAK_BYTES_PER_JSON_BYTE = 2.0
"""Stage 05's peak RSS above its imports per byte of trace JSON on a kernel-dense trace
(benchmarks/trace_load.py --kernels N --analysis, 2026-12-02): 0.43 at 10 M kernels of ~187
bytes of JSON each (1,868 MB, peak 915 MB, 84 bytes per device event above the imports), 0.59
with --short's ~140 bytes each (1,371 MB, peak 919 MB), 0.53 at 2 M (371 MB, peak 310 MB).
Issue 26's shape (~120 bytes each) gives ~0.7. Kept at 2.0 for traces that spend fewer bytes
of JSON per kernel still, and for the run-to-run spread of the heap. It was 0.62 at 10 M at
a5ffc33, 0.89 at be6c2e0, and 2.77 at 2 M before per-event text became codes (34dd664)."""
CPU_WORK_BYTES_PER_EVENT = 1_800
"""Stage 05's peak per event of a trace with no device event (its ops are its work): 1,685
bytes at 500,000 and 1,469 at 1,000,000 tiny cpu_op events (benchmarks/hostile_traces.py's
`tiny_events`, 40 and 81 MB of JSON, 2026-12-02), rounded up. The second fault probe's 30 M
such events passed the per-byte estimate under an 8 GB budget and grew past 12 GB."""
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

    @property
    def over(self) -> bool:
        return self.estimate_bytes > self.budget_bytes


def default_budget_bytes() -> int:
    """MEMORY_BUDGET_AVAILABLE_SHARE of the memory available now (psutil)."""
    import psutil

    return int(psutil.virtual_memory().available * MEMORY_BUDGET_AVAILABLE_SHARE)


def estimate_peak_bytes(json_bytes: int) -> int:
    return int(IMPORTS_BYTES + PEAK_BYTES_PER_JSON_BYTE * json_bytes)


_DEVICE_CATS = tuple(f'"cat":{sp}"{c}"'.encode() for c in ("kernel", "gpu_memcpy", "gpu_memset") for sp in ("", " "))


def count_events(path: Path) -> tuple[int, int]:
    """(events, device events) of one trace, counted in its decompressed stream: a pass of
    byte counts (about a second per GB of JSON), no JSON decoded."""
    from stepscope.trace.parse import open_stream

    n = dev = 0
    tail = b""
    with open_stream(Path(path)) as fh:
        while chunk := fh.read(8 << 20):
            buf = tail + chunk  # a mark cut by the chunk's edge is whole here; the tail's own were counted
            n += buf.count(b'"ph"') - tail.count(b'"ph"')
            dev += sum(buf.count(m) - tail.count(m) for m in _DEVICE_CATS)
            tail = buf[-32:]
    return n, dev


def _counted(path: Path) -> tuple[int, int]:
    """count_events, or (0, 1) for a file that cannot be read to its end: the parse names
    what is wrong with it, and a damaged file gets the per-byte estimate."""
    st = path.stat()
    return _counted_once(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _counted_once(path: str, size: int, mtime_ns: int) -> tuple[int, int]:
    """One pass per file version: `analyze` checks the budget before stage 05 and stage 05
    checks it again in the same process, and a pass costs about a second per GB of JSON."""
    import zlib

    from isal.isal_zlib import error as isal_error

    try:
        return count_events(Path(path))
    except (OSError, EOFError, ValueError, zlib.error, isal_error) as exc:  # truncated or corrupt gzip
        log.debug("%s: events not counted for the memory estimate (%s)", path, exc)
        return 0, 1


def check_budget(paths: list[Path], budget_gb: float | None) -> BudgetCheck:
    """The estimate for analysing `paths` together against the budget (GB = 2**30 bytes;
    None: the default share of available memory)."""
    sizes = [split.json_size_estimate(Path(p)) for p in paths]
    json_bytes = sum(sizes)
    if budget_gb is None:
        budget, source = default_budget_bytes(), (f"{MEMORY_BUDGET_AVAILABLE_SHARE:.0%} of the memory "
                                                  "available when the stage started")
    else:
        budget, source = int(budget_gb * 2**30), "analysis.memory_budget_gb"
    estimate, cpu_events = estimate_peak_bytes(json_bytes), None
    if IMPORTS_BYTES + WORST_BYTES_PER_JSON_BYTE * json_bytes > budget:
        counts = [_counted(Path(p)) for p in paths]
        cpu_events = sum(n for n, dev in counts if dev == 0) or None
        if cpu_events:
            # per-byte for the traces with device events, per event for those without
            gpu_json = sum(size for size, (_, dev) in zip(sizes, counts) if dev)
            estimate = max(estimate, int(IMPORTS_BYTES + PEAK_BYTES_PER_JSON_BYTE * gpu_json
                                         + CPU_WORK_BYTES_PER_EVENT * cpu_events))
    return BudgetCheck(json_bytes, estimate, budget, source, cpu_events)


def require_budget(paths: list[Path], budget_gb: float | None) -> BudgetCheck:
    """check_budget, raising MemoryBudgetExceeded when the estimate is over the budget."""
    c = check_budget(paths, budget_gb)
    if c.over:
        gb = 2**30
        raise MemoryBudgetExceeded(
            f"analysing {len(paths)} trace file(s) would peak at about {c.estimate_bytes / gb:.2f} GB "
            f"({_how(c)} + {IMPORTS_BYTES >> 20} MB for the interpreter), over the memory budget of "
            f"{c.budget_bytes / gb:.2f} GB ({c.budget_source}); nothing was parsed",
            where=", ".join(map(str, paths)),
            hint="raise the budget: params analysis.memory_budget_gb (stepscope run) or "
                 "`stepscope analyze --memory-budget-gb N`; or analyse fewer ranks at once, on a machine "
                 "with more free memory")
    return c


def _how(c: BudgetCheck) -> str:
    if c.cpu_work_events:
        return (f"{CPU_WORK_BYTES_PER_EVENT:,} bytes for each of {c.cpu_work_events:,} events of traces with no "
                f"device event, whose ops are their work")
    return f"{PEAK_BYTES_PER_JSON_BYTE:g} x their {c.json_bytes / 2**20:,.0f} MB of JSON, read from the gzip trailers"


@functools.lru_cache(maxsize=None)
def return_freed_arrays() -> bool:
    """Make the C allocator give a freed large array back to the system (glibc; once per process).

    glibc raises its mmap threshold each time a mapped block is freed, up to 32 MB, so after
    the first temporary column is freed, columns of a few MB come from the heap, and the heap
    keeps what they freed: on a 2 M-kernel trace stage 05's RSS stayed 200-300 MB above what
    its tables held. Fixing the threshold at MMAP_THRESHOLD_BYTES (which ends the raising)
    cut the peak by that much (benchmarks/trace_load.py --kernels 2000000 --analysis). True
    when it was set; elsewhere (musl, macOS) nothing changes."""
    libc = _libc()
    try:
        return libc is not None and bool(libc.mallopt(-3, MMAP_THRESHOLD_BYTES))  # -3: M_MMAP_THRESHOLD
    except AttributeError:
        return False


def give_back_free_heap() -> bool:
    """Hand the C heap's free pages back to the system (glibc's `malloc_trim`), between phases.

    Slices of a few hundred KB and small objects come from the heap, and freed pages in its
    middle stay counted in RSS until trimmed: after the load and after the build of a 10 M
    kernel trace that was ~20-30 MB each (issue 26). True when it ran; elsewhere a no-op."""
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
