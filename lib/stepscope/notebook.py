"""The few calls every notebook makes, so notebooks stay free of logic."""

from __future__ import annotations

from pathlib import Path

from stepscope.config import Params, load_params
from stepscope.runfolder import STAGE_BY_ID, stage_dir, write_json


def open_stage(params_file: str | Path, run_dir: str | Path, stage_id: str) -> tuple[Params, Path]:
    """Validate params and return them with the stage's artifact folder (created)."""
    if stage_id not in STAGE_BY_ID:
        raise KeyError(f"unknown stage {stage_id!r}; stages are {list(STAGE_BY_ID)}")
    params = load_params(params_file)
    return params, stage_dir(run_dir, stage_id)


def not_built_yet(out_dir: str | Path, what: str) -> None:
    """Say plainly that a stage does not measure anything yet, and leave a marker file."""
    out_dir = Path(out_dir)
    message = f"{out_dir.name}: not built yet; {what} are not measured in this release."
    write_json(out_dir / "not_built.json", {"stage": out_dir.name, "message": message})
    print(message)


def show_figures(figures: dict, run_dir: str | Path) -> list[Path]:
    """Save `{name: figure}` into the run's figures/ and show the saved PNGs.

    Showing the file, not the live figure, means the notebook displays exactly what
    the report embeds, and the figure can be closed at once to free its memory.
    """
    from IPython.display import Image, display

    from stepscope.runfolder import save_figures

    saved = save_figures(figures, run_dir)
    display(*(Image(filename=str(p)) for p in saved))
    return saved
