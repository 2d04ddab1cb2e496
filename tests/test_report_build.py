"""The writeup from synthetic run folders: numbers, missing-stage boxes, verdict, self-contained HTML."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from stepscope.report import build_report
from stepscope.testing.synthetic import make_synthetic_run
from stepscope.report.markdown_util import MISSING_MARK
from stepscope.wording import fmt_num
from stepscope.testing.report import PARAGRAPH_MAX_WORDS, REPORT_MAX_BYTES, paragraphs, section

# The synthetic run's exposed ms per decode step (see stepscope/testing/synthetic.py), re-stated here so a
# change there cannot silently change what the test expects.
EXPOSED = {"all_reduce": 5.0, "all_gather": 0.2, "quant_gemm": 4.0, "fused_moe": 1.0,
           "attention": 1.2, "norm": 0.4, "elementwise": 0.3, "other": 0.01}
SPAN = sum(EXPOSED.values()) * 1.05
PERIOD = SPAN * 1.04
"""Shares and Amdahl ceilings divide by the period (step start to next step start)."""


def _report(tmp_path, name="run", **kw) -> tuple[str, str, dict]:
    """Text-only report (figures take seconds to draw; `full` below draws them once)."""
    run = make_synthetic_run(tmp_path / name, **kw)
    paths = build_report(run, draw_figures=False)
    return paths["markdown"].read_text(), paths["html"].read_text(), paths


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> tuple[str, str, dict]:
    run = make_synthetic_run(tmp_path_factory.mktemp("full") / "run")
    paths = build_report(run)
    return paths["markdown"].read_text(), paths["html"].read_text(), paths


def test_full_report_shows_measured_numbers(full):
    md, _, paths = full
    assert MISSING_MARK not in md
    # macro: knee, plateau, c=1 TPOT/TTFT
    assert "from concurrency 4" in md and "300 output tok/s" in md  # prose.plateau_sentence, unbolded since 2026-12-01
    assert "median TPOT is **13.3 ms**" in md and "median TTFT **28.0 ms**" in md
    # micro: the GEMM pivot the prediction reads (settings said once above it) is the appendix's, linked by
    # its anchor (issue 37); the burst with count, total, per-op and mode stays
    appendix = paths["appendix_markdown"].read_text()
    used = appendix.split("### GEMM timings the prediction reads (stage 02)", 1)[1].split("###", 1)[0]
    assert "*synthetic-moe* (dtype: w4a16; backend: marlin; mode: cold):" in used
    assert "| experts.down | 7,168 | 256 | 11 | 12 | 14 | 18 |" in used
    assert "| experts.down |" not in md and "](appendix.md#gemm-timings-the-prediction-reads-stage-02)" in md
    assert "*In every row: batch M: 1; bytes: 14,336; ranks: 8; status: ok.*" in md
    assert "| 123 | cuda_graph | nccl | 4,300 | 35.0 | 35.0 |" in md
    assert "no CUDA on this machine" in md
    # breakdown: all_reduce 5.5 ms of a period of 12.11 * 1.05 * 1.04 ms
    assert "| all_reduce | communication | 5.50 |" in md
    assert f"| {fmt_num(100 * 5.5 / PERIOD)} |" in md
    # the step read several ways: the table is the appendix's, its reconciliation stays in the report
    assert f"| period (start of one step to the start of the next) | {fmt_num(PERIOD)} |" in appendix
    assert "| span (first to last device event of the step) | 12.7 |" in appendix
    assert "| TPOT measured by the client during capture | 12.1 |" in appendix
    assert "| TPOT measured by the client during capture |" not in md and "](appendix.md#step-readings-stage-05)" in md
    # cross-checks: collectives and micro-vs-trace ratio (5.7 ms traced / 4.3 ms predicted)
    assert "| all_reduce | 123 | 123 | yes |" in md
    assert f"| {fmt_num(5.7 / 4.3)} | no |" in md
    # every figure exists and is linked relatively
    figs = [p for k, p in paths.items() if k.startswith("figure_")]
    assert len(figs) == 9 and all(p.stat().st_size > 5000 for p in figs)
    for p in figs:
        assert f"](../figures/{p.name})" in md


def test_amdahl_ceiling_for_every_category(full):
    md, _, _ = full
    verdict = section(md, "Verdict")
    assert "| lever | removable ms/step | decode step at most × faster |" in verdict
    small = []
    for cat, exp in EXPOSED.items():
        x = PERIOD / (PERIOD - exp)
        if x >= 1.01:
            assert f"| {cat} | {fmt_num(exp)} | {fmt_num(x)} |" in verdict
        else:
            small.append(cat)
    assert small == ["other"] and "Under 1.01× each: other (every category is in the figure)." in verdict
    assert "**Dominant category: all_reduce**" in md


def test_amdahl_ceiling_is_read_from_stage_05_never_recomputed(tmp_path):
    run = make_synthetic_run(tmp_path / "run")
    p = run / "05_categorize" / "amdahl.csv"
    amd = pd.read_csv(p)
    # stage 05 owns the ceilings: the report says what amdahl.csv says, not a number of its own
    amd.loc[amd["category"] == "all_reduce", "speedup_ceiling"] = 9.5
    amd.to_csv(p, index=False)
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    assert "| all_reduce | 5.00 | 9.50 |" in md
    assert f"| all_reduce | 5.00 | {fmt_num(PERIOD / (PERIOD - 5.0))} |" not in md


def test_an_artifact_off_its_schema_is_named_not_guessed(tmp_path):
    run = make_synthetic_run(tmp_path / "run")
    p = run / "05_categorize" / "amdahl.csv"
    pd.read_csv(p).drop(columns=["speedup_ceiling"]).to_csv(p, index=False)
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    assert "Unreadable artifact: 05_categorize/amdahl.csv: missing column(s) speedup_ceiling of AmdahlRow" in md


def test_params_that_do_not_parse_are_not_shown_raw(tmp_path):
    run = make_synthetic_run(tmp_path / "run")
    (run / "params.yaml").write_text("server: {api_key: sk-SECRET-123\n  bad: [\n")
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    assert "sk-SECRET-123" not in md
    assert "Unreadable artifact: params.yaml: not valid YAML (line 2: expected ',' or '}', but got ':')" in md



def test_missing_stages_render_as_not_measured_boxes(tmp_path):
    md, html, _ = _report(tmp_path, stages=("05_categorize",))
    for what in ("The load sweep", "GEMM timings", "Collective timings"):
        assert f"> **{MISSING_MARK}:** {what}." in md
    assert "Stage 01_macro_sweep (macro sweep) was not measured (no artifacts)." in md
    assert "Stage 02_gemm_micro (GEMM micro-benchmark) was not measured (no artifacts)." in md
    # the measured part still renders
    assert "**Dominant category: all_reduce**" in md
    assert html.count('<blockquote class="missing">') == md.count(f"**{MISSING_MARK}:**") >= 4


def test_empty_run_folder_still_renders(tmp_path):
    (tmp_path / "empty").mkdir()
    paths = build_report(tmp_path / "empty", draw_figures=False)
    md = paths["markdown"].read_text()
    assert md.count(MISSING_MARK) >= 8
    assert "## 8. Caveats" in md and "Stage 05_categorize (trace categorization) was not measured" in md


def test_unreadable_artifact_becomes_a_caveat(tmp_path):
    run = make_synthetic_run(tmp_path / "run")
    (run / "05_categorize" / "summary.json").write_text("{not json")
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    assert "Unreadable artifact: 05_categorize/summary.json: not readable as JSON" in md
    # the per-category table comes from the CSV, so it still renders
    assert "| all_reduce | communication | 5.50 |" in md


def test_single_gpu_trace_without_architecture_renders_its_crosscheck(tmp_path):
    # `stepscope analyze` on one TP=1 trace with no config.json: nothing expected, none seen.
    run = make_synthetic_run(tmp_path / "run")
    p = run / "05_categorize" / "summary.json"
    s = json.loads(p.read_text())
    s["collectives_check"] = {
        "observed": {"steps_used": "all steps", "n_steps": 1,
                     "all_reduce": {"median": 0.0, "min": 0, "max": 0},
                     "all_gather": {"median": 0.0, "min": 0, "max": 0}},
        "expected": None, "match": None, "rank": 0, "tp": 1,
        "explanation": ["no expectation: no architecture given"]}
    p.write_text(json.dumps(s))
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    section = md.split("### Collectives per decode step", 1)[1].split("###", 1)[0]
    assert "Counted on rank 0 over 1 decode step, TP=1:\n\nNo collective ran in these steps." in section
    assert "No expectation: no architecture given" in section


def _verdict(md: str) -> str:
    """The verdict's findings, one bullet each, joined."""
    return " ".join(ln[2:] for ln in section(md, "Verdict").splitlines() if ln.startswith("- "))


def test_verdict_follows_the_data(tmp_path):
    md_a, _, _ = _report(tmp_path, "a", comm_exposed=True, launch_bound=False)
    md_b, _, _ = _report(tmp_path, "b", comm_exposed=False, launch_bound=True)
    va, vb = _verdict(md_a), _verdict(md_b)
    assert "Communication is exposed" in va and "mostly hidden" not in va
    assert "Communication is mostly hidden under compute" in vb
    assert "bound by the work itself" in va
    assert "the step is host-bound" in vb and "CUDA graphs" in vb
    # launch-bound run: the period is 3 x 1.04 x the busy time, so the device idles 68 % of it
    assert f"idles {fmt_num(100 * (1 - 1 / 3.12))} % of each step" in vb
    assert va != vb


def test_html_is_self_contained(full):
    _, html, paths = full
    assert "<script" not in html.lower()
    assert not re.search(r"<link\b", html, re.I)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I)
    assert not re.search(r"url\(\s*['\"]?(https?:)?//", html, re.I)
    imgs = re.findall(r'<img[^>]*src="([^"]*)"', html)
    assert len(imgs) == len([k for k in paths if k.startswith("figure_")])
    assert all(s.startswith("data:image/png;base64,") for s in imgs)
    assert "<table>" in html and "<style>" in html


def test_markdown_has_no_raw_html_tables(full):
    md, _, _ = full
    assert "<table" not in md and "<img" not in md
    assert md.count("\n|---") >= 10


def test_secrets_never_reach_the_report(tmp_path):
    run = make_synthetic_run(tmp_path / "run")
    p = run / "params.yaml"
    p.write_text(p.read_text() + "secrets:\n  hf_token: hf_SECRET123\n")
    rj = json.loads((run / "run.json").read_text())
    rj["argv"] += ["--api-key", "sk-SECRET456"]
    (run / "run.json").write_text(json.dumps(rj))
    paths = build_report(run, draw_figures=False)
    for f in (paths["markdown"], paths["html"], paths["appendix_markdown"], paths["appendix_html"]):
        text = f.read_text()
        assert "hf_SECRET123" not in text and "sk-SECRET456" not in text
    for f in (paths["appendix_markdown"], paths["appendix_html"]):  # the params and argv live there
        assert "***redacted***" in f.read_text()


def test_whatif_section_uses_params(full):
    md, _, paths = full
    assert "acceptance lengths [1.5, 2.0, 3.0] and draft costs [0.1, 0.2]" in md
    # acceptance 3: k = 3 drafted tokens, M = 4, batch 1 from the trace (the same in every row: said once)
    # the figure draws the projection: its table is the appendix's (issue 37), linked by its anchor
    whatif = section(md, "What-if")
    assert "| 3.00 |" not in whatif and "](appendix.md#the-what-if-at-the-measured-batch)" in whatif
    table = paths["appendix_markdown"].read_text().split("### The what-if at the measured batch", 1)[1].split("###")[0]
    assert table.count("\n| 3.00 | 3 | 4 |") == 2 and "*In every row: batch: 1;" in table


@pytest.mark.parametrize("v,s", [(None, "–"), (float("nan"), "–"), (12.1, "12.1"), (0.0123456, "0.0123"),
                                 (1536.4, "1,536"), (123.0, "123"), (28.0, "28.0"), (5, "5"), (float("inf"), "∞")])
def test_fmt_num(v, s):
    assert fmt_num(v) == s


def test_period_and_capture_tpot_are_set_side_by_side(tmp_path):
    run = make_synthetic_run(tmp_path / "agree")
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    assert f"The period ({fmt_num(PERIOD)} ms) and the TPOT the client measured during capture (12.1 ms) agree" in md
    p = run / "05_categorize" / "summary.json"
    s = json.loads(p.read_text())
    s["decode"]["steps"]["tpot_capture_ms"] = 8.0   # stage 05 copies the capture's mean TPOT here
    p.write_text(json.dumps(s))
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    assert f"**The period ({fmt_num(PERIOD)} ms) and the client's TPOT (8.00 ms) disagree** by" in md


@pytest.mark.parametrize("trace_files, stacked_drawn", [
    (["sglang-mi300x-qwen3-8b-decode.json.gz"], False),  # one rank, one step: stage 05's bar is the mean
    (["vllm-cpu-tinyllama-tp2-rank0.pt.trace.json.gz", "vllm-cpu-tinyllama-tp2-rank1.pt.trace.json.gz"], True)])
def test_the_report_does_not_redraw_stage_05s_single_step_bar(tmp_path, real_traces, trace_files, stacked_drawn):
    from stepscope.runfolder import save_figures
    from stepscope.trace import analyze_traces
    from stepscope.trace.plots import stage_figures

    run = tmp_path / "run"
    an = analyze_traces([real_traces / f for f in trace_files], run / "05_categorize", progress=False,
                        perfetto=False)
    save_figures(stage_figures(an), run)
    md = build_report(run)["markdown"].read_text()
    drawn = {p.name for p in (run / "figures").glob("*.png")}
    assert ("step_category_ms_stacked.png" in drawn) is stacked_drawn
    assert ("step_category_ms_stacked.png" in md) is stacked_drawn
    assert "05_step_categories_rank0.png" in md  # the stage's per-step figure is embedded either way


def test_setup_states_the_weight_format_the_kernels_name(tmp_path, real_traces):
    # gpt-oss on MI300X: params (stepscope analyze) say nothing, the MoE kernels say MXFP4.
    # Before: "| Quantization | – |", the params' default shown as if it were a reading.
    from stepscope.report.build import quantization_cell
    from stepscope.trace import analyze_traces

    run = tmp_path / "run"
    analyze_traces([real_traces / "vllm-mi300x-gptoss-decode-fullgraph.json.gz"], run / "05_categorize",
                   progress=False, perfetto=False)
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    row = next(ln for ln in md.splitlines() if ln.startswith("| Quantization |"))
    assert row == ("| Quantization | mxfp4 named by 2 GEMM kernels (7.03 ms per step, e.g. "
                   "`_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1`); params do not say (`model.quantization`: "
                   "unset) |")
    named = [{"format": "w4a16", "n_kernels": 1, "ms_per_step": 2.0, "example_kernel": "fused_marlin_moe"}]
    assert quantization_cell("int4", named).startswith("int4 (params); the trace: w4a16 named by 1 GEMM kernel")
    assert quantization_cell("int4", []) == "int4 (params; no GEMM kernel's name states a format)"
    assert quantization_cell("none", []) == ("not stated: params do not say and no GEMM kernel's name "
                                             "states a format")


@pytest.mark.parametrize("trace, tpot_row", [
    ("vllm-mi300x-gptoss-decode-fullgraph.json.gz", True),   # decode, no capture: "–" says nothing measured it
    ("hf-h100-qwen1.5-0.5b-eager.json.gz", False)])          # a prefill pass has no tokens per step to time
def test_the_tpot_reading_is_listed_for_decode_traces_only(tmp_path, real_traces, trace, tpot_row):
    from stepscope.trace import analyze_traces

    run = tmp_path / "run"
    analyze_traces([real_traces / trace], run / "05_categorize", progress=False, perfetto=False)
    appendix = build_report(run, draw_figures=False)["appendix_markdown"].read_text()  # the step readings' table
    assert ("| TPOT measured by the client during capture | – |" in appendix) is tpot_row
    assert "| span (first to last device event of the " in appendix


def test_a_trace_without_a_step_marker_is_reported_as_one_window(tmp_path, real_traces):
    # The MI210 kernel-only trace has no step marker: it once read "2.44 ms per step" of "1 step".
    from stepscope.trace import analyze_traces

    run = tmp_path / "run"
    analyze_traces([real_traces.parent / "corpus" / "tracelens-mi210-gpu-only.json.gz"], run / "05_categorize",
                   progress=False, perfetto=False)
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    assert "per step" not in md and "ms/step" not in md
    assert "| Trace | training (no step marker: read whole, as one window) |" in md
    assert "conv takes the most time: 2.44 ms in the window" in md
    assert "| category | ms in window mean |" in md and "*In every row: class: compute;" in md
    assert "### Collectives in the window" in md
    assert "step annotation (host-side" not in md  # a window has no step annotation to read
    assert ("This is a training trace (from the trace: kernel `batch_norm_backward_kernel` ×20" in md
            and "the whole trace was read as one window" in md)




def test_the_report_reads_in_a_minute(full):
    # Issue 37: the demo's report was 44 KB, its verdict one 522-word blockquote, its sections
    # numbered 1-4, then an unnumbered one, then 5-8, and half its lines the appendix.
    md, html, paths = full
    assert len(md.encode()) <= REPORT_MAX_BYTES
    longest = max(paragraphs(md), key=lambda p: len(p.split()))
    assert len(longest.split()) <= PARAGRAPH_MAX_WORDS, longest
    numbers = [int(n) for n in re.findall(r"^## (\d+)\. ", md, re.M)]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) == 8
    assert not re.search(r"^## (?!\d+\. )", md, re.M)  # every section numbered
    # the opening screen: In short, then the findings list under the verdict, then no appendix
    assert md.index("> **In short:**") < md.index("## 1. Setup")
    assert "## Appendix" not in md and "```yaml" not in md and "[appendix](appendix.md)" in md
    assert '<a href="appendix.html">appendix</a>' in html
    appendix = paths["appendix_markdown"].read_text()
    assert "## Params file" in appendix and "## Files in the run folder" in appendix and "## Command lines" in appendix
    assert "<pre>" in paths["appendix_html"].read_text()


def test_no_table_row_is_all_dashes(full):
    md, _, _ = full
    for line in md.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split("|")][1:]
            assert cells and any(c not in ("–", "") for c in cells), line


def test_what_to_try_names_the_setting_that_moves_the_biggest_lever(tmp_path):
    # A launch-bound step whose biggest lever is the short gaps, served eager: the change to try
    # is the params key that turns CUDA graphs on, said right after the headline.
    import yaml

    from stepscope.report.try_next import server_settings

    run = make_synthetic_run(tmp_path / "run", launch_bound=True)
    p = run / "params.yaml"
    params = yaml.safe_load(p.read_text())
    params["server"]["enforce_eager"] = True
    p.write_text(yaml.safe_dump(params))
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    assert "The biggest lever is the short gaps between kernels" in md
    line = next(ln for ln in md.splitlines() if ln.startswith("**What to try first:**"))
    assert line.startswith("**What to try first:** CUDA graphs are off (`server.enforce_eager: true`): try "
                           "`enforce_eager: false`. *Evidence:* the short gaps between ops take ")
    assert md.index("> **In short:**") < md.index(line) < md.index("## 1. Setup")
    # an attached server's flags and an analyze run's defaults describe no server stepscope launched
    assert server_settings({"server": {"mode": "attach", "enforce_eager": True}}).enforce_eager is None
    assert server_settings({"analysis": {"trace_paths": ["x"]}, "server": {"enforce_eager": False}}).enforce_eager is None


def test_on_a_cpu_trace_what_to_try_names_torch_compile_not_cuda_graphs(tmp_path):
    # vLLM's CPU backend has no CUDA graphs: enforce_eager: false compiles the model instead.
    import yaml

    from stepscope.report.artifacts import load_run_artifacts
    from stepscope.report.build import report_context, writeup_params_from
    from stepscope.report.try_next import try_next

    run = make_synthetic_run(tmp_path / "run", launch_bound=True)
    params = yaml.safe_load((run / "params.yaml").read_text())
    params["server"]["enforce_eager"] = True
    a = load_run_artifacts(run)
    v = report_context(a, writeup_params_from(a)).verdict
    cpu = try_next(v, params, cpu=True).change
    assert cpu.startswith("the model runs op by op (`server.enforce_eager: true`): try `enforce_eager: false`, "
                          "which on vLLM's CPU backend compiles it with torch.compile")
    assert "CUDA graphs are off" not in cpu and try_next(v, params).change.startswith("CUDA graphs are off")


def test_an_analyze_report_says_it_covers_the_trace_only(tmp_path):
    run = make_synthetic_run(tmp_path / "run", stages=("05_categorize",))
    p = run / "params.yaml"
    p.write_text(p.read_text() + "analysis:\n  trace_paths: [/traces/rank0.json.gz]\n")
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    assert md.count("This report covers the trace only (`stepscope analyze`)") == 1
    for what in ("The load sweep", "GEMM timings", "Collective timings"):
        assert f"**{MISSING_MARK}:** {what}." not in md
    assert "Macro results" not in md and "## 2. Profiler breakdown" in md


def test_decision_caveats_come_first(tmp_path):
    from stepscope.testing.synthetic import set_level_columns

    run = set_level_columns(make_synthetic_run(tmp_path / "run"), bunched_chunk_share=[0.9, 0.6, 0.1, 0.1],
                            stall_share=[0.0, 0.1, 0.6, 0.2])
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    head = md.split("## 1. Setup", 1)[0]
    assert ("- At 2 of 4 sweep levels the TPOT and ITL measure delivery, not decode: up to 90 % of token "
            "chunks arrived together with the previous one") in head
    assert "- Server-wide stalls took up to 60 % of a sweep level's time (concurrency 4)" in head


def test_stage_01s_per_level_flags_are_one_caveat_naming_each_level():
    """Five "chunks bunched" lines said one thing five times: one line keeps each level and its share."""
    from stepscope.report.build import per_level_once

    tail = "of token chunks arrived together with the previous one: TPOT/ITL here measure delivery, not decode"
    items = ["[01] no knee", f"[01] level c0001: 92% {tail}", "[01] level c0001: client used 95 % of a core",
             f"[01] level c0004: 64% {tail}", "[05 info] other"]
    assert per_level_once(items) == ["[01] no knee", f"[01] levels c0001 (92%), c0004 (64%): that share {tail}",
                                     "[01] level c0001: client used 95 % of a core", "[05 info] other"]
    assert per_level_once(items[:2]) == items[:2]  # one level: as stage 01 wrote it


@pytest.mark.parametrize("observed, kept", [(123.0, False), (122.0, True)])
def test_why_a_collective_count_may_differ_is_said_only_when_one_does(tmp_path, observed, kept):
    # issue 37: the reasons a count could differ were printed under counts that all matched
    from stepscope.model.arch import Architecture
    from stepscope.model.shapes import explain_collectives

    arch = Architecture(name="tiny", family="llama", n_layers=61, n_dense_layers=61, hidden=256, vocab=2048, heads=4,
                        kv_heads=4, head_dim=64, intermediate=512)
    reasoning = explain_collectives(arch, 8)
    run = make_synthetic_run(tmp_path / "run")
    p = run / "05_categorize" / "summary.json"
    s = json.loads(p.read_text())
    s["collectives_check"]["expected"]["reasoning"] = reasoning
    s["collectives_check"]["observed"]["all_reduce"] = {"median": observed, "min": observed, "max": observed}
    p.write_text(json.dumps(s))
    crosschecks = section(build_report(run, draw_figures=False)["markdown"].read_text(), "Cross-checks")
    said = reasoning.split(" Observed counts can differ when")[0]
    assert f"Expected from the architecture: {said}" in crosschecks
    assert ("Observed counts can differ when: an all-reduce is fused with the next RMSNorm" in crosschecks) is kept


def test_stage_01s_flags_explained_alike_are_one_line_and_a_table_of_each_levels_numbers():
    """Six stall lines said one sentence six times (issue 37): the sentence once, naming the
    levels, and each level's numbers in a table after the list."""
    from stepscope.report.build import _section_caveats, per_level_table

    tail = ("every open stream was silent at once for over 0.5 s, so throughput here is low by up to that share; "
            "sweep.min_level_duration_s makes one stall weigh less")
    items = ["[01] no knee", f"[01] level c0001: 3 server-wide stall(s), 2.50 s in all (longest 1.10 s, 16% of the "
             f"level's 15.2 s): {tail}", "[01] level c0002: 3 of 9 requests failed",
             f"[01] level c0016: 5 server-wide stall(s), 6.31 s in all (longest 1.41 s, 41% of the level's 15.3 s): {tail}"]
    lines, tables = per_level_table(items)
    assert lines == ["[01] no knee", f"[01] levels c0001, c0016 (their numbers in the table below): {tail}",
                     "[01] level c0002: 3 of 9 requests failed"]
    assert tables == ["| level | [01] flag |\n|---|---|\n"
                      "| c0001 | 3 server-wide stall(s), 2.50 s in all (longest 1.10 s, 16% of the level's 15.2 s) |\n"
                      "| c0016 | 5 server-wide stall(s), 6.31 s in all (longest 1.41 s, 41% of the level's 15.3 s) |\n"]
    assert per_level_table(items[:2]) == (items[:2], [])  # one level: as stage 01 wrote it
    text = _section_caveats(items)
    assert text.index("- [01] level c0002") < text.index("| c0001 |") and text.count(tail) == 1


def test_checks_that_held_are_one_line_after_the_caveats_not_caveats():
    from stepscope.report.build import _section_caveats

    held = ["no kernel matched only a catch-all rule on any rank", "every device event was attributed to a step on every rank"]
    text = _section_caveats(["[01] a sweep flag"], held)
    assert text == ("## Caveats\n\n- [01] a sweep flag\n\nChecks that held: no kernel matched only a catch-all rule on "
                    "any rank; every device event was attributed to a step on every rank.\n")
    assert _section_caveats([], held).startswith("## Caveats\n\nNo data-quality flag was raised.\n\nChecks that held: ")
    assert _section_caveats([]) == "## Caveats\n\nNo data-quality flag was raised.\n"


def test_report_links_the_merged_perfetto_file_and_names_the_drawn_step(tmp_path):
    """Issue 38 item 6: the report links stage 05's merged Perfetto file (a link the HTML keeps)
    and names the step its timeline draws, the step the file's README points to."""
    from stepscope.report.build import build_report
    from stepscope.trace import analyze_traces

    data = Path(__file__).parent / "data" / "traces"
    run = tmp_path / "run"
    analyze_traces([data / f"vllm-cpu-tinyllama-tp2-rank{i}.pt.trace.json.gz" for i in (0, 1)],
                   run / "05_categorize", progress=False, perfetto=True)
    step = int(pd.read_csv(run / "05_categorize" / "timeline_rank0_step.csv")["step_id"].iloc[0])
    out = build_report(run, draw_figures=False)
    md = out["markdown"].read_text()
    assert ("open [ranks.merged.json.gz](../05_categorize/perfetto/ranks.merged.json.gz) (every rank" in md
            and f"is step {step} of rank 0; type `step {step} `" in md)
    assert f"Look at step {step} " in (run / "05_categorize" / "perfetto" / "README.md").read_text()
    assert '<a href="../05_categorize/perfetto/ranks.merged.json.gz">' in out["html"].read_text()
