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

ANALYSIS_PEAK_BYTES_PER_DEVICE_EVENT = 56
"""The bound held, the loaded event table counted (as stage 05 holds it), with slices of 4,096
rows, so that, as on a large trace, the per-row temporaries are what is measured and not the
slices'. 49 bytes measured on 2026-12-03 once every int column of the event table (pids, tids,
streams, sizes, codes) and the work table's step ids were held in the narrowest ints that fit
them, rows were picked column by column through their mask, and the accounting's row sets,
group sums and medians made no int64 per row (the loaded table: 29 bytes an event, 44 before).
55 bytes on 2026-12-02 (second stop) once the work table kept no end, launch
time, correlation or event row per kernel, each launch was attributed once (its step, context
and recompute), the event table lost `External id`, the build gathered columns in place and
every code was made in its narrowest ints a slice at a time; 84 at 7ce05a2 (89 before its kind
evidence counted names slice by slice), 123 at 584fd15 (in `build_work`, the event and work
tables side by side). With 65,536-row slices (a third of this rank) the code of 584fd15 read
118, be6c2e0 177, 1591140 248, and more before per-event text became codes (34dd664: 328 above
the table alone)."""

SLICE_ROWS = 4096
"""Every `*_CHUNK_ROWS` of stage 05, for this test."""


def _trace_load_benchmark():
    spec = importlib.util.spec_from_file_location("trace_load_bench", REPO_ROOT / "benchmarks" / "trace_load.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SHAPES = (None, "no-steps-no-launches", "interleaved-streams")
"""The default kernel-dense trace (annotated steps, full names), and two of benchmarks/trace_load.py's
SHAPES: issue 39's probe (no step marker, no launch: the whole trace is one step, whose gaps were
~165 bytes a kernel in `period.step_idle`) and overlapping streams."""


@pytest.fixture(scope="module", params=SHAPES, ids=lambda s: s or "annotated-steps")
def kernel_dense_trace(tmp_path_factory, request) -> Path:
    out = tmp_path_factory.mktemp("kernel-dense")
    gz, _, _ = _trace_load_benchmark().build_kernel_dense(200_000, out, shape=request.param)
    return gz


def test_analysing_a_kernel_dense_rank_peaks_under_the_stated_bytes_per_event(kernel_dense_trace, monkeypatch):
    from stepscope.trace import account, codes, context, period, steps
    from stepscope.trace.analyze import analyze_rank
    from stepscope.trace.categorize import make_rules
    from stepscope.trace.load import load_ranks

    for module, name in ((account, "UNION_CHUNK_ROWS"), (codes, "FACTORIZE_CHUNK_ROWS"),
                         (steps, "ENCLOSING_CHUNK_ROWS"), (context, "CONTEXT_CHUNK_ROWS"),
                         (period, "GAP_CHUNK_ROWS")):
        monkeypatch.setattr(module, name, SLICE_ROWS)
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
    assert loaded / n > 20  # the table was counted: ~26 bytes per device event
    # the analysis is whole: every kernel in a decode step, categorized
    assert (result.work["step_id"] >= 0).all()
    assert set(result.work["category"].astype(str)) == {"all_reduce", "attention", "dense_gemm", "elementwise",
                                                         "norm"}
    assert peak / n < ANALYSIS_PEAK_BYTES_PER_DEVICE_EVENT, f"{peak / n:.0f} bytes per device event"


def test_the_step_timeline_of_a_trace_with_no_step_marker_is_capped(tmp_path: Path):
    """With no step marker the whole trace is one step, and its timeline (CSV and stage 05's figure)
    held every kernel: drawing 200,000 took 23 s and ~0.5 KB each, 10 M would take GBs."""
    from stepscope.trace.analyze import TIMELINE_MAX_EVENTS, analyze_traces

    gz, _, _ = _trace_load_benchmark().build_kernel_dense(TIMELINE_MAX_EVENTS + 1000, tmp_path,
                                                          shape="no-steps-no-launches")
    an = analyze_traces(gz, tmp_path / "out", perfetto=False, progress=False)
    assert an.summary.ranks[0].step_source == "whole_trace"
    assert len(an.timeline) == TIMELINE_MAX_EVENTS
    assert an.timeline["start_us"].iloc[-1] == TIMELINE_MAX_EVENTS - 1.0  # its first events, 1 us apart
