"""Issue 26: stage 05's memory per device event on a kernel-dense trace.

The trace is `benchmarks/trace_load.py`'s kernel-dense generator (tiny kernels in annotated
decode steps, each launched through a cudaGraphLaunch). Memory is read with tracemalloc,
which counts numpy's and pandas' buffers, so the figure does not move with the machine's
load or the allocator, unlike RSS: the bytes allocated at the peak of analysing one loaded
rank (the loaded event table counted), per device event."""

from __future__ import annotations

import importlib.util
import tracemalloc
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

ANALYSIS_PEAK_BYTES_PER_DEVICE_EVENT = 140
"""The bound held, the loaded event table counted (as stage 05 holds it): 118 bytes measured
on 2026-12-02 (200,000 kernels; slices of 65,536 rows are a third of the rank here, so their
temporaries count for more than on a large trace), once the loaded table kept one block per
column, the category sums came from one dense key and the int64 widenings went; 177 earlier the
same day (be6c2e0), 248 at 1591140, and more before per-event text became codes (34dd664: 328
above the loaded table alone)."""


def _trace_load_benchmark():
    spec = importlib.util.spec_from_file_location("trace_load_bench", REPO_ROOT / "benchmarks" / "trace_load.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def kernel_dense_trace(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("kernel-dense")
    gz, _, _ = _trace_load_benchmark().build_kernel_dense(200_000, out)
    return gz


def test_analysing_a_kernel_dense_rank_peaks_under_the_stated_bytes_per_event(kernel_dense_trace):
    from stepscope.trace.analyze import analyze_rank
    from stepscope.trace.categorize import make_rules
    from stepscope.trace.load import load_ranks

    rules = make_rules(())
    tracemalloc.start()
    try:
        ranks, flags = load_ranks([kernel_dense_trace], cache_dir=None, progress=False)
        assert ranks, flags
        loaded = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()  # the parse's own peak is the loader's (test_trace_hostile)
        result = analyze_rank(ranks[0], rules, consume=True)  # as stage 05 runs it
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    n = len(result.work)
    assert n == 200_000
    assert loaded / n > 30  # the table was counted: ~51 bytes per device event
    # the analysis is whole: every kernel in a decode step, categorized
    assert (result.work["step_id"] >= 0).all()
    assert set(result.work["category"].astype(str)) == {"all_reduce", "attention", "dense_gemm", "elementwise",
                                                         "norm"}
    assert peak / n < ANALYSIS_PEAK_BYTES_PER_DEVICE_EVENT, f"{peak / n:.0f} bytes per device event"
