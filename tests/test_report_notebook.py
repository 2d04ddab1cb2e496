"""Notebook 06 under papermill, the way the runner runs it: it must not fail nor bloat."""

from __future__ import annotations

import nbformat
import pytest

from stepscope.execute import with_kernel
from stepscope.paths import REPO_ROOT
from stepscope.stages import STAGE_BY_ID
from stepscope.testing.synthetic import make_synthetic_run

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("stages", [None, ("05_categorize",)], ids=["full", "only-05"])
def test_notebook_06_runs_under_papermill_and_stays_small(tmp_path, stages):
    pytest.importorskip("papermill")
    kw = {} if stages is None else {"stages": stages}
    run = make_synthetic_run(tmp_path / "run", **kw)
    # The runner's own executor: its kernel runs in batch (runfolder.BATCH_RUN_ENV) under the
    # stage's cell timeout. Building the explorer's widget under papermill hung this test in
    # CI at times (the kernel idle, nbclient waiting for a reply), as it once hung a run;
    # the widget itself is tested in-process (test_report_figures).
    out = with_kernel(STAGE_BY_ID["06_writeup"], REPO_ROOT / "params" / "cpu-demo.yaml", run, progress=False)
    assert out == run / "notebooks" / "06_writeup.ipynb"
    assert out.stat().st_size < 2_000_000
    nb = nbformat.read(out, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    md = [o["data"]["text/markdown"] for o in outputs if "text/markdown" in o.get("data", {})]
    assert md and "## 6. Verdict" in md[0]
    # the executed notebook lives in <run>/notebooks/, so figure links climb one level
    assert "](../figures/step_category_shares.png)" in md[0]
    assert (run / "06_writeup" / "report.html").is_file()
    assert not [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    notes = [o["data"]["text/html"] for o in outputs if "Step explorer:" in o.get("data", {}).get("text/html", "")]
    assert len(notes) == 1 and "not built in this batch run" in notes[0]
    assert f"stepscope lab {run}" in notes[0]
