"""Stage 05: trace loading, kernel categories, exact per-step accounting.

`analyze_traces(paths, out_dir)` and `run_stage(params, run_dir, out_dir)` (`stepscope.trace.analyze`)
are the entry points. The method is in docs/methods.md and docs/trace-analysis.md; every artifact of
`05_categorize/` is in docs/artifacts.md.
"""

_EXPORTS = {"analyze_traces": "analyze", "run_stage": "analyze", "trace_inputs_for_run": "analyze",
            "Analysis": "analyze", "load_rank": "load", "load_ranks": "load", "read_trace": "load",
            "parse_trace": "load"}


def __getattr__(name: str):
    # Lazy re-exports: `import stepscope.trace.load` alone must not pull in pandas.
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"stepscope.trace.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'stepscope.trace' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
