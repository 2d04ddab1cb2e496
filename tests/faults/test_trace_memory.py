"""Issue 26: stage 05's memory per device event on a kernel-dense trace.

The trace is `benchmarks/trace_load.py`'s kernel-dense generator (tiny kernels in annotated
decode steps, each launched through a cudaGraphLaunch). Memory is read with tracemalloc,
which counts numpy's and pandas' buffers, so the figure does not move with the machine's
load or the allocator, unlike RSS: the bytes allocated at the peak of analysing one loaded
rank, per device event."""

from __future__ import annotations

import importlib.util
import tracemalloc
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

ANALYSIS_PEAK_BYTES_PER_DEVICE_EVENT = 175
"""The bound held, above the loaded event table: 149 bytes measured on 2026-12-02 (200,000
kernels) once the unions and the step search read slices and class_of judged each category
once; 196 before that, and 328 before per-event text became codes (34dd664)."""


def _trace_load_benchmark():
    spec = importlib.util.spec_from_file_location("trace_load_bench", REPO_ROOT / "benchmarks" / "trace_load.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def kernel_dense_rank(tmp_path_factory):
    from stepscope.trace.load import load_ranks

    out = tmp_path_factory.mktemp("kernel-dense")
    gz, _, _ = _trace_load_benchmark().build_kernel_dense(200_000, out)
    ranks, flags = load_ranks([gz], cache_dir=None, progress=False)
    assert ranks, flags
    return ranks[0]


def test_analysing_a_kernel_dense_rank_peaks_under_the_stated_bytes_per_event(kernel_dense_rank):
    from stepscope.trace.analyze import analyze_rank
    from stepscope.trace.categorize import make_rules

    rules = make_rules(())
    tracemalloc.start()
    try:
        result = analyze_rank(kernel_dense_rank, rules, consume=True)  # as stage 05 runs it
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    n = len(result.work)
    assert n == 200_000
    # the analysis is whole: every kernel in a decode step, categorized
    assert (result.work["step_id"] >= 0).all()
    assert set(result.work["category"].astype(str)) == {"all_reduce", "attention", "dense_gemm", "elementwise",
                                                         "norm"}
    assert peak / n < ANALYSIS_PEAK_BYTES_PER_DEVICE_EVENT, f"{peak / n:.0f} bytes per device event"
