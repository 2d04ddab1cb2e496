"""Helpers for the fault tests: process-tree checks, stand-in notebooks and a fake server.

The fake server is a fake named as such: it stands in for vLLM only in the fast tests of
the runner's server bookkeeping (death, relaunch, interrupts). The slow tests in this
folder use the real vLLM CPU server.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
from pathlib import Path

import nbformat
import psutil

from stepscope.stages import STAGES

FAKE_SERVER = textwrap.dedent('''\
    #!{python}
    """FAKE vLLM API server for fault tests: answers /health, /version and /v1/models, and
    keeps one child process (its stand-in engine core) in its process group."""
    import http.server, json, os, subprocess, sys
    argv = sys.argv
    port = int(argv[argv.index("--port") + 1])
    engine = subprocess.Popen(["sleep", "600"])
    with open(os.environ["FAKE_PID_LOG"], "a") as fh:
        fh.write(json.dumps({{"api": os.getpid(), "engine": engine.pid}}) + "\\n")
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = {{"/health": {{}}, "/version": {{"version": "fake"}},
                    "/v1/models": {{"data": [{{"id": "m", "root": "/m"}}]}}}}.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    ''')


def write_fake_server(folder: Path) -> Path:
    script = folder / "fake_vllm_server.py"
    script.write_text(FAKE_SERVER.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def fake_pids(pid_log: Path) -> list[dict]:
    return [json.loads(line) for line in pid_log.read_text().splitlines()] if pid_log.is_file() else []


def running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def command_line(proc: psutil.Process) -> str:
    """The process's command line, or "" once it has exited: a child that exits while a test
    walks the tree is a zombie for a moment, and psutil raises rather than answer for it."""
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def descendants(root_pid: int | None = None) -> frozenset[int]:
    """The pids below `root_pid` (this process when None) now: what a test already had,
    e.g. the session's live vLLM server, which a run under test must not be blamed for."""
    return frozenset(p.pid for p in psutil.Process(root_pid or os.getpid()).children(recursive=True))


def leftover_processes(root_pid: int | None = None, pgids: tuple[int, ...] = (),
                       before: frozenset[int] = frozenset()) -> list[str]:
    """Processes a finished run may not leave behind: any descendant of `root_pid` (the
    test process itself when None) not in `before`, and any live member of the given
    process groups."""
    root = psutil.Process(root_pid or os.getpid())
    left = {}
    for p in root.children(recursive=True):
        if p.pid in before:
            continue
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                left[p.pid] = " ".join(p.cmdline())[:120]
        except psutil.NoSuchProcess:
            continue
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.pid) in pgids:
                left[p.pid] = " ".join(p.info["cmdline"] or [])[:120]
        except (ProcessLookupError, psutil.NoSuchProcess, OSError):
            continue
    return [f"{pid}: {cmd}" for pid, cmd in sorted(left.items())]


def stand_in_notebooks(folder: Path, bodies: dict[str, str]) -> Path:
    """One tiny notebook per stage; `bodies` replaces the default ('write <stage>/done.txt')."""
    folder.mkdir(parents=True, exist_ok=True)
    for stage in STAGES:
        params = nbformat.v4.new_code_cell('params_file = ""\nrun_dir = ""')
        params.metadata["tags"] = ["parameters"]
        body = bodies.get(stage.id) or (
            "from pathlib import Path\n"
            f"d = Path(run_dir) / '{stage.id}'\nd.mkdir(exist_ok=True)\n(d / 'done.txt').write_text('ok')")
        nb = nbformat.v4.new_notebook(cells=[params, nbformat.v4.new_code_cell(body)])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, folder / f"{stage.id}.ipynb")
    return folder


def stage_status(run_dir: Path) -> dict[str, str]:
    return {k: v["status"] for k, v in json.loads((run_dir / "run.json").read_text())["stages"].items()}
