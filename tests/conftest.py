"""Shared fixtures: where the real traces live, and the repository root."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from stepscope.paths import REPO_ROOT


TRACE_DATA = Path(__file__).resolve().parent / "data" / "traces"

# A background job of a non-interactive shell starts with SIGINT ignored, and children
# inherit an ignored signal across exec, so the tests that press Ctrl-C on a `stepscope`
# child would see it finish normally. A handled signal is reset to the default in children.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The suite must test the library of the checkout it sits in, not another one an editable
# install or a stale PYTHONPATH points at (a second clone or worktree sharing one venv).
if REPO_ROOT != Path(__file__).resolve().parents[1]:
    raise pytest.UsageError(
        f"stepscope is imported from {REPO_ROOT}, but these tests belong to "
        f"{Path(__file__).resolve().parents[1]}; set PYTHONPATH=<this checkout>/lib or reinstall")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def real_traces() -> Path:
    """The real profiler traces kept in the repository (tests/data/traces/README.md)."""
    if not TRACE_DATA.is_dir():
        pytest.fail(f"real traces not found at {TRACE_DATA}; the clone is incomplete")
    return TRACE_DATA


class LiveServer:
    """A real vLLM CPU server (TP=2, eager) serving the tiny model, for slow tests."""

    def __init__(self, base_url: str, served_model: str, profiler_dir: Path, tp: int, run_dir: Path,
                 params):
        self.base_url = base_url
        self.served_model = served_model
        self.profiler_dir = profiler_dir
        self.tp = tp
        self.run_dir = run_dir
        self.params = params


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, what: str, timeout_s: float = 60.0, poll_s: float = 0.05):
    """Poll `condition()` until it returns something truthy (returned) or fail naming `what`.

    Tests that race a subprocess wait on something observable (a file, a log line, a process
    state) with a generous deadline, never a fixed sleep: a loaded machine only makes them slower.
    """
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout_s:g} s for {what}")
        time.sleep(poll_s)


@pytest.fixture(scope="session")
def live_vllm_server(tmp_path_factory):
    """One real server for the whole session; its run folder holds 00_deploy/server.json."""
    from stepscope.config import load_params, params_to_dict, params_from_dict, deep_merge
    from stepscope.serve import create_tiny_model, launch, tiny_model_exists
    from stepscope.serve.launch import resolve_model_path

    base = load_params(REPO_ROOT / "params" / "smoke.yaml")
    run_dir = tmp_path_factory.mktemp("live-server-run")
    params = params_from_dict(deep_merge(params_to_dict(base), {
        "server": {"port": free_port(), "profiler": {"dir": str(run_dir / "profiler_raw")}}}))
    model = resolve_model_path(params)
    if not tiny_model_exists(model):
        create_tiny_model(model, params.model.tiny)
    proc, handle = launch(params, run_dir, progress=False)
    try:
        yield LiveServer(handle.base_url, handle.served_model, Path(handle.profiler_dir),
                         params.server.tp, run_dir, params)
    finally:
        proc.stop()


def _cuda_missing() -> str | None:
    """None when a CUDA device is usable, else the one-line reason it is not."""
    import torch

    if torch.cuda.is_available():
        return None
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    return f"no CUDA device: torch {torch.__version__} ({build}) sees no GPU"


def pytest_runtest_setup(item):
    # `@pytest.mark.gpu` tests skip, with the reason, on machines without CUDA.
    if item.get_closest_marker("gpu") is not None:
        reason = _cuda_missing()
        if reason:
            pytest.skip(reason)
