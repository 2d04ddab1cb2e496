"""Stage 06: the report, its figures, and run comparison.

`build_report(run_dir)` reads only the run folder and writes 06_writeup/ (report, appendix,
verdict.json); a missing artifact turns its section into a "Not measured" box. `compare_runs`,
`step_explorer` and `report_markdown_for_notebook` serve the CLI and notebooks;
`report.findings.verdict(run_dir)` is the verdict as tables (notebook 06). How the report
judges: docs/verdict.md; what it reads: docs/artifacts.md.
"""

from stepscope.report.build import build_report, report_markdown_for_notebook
from stepscope.report.compare import compare_runs
from stepscope.report.explorer import step_explorer
from stepscope.report.findings import Findings

__all__ = ["Findings", "build_report", "compare_runs", "report_markdown_for_notebook",
           "step_explorer"]
