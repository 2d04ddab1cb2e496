"""`stepscope lab`: the workbook in JupyterLab, on loopback, behind a token.

A kernel runs whatever a browser sends it, so JupyterLab binds to 127.0.0.1 with a fresh token (passed through
its environment, not argv), phones nothing home, dies with `stepscope lab` (`stepscope.lifeline`), and opens a
run's scratch copy (`stepscope.scratch`) unless `--write-run`.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from stepscope import lifeline, scratch
from stepscope.errors import StepscopeError
from stepscope.paths import REPO_ROOT

LOOPBACK = "127.0.0.1"
LAB_SETTINGS_DIR = Path(__file__).parent / "lab_settings"
"""JupyterLab's app settings folder for `stepscope lab`: only `overrides.json` (setting defaults)."""
START_TIMEOUT_S = 90.0


@dataclass
class LabServer:
    """A running JupyterLab: `url` opens the start folder with the token."""

    proc: subprocess.Popen
    host: str
    port: int
    token: str
    root: Path
    start_path: str

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base_url}/lab/tree/{self.start_path}?token={self.token}"

    def stop(self, timeout_s: float = 15.0) -> None:
        """End the server and its kernels (one process group)."""
        if self.proc.poll() is not None:
            lifeline.release(self.proc.pid)
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout_s)
        except ProcessLookupError:
            pass
        finally:
            lifeline.release(self.proc.pid)


def lab_root(run: str | Path | None, outputs_dir: str | Path = REPO_ROOT / "outputs") -> tuple[Path, str]:
    """(root folder, start path inside it): the repository at `notebooks/`, or a run folder
    (a path, or a run id under outputs/) at its executed `notebooks/`."""
    if run is None:
        return REPO_ROOT, "notebooks"
    for candidate in (Path(run), Path(outputs_dir) / str(run)):
        if (candidate / "notebooks").is_dir():
            return candidate.resolve(), "notebooks"
    raise StepscopeError("no executed notebooks (notebooks/) in this run folder", where=str(run),
                         hint="pass a run folder or run id under outputs/ that `stepscope run` wrote, "
                              "or no RUN to open the workbook's notebooks/")


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def checkpoints_dir(root: Path) -> Path:
    """Where JupyterLab keeps checkpoints: the lab's folder beside the runs (a run's scratch copy
    holds its own), never a run folder."""
    if scratch.is_scratch(root):
        return root / scratch.CHECKPOINTS_DIR
    if root == REPO_ROOT:
        return REPO_ROOT / "outputs" / scratch.LAB_DIR / scratch.CHECKPOINTS_DIR
    return scratch.scratch_dir(root) / scratch.CHECKPOINTS_DIR  # --write-run: the run is the root


def lab_argv(root: Path, host: str, port: int) -> list[str]:
    return [sys.executable, "-m", "jupyterlab", "--no-browser",
            f"--ServerApp.ip={host}", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
            f"--ServerApp.root_dir={root}", "--ServerApp.log_level=WARN", "--LabApp.log_level=WARN",
            "--LabApp.news_url=None", f"--LabApp.app_settings_dir={LAB_SETTINGS_DIR}",
            # An absolute checkpoint_dir is one folder for every notebook (os.path.join keeps it).
            f"--FileCheckpoints.checkpoint_dir={checkpoints_dir(root)}",
            "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate",
            # containers often run as root; Jupyter refuses that unless told
            *(["--ServerApp.allow_root=True"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])]


def lab_env(token: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: the token, and this checkout's library first on the path."""
    env = dict(os.environ)
    path = [str(REPO_ROOT / "lib")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update({"JUPYTER_TOKEN": token, "PYTHONPATH": os.pathsep.join(dict.fromkeys(path))})
    env.update(extra or {})
    return env


def _ready(base_url: str, token: str) -> bool:
    req = urllib.request.Request(f"{base_url}/api/status", headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(req, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def lab_folder(run: str | Path | None, write_run: bool = False) -> tuple[Path, str]:
    """(root, start path) JupyterLab serves: a run's scratch copy (`stepscope.scratch`), made or
    brought up to date here, unless `write_run` asks for the run itself."""
    root, start = lab_root(run)
    if run is None or write_run:
        return root, start
    return scratch.make_scratch(root), start


def start_lab(run: str | Path | None = None, *, host: str = LOOPBACK, port: int | None = None,
              env: dict[str, str] | None = None, log_path: str | Path | None = None,
              timeout_s: float = START_TIMEOUT_S, write_run: bool = False) -> LabServer:
    """Start JupyterLab and return once it answers; the caller stops it (`LabServer.stop`).
    A run opens in its scratch copy unless `write_run`."""
    try:
        import jupyterlab  # noqa: F401
    except ImportError as e:
        raise StepscopeError("JupyterLab is not installed in this environment", where=sys.executable,
                             hint="run `bash .ci/setup`, or `pip install jupyterlab`") from e
    root, start = lab_folder(run, write_run)
    port = port or _free_port(host)
    token = secrets.token_urlsafe(24)
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    try:
        proc = lifeline.spawn(lab_argv(root, host, port), cwd=root, env=lab_env(token, env),
                              stdout=log, stderr=subprocess.STDOUT if log_path else None, stdin=subprocess.DEVNULL)
    finally:
        if log_path:
            log.close()
    try:
        lifeline.guard(proc.pid, log_path=log_path, grace_s=5.0, what="JupyterLab")
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    server = LabServer(proc, host, port, token, root, start)
    deadline = time.monotonic() + timeout_s
    while not _ready(server.base_url, token):
        if proc.poll() is not None or time.monotonic() > deadline:
            what = (f"exited with code {proc.returncode}" if proc.poll() is not None
                    else f"did not answer within {timeout_s:.0f} s")
            server.stop()
            raise StepscopeError(f"JupyterLab {what} on {host}:{port}", where=str(log_path or "its output above"),
                                 hint="is the port free? pass --port, or read its messages")
        time.sleep(0.3)
    return server


def perfetto_link(root: Path, echo=print, ui_url: str | None = None, port: int | None = None):
    """Serve the run's merged Perfetto file on loopback and print the link that opens it in Perfetto's UI (the
    browser contacts the UI, never stepscope). Returns the file server to shut down, or None."""
    from stepscope.trace import perfetto

    merged = root / "05_categorize" / "perfetto" / perfetto.MERGED_NAME
    if not merged.is_file():
        return None
    ui = ui_url or perfetto.UI_URL
    where = f"{merged} (Open trace file in {ui}; which step to look at: {merged.parent / 'README.md'})"
    try:
        server, link = perfetto.serve_for_ui(merged, port=perfetto.UI_PORT if port is None else port, origin=ui)
    except OSError as exc:  # the port is taken (another trace served to the UI)
        echo(f"Perfetto: {where}; not served on loopback: {exc}")
        return None
    echo(f"Perfetto (every rank, one clock): {link}")
    echo(f"  or open {where}")
    return server


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def run_lab(run: str | Path | None = None, *, host: str = LOOPBACK, port: int | None = None,
            echo=print, write_run: bool = False) -> int:
    """`stepscope lab`: start, print the URL, serve until Ctrl-C."""
    if not is_loopback(host):
        echo(f"warning: JupyterLab listens on {host}: anyone who can reach it and holds the token "
             "can run code as you")
    server = start_lab(run, host=host, port=port, write_run=write_run)
    echo(f"JupyterLab at {server.root / server.start_path}")
    if scratch.is_scratch(server.root):
        echo(f"  a scratch copy of {lab_root(run)[0]}: what runs here writes into the copy, never into the run "
             "(--write-run opens the run itself)")
    echo(f"  {server.url}")
    files = perfetto_link(server.root, echo) if run is not None else None
    echo("Ctrl-C stops it (and its kernels).")
    # The server runs in its own session (so Ctrl-C reaches it once, through us): a SIGTERM
    # to this process must stop it too, not leave it orphaned.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        if files is not None:
            files.shutdown()
        server.stop()
    return 0 if server.proc.returncode in (0, -signal.SIGTERM, None) else 1
