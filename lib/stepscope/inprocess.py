"""Run stage notebooks inside the calling process, with no kernel and no papermill import.

A kernel and papermill cost ~2.5 s a notebook for traces analysed in under a second; here imports are paid
once and the notebook is written as papermill writes it. No isolation, so the runner uses it only for the
analysis stages; a failing cell raises papermill's `PapermillExecutionError`.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

PAPERMILL_VERSION = "2.7.0"
"""The papermill layout the executed notebooks follow (metadata keys, injected cell)."""


class _CellOutputs:
    """Where the shell's output goes while one cell runs (nbformat output dicts)."""

    def __init__(self, execution_count: int) -> None:
        self.outputs: list[dict] = []
        self.execution_count = execution_count
        self.error: dict | None = None
        self.interrupted = False
        """Ctrl-C (or SIGTERM) reached the cell: IPython caught it as an error, the runner must not."""

    def stream(self, name: str, text: str) -> None:
        if not text:
            return
        last = self.outputs[-1] if self.outputs else None
        if last is not None and last["output_type"] == "stream" and last["name"] == name:
            last["text"] += text
        else:
            self.outputs.append({"output_type": "stream", "name": name, "text": text})

    def display(self, data: dict, metadata: dict | None, result: bool = False) -> None:
        out = {"output_type": "execute_result" if result else "display_data", "data": _encode(data),
               "metadata": metadata or {}}
        if result:
            out["execution_count"] = self.execution_count
        self.outputs.append(out)

    def fail(self, ename: str, evalue: str, traceback: list[str]) -> None:
        self.error = {"output_type": "error", "ename": ename, "evalue": evalue, "traceback": traceback}
        self.outputs.append(self.error)


def _encode(data: dict) -> dict:
    """Binary mime data (PNG, JPEG) as base64 text, as Jupyter stores it."""
    return {k: base64.b64encode(v).decode("ascii") if isinstance(v, bytes) else v for k, v in data.items()}


class _Stream(io.TextIOBase):
    def __init__(self, sink: _CellOutputs, name: str) -> None:
        self.sink, self.stream_name = sink, name

    def write(self, s: str) -> int:
        self.sink.stream(self.stream_name, s)
        return len(s)

    def isatty(self) -> bool:
        return False


_SHELL = None


def shell():
    """This process's IPython shell, built once, its output captured per cell; None when
    another IPython shell (a notebook that calls stepscope) already owns the process."""
    global _SHELL
    if _SHELL is not None:
        return _SHELL
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell

    if InteractiveShell.initialized():
        return None

    class Publisher(DisplayPublisher):
        def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kw):
            self.shell.stepscope_sink.display(data, metadata)

        def clear_output(self, wait=False):
            self.shell.stepscope_sink.outputs.clear()

    class Hook(DisplayHook):
        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            self.shell.stepscope_sink.display(format_dict, md_dict, result=True)

        def finish_displayhook(self):
            pass

    class Shell(InteractiveShell):
        displayhook_class = Hook
        display_pub_class = Publisher

        def enable_gui(self, gui=None):
            pass  # figures are shown as saved PNGs; there is no GUI loop to run

        def showtraceback(self, exc_tuple=None, *args, **kwargs):
            etype, evalue, _ = exc_tuple or sys.exc_info()
            if etype is not None and issubclass(etype, KeyboardInterrupt):
                # No stack for an interrupt: IPython reads and parses every frame's source file
                # to format one (1.5 s of a Ctrl-C in `analyze`), while the user waits.
                self.stepscope_sink.fail(etype.__name__, str(evalue), [])
                return
            super().showtraceback(exc_tuple, *args, **kwargs)

        def _showtraceback(self, etype, evalue, stb):
            self.stepscope_sink.fail(etype.__name__, str(evalue), list(stb))

    _SHELL = Shell.instance(colors="nocolor")
    _SHELL.stepscope_sink = _CellOutputs(0)
    return _SHELL


def _fresh_namespace(sh) -> None:
    """Forget the previous notebook's variables (not `reset()`: its gc.collect costs 0.1 s)."""
    for name in [k for k in sh.user_ns if k not in sh.user_ns_hidden]:
        del sh.user_ns[name]


def run_cell(sh, source: str, count: int) -> _CellOutputs:
    """Execute one cell in `sh`; its outputs, with `.error` set when it raised."""
    sink = _CellOutputs(count)
    sh.stepscope_sink = sink
    sh.execution_count = count
    with contextlib.redirect_stdout(_Stream(sink, "stdout")), contextlib.redirect_stderr(_Stream(sink, "stderr")):
        result = sh.run_cell(source, store_history=False)
    exc = result.error_before_exec or result.error_in_exec
    sink.interrupted = isinstance(exc, KeyboardInterrupt)
    if sink.error is None and exc is not None:
        sink.fail(type(exc).__name__, str(exc), [])
    return sink


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def inject_parameters(nb: dict, parameters: dict) -> dict:
    """papermill's injection: a tagged cell of assignments right after the `parameters` cell."""
    lines = ["# Parameters"] + [f"{k} = {v!r}" for k, v in parameters.items()]
    cell = {"cell_type": "code", "execution_count": None, "id": "injected-parameters",
            "metadata": {"tags": ["injected-parameters"]}, "outputs": [], "source": "\n".join(lines) + "\n"}
    cells = [c for c in nb["cells"] if "injected-parameters" not in c.get("metadata", {}).get("tags", [])]
    at = next((i + 1 for i, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", [])), 0)
    nb["cells"] = cells[:at] + [cell] + cells[at:]
    nb.setdefault("metadata", {})["papermill"] = {
        "default_parameters": {}, "parameters": dict(parameters), "environment_variables": {},
        "version": PAPERMILL_VERSION, "exception": None}
    return nb


@contextlib.contextmanager
def _working_dir(path: Path | None):
    before = os.getcwd()
    if path is not None:
        os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def _save(nb: dict, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(nb, fh, indent=1, ensure_ascii=False)
        fh.write("\n")
    os.replace(tmp, path)


def execute_notebook(input_path: Path, output_path: Path, parameters: dict, cwd: Path | None = None) -> dict:
    """Execute a notebook in this process, writing it to `output_path` after every cell; raises
    PapermillExecutionError at the first failing cell."""
    sh = shell()
    if sh is None:
        raise RuntimeError("an IPython shell already runs in this process; use a kernel")
    nb = inject_parameters(json.loads(Path(input_path).read_text()), parameters)
    meta = nb["metadata"]["papermill"]
    meta.update(input_path=str(input_path), output_path=str(output_path), start_time=_now())
    for cell in nb["cells"]:
        cell.setdefault("metadata", {})["papermill"] = {"status": "pending", "exception": None,
                                                        "start_time": None, "end_time": None, "duration": None}
    t_nb = time.monotonic()
    _fresh_namespace(sh)
    failed: tuple[int, dict, _CellOutputs] | None = None
    count = 0
    with _working_dir(cwd):
        for index, cell in enumerate(nb["cells"]):
            if cell["cell_type"] != "code":
                continue
            count += 1
            pm = cell["metadata"]["papermill"]
            pm.update(status="running", start_time=_now())
            t0 = time.monotonic()
            out = run_cell(sh, _source(cell), count)
            cell["outputs"], cell["execution_count"] = out.outputs, count
            pm.update(end_time=_now(), duration=round(time.monotonic() - t0, 6),
                      status="failed" if out.error else "completed", exception=out.error is not None)
            if out.interrupted:
                # IPython reports Ctrl-C as the cell's error; an interrupt is not a failure of
                # the notebook: say where it stopped and let the runner record it as interrupted.
                pm.update(status="interrupted")
                meta.update(end_time=_now(), duration=round(time.monotonic() - t_nb, 6), exception=True)
                _save(nb, output_path)
                raise KeyboardInterrupt
            _save(nb, output_path)
            if out.error:
                failed = (index, cell, out)
                break
    meta.update(end_time=_now(), duration=round(time.monotonic() - t_nb, 6), exception=failed is not None)
    _save(nb, output_path)
    if failed is not None:
        from papermill.exceptions import PapermillExecutionError

        index, cell, out = failed
        raise PapermillExecutionError(cell_index=index, exec_count=out.execution_count, source=_source(cell),
                                      ename=out.error["ename"], evalue=out.error["evalue"],
                                      traceback=out.error["traceback"])
    return nb

