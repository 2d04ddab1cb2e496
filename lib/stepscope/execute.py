"""The one way a stage's notebook is executed: `with_kernel` (papermill, isolated) or `in_process` (no kernel,
for the analysis stages).

Both return the executed notebook's path, scrubbed of secrets; this module sits between the runner and
`inprocess` so neither imports the other.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from stepscope import paths, runfolder
from stepscope.progress import notebook_bar
from stepscope.redaction import scrub
from stepscope.stages import Stage


def with_kernel(stage: Stage, params_file: Path, run_dir: Path, progress: bool) -> Path:
    """Run one stage's notebook with papermill; returns the executed notebook's path."""
    import papermill as pm

    out_nb = Path(run_dir) / "notebooks" / f"{stage.id}.ipynb"
    out_nb.parent.mkdir(parents=True, exist_ok=True)
    with runfolder.batch_run_environment(), scrubbed(out_nb):  # the kernel knows it runs in batch: no widgets (runfolder.BATCH_RUN_ENV)
        pm.execute_notebook(
            str(stage.notebook), str(out_nb),
            parameters={"params_file": str(params_file), "run_dir": str(run_dir)},
            kernel_name="python3", cwd=str(paths.NOTEBOOKS_DIR), progress_bar=notebook_bar(progress, stage.id),
            log_output=False, request_save_on_cell_execute=True, execution_timeout=stage.cell_timeout_s,
            # The kernel's own log is noise on the console (start-up warnings, a spurious KeyboardInterrupt
            # line): a cell's error is in its notebook, a dead kernel papermill's DeadKernelError.
            extra_arguments=["--IPKernelApp.log_level=CRITICAL"],
        )
    return out_nb


def in_process(stage: Stage, params_file: Path, run_dir: Path, progress: bool) -> Path:
    """The analysis stages' executor (see `stepscope.inprocess`); falls back to a kernel when
    this process already runs an IPython shell (a notebook calling `analyze`)."""
    from stepscope import inprocess

    if inprocess.shell() is None:
        return with_kernel(stage, params_file, run_dir, progress)
    out_nb = Path(run_dir) / "notebooks" / f"{stage.id}.ipynb"
    out_nb.parent.mkdir(parents=True, exist_ok=True)
    with scrubbed(out_nb):
        inprocess.execute_notebook(stage.notebook, out_nb, {"params_file": str(params_file), "run_dir": str(run_dir)},
                                   cwd=paths.NOTEBOOKS_DIR)
    return out_nb


@contextlib.contextmanager
def scrubbed(notebook: Path):
    """Run the block, then put the notebook it wrote (if any) through the secret filter, also
    when the block raised (a failed stage's partial notebook is kept)."""
    try:
        yield
    finally:
        scrub_notebook(notebook)


def scrub_notebook(notebook: Path) -> bool:
    """Blank every secret in an executed notebook's text; True when one was found. nbformat
    writes one string a line and no rule of the filter crosses a line end: the JSON stays whole."""
    try:
        text = notebook.read_text()
    except (OSError, UnicodeDecodeError):
        return False
    clean = scrub(text)
    if clean == text:
        return False
    with runfolder.atomic_open(notebook) as fh:
        fh.write(clean)
    return True
