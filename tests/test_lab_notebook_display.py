"""What an executed notebook keeps (issue 38, item 4): tables through the report's number
formatter, not pandas' six decimals, and progress as text lines under papermill, not a widget
saved frozen at "0 %". Run in a real kernel (as papermill runs a stage) and in this process (as
`stepscope analyze` does)."""

from __future__ import annotations

import nbformat
import pytest

from stepscope import runfolder

CELLS = [
    "from stepscope.notebook import format_tables\nformat_tables()",
    "import pandas as pd\npd.DataFrame({'category': ['all_reduce'], 'union_us': [12.474713], 'calls': [5],"
    " 'share_pct': [float('nan')]})",
    "from stepscope.progress import bar\nb = bar(range(3), desc='GEMM cases')\nfor _ in b:\n    pass\nb.close()",
]


def _notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def _check(nb: dict) -> None:
    table = nb["cells"][1]["outputs"]
    html = "".join(o["data"]["text/html"] for o in table if "text/html" in o.get("data", {}))
    plain = "".join(o["data"]["text/plain"] for o in table if "text/plain" in o.get("data", {}))
    assert "<td>12.5</td>" in html and "12.474713" not in html and "<td>–</td>" in html
    assert "12.5" in plain and "12.474713" not in plain
    bar_out = nb["cells"][2]["outputs"]
    assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in bar_out)
    text = "".join(o.get("text", "") for o in bar_out if o["output_type"] == "stream")
    assert "GEMM cases: 100%" in text and "\r" not in text


def test_an_executed_notebook_keeps_formatted_tables_and_text_progress(tmp_path):
    from nbclient import NotebookClient

    nb = _notebook()
    with runfolder.batch_run_environment():  # the kernel papermill starts for `stepscope run`
        NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    _check(nb)


def test_the_same_in_process(tmp_path):
    from stepscope import inprocess

    if inprocess.shell() is None:
        pytest.skip("another IPython shell owns this process")
    src = tmp_path / "in.ipynb"
    nb = _notebook()
    nb.cells.insert(0, nbformat.v4.new_code_cell("x = None", metadata={"tags": ["parameters"]}))
    nbformat.write(nb, src)
    out = inprocess.execute_notebook(src, tmp_path / "out.ipynb", {"x": 1}, cwd=tmp_path)
    _check({"cells": [c for c in out["cells"] if "parameters" not in str(c.get("metadata", {}).get("tags", []))]})
