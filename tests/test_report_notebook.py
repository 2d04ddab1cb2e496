"""Notebook 06 under papermill, the way the runner runs it: it must not fail nor bloat."""

from __future__ import annotations

import nbformat
import pytest

from stepscope.testing.synthetic import make_synthetic_run
from stepscope.paths import NOTEBOOKS_DIR, REPO_ROOT

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("stages", [None, ("05_categorize",)], ids=["full", "only-05"])
def test_notebook_06_runs_under_papermill_and_stays_small(tmp_path, stages):
    papermill = pytest.importorskip("papermill")
    kw = {} if stages is None else {"stages": stages}
    run = make_synthetic_run(tmp_path / "run", **kw)
    out = run / "notebooks" / "06_writeup.ipynb"
    out.parent.mkdir()
    papermill.execute_notebook(str(NOTEBOOKS_DIR / "06_writeup.ipynb"), str(out),
                               parameters={"params_file": str(REPO_ROOT / "params" / "cpu-demo.yaml"),
                                           "run_dir": str(run)},
                               kernel_name="python3", cwd=str(NOTEBOOKS_DIR), progress_bar=False)
    assert out.stat().st_size < 2_000_000
    nb = nbformat.read(out, as_version=4)
    md = [o["data"]["text/markdown"] for c in nb.cells if c.cell_type == "code"
          for o in c.get("outputs", []) if "text/markdown" in o.get("data", {})]
    assert md and "## 6. Verdict" in md[0]
    # the executed notebook lives in <run>/notebooks/, so figure links climb one level
    assert "](../figures/step_category_shares.png)" in md[0]
    assert (run / "06_writeup" / "report.html").is_file()
    widgets = [o for c in nb.cells for o in c.get("outputs", [])
               if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert len(widgets) == 1
