"""The corpus (issue 23, item 5): stepscope's analysis of every real trace in `tests/data/corpus/`
against facts checked by hand with an independent script (`independent_facts.py`, no stepscope).

Each trace is analysed once (stage 05, then the stage-06 report and verdict) and each fact is
its own test, so a failing fact names the trace and the fact. Facts that fail today are marked
`xfail(strict=True)` with the reason in `KNOWN_FAILING`: the fix flips them to passing, and the
strict mark then fails loudly so that the fixer removes the entry.
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from stepscope import schema
from stepscope.report.artifacts import load_run_artifacts
from stepscope.report.build import build_report, report_context, writeup_params_from
from stepscope.trace import analyze_traces

DATA = Path(__file__).parent / "data"
CORPUS = DATA / "corpus"
FACTS = {p.name.removesuffix(".facts.yaml"): yaml.safe_load(p.read_text()) for p in sorted(CORPUS.glob("*.facts.yaml"))}
CHECKS = ("kind", "n_steps", "world_size", "rank_shown", "device_events", "device_sum_ms", "collectives",
          "dominant", "shares_at_most_100", "busy_at_most_period", "verdict", "whatif", "must_say", "may_not_say",
          "headline")
# tolerances: the device sum is a sum of microsecond durations; shares and busy carry float noise
SUM_TOL_MS = 0.01
SHARE_TOL = 1e-4  # 0.01 %: the SGLang extend step's exposed times sum to 100.001 % of busy, float noise

KNOWN_FAILING: dict[tuple[str, str], str] = {
}


@cache
def _analysed(name: str, tmp_root: str) -> dict[str, Any]:
    facts = FACTS[name]
    run = Path(tmp_root) / name
    an = analyze_traces([DATA / p for p in facts["traces"]], run / "05_categorize", progress=False, perfetto=False)
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    a = load_run_artifacts(run)
    ctx = report_context(a, writeup_params_from(a))
    dc = run / "05_categorize" / "decode_categories.csv"
    verdict = schema.read(run / "06_writeup" / "verdict.json", schema.VerdictFile)
    return {"summary": an.summary, "md": md, "ctx": ctx, "verdict": verdict,
            "categories": pd.read_csv(dc) if dc.is_file() and dc.stat().st_size else pd.DataFrame()}


@pytest.fixture(scope="module")
def corpus_tmp(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("corpus"))


def _params():
    for name, facts in FACTS.items():
        # a fact the hand-check could not settle is left out of the file, and so out of the test
        for check in (c for c in CHECKS if c != "dominant" or "dominant" in facts):
            reason = KNOWN_FAILING.get((name, check))
            marks = [pytest.mark.xfail(strict=True, reason=reason + " (now passing? remove it from KNOWN_FAILING)")] \
                if reason else []
            yield pytest.param(name, check, id=f"{name}-{check}", marks=marks)


def test_corpus_is_a_corpus():
    # at least 20 traces, of at least 7 kinds; every trace a facts file names is in the repository
    assert len(FACTS) >= 20 and len({f["kind"] for f in FACTS.values()}) >= 7
    missing = [p for f in FACTS.values() for p in f["traces"] if not (DATA / p).is_file()]
    assert missing == []
    size_mb = sum(p.stat().st_size for p in CORPUS.iterdir()) / 1e6
    assert size_mb < 12, f"tests/data/corpus holds {size_mb:.1f} MB; cut new traces with cut.py"


@pytest.mark.parametrize("name,check", list(_params()))
def test_corpus_fact(name, check, corpus_tmp):
    facts, got = FACTS[name], _analysed(name, corpus_tmp)
    CHECK_FNS[check](facts, got)


def _kind(facts, got):
    info = got["summary"].trace_info
    if info is None or info.kind is None:
        pytest.xfail("trace kind not yet detected")
    assert info.kind == facts["kind"], info.kind_evidence


def _n_steps(facts, got):
    # None in the facts: the trace has no step marker, and stepscope should say so, not count one
    n = got["summary"].trace_info.n_steps
    assert (n or None) == facts["n_steps"]


def _world_size(facts, got):
    assert got["summary"].trace_info.world_size == facts["world_size"]


def _rank_shown(facts, got):
    assert got["summary"].ranks[0].rank == facts["rank_shown"]


def _device_events(facts, got):
    r = got["summary"].ranks[0]
    if facts["device_events"] == 0:  # a CPU-only trace: stepscope reads its CPU ops as the work, and says so
        assert r.mode == "cpu"
        return
    assert r.n_device_events == facts["device_events"]


def _device_sum_ms(facts, got):
    r = got["summary"].ranks[0]
    if facts["device_events"] == 0:
        assert r.mode == "cpu"
        return
    assert math.isclose(r.kernel_sum_us / 1000, facts["device_sum_ms"], abs_tol=SUM_TOL_MS)


def _collectives(facts, got):
    # every collective with calls in the judged steps, by its median count per step
    seen = {k: median for k, median in got["summary"].collectives_check.observed.per_step().items() if median}
    assert seen == facts["collectives_per_step"]


def _dominant(facts, got):
    d = got["ctx"].verdict.dominant
    assert (d.category if d is not None else None) == facts["dominant"]


def _shares_at_most_100(facts, got):
    cats = got["categories"]
    for col in ("share_of_period", "share_of_span", "exposed_share_of_busy"):
        if col in cats:
            over = cats[cats[col] > 1 + SHARE_TOL]
            assert over.empty, f"{col} over 100 %: {over[['category', col]].to_dict('records')}"
    # categories overlap (a collective beside compute), so their shares may sum past 100 %; the
    # exposed times partition busy, so theirs may not
    if "exposed_share_of_busy" in cats and cats["exposed_share_of_busy"].notna().any():
        per_rank = cats.groupby("rank")["exposed_share_of_busy"].sum()
        assert (per_rank <= 1 + SHARE_TOL).all(), f"exposed shares of busy sum past 100 %: {per_rank.to_dict()}"


def _busy_at_most_period(facts, got):
    # where steps overlap on the device a step's own work outlasts its period; what a period can
    # hold is the device's busy time within it (`period_busy_ms`, any step's work)
    steps = got["summary"].decode.steps
    busy = steps.period_busy_ms.median if steps.period_busy_ms is not None else steps.union_ms.median
    period = steps.period_ms.median if steps.period_ms is not None else None
    if busy is None or period is None:
        assert facts["n_steps"] is None or facts["n_steps"] == 1 or not facts["takes_verdict"]
        return
    assert busy <= period * (1 + SHARE_TOL), f"busy {busy:.3f} ms > period {period:.3f} ms"


def _verdict(facts, got):
    v = got["ctx"].verdict
    gave = v.dominant is not None or v.biggest is not None or bool(v.levers)
    assert gave == facts["takes_verdict"]


def _whatif(facts, got):
    assert (got["ctx"].whatif is not None) == facts["whatif"]


def _must_say(facts, got):
    assert [s for s in facts["must_say"] if s not in got["md"]] == []


def _may_not_say(facts, got):
    said = [s for s in facts["may_not_say"] if s in got["md"]]
    assert said == [], [ln for ln in got["md"].splitlines() if any(s in ln for s in said)][:3]


HEADLINE_WORDS = 60
INVARIANTS = ("share_at_most_step", "busy_at_most_period", "below_peak", "clocks_agree", "classes_add_up",
              "communication_has_collectives", "steady_state", "lever_coherent", "kind_takes_verdict",
              "device_work_recorded", "steps_apart")


def _headline(facts, got):
    # read in ten seconds: at most three sentences and 60 words, no internal name, and no
    # "biggest lever" that buys under LEVER_MIN_X
    from stepscope.thresholds import LEVER_MIN_X

    text = " ".join(s.text for s in got["verdict"].headline)
    assert len(got["verdict"].headline) <= 3 and len(text.split()) <= HEADLINE_WORDS, text
    assert not [w for w in INVARIANTS if w in text], text
    lever = got["verdict"].biggest
    if lever is not None and lever.ceiling_x < LEVER_MIN_X:
        # a host-bound step's headline names no lever at all: it says where the host was instead
        host_bound = any(s.finding == "boundness" for s in got["verdict"].headline)
        assert "biggest lever" not in text and ("No lever is worth naming" in text or host_bound), text


CHECK_FNS = {"kind": _kind, "n_steps": _n_steps, "world_size": _world_size, "rank_shown": _rank_shown,
             "device_events": _device_events, "device_sum_ms": _device_sum_ms, "collectives": _collectives,
             "dominant": _dominant, "shares_at_most_100": _shares_at_most_100,
             "busy_at_most_period": _busy_at_most_period, "verdict": _verdict, "whatif": _whatif,
             "must_say": _must_say, "may_not_say": _may_not_say, "headline": _headline}
