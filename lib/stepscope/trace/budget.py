"""The analysis's memory budget (issue 26): stage 05's peak is estimated before any trace is
parsed, and over the budget the stage stops with a message naming the files, the estimate,
the budget and how to raise it, instead of being OOM-killed part way.

The estimate is linear in the traces' JSON bytes (read from the gzip trailer,
`split.json_size_estimate`, so nothing is decompressed), with the slope of the worst case
measured: a kernel-dense trace (benchmarks/trace_load.py --kernels --analysis), whose device
events each cost stage 05 a work-table row. CPU-op-heavy traces stay well under it. Every
rank is loaded before the first is analysed, so the ranks' bytes add up.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from stepscope.errors import StepscopeError
from stepscope.thresholds import MEMORY_BUDGET_AVAILABLE_SHARE
from stepscope.trace import split

PEAK_BYTES_PER_JSON_BYTE = 3.0
"""Stage 05's peak RSS above its imports per byte of trace JSON on the kernel-dense trace:
2.77 measured at 2 M kernels (371 MB JSON, peak 1,174 MB; benchmarks/trace_load.py --kernels
2000000 --analysis, 2026-12-01), rounded up for the run-to-run spread of the heap."""
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

    @property
    def over(self) -> bool:
        return self.estimate_bytes > self.budget_bytes


def default_budget_bytes() -> int:
    """MEMORY_BUDGET_AVAILABLE_SHARE of the memory available now (psutil)."""
    import psutil

    return int(psutil.virtual_memory().available * MEMORY_BUDGET_AVAILABLE_SHARE)


def estimate_peak_bytes(json_bytes: int) -> int:
    return int(IMPORTS_BYTES + PEAK_BYTES_PER_JSON_BYTE * json_bytes)


def check_budget(paths: list[Path], budget_gb: float | None) -> BudgetCheck:
    """The estimate for analysing `paths` together against the budget (GB = 2**30 bytes;
    None: the default share of available memory)."""
    json_bytes = sum(split.json_size_estimate(Path(p)) for p in paths)
    if budget_gb is None:
        budget, source = default_budget_bytes(), (f"{MEMORY_BUDGET_AVAILABLE_SHARE:.0%} of the memory "
                                                  "available when the stage started")
    else:
        budget, source = int(budget_gb * 2**30), "analysis.memory_budget_gb"
    return BudgetCheck(json_bytes, estimate_peak_bytes(json_bytes), budget, source)


def require_budget(paths: list[Path], budget_gb: float | None) -> BudgetCheck:
    """check_budget, raising MemoryBudgetExceeded when the estimate is over the budget."""
    c = check_budget(paths, budget_gb)
    if c.over:
        gb = 2**30
        raise MemoryBudgetExceeded(
            f"analysing {len(paths)} trace file(s) would peak at about {c.estimate_bytes / gb:.2f} GB "
            f"({PEAK_BYTES_PER_JSON_BYTE:g} x their {c.json_bytes / 2**20:,.0f} MB of JSON, read from the gzip "
            f"trailers, + {IMPORTS_BYTES >> 20} MB for the interpreter), over the memory budget of "
            f"{c.budget_bytes / gb:.2f} GB ({c.budget_source}); nothing was parsed",
            where=", ".join(map(str, paths)),
            hint="raise the budget: params analysis.memory_budget_gb (stepscope run) or "
                 "`stepscope analyze --memory-budget-gb N`; or analyse fewer ranks at once, on a machine "
                 "with more free memory")
    return c
