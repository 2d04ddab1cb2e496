"""The structured verdict: every printed number comes from a finding, and no sentence claims
what the data contradicts. Run folders with contrasting data (synthetic, with the stage-05
contract's keys) and real traces analysed by stage 05 in-process."""

from __future__ import annotations

import msgspec
import json
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from stepscope.testing.report import section
from stepscope.report import build_report
from stepscope.testing.synthetic import make_synthetic_run
from stepscope.report import prose
from stepscope.report.artifacts import load_run_artifacts
from stepscope.report.build import report_context, writeup_params_from
from stepscope.wording import NUMBER_RE, fmt_num
from stepscope.report.verdict import RooflineFinding
from stepscope.wording import short_name, short_names
from stepscope.thresholds import COMM_EXPOSED_SHARE, HOST_BOUND_MICRO_IDLE_SHARE, LOW_CONFIDENCE_STEPS

CASES = {
    "exposed-device-bound-plateau": dict(comm_exposed=True, launch_bound=False, plateau=True),
    "hidden-host-bound-no-plateau": dict(comm_exposed=False, launch_bound=True, plateau=False),
    "one-stall": dict(launch_bound=True, stall=True),
    "ranks-missing": dict(ranks_missing=True),
    "prefill": dict(kind="prefill"),
    "training": dict(kind="training", launch_bound=True),
    "older-summary": dict(contract_keys=False, launch_bound=True),
}


def _build(tmp_path: Path, name: str, **kw):
    run = make_synthetic_run(tmp_path / name, **kw)
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    a = load_run_artifacts(run)
    ctx = report_context(a, writeup_params_from(a))
    return run, md, ctx.verdict


def _quote(md: str, mark: str) -> str:
    if mark.startswith("Verdict"):  # the verdict is a list, one finding per bullet
        return " ".join(ln[2:] for ln in section(md, "Verdict").splitlines() if ln.startswith("- "))
    return re.search(rf"^> \*\*{re.escape(mark)}\*\* (.*)$", md, re.M).group(1)


def _printable(findings) -> set[str]:
    """Every numeric field of the findings, formatted as the report formats numbers."""
    out = set()
    for f in findings:
        for v in msgspec.structs.asdict(f).values():
            # a Guard's values are (name, value) pairs
            for x in ([p[1] for p in v if isinstance(p, tuple) and len(p) == 2] if isinstance(v, tuple) else [v]):
                if isinstance(x, (int, float)) and not isinstance(x, bool):
                    out.add(fmt_num(x))
    return out


def _numbers(sentence: str) -> list[str]:
    return NUMBER_RE.findall(re.sub(r"`[^`]*`", "", sentence))


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_number_in_headline_and_verdict_is_a_structured_value(tmp_path, case):
    _, md, v = _build(tmp_path, case, **CASES[case])
    pairs = prose.sentences(v)
    assert " ".join(s for _, s in pairs) == _quote(md, "Verdict.")
    head = prose.headline_sentences(v)
    assert " ".join(s for _, s in head) == _quote(md, "In short:")
    for src, sentence in pairs + head:
        allowed = _printable(src)
        stray = [n for n in _numbers(sentence) if n not in allowed]
        assert not stray, f"{sentence!r} prints {stray}, which no field of {type(src[0]).__name__} holds"
    assert len(pairs) >= 4


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_sentence_claims_what_the_data_contradicts(tmp_path, case):
    run, md, v = _build(tmp_path, case, **CASES[case])
    said = _quote(md, "Verdict.") + " " + _quote(md, "In short:")
    summary = json.loads((run / "05_categorize" / "summary.json").read_text())
    sweep = json.loads((run / "01_macro_sweep" / "summary.json").read_text())
    dec = pd.read_csv(run / "05_categorize" / "decode_categories.csv")
    dec = dec[dec["rank"] == 0]
    comm = dec[dec["class"] == "communication"]
    exposed_frac = comm["exposed_ms_mean"].sum() / comm["union_ms_mean"].sum()
    # the plateau: only where stage 01 found a knee
    knee = sweep["knee_concurrency"]
    assert ("the plateau is" in said) == (knee is not None)
    assert ("No plateau was reached" in said) == (knee is None)
    # Section 2 says the verdict's own plateau finding in the renderer's sentence (until 2026-12-01
    # build.py had a second wording of it, with its own arithmetic).
    assert prose.plateau_sentence(v.plateau) in md.split("## 2.", 1)[1].split("## 3.", 1)[0]
    # exposed communication only at or above the threshold
    assert ("Communication is exposed" in said) == (exposed_frac >= COMM_EXPOSED_SHARE)
    # host-bound only where short gaps carry it
    d = summary["decode"]
    if "host-bound" in said.replace("not a host-bound", "").replace("host-bound from", "").replace(
            "host-bound cannot be told", ""):
        assert d["idle_micro_ms"] / d["period_ms"]["mean"] >= HOST_BOUND_MICRO_IDLE_SHARE
    if d.get("largest_gap") and CASES[case].get("stall"):
        assert "a stall to remove, not a host-bound step" in said and "CUDA graphs" not in said
        assert "while the host was in `cudaMemcpyAsync`" in said
    # waiting and transfer: never with ranks missing, always apart otherwise
    cm = summary.get("collectives_matched")
    if cm and not cm["complete"]:
        assert "Ranks wait" not in said and "in transfer" not in said
        assert f"Only {len(cm['ranks_present'])} of {cm['world_size']} ranks' traces are here" in said
    # the kind of trace
    kind = (summary.get("trace_info") or {}).get("kind", "decode")
    if "idle_micro_ms" not in d and CASES[case].get("launch_bound"):
        assert "host-bound cannot be told from one stall" in said
    if kind != "decode":
        assert "decode step" not in said
        assert f"This is a {kind} trace" in said
        assert "Not projected: this is a" in md
    else:
        assert "decode step" in said


def test_verdicts_differ_where_the_data_does(tmp_path):
    _, _, a = _build(tmp_path, "a", **CASES["exposed-device-bound-plateau"])
    _, _, b = _build(tmp_path, "b", **CASES["hidden-host-bound-no-plateau"])
    _, _, c = _build(tmp_path, "c", **CASES["one-stall"])
    assert (a.communication.status, b.communication.status) == ("exposed", "hidden")
    assert (a.boundness.status, b.boundness.status, c.boundness.status) == ("device-bound", "host-bound", "stall")
    assert a.plateau.reached and not b.plateau.reached
    assert a.comm_split.status == "split" and a.comm_split.wait_ms == pytest.approx(0.4 * 5.5)


def test_shares_and_ceilings_use_the_period(tmp_path):
    run, md, v = _build(tmp_path, "p")
    period = json.loads((run / "05_categorize" / "summary.json").read_text())["decode"]["period_ms"]["mean"]
    assert v.basis.denominator == "period" and v.basis.step_ms == pytest.approx(period)
    top = v.levers[0]
    assert top.ceiling_x == pytest.approx(period / (period - top.exposed_ms))
    assert f"on the period of {fmt_num(period)} ms" in _quote(md, "Verdict.")


def test_falls_back_to_the_span_and_says_why(tmp_path):
    _, md, v = _build(tmp_path, "old", contract_keys=False)
    assert v.basis.denominator == "span"
    assert "the period is not used: stage 05 gave no step period" in md


def test_no_cuda_graphs_advice_for_a_step_that_replays_a_graph(tmp_path):
    run = make_synthetic_run(tmp_path / "g", launch_bound=True)
    p = run / "05_categorize" / "summary.json"
    s = json.loads(p.read_text())
    s["trace_info"]["graph_replay"] = True
    p.write_text(json.dumps(s))
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    v = _quote(md, "Verdict.")
    assert "the step is host-bound" in v and "already replays a graph" in v and "CUDA graphs" not in v


def test_one_long_gap_among_many_steps_is_not_the_steps_idle(tmp_path):
    # The longest gap is one step's; idle is a mean per step. A 'stall' needs the steps' long
    # gaps (mean macro idle) to hold the idle; the CPU demo once read "one gap holds 169 % of that idle".
    run = make_synthetic_run(tmp_path / "g", launch_bound=True)
    p = run / "05_categorize" / "summary.json"
    s = json.loads(p.read_text())
    dec = s["decode"]
    idle = dec["period_ms"]["mean"] - dec["steps"]["union_ms"]["mean"]
    dec.update(idle_micro_ms=0.1 * idle, idle_macro_ms=0.1 * idle)
    dec["largest_gap"]["dur_ms"] = 2.0 * idle
    p.write_text(json.dumps(s))
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    said = _quote(md, "Verdict.")
    assert "stall" not in said and "host-bound" not in said
    period, span = dec["period_ms"]["mean"], dec["steps"]["span_ms"]["mean"]
    assert (f"{fmt_num(100 * 0.1 * idle / period)} % in short gaps between kernels, "
            f"{fmt_num(100 * 0.1 * idle / period)} % in gaps of 1.00 ms or more, "
            f"{fmt_num(100 * (period - span) / period)} % between steps") in said
    for n in re.findall(r"([\d.]+) %", said):
        assert float(n) <= 100, said


def test_low_confidence_under_five_steps(tmp_path):
    run = make_synthetic_run(tmp_path / "few")
    p = run / "05_categorize" / "summary.json"
    s = json.loads(p.read_text())
    s["trace_info"].update(n_decode_steps=1, low_confidence=True)
    p.write_text(json.dumps(s))
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    assert (f"Low confidence: only 1 decode step judged, fewer than {LOW_CONFIDENCE_STEPS}"
            in _quote(md, "Verdict."))
    # the caveat that matters most, said in the headline in its short form
    assert f"Caveat: only 1 decode step judged, fewer than {LOW_CONFIDENCE_STEPS}" in _quote(md, "In short:")


# --------------------------------------------------------------------------- issue 10's report bugs


def test_no_plateau_claimed_without_a_knee(tmp_path):
    # The CPU demo's sweep: knee null and a "no knee" flag, throughput still doubling.
    _, md, v = _build(tmp_path, "np", plateau=False)
    macro = md.split("## 2.", 1)[1].split("## 3.", 1)[0]
    assert "plateau is" not in macro
    # (finding, sentence): the verdict's plateau, in the renderer's one sentence
    assert (v.plateau.reached, v.plateau.knee_gain_pct, v.plateau.best_concurrency) == (False, 10.0, 8)
    assert prose.plateau_sentence(v.plateau) in macro
    assert "so the sweep stopped short of saturation." in _quote(md, "Verdict.")


def test_no_plateau_read_from_stalled_levels_says_so(tmp_path):
    # As on the CPU demo of 2026-12-01 (run review1): no knee, and server-wide stalls took 7-57 % of
    # every level; throughput went 363 -> 1,128 tok/s from concurrency 4 to 8 (3.1x for a doubling),
    # the stalled level 4 reading low. The report said "still grew ... so the sweep stopped short
    # of saturation" with no word on the stalls.
    run = make_synthetic_run(tmp_path / "nst", plateau=False)
    levels = run / "01_macro_sweep" / "levels.csv"
    lv = pd.read_csv(levels)
    lv["stall_share"] = [0.0675, 0.364, 0.568, 0.35][:len(lv)]
    lv.to_csv(levels, index=False)
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    v = report_context(load_run_artifacts(run), writeup_params_from(load_run_artifacts(run))).verdict
    assert (v.plateau.reached, v.plateau.stall_pct, v.plateau.stall_concurrency) == (False, pytest.approx(56.8), 4)
    tail = ("but server-wide stalls (every stream silent at once) took up to 56.8 % of a level's time (at "
            "concurrency 4): each level is low by up to its own share, so the growth between levels may be the "
            "stalls', not the server's (longer levels, sweep.min_level_duration_s, make one stall weigh less)")
    assert f"(640 output tok/s), {tail}." in _quote(md, "Verdict.")
    assert f"{prose.plateau_sentence(v.plateau)}" in md.split("## 2.", 1)[1].split("## 3.", 1)[0]
    assert "stopped short of saturation" not in md


def test_plateau_read_from_stalled_levels_says_so(tmp_path):
    # As on the CPU demo (2026-12-01): server-wide stalls took 12-45 % of every level's time,
    # 35 % at the knee and 45 % beyond it, and the plateau was stated without a word on them.
    run = make_synthetic_run(tmp_path / "st")
    levels = run / "01_macro_sweep" / "levels.csv"
    lv = pd.read_csv(levels)
    lv["stall_share"] = [0.121, 0.181, 0.353, 0.448]
    lv["stall_count"] = [2, 3, 5, 7]
    lv["bunched_chunk_share"] = [0.21, 0.517, 0.137, 0.709]
    lv.to_csv(levels, index=False)
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    # Both readings stand in the sweep table, beside the numbers they qualify.
    assert "| client-bound? | chunks bunched % | stalled % of level |" in md
    assert re.search(r"^\| 8 \|.* \| 70\.9 \| 44\.8 \|$", md, re.M)
    v = report_context(load_run_artifacts(run), writeup_params_from(load_run_artifacts(run))).verdict
    assert (v.plateau.knee_concurrency, v.plateau.stall_pct, v.plateau.stall_concurrency) == (4, pytest.approx(44.8), 8)
    clause = ("but server-wide stalls (every stream silent at once) took up to 44.8 % of a level's time from the "
              "knee on (at concurrency 8), so it is low by up to that share")
    assert f"the plateau is 300 output tok/s, {clause}." in _quote(md, "Verdict.")
    assert prose.plateau_sentence(v.plateau) in md.split("## 2.", 1)[1].split("## 3.", 1)[0]
    # Stalls only below the knee, or within the noise, leave the plateau as stated.
    lv["stall_share"] = [0.4, 0.3, 0.04, 0.0]
    lv.to_csv(levels, index=False)
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    assert "the plateau is 300 output tok/s." in _quote(md, "Verdict.") and "server-wide stalls (every" not in md


def _analyze_style(run: Path, info: dict) -> None:
    """What `stepscope analyze` leaves: stage 05 only, params with defaults, the analysing machine in run.json."""
    for stage in ("00_deploy", "01_macro_sweep", "02_gemm_micro", "03_nccl_burst", "04_profiler_capture"):
        for f in sorted((run / stage).rglob("*"), reverse=True):
            f.unlink() if f.is_file() else f.rmdir()
        (run / stage).rmdir()
    (run / "params.yaml").write_text(yaml.safe_dump({"run": {"name": "analyze"},
                                                     "server": {"engine": "vllm", "tp": 1},
                                                     "capture": {"requests": 5, "output_len": 32}}))
    rj = json.loads((run / "run.json").read_text())
    rj["hardware"] = {"cpu": "AMD EPYC (the analysing machine)", "gpus": []}
    (run / "run.json").write_text(json.dumps(rj))
    p = run / "05_categorize" / "summary.json"
    s = json.loads(p.read_text())
    s["trace_info"].update(info)
    p.write_text(json.dumps(s))


def _setup(md: str) -> dict[str, str]:
    sec = md.split("## 1. Setup", 1)[1].split("## 2.", 1)[0]
    return dict(re.findall(r"^\| ([^|]+?) \| (.+?) \|$", sec, re.M))


def test_a_bunched_level_tpot_is_not_quoted_as_decode(tmp_path):
    # The CPU demo's concurrency-1 level: 92 % of chunks bunched, median TPOT 0 ms, once quoted in bold.
    run = make_synthetic_run(tmp_path / "b")
    p = run / "01_macro_sweep" / "levels.csv"
    lv = pd.read_csv(p)
    lv["bunched_chunk_share"] = [0.92 if c == 1 else 0.1 for c in lv["concurrency"]]
    lv.to_csv(p, index=False)
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    macro = md.split("## 2.", 1)[1].split("Per level", 1)[0]
    assert ("but 92 % of that level's token chunks arrived together with the previous one, so its TPOT "
            "measures delivery, not decode") in macro


def test_setup_comes_from_the_trace_not_the_analysing_machine(tmp_path):
    run = make_synthetic_run(tmp_path / "an")
    _analyze_style(run, {"engine": "sglang", "device_name": "AMD Instinct MI300X", "device_count": 1,
                         "batch_size": 32.0, "tp": 8, "tp_source": "trace", "world_size": 8})
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    rows = _setup(md)
    assert rows["Engine"] == "sglang"
    # as many devices as the world size (each worker's trace lists only the one it sees)
    assert rows["Device"] == "8 × AMD Instinct MI300X (from the trace, world size; its device list shows 1)"
    assert rows["Batch"].startswith("32 requests per step")
    assert rows["Tensor parallel (TP)"] == "8 (from the trace)"
    assert "CPU" not in rows and rows["Analysed on (CPU)"] == "AMD EPYC (the analysing machine)"
    assert "at batch 1" not in md.split("## 2.", 1)[0]


def test_tp_disagreement_is_shown(tmp_path):
    run = make_synthetic_run(tmp_path / "tp")
    _analyze_style(run, {"tp": 8, "tp_source": "trace", "tp_disagreement": True})
    rows = _setup(build_report(run, draw_figures=False)["markdown"].read_text())
    assert rows["Tensor parallel (TP)"].startswith("8 (from the trace) — **the trace's world size and the params")


def _real_run(tmp_path: Path, traces: list[Path]) -> Path:
    from stepscope.trace import analyze_traces

    run = tmp_path / "run"
    analyze_traces(traces, run / "05_categorize", progress=False, perfetto=False)
    return run


def test_training_trace_is_not_called_decode(tmp_path, real_traces):
    # A DDP training trace: ProfilerStep#N markers, n_decode_steps 0.
    run = _real_run(tmp_path, [real_traces / "hta-a100-ddp-nccl.json.gz"])
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    said = _quote(md, "Verdict.") + _quote(md, "In short:")
    assert "decode step" not in said
    assert "over 3 training steps" in said and "This is a training trace" in said
    assert "Not projected: this is a" in section(md, "What-if")


def test_eager_prefill_gets_no_decode_verdict(tmp_path, real_traces):
    run = _real_run(tmp_path, [real_traces / "hf-h100-qwen1.5-0.5b-eager.json.gz"])
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    said = _quote(md, "Verdict.")
    assert "decode step" not in said and "Low confidence: only 1 prefill step judged" in said
    assert "This is a prefill trace (1 prefill step)" in said
    # Device-bound: the sentence states the idle it judged, beside the threshold it judged it by.
    busy, idle, limit = map(float, re.search(
        r"busy ([\d.]+) % of each step \(span [\d.]+ ms, busy [\d.]+ ms, idle ([\d.]+) %; device-bound up to "
        r"([\d.]+) % idle\)", said).groups())
    assert busy + idle == pytest.approx(100, abs=0.2) and idle <= limit
    whatif = section(md, "What-if")
    assert "Not projected: this is a prefill trace" in whatif and "| acceptance" not in whatif
    # The headings name the step the trace has, too.
    assert md.startswith("# Where does a prefill step's time go?")
    assert ". Profiler breakdown of a prefill step" in md and "### Collectives per prefill step" in md
    assert "Times are per prefill step unless stated" in md
    assert "Per category, over 1 prefill step (rank 0" in md and "over 1 prefill step, TP=1" in md


def test_two_ranks_of_a_large_world_make_no_cross_rank_claim(tmp_path, real_traces):
    run = _real_run(tmp_path, [real_traces / "hta-sampled-rank-0.json.gz", real_traces / "hta-sampled-rank-1.json.gz"])
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    said = _quote(md, "Verdict.")
    world = json.loads((run / "05_categorize" / "summary.json").read_text())["trace_info"]["world_size"]
    assert world > 2
    assert f"Only 2 of {world} ranks' traces are here, so no cross-rank claim is made" in said
    assert "least-waiting rank" not in md and "the table is left out" in md


REAL = {"vllm-cpu-tp2": ["vllm-cpu-tinyllama-tp2-rank0.pt.trace.json.gz", "vllm-cpu-tinyllama-tp2-rank1.pt.trace.json.gz"],
        "vllm-cpu-tp1": ["vllm-cpu-tinyllama-tp1-nostack-rank0.pt.trace.json.gz"],
        "vllm-cpu-ngram": ["vllm-cpu-tinyllama-tp2-ngram-rank0.pt.trace.json.gz",
                           "vllm-cpu-tinyllama-tp2-ngram-rank1.pt.trace.json.gz"],
        "sglang-mi300x": ["sglang-mi300x-qwen3-8b-decode.json.gz"],
        "hf-h100-eager": ["hf-h100-qwen1.5-0.5b-eager.json.gz"],
        "a100-ddp": ["hta-a100-ddp-nccl.json.gz"]}


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_trace_verdicts_print_only_structured_values(tmp_path, real_traces, name):
    run = _real_run(tmp_path, [real_traces / f for f in REAL[name]])
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    a = load_run_artifacts(run)
    v = report_context(a, writeup_params_from(a)).verdict
    pairs, head = prose.sentences(v), prose.headline_sentences(v)
    assert " ".join(s for _, s in pairs) == _quote(md, "Verdict.")
    assert " ".join(s for _, s in head) == _quote(md, "In short:")
    for src, sentence in pairs + head:
        stray = [n for n in _numbers(sentence) if n not in _printable(src)]
        assert not stray, f"{sentence!r} prints {stray}"
    # "biggest" is said of one lever only, the one with the highest ceiling of all.
    ceilings = ([lv.ceiling_x for lv in v.levers] + [g.ceiling_x for g in v.gap_levers]
                + ([v.between_steps.ceiling_x] if v.between_steps else []))
    best_x = v.biggest.ceiling_x if v.biggest is not None else None
    assert best_x == (max(ceilings) if ceilings else None)
    biggest = [s for _, s in pairs if "biggest" in s and not s.startswith("Among the categories")]
    # a host-bound step's one gap outranks every category (its lever withdrawn as no steady state):
    # then no category is called the biggest, only the biggest among the categories
    host_gap = v.boundness is not None and v.boundness.status == "host gap"
    assert len(biggest) == (1 if ceilings and not host_gap else 0)
    if biggest and v.biggest.kind == "category":
        assert biggest[0].startswith(f"The biggest single lever is {v.biggest.name}:")


def test_tp2_cpu_report_separates_waiting_from_transfer(tmp_path, real_traces):
    run = _real_run(tmp_path, [real_traces / f for f in REAL["vllm-cpu-tp2"]])
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    cm = json.loads((run / "05_categorize" / "summary.json").read_text())["collectives_matched"]
    said = _quote(md, "Verdict.")
    assert f"Communication costs {fmt_num(cm['transfer_ms_per_step'])} ms per step in transfer" in said
    # The mean over ranks describes no rank: the least and most waiting ranks stand beside it
    # (rank 0 arrives last on most calls, so it waits least).
    w = {int(r): v for r, v in cm["wait_ms_per_step_by_rank"].items()}
    assert w[0] < w[1]
    assert (f"Ranks wait {fmt_num(cm['wait_ms_per_step'])} ms per step for each other (mean over ranks, from "
            f"{fmt_num(w[0])} ms on rank 0 to {fmt_num(w[1])} ms on rank 1; ") in said
    # The skew quoted is one kind of collective's (the one waited on most), not all-reduces and
    # all-gathers pooled: here the all-reduces' 4.27 ms, with their straggler.
    ar = cm["by_category"]["all_reduce"]
    assert (f"; p90 arrival skew of the all_reduce calls {fmt_num(ar['skew_us']['p90'])} µs, straggler rank "
            f"{ar['straggler_rank']}):") in said
    assert ") (" not in said  # one parenthesis, not two in a row
    assert ar["skew_us"]["p90"] != cm["skew_us"]["p90"]
    assert "every microsecond saved there shortens the step" not in md
    # The per-step figures sum the instances of the judged (decode) steps, and the sentence counts those.
    assert cm["n_instances_judged"] == 60 and cm["n_instances"] == 72
    assert "over 60 matched collectives" in said
    # The cross-rank table's estimate column is a time, and its header says so (the appendix's table, issue 37).
    appendix = (run / "06_writeup" / "appendix.md").read_text()
    assert "| transfer est. (least-waiting rank) |" in appendix and "| least-waiting rank |" not in appendix
    assert "| transfer est." not in md and "](appendix.md#collective-transfer-and-wait-stage-05)" in md
    period = json.loads((run / "05_categorize" / "summary.json").read_text())["decode"]["period_ms"]
    assert f"(the period, mean over {period['n']} intervals)" in md and period["n"] == 8


def test_one_blocking_gap_is_a_stall_not_host_bound(tmp_path, real_traces):
    # SGLang on MI300X: one decode step whose idle is almost all one long gap.
    run = _real_run(tmp_path, [real_traces / f for f in REAL["sglang-mi300x"]])
    said = _quote(build_report(run, draw_figures=False)["markdown"].read_text(), "Verdict.")
    assert "a stall to remove, not a host-bound step" in said
    assert "CUDA graphs" not in said and "the step is host-bound" not in said


def test_the_roofline_bounds_what_faster_kernels_buy(tmp_path, real_traces):
    # gpt-oss-20b on MI300X: fused_moe (the MXFP4 experts) takes 7.29 of a 10.7 ms step at 26 %
    # of peak bandwidth. Removing it would buy 3.11x; kernels at the roofline still need 26 % of
    # its time, so faster kernels buy at most about 2x. Both stand in the lever sentence.
    from stepscope.model.arch import get_preset
    from stepscope.trace import analyze_traces

    run = tmp_path / "run"
    analyze_traces([real_traces / "vllm-mi300x-gptoss-decode-fullgraph.json.gz"], run / "05_categorize",
                   arch=get_preset("gpt-oss-20b"), progress=False, perfetto=False)
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    a = load_run_artifacts(run)
    v = report_context(a, writeup_params_from(a)).verdict
    moe = next(r for r in v.roofline if r.category == "fused_moe")
    lever = next(lv for lv in v.levers if lv.category == "fused_moe")
    assert moe.at_peak_ms == pytest.approx(moe.time_ms_per_step * max(moe.pct_peak_bw, moe.pct_peak_flops) / 100)
    assert moe.at_peak_ms == pytest.approx(1.91, abs=0.005) and lever.ceiling_x == pytest.approx(3.11, abs=0.005)
    cut = min(lever.exposed_ms, moe.time_ms_per_step - moe.at_peak_ms)
    assert moe.at_peak_ceiling_x == pytest.approx(v.basis.step_ms / (v.basis.step_ms - cut))
    assert 1.0 < moe.at_peak_ceiling_x < lever.ceiling_x
    clause = (f"at the device's peaks its bytes and FLOPs would still need {fmt_num(moe.at_peak_ms)} ms per step, "
              f"so faster kernels alone make a decode step at most {fmt_num(moe.at_peak_ceiling_x)}× faster")
    assert clause not in _quote(md, "In short:") and _quote(md, "Verdict.").count(clause) == 1
    for src, sentence in prose.sentences(v) + prose.headline_sentences(v):
        stray = [n for n in _numbers(sentence) if n not in _printable(src)]
        assert not stray, f"{sentence!r} prints {stray}"


def test_a_category_at_the_roofline_is_told_to_do_less_work():
    r = RooflineFinding(category="lm_head", time_ms_per_step=0.277, achieved_gbps=5300.0, pct_peak_bw=100.4,
                        achieved_tflops=134.0, pct_peak_flops=10.2, device="AMD Instinct MI300X", peak_known=True,
                        at_peak_ms=0.278, at_peak_ceiling_x=1.0, step_ms=10.7, denominator="span")
    said = prose.roofline_sentence(r, "decode step")
    assert "already run at the roofline" in said and "fewer bytes moved" in said and "faster kernels" not in said


@pytest.mark.parametrize("trace,preset,cats", [
    ("sglang-mi300x-qwen3-8b-decode.json.gz", "qwen3-8b", {"dense_gemm"}),
    ("vllm-mi300x-gptoss-decode-fullgraph.json.gz", "gpt-oss-20b", {"dense_gemm", "fused_moe"})])
def test_gpu_reports_show_percent_of_peak_for_their_gemms(tmp_path, real_traces, trace, preset, cats):
    from stepscope.model.arch import get_preset
    from stepscope.trace import analyze_traces

    run = tmp_path / "run"
    analyze_traces([real_traces / trace], run / "05_categorize", arch=get_preset(preset), progress=False,
                   perfetto=False)
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    rows = json.loads((run / "05_categorize" / "summary.json").read_text())["roofline"]["rows"]
    said = _quote(md, "Verdict.")
    assert {r["category"] for r in rows} >= cats
    for r in rows:
        assert (f"On the trace {r['category']} moves {fmt_num(r['achieved_gbps'])} GB/s, "
                f"{fmt_num(r['pct_peak_bw'])} % of the AMD Instinct MI300X's peak memory bandwidth") in said


def test_analyze_takes_an_architecture_preset(tmp_path):
    from stepscope.runner import analyze_params

    data = analyze_params(["x.json.gz"], model_config=None, tp=None, arch_preset="qwen3-8b")
    assert data["model"] == {"arch_preset": "qwen3-8b"}


def test_catch_all_share_is_reported_beside_other(tmp_path):
    run = make_synthetic_run(tmp_path / "ca")
    p = run / "05_categorize" / "summary.json"
    s = json.loads(p.read_text())
    for r in s["ranks"]:
        r["catch_all_share"], r["catch_all_top_names"] = 0.031, [{"name": "aten::copy_ kernel", "sum_us": 9.0, "count": 3}]
    p.write_text(json.dumps(s))
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    assert "Only a catch-all rule matched 3.1 % of kernel time" in md and "`aten::copy_ kernel`" in md


def test_one_rank_gets_no_across_ranks_table(tmp_path, real_traces):
    run = _real_run(tmp_path, [real_traces / "hf-h100-qwen1.5-0.5b-eager.json.gz"])
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    assert "Across ranks" not in md


def test_a_speculative_run_says_so(tmp_path, real_traces):
    run = _real_run(tmp_path, [real_traces / "vllm-cpu-tinyllama-tp2-ngram-rank0.pt.trace.json.gz",
                               real_traces / "vllm-cpu-tinyllama-tp2-ngram-rank1.pt.trace.json.gz"])
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    sd = json.loads((run / "05_categorize" / "summary.json").read_text())["decode"]["spec_decode"]
    assert (f"This run already decodes speculatively: {sd['n_verify_steps']} of its {sd['n_decode_steps']} decode "
            f"steps verify drafted tokens") in _quote(md, "Verdict.")
    assert "**This run already decodes speculatively**" in section(md, "What-if")
    a = load_run_artifacts(run)
    v = report_context(a, writeup_params_from(a)).verdict
    for src, sentence in prose.sentences(v):
        assert not [n for n in _numbers(sentence) if n not in _printable(src)], sentence


def test_roofline_with_unknown_peak_still_sets_the_trace_beside_stage_02(tmp_path):
    run = make_synthetic_run(tmp_path / "rf")
    p = run / "05_categorize" / "summary.json"
    s = json.loads(p.read_text())
    s["roofline"]["device"] = {"name": "CPU", "known": False}
    row = s["roofline"]["rows"][0]
    row.update(micro_gbps=1800.0, micro_vs_trace=row["achieved_gbps"] / 1800.0)
    p.write_text(json.dumps(s))
    said = _quote(build_report(run, draw_figures=False)["markdown"].read_text(), "Verdict.")
    assert (f"On the trace quant_gemm moves {fmt_num(row['achieved_gbps'])} GB/s; the device's peak (CPU) is "
            f"unknown, so no % of peak is given; stage 02's micro-benchmark reaches 1,800 GB/s at the same shapes "
            f"(trace / micro {fmt_num(row['micro_vs_trace'])})") in said


def test_a_graph_replaying_step_gets_no_cuda_graph_advice(tmp_path, real_traces):
    # vLLM full-graph decode on MI300X: 421 of the step's 434 device events come from one
    # hipGraphLaunch, so stage 05 says the step replays a graph.
    run = _real_run(tmp_path, [real_traces / "vllm-mi300x-gptoss-decode-fullgraph.json.gz"])
    info = json.loads((run / "05_categorize" / "summary.json").read_text())["trace_info"]
    assert (info["graph_replay"], info["graph_launched_events"], info["device_events"]) == (True, 421, 434)
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    assert "CUDA graphs" not in md
    a = load_run_artifacts(run)
    b = report_context(a, writeup_params_from(a)).verdict.boundness
    assert b.graph_replay is True and b.status == "device-bound"
    # Were the same step host-bound, the lever named would still not be CUDA graphs.
    said = prose.boundness_sentence(msgspec.structs.replace(b, status="host-bound", micro_idle_pct=40.0))
    assert "already replays a graph" in said and "CUDA graphs" not in said


def test_a_whole_batch_prints_as_a_count(tmp_path, real_traces):
    # SGLang's `step[DECODE bs=32]`: the median batch over steps is 32 requests, not 32.0.
    run = _real_run(tmp_path, [real_traces / f for f in REAL["sglang-mi300x"]])
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    assert "| Batch | 32 requests per step" in md and "**32 requests per step**" in md
    assert "32.0 requests" not in md


def test_time_between_steps_is_a_lever_of_its_own(tmp_path, real_traces):
    # vLLM CPU, TP=2: steps start 26.4 ms apart but each spans 20.0 ms of recorded work.
    run = _real_run(tmp_path, [real_traces / f for f in REAL["vllm-cpu-tp2"]])
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    v = report_context(load_run_artifacts(run), writeup_params_from(load_run_artifacts(run))).verdict
    b = v.between_steps
    d = json.loads((run / "05_categorize" / "summary.json").read_text())["decode"]["steps"]
    assert b.period_ms == pytest.approx(d["period_ms"]["mean"]) and b.span_ms == pytest.approx(d["span_ms"]["mean"])
    assert b.gap_ms == pytest.approx(b.period_ms - b.span_ms) and b.ceiling_x == pytest.approx(b.period_ms / b.span_ms)
    assert b.n_intervals == 8 and 20 < b.gap_pct < 30
    # all_reduce's 1.42x beats the 1.32x between steps (and the gaps inside): the biggest single lever.
    assert v.biggest.kind == "category" and v.levers[0].ceiling_x > b.ceiling_x
    assert f"The biggest single lever is {v.levers[0].category}: " in _quote(md, "Verdict.")
    assert f"It is also the biggest lever: removing its {fmt_num(v.levers[0].exposed_ms)} ms" in _quote(md, "In short:")
    assert (f"Between steps, {fmt_num(b.gap_ms)} ms per step ({fmt_num(b.gap_pct)} % of the {fmt_num(b.period_ms)} ms "
            f"period, mean over 8 intervals)") in _quote(md, "Verdict.")
    assert f"at most {fmt_num(b.ceiling_x)}× faster (period / span of {fmt_num(b.span_ms)} ms)" in md


def test_time_between_steps_is_the_biggest_lever_when_it_beats_every_other(tmp_path, real_traces):
    # vLLM CPU, TP=2, n-gram speculation: framework, the best category, buys at most 1.08x, the
    # host work between steps 1.79x. The headline once called framework "the biggest single lever".
    run = _real_run(tmp_path, [real_traces / f for f in REAL["vllm-cpu-ngram"]])
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    a = load_run_artifacts(run)
    v = report_context(a, writeup_params_from(a)).verdict
    b, top = v.between_steps, v.levers[0]
    assert v.biggest.kind == "between steps" and 1.7 < b.ceiling_x < 1.9 and top.ceiling_x < 1.1
    assert all(b.ceiling_x > g.ceiling_x for g in v.gap_levers)
    assert (v.biggest.name, v.biggest.ceiling_x) == ("time between steps", b.ceiling_x)
    head, said = _quote(md, "In short:"), _quote(md, "Verdict.")
    # the headline's short form, the verdict's full one
    assert (f"The biggest lever is the time between steps: removing its {fmt_num(b.gap_ms)} ms of host work per step "
            f"would make a decode step at most {fmt_num(b.ceiling_x)}× faster.") in head
    assert (f"The biggest lever lies between steps: {fmt_num(b.gap_ms)} ms per step" in said
            and f"at most {fmt_num(b.ceiling_x)}× faster (period / span of {fmt_num(b.span_ms)} ms), more than any "
                f"other lever." in said)
    assert f"Among the categories, the biggest lever is {top.category}: " in said
    assert said.index("The biggest lever lies between steps") < said.index("Among the categories")
    assert "The biggest single lever" not in md and "Among the categories" not in head


@pytest.mark.parametrize("name, kind, idle_key", [
    # vLLM CPU, TP=1: 2.42 ms of short gaps per 6.51 ms period (1.59x) against framework's 1.10x.
    ("vllm-cpu-tp1", "short gaps", "idle_micro_ms")])
# (SGLang on MI300X, one 463 ms stall in a 474 ms step, is mostly stall: the steady-state guard
# withdraws its gap lever, test_a_step_that_is_mostly_stall_offers_no_gap_lever)
def test_gaps_inside_the_step_are_the_biggest_lever_when_they_beat_every_other(tmp_path, real_traces, name, kind,
                                                                                idle_key):
    run = _real_run(tmp_path, [real_traces / f for f in REAL[name]])
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    a = load_run_artifacts(run)
    v = report_context(a, writeup_params_from(a)).verdict
    g = next(g for g in v.gap_levers if g.kind == kind)
    d = json.loads((run / "05_categorize" / "summary.json").read_text())["decode"]
    assert g.idle_ms == pytest.approx(d[idle_key]) and g.ceiling_x == pytest.approx(g.step_ms / (g.step_ms - g.idle_ms))
    assert v.biggest.kind == kind and g.ceiling_x > v.levers[0].ceiling_x
    head, said = _quote(md, "In short:"), _quote(md, "Verdict.")
    assert (f"removing their {fmt_num(g.idle_ms)} ms per step would make a decode step at most "
            f"{fmt_num(g.ceiling_x)}× faster") in head and head.count("The biggest") == 1
    assert f"Among the categories, the biggest lever is {v.levers[0].category}: " in said


def test_a_step_that_is_mostly_stall_offers_no_gap_lever(tmp_path, real_traces):
    # SGLang on MI300X: one 463 ms stall (a blocking hipMemcpy) in a 474 ms step would read 45.3x
    run = _real_run(tmp_path, [real_traces / f for f in REAL["sglang-mi300x"]])
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    a = load_run_artifacts(run)
    v = report_context(a, writeup_params_from(a)).verdict
    g = next(g for g in v.guards if g.invariant == "steady_state")
    assert not g.holds and g.withdrawn == ("gap_levers",) and g.value("stall_pct") == pytest.approx(97.8, abs=0.05)
    assert v.gap_levers == () and v.biggest.kind == "category" and v.biggest.name == "dense_gemm"
    assert "45.3×" not in md and "mostly host stall" in _quote(md, "Verdict.")


def test_no_between_steps_lever_without_a_period_or_below_the_threshold(tmp_path, real_traces):
    from stepscope.report.verdict import between_steps
    from stepscope.thresholds import BETWEEN_STEPS_SHARE

    run = _real_run(tmp_path, [real_traces / f for f in REAL["sglang-mi300x"]])  # one step: no period
    a = load_run_artifacts(run)
    ctx = report_context(a, writeup_params_from(a))
    assert ctx.verdict.between_steps is None and "Between steps," not in _quote(
        build_report(run, draw_figures=False)["markdown"].read_text(), "Verdict.")
    ident = ctx.verdict.identity
    below = {"period_ms": 10.0, "span_ms": 10.0 * (1 - BETWEEN_STEPS_SHARE) + 1e-9}
    assert between_steps(below, ident) is None
    assert between_steps({"period_ms": 10.0, "span_ms": 8.0}, ident).ceiling_x == pytest.approx(1.25)


def test_a_cpu_trace_is_worded_in_ops_not_kernels(tmp_path, real_traces):
    # vLLM CPU: the counted work is each op's self time on the CPU worker; there are no kernels.
    run = _real_run(tmp_path, [real_traces / f for f in REAL["vllm-cpu-tp2"]])
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    said = _quote(md, "Verdict.")
    assert "The CPU worker idles" in said and "% in short gaps between ops (host-bound from" in said
    assert "faster ops" in said
    appendix = (run / "06_writeup" / "appendix.md").read_text()  # the step readings' table (issue 37)
    assert "| op sum (every op's self time added up) |" in appendix
    assert "| union (time the CPU worker was busy) |" in appendix
    assert "- Ops barely overlap: summed op time" in md and "pass with no counted work of the step" in md
    for kernel_word in ("between kernels", "Kernels barely", "kernel sum (", "faster kernels", "device work of"):
        assert kernel_word not in md, kernel_word


def test_one_request_per_step_is_singular(tmp_path, real_traces):
    # vLLM CPU at concurrency 1: `execute_context_0(0)_generation_1(1)`, one request per step.
    run = _real_run(tmp_path, [real_traces / f for f in REAL["vllm-cpu-tp2"]])
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    assert "| Batch | 1 request per step" in md and "**1 request per step**" in md
    assert "1 requests" not in md and "1.00 requests" not in md


def test_both_transfer_readings_stand_side_by_side(tmp_path, real_traces):
    # TP=2 CPU: all_reduce's least-waiting rank (rank 0) spends 7.86 ms per step in it, the matched
    # instances transfer 8.02 ms: within 5 %. 6 of all_gather's 10 instances are asymmetric.
    from stepscope.report.analysis import transfer_readings

    run = _real_run(tmp_path, [real_traces / f for f in REAL["vllm-cpu-tp2"]])
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    r = transfer_readings(load_run_artifacts(run)).set_index("category")
    cm = json.loads((run / "05_categorize" / "summary.json").read_text())["collectives_matched"]["by_category"]
    cr = pd.read_csv(run / "05_categorize" / "cross_rank.csv").set_index("category")
    ar = r.loc["all_reduce"]
    assert ar.transfer_ms_matched == cm["all_reduce"]["transfer_ms_per_step"]
    assert ar.transfer_ms_est == cr.loc["all_reduce", "transfer_ms_est"] and ar.agree
    assert abs(ar.transfer_ms_est - ar.transfer_ms_matched) / ar.transfer_ms_matched < 0.05
    assert r.loc["all_gather"].agree is None and r.loc["all_gather"].n_asymmetric == 1
    appendix = (run / "06_writeup" / "appendix.md").read_text()  # the readings' table (issue 37)
    assert "| transfer (matched instances) |" in appendix and "| transfer (matched instances) |" not in md
    row = next(line for line in appendix.split("For a collective", 1)[1].splitlines()
               if line.startswith("| all_reduce | "))
    assert f"| {fmt_num(ar.transfer_ms_est)} | {fmt_num(ar.transfer_ms_matched)} |" in row
    assert "- all_gather: 1 of 10 matched instances are asymmetric" in md
    assert "upper bound on the transfer" not in md  # the estimate can fall below the matched transfer


def test_transfer_readings_that_disagree_are_flagged_with_both_values():
    from stepscope.report.build import _transfer_reading_notes

    rows = pd.DataFrame([{"category": "all_reduce", "transfer_ms_est": 6.0, "transfer_ms_matched": 8.0,
                          "n_instances": 50, "n_asymmetric": 0, "rel_diff": 0.25, "agree": False},
                         {"category": "all_gather", "transfer_ms_est": 1.0, "transfer_ms_matched": 1.01,
                          "n_instances": 10, "n_asymmetric": 0, "rel_diff": 0.01, "agree": True}])
    notes = _transfer_reading_notes(rows)
    assert "⚠ all_reduce: the two transfer readings differ by 25 % (6.00 ms the least-waiting rank's mean, " \
           "8.00 ms matched instance by instance; they agree within 5.0 %)" in notes
    assert "all_gather" not in notes


def test_training_caveats_name_training_steps_and_say_plainly_when_nothing_fell_to_other(tmp_path, real_traces):
    run = _real_run(tmp_path, [real_traces / "hta-a100-ddp-nccl.json.gz"])
    caveats = section(build_report(run, draw_figures=False)["markdown"].read_text(), "Caveats")
    assert "Collectives per training step were not checked" in caveats and "per decode step" not in caveats
    assert "at most 0 %" not in caveats
    # a check that held is said once, on its line, never as a caveat's bullet
    (held,) = [line for line in caveats.splitlines() if line.startswith("Checks that held: ")]
    assert "no kernel time fell to \"other\" on any rank" in held
    assert "no kernel matched only a catch-all rule on any rank" in held
    assert not [line for line in caveats.splitlines() if line.startswith("- ") and ("No kernel" in line or "Every " in line)]


def test_kernel_names_that_differ_inside_stay_apart(tmp_path, real_traces):
    # gpt-oss on MI300X: two of dense_gemm's hipBLASLt kernels (447 and 448 characters) share
    # their first 264 and last 155 (NTA0 against NTA4, NEPBS8 against NEPBS16), so the middle
    # cut printed them as two identical rows.
    run = _real_run(tmp_path, [real_traces / "vllm-mi300x-gptoss-decode-fullgraph.json.gz"])
    appendix = build_report(run, draw_figures=False)["appendix_markdown"].read_text()  # the largest kernels' table
    rows = [r for r in appendix.splitlines() if r.startswith("| dense_gemm | `Cijk_")]
    names = [r.split("`")[1] for r in rows]
    assert len(names) == len(set(names)) == 3 and all(len(n) <= 80 for n in names)
    assert "_NTA0_" in names[0] and "_NEPBS8_" in names[0] and "_NTA4_" in names[1] and "_NEPBS16_" in names[1]
    assert names[2] == short_name(names[2], 80)  # a name that clashed with none keeps the plain cut


def test_short_names_part_every_clash_and_leave_equal_names_equal():
    base = "k_" + "a" * 100
    names = [base + "X" + "b" * 50 + "Y" + "c" * 100, base + "X" + "b" * 50 + "Z" + "c" * 100,
             base + "W" + "b" * 50 + "Y" + "c" * 100, "short", "short", None]
    cut = short_names(names, 60)
    assert len(set(cut[:3])) == 3 and cut[3] == cut[4] == "short" and cut[5] == "?"
    assert all(len(c) == 60 for c in cut[:3]) and all(c.startswith("k_aaa") and c.endswith("ccc") for c in cut[:3])


def _levers_and_matched(tmp_path, real_traces, name):
    run = _real_run(tmp_path / name, [real_traces / f for f in REAL[name]])
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    a = load_run_artifacts(run)
    v = report_context(a, writeup_params_from(a)).verdict
    matched = json.loads((run / "05_categorize" / "summary.json").read_text())["collectives_matched"]["by_category"]
    return md, v, matched


def test_a_collective_lever_says_how_much_of_it_a_faster_collective_buys(tmp_path, real_traces):
    # vLLM CPU at TP=2 with n-gram drafts: 0.034 of rank 0's 0.208 ms of all_reduce per step is
    # transfer, the rest waiting for rank 1, so removing it and making it faster differ.
    _, v, matched = _levers_and_matched(tmp_path, real_traces, "vllm-cpu-ngram")
    ar = next(lv for lv in v.levers if lv.category == "all_reduce")
    assert ar.transfer_ms == pytest.approx(matched["all_reduce"]["transfer_ms_per_step"])
    assert ar.transfer_ms == pytest.approx(0.034, abs=0.0005) and ar.exposed_ms == pytest.approx(0.208, abs=0.0005)
    assert ar.transfer_ceiling_x == pytest.approx(ar.step_ms / (ar.step_ms - ar.transfer_ms))
    assert 1.0 < ar.transfer_ceiling_x < ar.ceiling_x
    assert all(lv.transfer_ms is None for lv in v.levers if lv.category not in matched)
    said = prose.lever_sentence((ar,), "decode step")
    assert (f"of it, {fmt_num(ar.transfer_ms)} ms per step is transfer (last arrival to completion) and the rest "
            f"is time the ranks wait for each other, so a faster all_reduce alone makes a decode step at most "
            f"{fmt_num(ar.transfer_ceiling_x)}× faster") in said


def test_a_collective_that_is_all_transfer_is_said_to_be(tmp_path, real_traces):
    # The gloo capture at TP=2: the matched all-reduces spend 8.02 ms per step from the last
    # arrival to completion, more than rank 0's 7.86 ms exposed: no waiting to subtract.
    md, v, matched = _levers_and_matched(tmp_path, real_traces, "vllm-cpu-tp2")
    ar = v.levers[0]
    assert ar.category == "all_reduce" and ar.transfer_ms > ar.exposed_ms
    assert ar.transfer_ceiling_x == pytest.approx(ar.ceiling_x)
    assert (f"its matched calls spend {fmt_num(ar.transfer_ms)} ms per step from the last rank's arrival to "
            f"completion, all of its exposed time: transfer, not ranks waiting") in _quote(md, "Verdict.")


def test_a_speculative_run_reads_its_acceptance_from_stage_04s_counters(tmp_path, real_traces, repo_root):
    """Stage 04 reads /metrics around the profiled requests; the report then says what the server
    accepted and what a token costs (the decode step over tokens per step), every number from
    its structured value. The recorded counters are the same server's, around that capture."""
    from stepscope.server_metrics import spec_decode_delta

    run = _real_run(tmp_path, [real_traces / "vllm-cpu-tinyllama-tp2-ngram-rank0.pt.trace.json.gz",
                               real_traces / "vllm-cpu-tinyllama-tp2-ngram-rank1.pt.trace.json.gz"])
    m = repo_root / "tests" / "data" / "metrics" / "vllm-cpu-tinyllama-tp2-ngram"
    for when in ("before", "after"):
        (run / "04_profiler_capture").mkdir(exist_ok=True)
        (run / "04_profiler_capture" / f"metrics.{when}.prom").write_text(m.with_suffix(f".{when}.prom").read_text())
    stats = spec_decode_delta(m.with_suffix(".before.prom").read_text(), m.with_suffix(".after.prom").read_text())
    a = load_run_artifacts(run)
    v = report_context(a, writeup_params_from(a)).verdict
    sd = v.spec_decode
    assert (sd.accepted_tokens, sd.draft_tokens) == (98, 208)
    assert sd.tokens_per_decode_step == pytest.approx(stats.tokens_per_decode_step)
    assert sd.ms_per_token == pytest.approx(v.basis.step_ms / stats.tokens_per_decode_step)
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    assert (f"Over the profiled requests the server accepted 98 of 208 drafted tokens ({fmt_num(100 * 98 / 208)} %), "
            f"{fmt_num(stats.tokens_per_decode_step)} tokens per decode step (its /metrics counters), so a token "
            f"costs {fmt_num(sd.ms_per_token)} ms of decode time") in _quote(md, "Verdict.")
    for src, sentence in prose.sentences(v):
        assert not [n for n in _numbers(sentence) if n not in _printable(src)], sentence


def test_a_gap_lever_has_one_name_in_every_sentence():
    """The headline named the long gaps "the long gaps" when they bought little and "the long
    gaps inside the step" otherwise; the verdict's sentence said the second. One name now
    (`prose.lever_name`), whichever sentence says it."""
    from stepscope.report.verdict import GapLever

    long_gaps = GapLever("long gaps", idle_ms=0.4, step_ms=10.0, denominator="period", ceiling_x=1.04)
    short_gaps = msgspec.structs.replace(long_gaps, kind="short gaps", cpu=True, ceiling_x=2.0, idle_ms=5.0)
    assert prose.lever_headline(long_gaps, "decode step", buys_little=True) == (
        "No lever is worth naming: the biggest, the long gaps inside the step, would make a decode step at most "
        "1.04× faster.")
    assert prose.lever_headline(short_gaps, "decode step").startswith(
        "The biggest lever is the short gaps between ops: removing their 5.00 ms per step")
    assert prose.gap_lever_sentence(short_gaps, "decode step").startswith(
        "The biggest lever is the short gaps between ops (each under 1.00 ms): removing")
