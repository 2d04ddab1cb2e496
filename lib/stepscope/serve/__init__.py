"""Stage 00: start or attach to the inference server, and keep it for the run.

The runner, notebooks and other stages use only the names below; `00_deploy/` is in docs/artifacts.md.
"""

from stepscope import schema
from stepscope.serve.launch import (
    ServerHandle,
    ServerProcess,
    attach,
    build_server_command,
    launch,
    read_server,
    reap_dead_server,
    running_server,
    server_json_path,
    stop_server,
    tail_lines,
)
from stepscope.serve.tinymodel import create_tiny_model, tiny_model_exists

__all__ = [
    "ServerHandle", "ServerProcess", "attach", "build_server_command", "create_tiny_model",
    "ensure_server", "launch", "read_server", "reap_dead_server", "running_server", "server_json_path",
    "stop_server", "tail_lines", "tiny_model_exists",
]


def ensure_server(params, run_dir, progress: bool = True) -> dict:
    """Reuse the run's live server, else launch (launch mode) or attach (attach mode).

    A server launched here runs in its own process group; whoever asked for it stops it
    with `stop_server(run_dir)` (the runner does so at the end), and it dies with the process
    that launched it if that one dies first (`stepscope.lifeline`). A leftover of a dead
    supervisor is stopped, never adopted (`launch.is_leftover`).
    """
    record = running_server(run_dir)
    if record is not None:
        return schema.to_builtins(record)  # the notebook shows the record as launch() hands it over
    if params.server.mode == "attach":
        return attach(params, run_dir).to_json()
    _, handle = launch(params, run_dir, progress=progress)
    return handle.to_json()
