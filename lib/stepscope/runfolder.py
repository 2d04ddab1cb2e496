"""The run folder: the only channel between stages, so any stage can be re-run alone (layout:
docs/artifacts.md)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import logging
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import IO, Any, Callable, Iterator

import yaml

from stepscope.errors import StageInputMissing, StepscopeError

log = logging.getLogger(__name__)


def stage_dir(run_dir: str | Path, stage_id: str) -> Path:
    """The stage's artifact folder, created on demand."""
    d = Path(run_dir) / stage_id
    d.mkdir(parents=True, exist_ok=True)
    return d


def figures_dir(run_dir: str | Path) -> Path:
    d = Path(run_dir) / "figures"
    d.mkdir(parents=True, exist_ok=True)
    return d


FIGURE_DPI = 110


def save_figure(fig, path: str | Path) -> Path:
    """The one place a figure is written: PNG at FIGURE_DPI, then closed to free memory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=FIGURE_DPI)
    import matplotlib.pyplot as plt

    plt.close(fig)  # frees pyplot-managed figures; a no-op for the others
    log.debug("figure written: %s", path)
    return path


def save_figures(figures: dict, run_dir: str | Path) -> list[Path]:
    """Save `{name: figure}` as PNGs in the run's figures/ folder (`.png` added if missing).

    Rendering is most of a figure's cost, so figures are dealt round-robin to this process and a forked child
    per idle core, the same bytes; a failed child's share renders here, so errors surface as serially.
    """
    d = figures_dir(run_dir)
    jobs = [(fig, d / (name if name.endswith(".png") else f"{name}.png")) for name, fig in figures.items()]
    n_share = 1 if _in_jupyter_kernel() else max(1, min(len(jobs), 1 + _idle_cores()))
    here, children = jobs[0::n_share], []
    for share in (jobs[i::n_share] for i in range(1, n_share)):
        pid = _fork_saver(share)
        if pid is None:
            here += share
        else:
            children.append((pid, share))
    for fig, path in here:
        save_figure(fig, path)
    for pid, share in children:
        _, status = os.waitpid(pid, 0)
        failed = os.waitstatus_to_exitcode(status) != 0
        if failed:
            log.warning("figure child exited with %s; rendering its figures here", status)
        for fig, path in share:
            if failed:
                save_figure(fig, path)
            else:
                _close(fig)
    return [path for _, path in jobs]


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1


BATCH_RUN_ENV = "STEPSCOPE_BATCH_RUN"
"""Set to "1" for the kernels the runner starts for papermill: interactive cells then explain themselves
instead of building widgets, which hung papermill (nteract/papermill#723)."""


def batch_run() -> bool:
    """True in a kernel the runner started for a batch (papermill) run."""
    return os.environ.get(BATCH_RUN_ENV) == "1"


@contextlib.contextmanager
def batch_run_environment():
    """BATCH_RUN_ENV set for what starts inside (a kernel inherits it at launch), then restored."""
    before = os.environ.get(BATCH_RUN_ENV)
    os.environ[BATCH_RUN_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(BATCH_RUN_ENV, None)
        else:
            os.environ[BATCH_RUN_ENV] = before


def _in_jupyter_kernel() -> bool:
    """Whether a Jupyter kernel owns this process: its ZMQ threads make a fork unsafe, so figures render here.
    """
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return getattr(shell, "kernel", None) is not None


def _idle_cores() -> int:
    """Cores other than this process's idle now, by the 1-minute load average: on a busy machine a forked
    child only queues (no wall gain at load 5 on 2 cores)."""
    return min(_cores() - 1, max(0, math.floor(_cores() - os.getloadavg()[0] + 0.5)))


def _fork_saver(jobs: list) -> int | None:
    """Fork a child that saves `jobs` ((figure, path) pairs) and exits; its pid, or None
    when this platform or moment cannot fork (the caller then saves them itself)."""
    if not hasattr(os, "fork"):
        return None
    try:
        pid = os.fork()
    except OSError as exc:
        log.debug("no fork for figures: %s", exc)
        return None
    if pid:
        return pid
    code = 1
    try:  # the child: only render and write, then leave without running the parent's exit hooks
        for fig, path in jobs:
            path.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=FIGURE_DPI)
        code = 0
    finally:
        os._exit(code)


def _close(fig) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)


def params_snapshot_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "params.yaml"


RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
RUN_ID_CHARS = "letters, digits, '.', '_' and '-', starting with a letter or a digit"
"""A run id (and a `run.name`) is one path segment of these: no '/', never '..', never a
leading '-' that `lab` and `compare` would read as an option, nor a leading '.' (hidden)."""


def check_run_id(value: str, where: str) -> str:
    """`value` when it is a safe run id (RUN_ID_RE), else a StepscopeError naming `where`."""
    if not isinstance(value, str) or not RUN_ID_RE.fullmatch(value):
        raise StepscopeError(f"{value!r} is not a run id: one path segment of {RUN_ID_CHARS}, "
                             "at most 128 characters",
                             where=where, hint="e.g. cpu-demo or kimi-tp8.try2")
    return value


def run_folder_under(outputs_dir: str | Path, run_id: str, where: str = "--run-id") -> Path:
    """outputs_dir/run_id, checked: a safe run id, no symlinked run folder (it would send every write
    elsewhere), inside the resolved outputs_dir. Not created."""
    check_run_id(run_id, where)
    outputs = Path(outputs_dir).resolve()
    candidate = outputs / run_id
    if candidate.is_symlink():
        raise StepscopeError(f"the run folder is a symlink (to {os.readlink(candidate)}); stepscope writes "
                             "only into real folders under run.outputs_dir", where=str(candidate),
                             hint="remove the link, or pick another --run-id")
    if not candidate.resolve().is_relative_to(outputs):
        raise StepscopeError("the run folder resolves outside run.outputs_dir", where=str(candidate),
                             hint=f"pick a run id that stays under {outputs}")
    return candidate


def check_run_folder_links(run_dir: str | Path) -> None:
    """Refuse a run folder holding a symlink that resolves outside it (a planted
    `params.yaml` or `02_gemm_micro` link would make the run write through it)."""
    run_dir = Path(run_dir).resolve()
    if not run_dir.is_dir():
        return
    for entry in run_dir.iterdir():
        if entry.is_symlink() and not entry.resolve().is_relative_to(run_dir):
            raise StepscopeError(f"{entry.name} is a symlink to {os.readlink(entry)}, outside the run folder",
                                 where=str(entry), hint="remove the link: stepscope writes only inside the run folder")


LOCK_NAME = ".stepscope.lock"
"""The run folder's lock file: flock'ed by the process using the folder, and holding its pid."""

_HELD_LOCKS: dict[Path, list] = {}
"""Run folders this process holds, {folder: [open lock file, depth]}: a flock belongs to an open file, so a
second flock in one process would refuse itself."""


class RunFolderBusy(StepscopeError):
    """Another live process holds the run folder's lock."""


@contextlib.contextmanager
def run_folder_lock(run_dir: str | Path, say: Callable[[str], None] = print) -> Iterator[None]:
    """Hold the run folder for this process; a second process is refused, naming the holder's pid. A lock file
    whose flock is free is stale (its holder died) and taken over, told through `say`. Re-entrant."""
    run_dir = Path(run_dir).resolve()
    held = _HELD_LOCKS.get(run_dir)
    if held is not None:
        held[1] += 1
        try:
            yield
        finally:
            held[1] -= 1
        return
    fh = _take_lock(run_dir, say)
    _HELD_LOCKS[run_dir] = [fh, 1]
    try:
        yield
    finally:
        del _HELD_LOCKS[run_dir]
        with contextlib.suppress(OSError):
            fh.seek(0)
            fh.truncate()  # an empty file after a clean exit: nothing stale to report next time
        fh.close()  # closing drops the flock


def _take_lock(run_dir: Path, say: Callable[[str], None]) -> IO:
    import fcntl

    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    fh = open(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, output_mode()), "r+")  # noqa: SIM115
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = fh.read().strip() or "unknown"
        fh.close()
        raise RunFolderBusy(f"in use by another stepscope process (pid {holder}): two runs in one folder "
                            "would contaminate each other's timings and overwrite each other's files",
                            where=str(run_dir), hint="wait for it to finish (or stop it), or pick another "
                            "--run-id") from None
    stale = fh.read().strip()
    if stale and stale != str(os.getpid()):
        say(f"  {run_dir.name}: taking over the lock left by pid {stale}, which no longer holds it "
            f"({'gone' if not _pid_alive(stale) else 'alive, but not holding the lock'})")
    fh.seek(0)
    fh.truncate()
    fh.write(f"{os.getpid()}\n")
    fh.flush()
    return fh


def _pid_alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
"""A write refused for want of space (or of quota): said with the path and the free space."""


class DiskFull(StepscopeError):
    """A write that failed because the disk (or the user's quota) is full."""


def disk_full(path: str | Path, exc: OSError) -> DiskFull:
    """The error for a write to `path` refused with ENOSPC/EDQUOT: the path and the space left
    on its filesystem, so the message says where to make room."""
    path = Path(path)
    probe = next((p for p in (path, *path.parents) if p.exists()), Path("/"))
    try:
        free = f"{shutil.disk_usage(probe).free / 2**20:,.1f} MiB free on the filesystem holding {probe}"
    except OSError:
        free = "the free space could not be read"
    return DiskFull(f"{exc.strerror or exc} while writing it ({free})", where=str(path),
                    hint="free some space there (or move run.outputs_dir to a larger disk), then run the "
                         "same command with --resume: finished stages are kept")


def output_mode() -> int:
    """The mode every output file gets, 0o666 less the umask as open() gives: mkstemp's 0600 left JSON outputs
    unreadable to colleagues who could read the report."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A fresh temp file beside `path` (created exclusively, so no planted link is followed), renamed over
    `path` when the block ends. On failure the temp file goes, `path` keeps its last good content, and a full
    disk is raised as DiskFull."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, output_mode())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            raise disk_full(path, exc) from None
        raise


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w") -> Iterator[IO]:
    """`open(path, mode)` written atomically through `atomic_path` (text or binary)."""
    with atomic_path(path) as tmp, open(tmp, mode) as fh:
        yield fh


def write_json(path: str | Path, obj: Any) -> Path:
    """Write JSON atomically (temp file + rename): a crash never leaves half a file."""
    path = Path(path)
    with atomic_open(path) as fh:
        json.dump(obj, fh, indent=2, default=_json_default, allow_nan=True)
        fh.write("\n")
    log.debug("written: %s", path)
    return path


def write_yaml(path: str | Path, obj: Any) -> Path:
    """Write YAML atomically, like write_json."""
    path = Path(path)
    with atomic_open(path) as fh:
        fh.write(yaml.safe_dump(obj, sort_keys=False))
    return path


def short_hash(obj: Any) -> str:
    """16 hex digits of the SHA-256 of `obj` as canonical JSON: the fingerprint `--resume` and
    a campaign's stage reuse compare inputs by."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


def require_artifact(run_dir: str | Path, stage_id: str, name: str) -> Path:
    """Path of an earlier stage's artifact, or a clear error saying which stage to run."""
    p = Path(run_dir) / stage_id / name
    if not p.exists():
        raise StageInputMissing(
            f"needs {stage_id}/{name}, which is not there",
            where=str(Path(run_dir)),
            hint=f"run that stage first: stepscope run <params> --run-id {Path(run_dir).name} "
                 f"--stages {stage_id[:2]}",
        )
    return p


def _json_default(obj: Any) -> Any:
    import dataclasses

    import msgspec
    import numpy as np

    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    if isinstance(obj, msgspec.Struct):  # params sections and schema records
        return msgspec.to_builtins(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
