"""Stage 01: closed- and open-loop load against the server; serving metrics.

Entry points: `load_server`, `run_sweep`, `finish`, `import_vllm_results`; metric definitions live in
`stepscope.sweep.metrics` (docs/methods.md#serving-metrics); every `01_macro_sweep/` artifact is in
docs/artifacts.md.
"""

_EXPORTS = {"ServerInfo": "client", "load_server": "client", "SweepResult": "run", "finish": "run",
            "run_sweep": "run", "import_vllm_results": "vllm_import"}


def __getattr__(name: str):
    # Lazy re-exports: the report draws sweep plots (`stepscope.sweep.plots`) without
    # importing the HTTP client (aiohttp and ssl, ~0.1 s) that only stage 01 needs.
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"stepscope.sweep.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'stepscope.sweep' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
