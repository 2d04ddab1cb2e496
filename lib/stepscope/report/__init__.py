"""Stage 06: the report, its figures, and run comparison.

Public functions (what the CLI, the runner and notebook 06 call):

- `build_report(run_dir, writeup=None) -> dict[str, Path]`
  Reads only the run folder and writes `06_writeup/report.md` (figure links
  `../figures/<name>.png`, markdown tables) and `06_writeup/report.html` (one file: images as
  base64 data URIs, CSS inline, no script, nothing fetched). Returns {"markdown", "html",
  "figures", "figure_<key>"...}. Any missing artifact turns its section into a visible
  "⚠ Not measured" box; the rest still renders.
- `compare_runs(run_a, run_b, out_dir=None) -> dict` writes compare.md / compare.html /
  compare_*.csv (default folder `<run_b>/06_writeup/compare_vs_<run_a>/`).
- `step_explorer(run_dir, extra_rules=())` returns an ipywidgets explorer (rank, step,
  category -> table + timeline); its first render reads saved artifacts only.
- `report_markdown_for_notebook(md_path, run_dir)` rewrites figure links for display in a notebook.
- `stepscope.report.findings.verdict(run_dir) -> Findings`: the verdict as tables before it is
  rendered (notebook 06): shown, the findings one per sentence; `get_findings()`,
  `get_levers()`, `get_guards()`, `get_finding(name)`; `with_thresholds(NAME=value)` judges
  again with other thresholds and `changed(other)` lists what it would say differently. Not
  exported here by that name: `stepscope.report.verdict` is the findings' module.

How the report thinks (docs/verdict.md): `report.verdict.verdict(...)` returns typed findings
(trace identity, step basis, dominant category, communication, transfer vs waiting, host or
device, levers with Amdahl ceilings on the period, micro-vs-trace agreement, roofline,
plateau); `report.prose` writes them as sentences and computes nothing;
`report.whatif.predict_spec_decode_tpot` is the speculative-decoding model (pure, explicit
inputs); `wording.fmt_num` is the one number formatter.

Figures written to `<run>/figures/`, each drawn by the one function its stage uses (category
figures: `stepscope.trace.plots`, colours from `stepscope.palette`; sweep: `stepscope.sweep.plots`;
roofline: `stepscope.micro.gemm.plot_roofline`; collectives:
`stepscope.micro.collectives.plot_latency_vs_size`): step_category_ms_stacked.png,
step_category_shares.png, step_amdahl_ceiling_by_category.png,
whatif_speculative_decoding_tpot.png; and, only when the stage did not save its own plot,
step_timeline_rank0_by_lane.png, writeup_throughput_vs_concurrency.png,
writeup_latency_vs_concurrency.png, writeup_gemm_roofline.png,
writeup_collective_latency_vs_size.png. Stage plots are picked up by name: sweep_*.png,
gemm_roofline*.png, collective_*.png, 05_step_timeline*.png, 05_step_categories*.png,
05_cross_rank*.png.

Artifacts read (every one optional), each through its `stepscope.schema` type (one spelling
per key; a file off its schema is named under Caveats, never guessed at): run.json,
params.yaml, 00_deploy/server.json, 01_macro_sweep/{levels.csv, summary.json},
02_gemm_micro/{gemm.csv, prediction.json}, 03_nccl_burst/{collectives.csv, burst.csv,
prediction.json}, 04_profiler_capture/{manifest.json, capture_latency.json},
05_categorize/{summary.json, decode_categories.csv, amdahl.csv, steps.csv, cross_rank.csv,
timeline_rank0_step.csv}. The report's own tables name stage 05's per-step busy time
(`union_ms_*`) "ms per step" and recompute shares and Amdahl ceilings on its step basis
(`report.analysis`).
"""

from stepscope.report.build import build_report, report_markdown_for_notebook
from stepscope.report.compare import compare_runs
from stepscope.report.explorer import step_explorer
from stepscope.report.findings import Findings

__all__ = ["Findings", "build_report", "compare_runs", "report_markdown_for_notebook",
           "step_explorer"]
