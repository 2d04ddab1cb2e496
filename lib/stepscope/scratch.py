"""The lab's scratch copy of a finished run (`<outputs>/.lab/<run id>/`): exploring never rewrites the run.

Large files are linked, not copied; every artifact is written through `runfolder.atomic_path`, which replaces
a link rather than writing through it. Notebooks are copied once with parameters pointed at the copy
(docs/faults.md).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nbformat

from stepscope.errors import StepscopeError

LAB_DIR = ".lab"
"""The scratch copies' folder, beside the runs (`outputs/.lab/<run id>/`)."""
COPY_LIMIT_BYTES = 16 * 2**20
"""Files larger than this are linked into the scratch copy, not copied."""
CHECKPOINTS_DIR = ".checkpoints"
"""JupyterLab's checkpoints, inside the lab's folder (`FileCheckpoints.checkpoint_dir`)."""
SKIPPED = frozenset({".ipynb_checkpoints"})
SCRATCH_NOTE = "# stepscope lab: a scratch copy of {run}; a stage run here writes into this copy, never into the run."


def scratch_dir(run_dir: str | Path) -> Path:
    """Where the lab's copy of a run lives: `<run's parent>/.lab/<run id>/`."""
    run = Path(run_dir).resolve()
    return run.parent / LAB_DIR / run.name


def is_scratch(path: str | Path) -> bool:
    return Path(path).resolve().parent.name == LAB_DIR


def _sync_file(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_symlink() or dest.exists():
        dest.unlink()
    if src.stat().st_size > COPY_LIMIT_BYTES:
        os.symlink(src.resolve(), dest)
    else:
        shutil.copy2(src, dest)


def point_notebook_at(nb_path: Path, run: Path, scratch: Path) -> None:
    """Rewrite an executed notebook's injected parameters to the scratch copy (a notebook
    without them, run by hand, is left as it is)."""
    nb = nbformat.read(nb_path, as_version=4)
    cell = next((c for c in nb.cells if "injected-parameters" in c.get("metadata", {}).get("tags", [])), None)
    if cell is None:
        return
    params = scratch / "params.yaml"
    cell.source = "\n".join([SCRATCH_NOTE.format(run=run), "# Parameters",
                             f"params_file = {str(params)!r}" if params.is_file() else _kept_line(cell.source),
                             f"run_dir = {str(scratch)!r}", ""])
    nbformat.write(nb, nb_path)


def _kept_line(source: str) -> str:
    """The injected `params_file = ...` line, for a run without a params snapshot."""
    return next((ln for ln in source.splitlines() if ln.startswith("params_file")), "params_file = None")


def make_scratch(run_dir: str | Path, scratch: str | Path | None = None) -> Path:
    """Create (or bring up to date) the lab's scratch copy of a run; return its folder."""
    run = Path(run_dir).resolve()
    if not run.is_dir():
        raise StepscopeError("run folder not found", where=str(run), hint="pass a folder `stepscope run` wrote")
    dest = Path(scratch) if scratch is not None else scratch_dir(run)
    if dest.resolve() == run or run in dest.resolve().parents:
        raise StepscopeError("the scratch copy would be inside the run", where=str(dest),
                             hint="pick a scratch folder outside the run folder")
    fresh_notebooks: list[Path] = []
    for src in sorted(run.rglob("*")):
        rel = src.relative_to(run)
        if SKIPPED & set(rel.parts) or not src.is_file():
            continue
        target = dest / rel
        if rel.parts[0] == "notebooks" and src.suffix == ".ipynb":
            if not target.exists():  # the user's explorations are kept
                _sync_file(src, target)
                fresh_notebooks.append(target)
            continue
        _sync_file(src, target)
    for nb in fresh_notebooks:
        point_notebook_at(nb, run, dest)
    return dest
