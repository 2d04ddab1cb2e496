"""Progress bars that suit where they are shown: every bar of the library is made here.

- In a terminal: tqdm's bar, redrawn in place.
- In a Jupyter kernel a person watches (JupyterLab): `tqdm.auto`, a widget where one is available.
  In papermill's kernels (`runfolder.batch_run`) whole lines, as on a pipe: a widget would be
  saved in the executed notebook as a bar frozen at "0 %".
- Anywhere else (a pipe, a file, a CI log): one whole line at most every `LINE_INTERVAL_S`
  and the last state when the bar closes. tqdm's own bar redraws with carriage returns,
  which on a pipe pile up into one line that never ends (server start-up made 8 KB of it).
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from tqdm.std import tqdm as _std_tqdm

LINE_INTERVAL_S = 30.0
"""On a pipe, the least time between two lines of one bar, s (its last state comes at close)."""


def _in_kernel() -> bool:
    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except Exception:  # noqa: BLE001 - no IPython: not a kernel
        return False
    return shell is not None and hasattr(shell, "kernel")


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class LineBar(_std_tqdm):
    """A tqdm bar for a stream that is not a terminal: whole lines, a few of them."""

    def __init__(self, *args: Any, **kwargs: Any):
        self._line_at = -math.inf
        self._pending: str | None = None
        kwargs.setdefault("mininterval", LINE_INTERVAL_S)
        kwargs.setdefault("dynamic_ncols", False)
        kwargs.setdefault("ncols", 100)
        kwargs.setdefault("ascii", True)  # logs and CI viewers may not be UTF-8
        super().__init__(*args, **kwargs)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if msg == "":
            return True  # tqdm clearing the line: there is no line to clear
        self._pending = msg if msg is not None else self.__str__()
        self._emit(force=False)
        return True

    def _emit(self, force: bool) -> None:
        now = time.monotonic()
        if self._pending is None or (not force and now - self._line_at < LINE_INTERVAL_S):
            return
        self.fp.write(self._pending.strip() + "\n")
        getattr(self.fp, "flush", lambda: None)()
        self._line_at, self._pending = now, None

    def close(self) -> None:
        if self.disable:
            return
        self._pending = self.__str__()
        self._emit(force=True)
        self.disable = True
        self._decr_instances(self)


def _batch_kernel() -> bool:
    """A kernel papermill runs for `stepscope run`: its widget bar would be saved in the executed
    notebook frozen at "0 %" (no widget state is saved), so it gets whole text lines instead."""
    from stepscope.runfolder import batch_run

    return batch_run()


def bar(iterable: Any = None, **kwargs: Any) -> _std_tqdm:
    """A progress bar (tqdm's arguments) drawn to suit its stream: see the module's docstring."""
    stream = kwargs.get("file") or sys.stderr
    if kwargs.get("disable"):
        return _std_tqdm(iterable, **kwargs)
    if _in_kernel() and not _batch_kernel():
        from tqdm.auto import tqdm as auto_tqdm

        return auto_tqdm(iterable, **kwargs)
    if _is_terminal(stream):
        return _std_tqdm(iterable, **kwargs)
    return LineBar(iterable, **kwargs)


def write(message: str, file: Any = None) -> None:
    """A line printed between bars without breaking them."""
    _std_tqdm.write(message, file=file or sys.stderr)
