"""Progress that suits where it is shown: every bar and progress line of the library is made here.

tqdm's bar on a terminal, a widget in a watched Jupyter kernel, and elsewhere (pipes, papermill, CI logs)
whole lines at most every `LINE_INTERVAL_S`, since carriage returns pile up there. Events are whole lines,
relayed by the runner from a kernel through the file named in `EVENTS_ENV`.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

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


EVENTS_ENV = "STEPSCOPE_PROGRESS_EVENTS"
"""The file a stage appends its progress lines to while the runner `relay`s them (a kernel
started inside inherits it)."""

RELAY_POLL_S = 0.5
"""How often the runner looks for new progress lines, s."""


def event(line: str) -> None:
    """One line of progress for the person running (a sweep level finished): printed here (a
    notebook's output, a terminal) and, under `relay`, appended to its file for the runner's console."""
    line = line.replace("\r", " ").replace("\n", " ")
    write(line)
    path = os.environ.get(EVENTS_ENV)
    if path:
        try:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        except OSError:
            pass  # the console misses a line; the stage's files and notebook have it


class _Tail:
    """The whole lines appended to a file since the last look."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.rest = path, 0, b""

    def lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        self.offset += len(data)
        *whole, self.rest = (self.rest + data).split(b"\n")
        return [ln.decode("utf-8", "replace") for ln in whole if ln.strip()]


@contextlib.contextmanager
def relay(echo: Callable[[str], None], poll_s: float = RELAY_POLL_S) -> Iterator[Path]:
    """Say on `echo`, as they come, the `event` lines of whatever runs inside (a papermill
    kernel, or this process); every line is said by the time the block ends."""
    fd, name = tempfile.mkstemp(prefix="stepscope-progress-", suffix=".log")
    os.close(fd)
    tail, stop, before = _Tail(Path(name)), threading.Event(), os.environ.get(EVENTS_ENV)

    def say() -> None:
        for line in tail.lines():
            with _std_tqdm.external_write_mode():  # a bar on the terminal is cleared, then redrawn
                echo(line)

    def follow() -> None:
        while not stop.wait(poll_s):
            say()

    os.environ[EVENTS_ENV] = name
    thread = threading.Thread(target=follow, name="stepscope-progress-relay", daemon=True)
    thread.start()
    try:
        yield Path(name)
    finally:
        stop.set()
        thread.join()
        say()
        if before is None:
            os.environ.pop(EVENTS_ENV, None)
        else:
            os.environ[EVENTS_ENV] = before
        Path(name).unlink(missing_ok=True)


NOTEBOOK_BAR = {"unit": "cell", "bar_format": "{desc}: {n_fmt}/{total_fmt} cells [{elapsed}]"}
"""papermill's bar on a terminal: cells done and time spent, no ETA (a sweep cell takes minutes,
the next cell a second: a rate per cell predicts nothing)."""


def notebook_bar(show: bool, desc: str, stream: Any = None) -> dict[str, Any] | bool:
    """papermill's `progress_bar`: its bar on a terminal; off on a pipe or file, where the
    runner's own lines (a stage started, each sweep level, a stage done) say the progress."""
    if not show or not _is_terminal(stream or sys.stderr):
        return False
    return {**NOTEBOOK_BAR, "desc": desc}
