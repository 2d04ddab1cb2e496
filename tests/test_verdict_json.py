"""`06_writeup/verdict.json` on the real traces in tests/data/traces: the headline a person
reads in ten seconds (at most three sentences, about 60 words, each from one finding), and
the CLI's closing lines read from it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest

from stepscope import runner, schema
from stepscope.report import build_report, prose
from stepscope.report.artifacts import load_run_artifacts
from stepscope.report.build import report_context, writeup_params_from
from stepscope.wording import fmt_num
from stepscope.report.verdict import headline_findings
from stepscope.testing.synthetic import make_synthetic_run

HEADLINE_WORDS = 60
REAL = {  # trace files, and the caveat the headline must say (None: none applies)
    "vllm-cpu-tp2": (["vllm-cpu-tinyllama-tp2-rank0.pt.trace.json.gz", "vllm-cpu-tinyllama-tp2-rank1.pt.trace.json.gz"],
                     None),
    "vllm-cpu-tp1": (["vllm-cpu-tinyllama-tp1-nostack-rank0.pt.trace.json.gz"], None),
    "vllm-mi300x-gptoss": (["vllm-mi300x-gptoss-decode-fullgraph.json.gz"], "low_confidence"),
    "sglang-mi300x": (["sglang-mi300x-qwen3-8b-decode.json.gz"], "claims_withdrawn"),  # its one step is 97.8 % host stall: the gap lever is withdrawn, and that outranks one step
    "hf-h100-eager": (["hf-h100-qwen1.5-0.5b-eager.json.gz"], "not_decode"),
    "a100-ddp": (["hta-a100-ddp-nccl.json.gz"], "not_decode"),
}


def _run(tmp_path: Path, files: list[str], real_traces: Path) -> Path:
    from stepscope.trace import analyze_traces

    run = tmp_path / "run"
    analyze_traces([real_traces / f for f in files], run / "05_categorize", progress=False, perfetto=False)
    return run


def _in_short(md: str) -> str:
    return re.search(r"^> \*\*In short:\*\* (.*)$", md, re.M).group(1)


@pytest.mark.parametrize("name", sorted(REAL))
def test_the_headline_is_three_sentences_from_three_findings(tmp_path, real_traces, name):
    files, caveat = REAL[name]
    run = _run(tmp_path, files, real_traces)
    paths = build_report(run, draw_figures=False)
    record = schema.read(paths["verdict"], schema.VerdictFile)
    a = load_run_artifacts(run)
    v = report_context(a, writeup_params_from(a)).verdict
    h = headline_findings(v)
    text = " ".join(s.text for s in record.headline)
    assert text == _in_short(paths["markdown"].read_text())  # the report and the file say the same
    assert len(record.headline) <= 3 and len(text.split()) <= HEADLINE_WORDS, text
    # Each sentence from its finding, in order: the dominant cost, the biggest lever, one caveat.
    dominant, lever, *rest = record.headline
    assert dominant.finding == "dominant" and dominant.text.startswith(h.dominant.category + " takes the most time")
    assert record.dominant.category == h.dominant.category == v.dominant.category
    assert lever.finding in ("lever", "between_steps", "gap_lever")
    assert f"at most {fmt_num(v.biggest.ceiling_x)}× faster" in lever.text
    assert record.biggest == v.biggest and record.biggest.ceiling_x > 1
    assert [s.finding for s in rest] == ([f"caveat:{caveat}"] if caveat else [])
    # verdict.json is the verdict itself: every finding, every caveat, read back equal
    assert msgspec.structs.replace(record, headline=(), sentences=()) == schema.VerdictFile(**msgspec.structs.asdict(v))
    assert (headline_findings(record).caveat.code if headline_findings(record).caveat else None) == caveat
    if caveat:
        assert record.caveats[0].code == caveat and rest[0].text.startswith("Caveat: ")
    # The detail stays in the verdict section, which verdict.json carries whole.
    assert [s.text for s in record.sentences] == [t for _, t in prose.sentences(v)]
    assert record.identity.ranks_present == (len(a.ranks) or None)


def test_the_cli_closing_lines_are_the_verdict_headline(tmp_path, real_traces):
    run = _run(tmp_path, REAL["vllm-mi300x-gptoss"][0], real_traces)
    build_report(run, draw_figures=False)
    printed = runner.verdict_headline(run)
    record = json.loads((run / "06_writeup" / "verdict.json").read_text())
    assert printed.startswith("in short: ") and all(len(ln) <= 100 for ln in printed.splitlines())
    assert " ".join(printed.split()) == " ".join(("in short: " + " ".join(s["text"] for s in record["headline"])).split())
    # the file, not the markdown: a report edited by hand does not change what the terminal says
    md = run / "06_writeup" / "report.md"
    md.write_text(md.read_text().replace("> **In short:** ", "> **In short:** edited. "))
    assert runner.verdict_headline(run) == printed
    assert runner.verdict_headline(tmp_path / "none") is None


def _summary(run: Path, analysed: int, not_analysed: list[dict]) -> None:
    """Stage 05's summary.json with `analysed` ranks and these flags (a synthetic run's 8, cut down)."""
    source = make_synthetic_run(run.parent / "synthetic", stages=("05_categorize",)) / "05_categorize" / "summary.json"
    s = schema.read(source, schema.TraceSummary)
    path = run / "05_categorize" / "summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    s = msgspec.structs.replace(s, ranks=s.ranks[:analysed],
                                flags=[msgspec.convert(f, schema.Flag) for f in not_analysed])
    schema.write(path, s, schema.TraceSummary)


def test_analyze_exit_codes_come_from_stage_05(tmp_path):
    run = tmp_path / "run"
    bad = {"code": "rank_unreadable", "severity": "error", "message": "rank1.json.gz: not gzip"}
    _summary(run, 1, [bad])
    # stage 06's verdict, which says otherwise, is not what the exit code reads
    schema.write(run / "06_writeup" / "verdict.json", {"identity": {"kind": "decode", "step_label": "decode step",
                                                                    "source": "trace_info", "ranks_present": 2},
                                                       "basis": {"denominator": None, "step_ms": None}},
                 schema.VerdictFile)
    lines: list[str] = []
    assert runner.report_unanalysed_ranks(run, 2, lines.append) == runner.EXIT_RANKS_MISSING
    assert lines == ["  not analysed: rank1.json.gz: not gzip",
                     "analysed 1 rank(s) of the 2 expected (--tp 2); 1 trace file(s) could not be analysed"]
    _summary(run, 2, [])
    assert runner.report_unanalysed_ranks(run, 2, lines.append) == 0
    _summary(run, 0, [bad])
    assert runner.report_unanalysed_ranks(run, None, lines.append) == runner.EXIT_NO_RANK


def test_without_stage_05s_summary_no_rank_was_analysed(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    schema.write(run / "run.json", {"run_id": "run", "stages": {"05_categorize": {"status": "failed",
                                                                                 "error": "no traces"}}},
                 schema.RunRecord)
    lines: list[str] = []
    assert runner.report_unanalysed_ranks(run, None, lines.append) == runner.EXIT_NO_RANK
    # stage 05's FAILED line printed "no traces" already (runner._run_stage): it is not repeated
    assert lines == ["no rank was analysed: stage 05_categorize failed (its error is above)"]
    _summary(run, 8, [])  # stage 05 ran and stage 06 wrote nothing: the ranks are still known
    lines.clear()
    assert runner.report_unanalysed_ranks(run, 8, lines.append) == 0 and lines == []


def test_a_lever_that_buys_little_and_a_host_stall_are_said_plainly(tmp_path, real_traces):
    """SGLang's decode step is 97.8 % one host stall: its gap levers are withdrawn and the
    largest category would make it 1.01x faster. The headline said "It is also the biggest
    lever ... 1.01x" and "the claims resting on steady_state are withdrawn" (an internal name);
    it now says no lever is worth naming, and what the stall is, from the guard's values."""
    run = _run(tmp_path, REAL["sglang-mi300x"][0], real_traces)
    record = schema.read(build_report(run, draw_figures=False)["verdict"], schema.VerdictFile)
    pairs = [(s.finding, s.text) for s in record.headline]
    assert pairs[1:] == [
        ("lever", "No lever is worth naming: the biggest, dense_gemm, would make a decode step at most 1.01× faster."),
        ("caveat:claims_withdrawn", "Caveat: the decode step is mostly one host stall (97.8 % in long gaps): remove "
                                    "it and profile again."),
    ]
    assert record.biggest.name == "dense_gemm" and record.biggest.ceiling_x < 1.05
    assert "steady_state" not in " ".join(t for _, t in pairs)


def test_a_gpu_jobs_host_only_trace_says_its_times_are_the_hosts(tmp_path, real_traces):
    """HTA's CPU-only export of a GPU training job: no device event, but six `nccl:all_to_all`
    ops. Its figures are host op times, which the headline said nothing about; that caveat now
    comes first. A CPU engine's trace (vLLM CPU), whose ops are the work, names no GPU library."""
    from stepscope.trace import analyze_traces

    run = _run(tmp_path, ["hta-cpu-only.json.gz"], real_traces)
    record = schema.read(build_report(run, draw_figures=False)["verdict"], schema.VerdictFile)
    assert (record.headline[-1].finding, record.headline[-1].text) == (
        "caveat:host_only", "Caveat: a GPU job's trace with no device activity (op `nccl:all_to_all` ×6): its times "
                            "are host ops, so no lever is given.")
    # Host gaps of a GPU job are mostly the host waiting on the device: they were offered as a
    # 1.85x lever before the guard withdrew every lever.
    assert record.biggest is None and [s.finding for s in record.headline] == ["dominant", "caveat:host_only"]
    guard = next(s.text for s in record.sentences if s.finding == "guard")
    assert guard.startswith("Withdrawn, the levers and their ceilings, boundness and communication: this is a GPU "
                            "job's trace (op `nccl:all_to_all` ×6) with no device activity")
    assert len(" ".join(s.text for s in record.headline).split()) <= HEADLINE_WORDS
    cpu = analyze_traces([real_traces / "vllm-cpu-tinyllama-tp1-nostack-rank0.pt.trace.json.gz"], tmp_path / "cpu",
                         progress=False, perfetto=False)
    assert cpu.summary.trace_info.host_only_of_gpu_job == []


def test_a_step_that_mostly_idles_says_so_beside_its_largest_category(tmp_path):
    """HTA's MI250 toy training step: its largest category, elementwise, is 0.486 % of the
    period and the device idles 98.4 % of it. "elementwise takes the most time" alone reads as
    if it did; the sentence now adds the idle share, and the 1.00x lever is no lever."""
    from stepscope.trace import analyze_traces

    corpus = Path(__file__).parent / "data" / "corpus"
    run = tmp_path / "run"
    analyze_traces([corpus / "hta-mi250-minitoy-training.json.gz"], run / "05_categorize", progress=False,
                   perfetto=False)
    record = schema.read(build_report(run, draw_figures=False)["verdict"], schema.VerdictFile)
    assert [(s.finding, s.text) for s in record.headline][:2] == [
        ("dominant", "elementwise takes the most time: 0.0453 ms per training step, 0.486 % of its period; the "
                     "device idles 98.4 %."),
        ("lever", "No lever is worth naming: the biggest, elementwise, would make a training step at most 1.00× "
                  "faster."),
    ]


def test_a_trace_with_no_work_is_refused_and_the_report_claims_nothing(tmp_path, real_traces):
    """HTA's CPU-only rank 34 of 300: gloo all-reduces on two helper threads, one ProfilerStep,
    and its four CPU ops after the step. Stage 05 failed with "unexpected IndexError ... a
    stepscope bug" (an empty work table), and the report's headline then read "this is an
    unknown trace, not decode", a claim of a trace nobody analysed."""
    from stepscope.cli import main
    from stepscope.runner import EXIT_NO_RANK

    out = tmp_path / "run"
    rc = main(["analyze", str(real_traces / "hta-cpu-ops-outside-step.json.gz"), "--out", str(out), "--no-progress"])
    assert rc == EXIT_NO_RANK
    status = json.loads((out / "run.json").read_text())["stages"]["05_categorize"]
    assert "no work to analyse: no device event, and none of its 4 CPU op(s) lies inside one of its 1 step(s)" \
        in json.dumps(status) and "stepscope bug" not in json.dumps(status)
    record = schema.read(out / "06_writeup" / "verdict.json", schema.VerdictFile)
    assert [(s.finding, s.text) for s in record.headline] == [
        ("caveat:not_analysed", "Caveat: no trace was analysed, so there is no verdict: the profiler breakdown says why.")]
    assert [s.finding for s in record.sentences] == ["trace_identity"]
    assert record.sentences[0].text.startswith("No trace was analysed")


def test_one_caveat_list_the_verdicts_own_first_each_typed_and_the_report_lists_them_all(tmp_path):
    """Two lists by two rules (the report's strings, the headline's typed caveats) are one: every
    caveat a record of its code, the finding or flag it rests on and the part of the run it is
    about; the headline says the first, the Caveats section every one, in the same order."""
    from stepscope.report.verdict import rests_on
    from stepscope.testing.report import section

    run = make_synthetic_run(tmp_path / "run")
    paths = build_report(run, draw_figures=False)
    v = schema.read(paths["verdict"], schema.VerdictFile)
    assert [(c.code, c.concerns, c.finding, c.subject) for c in v.caveats] == [
        ("prediction_disagrees", "micro", "agreements", "communication"), ("other_share", "trace", None, None),
        ("unattributed_events", "trace", None, None), ("trace_flag", "trace", None, "kernel_sum_above_tpot"),
        ("client_bound", "sweep", None, None)]
    assert rests_on(v, v.caveats[0]) == next(g for g in v.agreements if g.quantity == "communication")
    assert v.caveats[2].values == (("n_events", 12), ("ranks", ["0"]))
    assert headline_findings(v).caveat == v.caveats[0] and v.headline[-1].finding == "caveat:prediction_disagrees"
    listed = [ln[2:] for ln in section(paths["markdown"].read_text(), "Caveats").splitlines() if ln.startswith("- ")]
    assert listed == [prose.caveat_text(c, v) for c in v.caveats]
    assert listed[0] == "The micro-benchmarks predict 4.30 ms of communication per step, the trace shows 5.70 ms."
    assert listed[2] == "12 device events were not attributed to any step (ranks 0); they are left out of per-step figures."


def test_a_verdict_json_of_schema_version_2_still_compares(tmp_path, real_traces):
    """Before schema version 3 verdict.json was a digest of the verdict (kind, dominant cost,
    biggest lever, the headline's caveat, ranks): an older run folder's reads as the verdict it
    summarised, so `stepscope compare` sets it beside a run of this version."""
    from stepscope.report.compare import verdict_section
    from stepscope.report.deltas import verdict_changes, verdict_fields

    old = tmp_path / "old"
    (old / "06_writeup").mkdir(parents=True)
    (old / "run.json").write_text(json.dumps({"run_id": "old", "schema_version": 2, "stages": {}}))
    (old / "06_writeup" / "verdict.json").write_text(json.dumps({
        "kind": "decode", "step_label": "decode step",
        "headline": [{"finding": "dominant", "text": "dense_gemm takes the most time."},
                     {"finding": "caveat:low_confidence", "text": "Caveat: only 3 decode steps judged."}],
        "dominant": {"category": "dense_gemm", "ms_per_step": 2.5, "share_pct": 40.0, "step_ms": 6.25,
                     "denominator": "period", "n_steps": 3},
        "biggest_lever": {"name": "dense_gemm", "kind": "category", "ceiling_x": 1.67, "removable_ms": 2.5},
        "caveat": {"code": "low_confidence", "text": "Caveat: only 3 decode steps judged."},
        "ranks": {"analysed": 1, "not_analysed": []}, "sentences": []}))
    a = load_run_artifacts(old)
    assert a.problems == [] and a.verdict.identity.n_judged_steps == 3 and a.verdict.basis.step_ms == 6.25
    assert verdict_fields(a.verdict) == {"dominant": "dense_gemm", "dominant_share_pct": 40.0, "communication": None,
                                         "bound": None, "biggest_lever": "dense_gemm", "biggest_lever_x": 1.67,
                                         "caveat": "low_confidence"}
    new = _run(tmp_path, REAL["vllm-mi300x-gptoss"][0], real_traces)
    build_report(new, draw_figures=False)
    b = load_run_artifacts(new)
    assert [k for k, _, _ in verdict_changes(a.verdict, b.verdict)] == ["dominant", "biggest_lever"]
    said = verdict_section(a, b, "old", "new")
    assert "| caveat | low_confidence | low_confidence |" in said and "dominant: dense_gemm → " in said


def test_what_the_clients_latencies_measure_is_a_caveat_of_the_one_list(tmp_path):
    """Bunched chunks and stalled sweep levels were a third list, computed in the report's opening:
    they are caveats of the one list, after the verdict's own and before the artifacts' other
    flags; the opening says them and so does the Caveats section."""
    from stepscope.testing.report import section
    from stepscope.testing.synthetic import set_level_columns

    run = set_level_columns(make_synthetic_run(tmp_path / "run"), bunched_chunk_share=[0.9, 0.6, 0.1, 0.1],
                            stall_share=[0.0, 0.1, 0.6, 0.2])
    paths = build_report(run, draw_figures=False)
    v = schema.read(paths["verdict"], schema.VerdictFile)
    assert [c.code for c in v.caveats][:5] == ["prediction_disagrees", "plateau_stalls", "sweep_delivery", "sweep_stalls",
                                               "other_share"]
    assert v.caveats[2].values == (("n_levels", 2), ("of_levels", 4), ("max_share", 0.9))
    assert v.caveats[3].values == (("stall_share", 0.6), ("concurrency", 4))
    said = "Server-wide stalls took up to 60 % of a sweep level's time (concurrency 4)"
    md = paths["markdown"].read_text()
    assert f"- {said}" in md.split("## 1. Setup", 1)[0] and f"- {said}" in section(md, "Caveats")
