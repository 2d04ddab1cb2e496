"""A sweep level's engine time cut by the level's own steps, as its streams saw them, checked by
the engine's own iteration count, with the trace's steps set beside them.

Data: run `moe-quiet1` (2026-12-05, a quiet AVX2-only 2-core machine): the tiny DeepSeek-V3 at
TP=2, its c=4 and c=16 sweep levels' request records, vLLM's /metrics scrapes over them, and
the c=16 load capture's rank-0 trace (tests/data/sweep/README.md, tests/data/traces/README.md)."""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest

from stepscope import schema
from stepscope.report import load as rl
from stepscope.sweep.metrics import RequestRecord, level_metrics
from stepscope.trace import load_reconcile as lr
from stepscope.trace.analyze import analyze_traces


def _records(real_traces, c: int) -> list[RequestRecord]:
    path = real_traces.parent / "sweep" / f"vllm-cpu-tinydsv3-tp2-quiet1-c{c:04d}.jsonl.gz"
    with gzip.open(path, "rt") as fh:
        return [RequestRecord.from_dict(json.loads(line)) for line in fh if line.strip()]


@pytest.fixture(scope="module")
def scrapes(real_traces) -> pd.DataFrame:
    return pd.read_csv(real_traces.parent / "sweep" / "vllm-cpu-tinydsv3-tp2-quiet1-server_metrics.csv")


@pytest.fixture(scope="module")
def c16_steps(real_traces, tmp_path_factory) -> pd.DataFrame:
    an = analyze_traces([real_traces / "vllm-cpu-tinydsv3-tp2-quiet1-c16-rank0.pt.trace.json.gz"],
                        tmp_path_factory.mktemp("c16"), progress=False, perfetto=False)
    return an.reference.steps_tot


def _rec(t0: float, chunks: list[float]) -> RequestRecord:
    return RequestRecord(start_s=t0, chunk_times_s=chunks, end_s=chunks[-1] + 0.001, output_tokens=len(chunks),
                         success=True)


def test_a_step_is_where_the_requests_counters_line_up():
    """A at 0.10 alone (its prefill), A at 0.12, A with B's first token at 0.14 (a mixed step: B is 2
    steps behind A), both at 0.16; then a backlog sent at once: A's two chunks within 1 ms with B's
    between, which B's offset puts in A's first of the two; and two first tokens 20 ms apart (two
    steps, though no request repeats)."""
    recs = [_rec(0.0, [0.10, 0.12, 0.14, 0.16, 0.2000, 0.2005]), _rec(0.11, [0.1402, 0.1601, 0.2003]),
            _rec(0.25, [0.30]), _rec(0.25, [0.32])]
    steps = lr.client_steps(recs)
    assert steps["t_s"].tolist() == pytest.approx([0.10, 0.12, 0.14, 0.16, 0.2000, 0.2005, 0.30, 0.32])
    assert steps["steps"].tolist() == [1] * 8
    assert steps["prefills"].tolist() == [1, 0, 1, 0, 0, 0, 1, 1]
    assert steps["chunks"].tolist() == [1, 1, 2, 2, 2, 1, 1, 1]


def test_a_chunk_of_several_tokens_is_several_steps():
    """A server that streams every 4 tokens (vLLM's stream interval): 13 tokens in 4 chunks, the
    first the prefill's alone, each later one 4 decode steps."""
    rec = RequestRecord(start_s=0.0, chunk_times_s=[0.1, 0.2, 0.3, 0.4], end_s=0.41, output_tokens=13, success=True)
    assert lr.client_steps([rec])["steps"].tolist() == [1, 4, 4, 4]


@pytest.mark.parametrize("c, found, counted", [(4, 494, 494), (16, 267, 267)])
def test_the_levels_steps_are_the_engines(real_traces, scrapes, c, found, counted):
    """The steps the streams show are vLLM's own iteration count, to the step, at both levels."""
    assert lr.engine_iterations(scrapes, c) == counted
    assert lr.client_steps(_records(real_traces, c))["steps"].sum() == found


def test_a_levels_time_is_cut_by_its_own_steps(real_traces, scrapes, c16_steps):
    """c=16's 15.29 s: 1.01 s of stalls, 0.15 s of ramp-up, turnaround and drain, and 14.13 s of
    engine time owned by its steps, 243.6 decode steps of 43.5 ms and 19.9 prefill or mixed steps of
    177 ms. Its requests run in waves (all 32 tokens long, started together), so a prefill step holds
    6.4 prefills, where the capture's staggered load held 1: priced at the trace's steps its tokens
    take 14.90 s, not 14.13."""
    recs = _records(real_traces, 16)
    rec = lr.reconcile_level(recs, 16, c16_steps, None, 2.19, lr.engine_iterations(scrapes, 16))
    parts = rec["parts"]
    assert rec["level_s"] == pytest.approx(level_metrics(recs)["duration_s"])
    assert sum(parts.values()) == pytest.approx(rec["level_s"], abs=1e-9)
    assert (parts["decode_steps"], parts["prefill_mixed_steps"], parts["stalls"]) == pytest.approx(
        (10.591, 3.534, 1.008), abs=1e-3)
    assert abs(parts["unexplained"]) < 1e-3 and rec["adds_up"] and rec["steps_agree"]
    assert (rec["decode_steps"], rec["prefill_mixed_steps"]) == pytest.approx((243.65, 19.93), abs=0.01)
    assert (rec["level_decode_period_ms"], rec["level_prefill_period_ms"]) == pytest.approx((43.47, 177.3), abs=0.05)
    assert (rec["level_prefills_per_step"], rec["prefills_per_step"]) == pytest.approx((6.368, 1.0), abs=1e-3)
    assert rec["decode_period_ms"] == pytest.approx(48.68, abs=0.01)
    assert rec["traced_steps_s"] == pytest.approx(14.898, abs=1e-3)
    schema.record_of(dict(rec, records="c0016.jsonl"), schema.LoadReconciliationLevel)


def test_steps_the_engine_did_not_count_do_not_add_up(real_traces, c16_steps):
    """Had vLLM counted 300 iterations, the 267 steps found would be 11 % short: the level does not
    add up, whatever its time's remainder, and the report says why."""
    rec = lr.reconcile_level(_records(real_traces, 16), 16, c16_steps, None, None, 300.0)
    assert rec["steps_agree"] is False and not rec["adds_up"]
    level = schema.record_of(dict(rec, records="c0016.jsonl"), schema.LoadReconciliationLevel)
    assert rl.steps_clause(level) == ("; vLLM counted 300 iterations where the level's streams showed 267 steps, "
                                      "so the steps' parts are not the engine's")
    no_counter = lr.reconcile_level(_records(real_traces, 16), 16, c16_steps)
    assert no_counter["steps_agree"] is None and no_counter["adds_up"]


def test_the_report_sets_the_levels_steps_beside_the_traces(real_traces, scrapes, c16_steps):
    rec = lr.reconcile_level(_records(real_traces, 16), 16, c16_steps, None, 2.19, lr.engine_iterations(scrapes, 16))
    level = schema.record_of(dict(rec, records="c0016.jsonl"), schema.LoadReconciliationLevel)
    assert rl.reconciliation_sentence(level) == (
        "of the sweep level's 15.3 s, the largest parts were decode steps 10.6 s (69 %), prefill and mixed steps "
        "3.53 s (23 %), server-wide stalls 1.01 s (6.6 %); priced at the trace's steps its tokens take 14.9 s of "
        "steps against the 14.1 s they took (a decode step took 43.5 ms in the level and 48.7 ms in the trace, "
        "whose profiler cost 2.19 ms a step at batch 1; a prefill or mixed step held 6.37 prefills in the level "
        "and 1.00 in the trace)")
    table = rl.reconciliation_section(schema.LoadReconciliation(tolerance_share=0.05, levels=[level]))
    assert "| 16 | 15.3 | 10.6 | 3.53 | 1.01 |" in table
    assert "| yes | 267 / 267 | 43.5 / 48.7 | 6.37 / 1.00 | 14.9 |" in table
