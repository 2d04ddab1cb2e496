"""The few calls every notebook makes, so notebooks stay free of logic."""

from __future__ import annotations

from pathlib import Path

import msgspec

from stepscope import schema
from stepscope.config import Params, load_params
from stepscope.errors import StepscopeError
from stepscope.paths import REPO_ROOT
from stepscope.redaction import REDACTED, secret_env
from stepscope.runfolder import params_snapshot_path, stage_dir
from stepscope.scratch import make_scratch
from stepscope.stages import STAGE_BY_ID

DEMO_PARAMS = REPO_ROOT / "params" / "cpu-demo.yaml"


class NoRunYet(StepscopeError):
    """A notebook opened by hand with no run to work on."""

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of a traceback: the message is the whole story.
        return [self.render()]


def newest_run(params_file: str | Path = DEMO_PARAMS) -> Path | None:
    """The newest run folder (by its timestamped name) of the params file's `run.name`."""
    params = load_params(params_file)
    outputs = Path(params.run.outputs_dir)
    outputs = outputs if outputs.is_absolute() else REPO_ROOT / outputs
    runs = sorted(p for p in outputs.glob(f"{params.run.name}-*") if (p / "run.json").is_file())
    return runs[-1] if runs else None


def default_run(params_file: str | Path | None, run_dir: str | Path | None, *,
                demo_params: str | Path = DEMO_PARAMS) -> tuple[Path, Path]:
    """What papermill injects, for a notebook run by hand (JupyterLab): the newest CPU-demo
    run's scratch copy (`stepscope.scratch`: exploring never rewrites a finished run) and the
    params file it was run with. Injected values, and a run_dir set by hand, pass through unchanged."""
    if params_file is not None and run_dir is not None:
        return Path(params_file), Path(run_dir)
    where = ""
    if run_dir is None:
        newest = newest_run(demo_params)
        if newest is None:
            raise NoRunYet("no CPU-demo run yet: run `stepscope run params/cpu-demo.yaml` first, "
                           "or set run_dir and params_file in the parameters cell")
        run_dir = make_scratch(newest)
        where = f" (its scratch copy; the run {newest} is not written)"
    params_file = Path(params_file or params_file_of(run_dir))
    print(f"no parameters injected: run {run_dir}{where}, params {params_file}")
    return params_file, Path(run_dir)


def params_file_of(run_dir: str | Path) -> Path:
    """The params a run's stages read: its snapshot (params.yaml), never the live file; runs older than
    snapshots fall back to the file run.json names."""
    snapshot = params_snapshot_path(run_dir)
    if snapshot.is_file():
        return snapshot
    record = schema.read_if_present(Path(run_dir) / "run.json", schema.RunRecord)
    recorded = record.params_file if record is not None else None
    for candidate in ((Path(recorded), REPO_ROOT / recorded) if recorded else ()):
        if candidate.is_file():
            return candidate.resolve()
    return snapshot


def open_stage(params_file: str | Path, run_dir: str | Path, stage_id: str) -> tuple[Params, Path]:
    """Validate params and return them with the stage's artifact folder (created). A redacted `server.env`
    value is dropped, so a launched server inherits the variable, never the placeholder."""
    if stage_id not in STAGE_BY_ID:
        raise KeyError(f"unknown stage {stage_id!r}; stages are {list(STAGE_BY_ID)}")
    format_tables()
    params = load_params(params_file)
    secret_env(params.server.api_key_env)  # whatever this stage writes, the key is blanked from it
    env = {k: v for k, v in params.server.env.items() if v != REDACTED}
    if env != params.server.env:
        params = msgspec.structs.replace(params, server=msgspec.structs.replace(params.server, env=env))
    return params, stage_dir(run_dir, stage_id)


TABLE_NA = "–"
"""A missing value in a displayed table, as the report writes it."""


def table_html(df) -> str:
    """A DataFrame as a notebook shows it: every float through the report's formatter
    (`wording.fmt_num`, three significant digits: 12.5 µs, not 12.474713), pandas' row limits kept."""
    import pandas as pd

    from stepscope.wording import fmt_num

    return df.to_html(float_format=fmt_num, na_rep=TABLE_NA, max_rows=pd.get_option("display.max_rows"),
                      max_cols=pd.get_option("display.max_columns"), show_dimensions=len(df) > 60, notebook=True)


def table_text(df) -> str:
    """The same table as text (an executed notebook's plain-text copy, a console)."""
    import pandas as pd

    from stepscope.wording import fmt_num

    return df.to_string(float_format=fmt_num, na_rep=TABLE_NA, max_rows=pd.get_option("display.max_rows"),
                        max_cols=pd.get_option("display.max_columns"))


def format_tables() -> bool:
    """Make the running IPython shell (a JupyterLab kernel, papermill's, `stepscope analyze`'s)
    display DataFrames through `table_html`/`table_text`; False outside IPython. pandas' own
    options stay untouched, so nothing outside a notebook's display changes."""
    try:
        import pandas as pd
        from IPython import get_ipython
    except ImportError:
        return False
    sh = get_ipython()
    if sh is None:
        return False
    formatters = sh.display_formatter.formatters
    formatters["text/html"].for_type(pd.DataFrame, table_html)
    formatters["text/plain"].for_type(pd.DataFrame, lambda df, p, cycle: p.text(table_text(df)))
    return True


def resuming(run_dir: str | Path) -> bool:
    """Whether the run's latest `stepscope run` was given --resume (run.json's `resume`): only
    then may a stage keep data measured earlier. A notebook run by hand measures afresh."""
    record = schema.read_if_present(Path(run_dir) / "run.json", schema.RunRecord)
    return record is not None and record.resume


def show_figures(figures: dict, run_dir: str | Path) -> list[Path]:
    """Save `{name: figure}` into the run's figures/ and show the saved PNGs: exactly what the report embeds,
    and the figure can be freed at once."""
    from IPython.display import Image, display

    from stepscope.runfolder import save_figures

    saved = save_figures(figures, run_dir)
    display(*(Image(filename=str(p)) for p in saved))
    return saved
