"""The in-process notebook executor `stepscope analyze` uses: papermill's document, no kernel."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from stepscope.inprocess import execute_notebook


def _nb(path: Path, *cells: tuple[str, str, list[str]]) -> Path:
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {"kernelspec": {"name": "python3", "language": "python",
                                                                          "display_name": "Python 3"}},
          "cells": [{"cell_type": kind, "id": f"c{i}", "metadata": {"tags": tags}, "source": src,
                     **({"outputs": [], "execution_count": None} if kind == "code" else {})}
                    for i, (kind, src, tags) in enumerate(cells)]}
    path.write_text(json.dumps(nb))
    return path


def test_cells_run_in_process_with_papermill_layout(tmp_path):
    src = _nb(tmp_path / "in.ipynb",
              ("markdown", "# Title", []),
              ("code", "x = 1\nname = 'default'", ["parameters"]),
              ("code", "print('x is', x, name)\nimport sys\nprint('warn', file=sys.stderr)", []),
              ("code", "import pandas as pd\nfrom IPython.display import display, Image\n"
                       "display(pd.DataFrame({'a': [1, 2]}))\nx * 21", []),
              ("code", "import matplotlib\nmatplotlib.use('Agg')\nfrom matplotlib.figure import Figure\n"
                       "import io\nf = Figure(figsize=(1, 1)); buf = io.BytesIO(); f.savefig(buf, format='png')\n"
                       "Image(data=buf.getvalue())", []))
    out = tmp_path / "out.ipynb"
    execute_notebook(src, out, {"x": 2, "name": "given"})
    nb = json.loads(out.read_text())
    cells = nb["cells"]
    assert [c["metadata"].get("tags") for c in cells[1:3]] == [["parameters"], ["injected-parameters"]]
    assert cells[2]["source"] == "# Parameters\nx = 2\nname = 'given'\n"
    assert nb["metadata"]["papermill"]["parameters"] == {"x": 2, "name": "given"}
    assert nb["metadata"]["papermill"]["exception"] is False
    assert [c["execution_count"] for c in cells if c["cell_type"] == "code"] == [1, 2, 3, 4, 5]
    assert all(c["metadata"]["papermill"]["status"] == "completed" for c in cells if c["cell_type"] == "code")
    assert cells[3]["outputs"] == [{"output_type": "stream", "name": "stdout", "text": "x is 2 given\n"},
                                   {"output_type": "stream", "name": "stderr", "text": "warn\n"}]
    disp, res = cells[4]["outputs"]
    assert disp["output_type"] == "display_data" and "<table" in disp["data"]["text/html"]
    assert res == {"output_type": "execute_result", "data": {"text/plain": "42"}, "metadata": {},
                   "execution_count": 4}
    png = base64.b64decode(cells[5]["outputs"][0]["data"]["image/png"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_failing_cell_stops_the_notebook_and_raises_papermills_error(tmp_path):
    from papermill.exceptions import PapermillExecutionError

    src = _nb(tmp_path / "in.ipynb", ("code", "a = 1", ["parameters"]),
              ("code", "raise ValueError(f'bad a={a}')", []), ("code", "never = True", []))
    out = tmp_path / "out.ipynb"
    with pytest.raises(PapermillExecutionError) as e:
        execute_notebook(src, out, {"a": 5})
    assert (e.value.ename, e.value.evalue) == ("ValueError", "bad a=5")
    nb = json.loads(out.read_text())
    failed, never = nb["cells"][2], nb["cells"][3]
    assert failed["outputs"][-1]["output_type"] == "error" and failed["outputs"][-1]["evalue"] == "bad a=5"
    assert failed["metadata"]["papermill"]["status"] == "failed"
    assert never["metadata"]["papermill"]["status"] == "pending" and never["outputs"] == []
    assert nb["metadata"]["papermill"]["exception"] is True


def test_each_notebook_starts_with_a_fresh_namespace(tmp_path):
    first = _nb(tmp_path / "a.ipynb", ("code", "leftover = 1", []))
    second = _nb(tmp_path / "b.ipynb", ("code", "print('leftover' in dir())", []))
    execute_notebook(first, tmp_path / "a.out.ipynb", {})
    execute_notebook(second, tmp_path / "b.out.ipynb", {})
    out = json.loads((tmp_path / "b.out.ipynb").read_text())["cells"][1]["outputs"]
    assert out == [{"output_type": "stream", "name": "stdout", "text": "False\n"}]


def test_an_interrupt_is_recorded_without_formatting_a_stack(tmp_path):
    """Ctrl-C inside a cell: the notebook says where it stopped and the executor raises
    KeyboardInterrupt at once. IPython's formatted stack would read and parse the source of
    every frame (1.5 s in a Ctrl-C of `analyze`), so none is formatted for an interrupt."""
    src = _nb(tmp_path / "in.ipynb", ("code", "a = 1", ["parameters"]),
              ("code", "def deep(n):\n    return deep(n - 1) if n else (_ for _ in ()).throw(KeyboardInterrupt)\n"
                       "deep(20)", []),
              ("code", "never = True", []))
    out = tmp_path / "out.ipynb"
    with pytest.raises(KeyboardInterrupt):
        execute_notebook(src, out, {"a": 2})
    cells = [c for c in json.loads(out.read_text())["cells"] if c["cell_type"] == "code"]
    assert [c["metadata"]["papermill"]["status"] for c in cells] == ["completed", "completed", "interrupted",
                                                                    "pending"]
    assert cells[2]["outputs"][-1] == {"output_type": "error", "ename": "KeyboardInterrupt", "evalue": "",
                                       "traceback": []}
