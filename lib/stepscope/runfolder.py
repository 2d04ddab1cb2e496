"""The run folder: the only channel between stages.

    outputs/<run-id>/
        run.json                 provenance + per-stage status (written by the runner)
        params.yaml              the params snapshot, secrets redacted
        notebooks/NN_name.ipynb  executed notebooks
        figures/                 every PNG, named for what it shows
        00_deploy/ ... 06_writeup/   one folder of artifacts per stage

Each stage reads only files here, so any stage can be re-run alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import logging
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stepscope.errors import StageInputMissing

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"


ANALYSIS_CELL_TIMEOUT_S = 3600.0
"""An hour for one cell of stage 05 or 06: eight 80 MB rank traces load in minutes."""


@dataclass(frozen=True)
class Stage:
    id: str
    """`NN_name`: the notebook's file stem and the stage's artifact folder."""
    needs: tuple[str, ...]
    """Stages whose artifacts this one cannot do without."""
    uses_server: bool
    sections: tuple[str, ...]
    """Params sections this stage reads."""
    cell_timeout_s: float | None = None
    """Longest a single notebook cell may run before the stage fails (None: no limit). Set
    on the analysis stages, which wait on no server: a cell there that outlasts this has hung
    (a kernel once sat idle while papermill waited for a reply that never came)."""

    @property
    def notebook(self) -> Path:
        return NOTEBOOKS_DIR / f"{self.id}.ipynb"

    @property
    def number(self) -> str:
        return self.id[:2]


STAGES: tuple[Stage, ...] = (
    Stage("00_deploy", (), True, ("run", "model", "server", "hardware")),
    Stage("01_macro_sweep", ("00_deploy",), True, ("sweep",)),
    Stage("02_gemm_micro", (), False, ("model", "server", "micro", "hardware")),
    Stage("03_nccl_burst", (), False, ("model", "micro", "server", "hardware")),
    Stage("04_profiler_capture", ("00_deploy",), True, ("capture",)),
    Stage("05_categorize", (), False, ("analysis",), cell_timeout_s=ANALYSIS_CELL_TIMEOUT_S),
    Stage("06_writeup", (), False, ("writeup",), cell_timeout_s=ANALYSIS_CELL_TIMEOUT_S),
)
STAGE_BY_ID = {s.id: s for s in STAGES}


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

    Rendering is most of a figure's cost (~0.1 s each, building it ~0.01 s), so the figures
    are dealt round-robin to this process and to one forked child per idle core (a GPU
    box's many cores render them all at once): the same files, byte for byte. Should a child
    fail, its share is rendered here, so an error surfaces as it would serially.
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
"""Set (to "1") in the environment of the kernels the runner starts for papermill: a notebook
run in batch, with no one to click. Interactive cells (the step explorer's widgets) then say
how to use them instead of building widgets: under papermill a widget cell was seen to hang
the execution (the kernel idle, nbclient waiting; jupyter/nbclient#312, nteract/papermill#723)."""


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
    """A Jupyter kernel owns this process (papermill's stage runs, JupyterLab): its ZMQ and
    channel threads make a fork unsafe in general, so figures render here (a stage's few
    figures cost about a second). The stage-06 hang once blamed on a fork was the step
    explorer's widget cell (see BATCH_RUN_ENV). `stepscope analyze`'s shell has no kernel."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return getattr(shell, "kernel", None) is not None


def _idle_cores() -> int:
    """Cores other than this process's that are idle now, by the 1-minute load average
    (which counts this process): 2 cores at load 1.4 leave one. On a busy machine a child
    only queues behind the others, and forking costs CPU (measured: no wall gain at load 5
    on 2 cores)."""
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


def write_json(path: str | Path, obj: Any) -> Path:
    """Write JSON atomically (temp file + rename): a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(obj, fh, indent=2, default=_json_default, allow_nan=True)
        fh.write("\n")
    os.replace(tmp, path)
    log.debug("written: %s", path)
    return path


def write_yaml(path: str | Path, obj: Any) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(yaml.safe_dump(obj, sort_keys=False))
    os.replace(tmp, path)
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

    import numpy as np

    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
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
