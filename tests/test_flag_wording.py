"""Stage 05's flags store a code and values; their sentence is written once, by
`wording.flag_message` (issue 24, words in one place). Each test pairs a flag with the
sentence the renderer writes from it, so a wording change is made in one place."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope import schema
from stepscope.report.analysis import _trace_caveats
from stepscope.report.prose import artifact_caveat_text
from stepscope.report.artifacts import RunArtifacts
from stepscope.trace.analyze import analyze_traces
from stepscope.wording import FLAGS_WITHOUT_VALUES, flag_message


def _flag(code: str, **values) -> schema.Flag:
    return schema.Flag(code=code, severity="warning", message="", **values)


# (flag, the sentence written from its values)
PAIRS = [
    (_flag("low_confidence", n_steps=3, step_kind="decode"),
     "only 3 decode step(s) with work (under 5): per-step figures rest on too few steps to show their spread"),
    (_flag("ranks_missing", ranks=[0, 1], world_size=128),
     "2 of 128 ranks' traces given (ranks [0, 1]); no cross-rank claim is made"),
    (_flag("tp_disagreement", tp=4, world_size=2),
     "TP from params is 4, but the traces' distributedInfo.world_size is 2; the params value is used"),
    (_flag("step_fallback", rank=1, step_source="graph_launches"),
     "rank 1: no step annotations; steps from graph_launches"),
    (_flag("other_share_high", rank=0, share=0.0496, limit_share=0.005,
           top_names=[schema.NamedTime(name="sage_fwd", sum_us=9995.9, count=228)]),
     "rank 0: 4.96% of kernel time is 'other' (limit 0.5%); top: sage_fwd (9996 us); add rules in params "
     "analysis.extra_rules"),
    (_flag("unattributed", rank=0, n_events=968, by_reason={"before_capture": 968}),
     "rank 0: 968 work events belong to no recorded step ({'before_capture': 968}; before_capture = launched "
     "before the capture's CPU side began, i.e. in an unrecorded earlier step)"),
    (_flag("period_from_device", n_steps=2),
     "2 step(s): the host-side period was shorter than the device's busy time, so the period is the device's "
     "step (first device event of one step to the next); shares and ceilings divide by it"),
    (_flag("kernel_sum_above_tpot", kernel_sum_ms=31.0, tpot_ms=30.0, cpu=True),
     "mean op sum per decode step (31.000 ms) exceeds the mean TPOT measured during capture (30.000 ms): ops "
     "overlap; read the union and span instead"),
    (_flag("span_below_tpot", span_ms=20.0, tpot_ms=30.0, share=1 / 3, cpu=False),
     "a decode step's work spans 20.000 ms (mean) of the 30.000 ms mean TPOT (33% of each token has no device "
     "work: host-side overhead, scheduling or launch gaps)"),
    (_flag("period_tpot_mismatch", period_ms=26.4, tpot_ms=20.0, judgement="tpot_below"),
     "the mean decode period in the trace is 26.400 ms but the mean TPOT the client measured during capture is "
     "20.000 ms (+32%): tokens reached the client in bursts (a starved API process or network), so the "
     "client's decode time is short and its TTFT long; the period is the server's reading"),
    (_flag("mixed_modes"), "some ranks are GPU traces and some CPU-only"),
    (_flag("bad_timestamps", rank=2, n_events=7),
     "rank 2: dropped 7 annotation or launch events with a non-finite, negative or out-of-range timestamp or "
     "duration (limits: parse.MAX_TS_US, MAX_DUR_US)"),
    (_flag("names_capped", rank=0, n_events=3, limit_chars=4096),
     "rank 0: 3 event names longer than 4,096 characters were cut to that length before the name rules saw "
     "them (the names say how long they were)"),
    (_flag("ids_out_of_range", rank=1, n_events=5),
     "rank 1: 5 ids (correlation, stream) outside 64-bit integers were read as no id, so those "
     "events are matched by time instead"),
    (_flag("unknown_event_category", rank=0, categories={"zeta": 2, "alpha": 1}),
     "rank 0: ignored events of unknown category 'alpha' (1), 'zeta' (2)"),
    (_flag("rank_assumed", file="one.json.gz"),
     "one.json.gz: no distributedInfo.rank and no rank in the file name; a single trace was given, so it is "
     "treated as rank 0"),
]


@pytest.mark.parametrize("flag,sentence", PAIRS, ids=[f.code for f, _ in PAIRS])
def test_each_flag_reads_as_the_sentence_of_its_values(flag, sentence):
    assert flag_message(flag) == sentence


def test_a_flag_without_values_reads_as_the_message_it_was_written_with():
    # a run folder written before flags carried values, and a code still without them
    old = schema.Flag(code="low_confidence", severity="warning", message="only 1 decode step(s) with work")
    assert flag_message(old) == "only 1 decode step(s) with work"
    kept = schema.Flag(code=FLAGS_WITHOUT_VALUES[0], severity="warning", message="as raised")
    assert flag_message(kept) == "as raised"


def test_stage05_writes_each_flags_values_and_its_rendered_sentence(real_traces: Path, tmp_path: Path):
    an = analyze_traces([real_traces / f"hta-sampled-rank-{i}.json.gz" for i in (0, 1)], tmp_path,
                        progress=False, perfetto=False)
    written = schema.read(tmp_path / "summary.json", schema.TraceSummary).flags
    missing = next(f for f in written if f.code == "ranks_missing")
    assert (missing.ranks, missing.world_size) == ([0, 1], 128)
    assert [f.message for f in written] == [flag_message(f) for f in written] == [f.message for f in an.flags]
    # only the values a code uses are written
    assert schema.to_builtins(missing).keys() == {"code", "severity", "message", "ranks", "world_size"}


def test_the_report_renders_a_flag_from_its_values_not_its_stored_words(tmp_path: Path):
    flags = [schema.Flag(code="ranks_missing", severity="warning", message="stale words", ranks=[0, 1],
                         world_size=8),
             schema.Flag(code="clock_disagreement", severity="warning", message="as stage 05 wrote it")]
    summary = schema.TraceSummary(ranks=[], decode=schema.DecodeSummary.empty(), trace_info=None,
                                  collectives_matched=None, roofline=None, flags=flags)
    lines = [artifact_caveat_text(c, "decode step")
             for c in _trace_caveats(RunArtifacts(run_dir=tmp_path, trace_summary=summary), "decode step")]
    assert "[05 warning] ranks_missing: 2 of 8 ranks' traces given (ranks [0, 1]); no cross-rank claim is made" \
        in lines
    assert "[05 warning] clock_disagreement: as stage 05 wrote it" in lines
