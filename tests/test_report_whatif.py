"""The speculative-decoding what-if: each part grows by its own law, the draft is charged per
drafted token, the measured batch is used, and every default is stated."""

from __future__ import annotations

import json

import pytest

from stepscope.errors import StepscopeError
from stepscope.report import build_report
from stepscope.wording import fmt_num
from stepscope.report.whatif import Part, SpecBaseline, predict_spec_decode_tpot
from stepscope.testing.synthetic import make_synthetic_run

GEMM = {1: 100.0, 3: 110.0, 8: 200.0, 24: 400.0}
"""GEMM µs per step at M tokens (stage 02's shape: flat while weight-bound, then rising)."""
ALLREDUCE = {1024: 10.0, 4096: 12.0, 16384: 20.0}
"""One all-reduce's µs at a message size in bytes (stage 03)."""


def _baseline(batch=1.0, gemm=GEMM, allreduce=ALLREDUCE) -> SpecBaseline:
    parts = (Part("dense_gemm", 4.0, "gemm"), Part("attention", 1.0, "tokens"),
             Part("all_reduce", 2.0, "message size"), Part("norm", 0.5, "unchanged"),
             Part("idle and between steps", 2.5, "unchanged"))
    return SpecBaseline(step_ms=10.0, step_basis="period", parts=parts, batch=batch, gemm_us_by_tokens=gemm,
                        allreduce_us_by_bytes=allreduce, allreduce_bytes_per_token=1024.0)


def test_each_part_grows_by_its_own_law():
    p = predict_spec_decode_tpot(_baseline(), acceptance_length=2.0, draft_ms_per_token=0.5, draft_tokens=2)
    assert (p.draft_tokens, p.verify_tokens) == (2, 3)
    scaled = {x.name: x for x in p.parts}
    assert scaled["dense_gemm"].scale == pytest.approx(110.0 / 100.0)   # stage 02 at M=3 over M=1
    assert scaled["attention"].scale == 3.0                              # tokens
    # 3 tokens x 1024 B = 3072 B, between 1024 and 4096 in log size
    assert scaled["all_reduce"].scale == pytest.approx((10.0 + 2.0 * 0.792481250) / 10.0, rel=1e-6)
    assert scaled["norm"].scale == 1.0 and scaled["idle and between steps"].scale == 1.0
    verify = 4.4 + 3.0 + 2.0 * scaled["all_reduce"].scale + 0.5 + 2.5
    assert p.verify_ms == pytest.approx(verify)
    assert p.draft_ms == pytest.approx(1.0)
    assert p.tpot_ms == pytest.approx((verify + 1.0) / 2.0)
    assert p.speedup == pytest.approx(10.0 / p.tpot_ms)
    assert p.tok_s_per_stream == pytest.approx(1000.0 / p.tpot_ms)


def test_a_larger_message_or_more_tokens_never_cost_less():
    # gloo on the CPU demo timed 256 B at 340 µs and 4096 B at 325 µs: the ratio of the curve
    # at 3x the message is noise below 1, and the what-if read it as a cheaper all-reduce.
    p = predict_spec_decode_tpot(_baseline(gemm={1: 100.0, 4: 95.0}, allreduce={256: 340.0, 4096: 325.0}),
                                 2.0, 0.5, draft_tokens=2)
    scaled = {x.name: x for x in p.parts}
    for name in ("dense_gemm", "all_reduce"):
        assert scaled[name].scale == 1.0 and scaled[name].ms == scaled[name].base_ms
        assert "below 1 is noise between near-equal points: ×1" in scaled[name].source


def test_not_the_acceptance_over_draft_tautology():
    # attention and the all-reduce grow with M, so the speed-up is below a / (1 + draft share)
    p = predict_spec_decode_tpot(_baseline(), 3.0, draft_ms_per_token=0.5, draft_tokens=3)
    assert p.speedup < 3.0 / (1 + 1.5 / 10.0) - 0.3


def test_draft_is_charged_per_drafted_token():
    p2 = predict_spec_decode_tpot(_baseline(), 2.0, 0.5, draft_tokens=2)
    p4 = predict_spec_decode_tpot(_baseline(), 2.0, 0.5, draft_tokens=4)
    assert p4.draft_ms == pytest.approx(2 * p2.draft_ms)
    assert p4.verify_tokens == 5 and p4.tpot_ms > p2.tpot_ms


def test_the_measured_batch_sets_the_gemm_m():
    p = predict_spec_decode_tpot(_baseline(batch=8.0), 2.0, 0.5, draft_tokens=2)
    gemm = next(x for x in p.parts if x.name == "dense_gemm")
    assert gemm.scale == pytest.approx(400.0 / 200.0)   # 24 tokens over 8
    assert p.batch == 8.0 and not any("batch" in a for a in p.assumptions)


def test_every_default_is_stated():
    p = predict_spec_decode_tpot(_baseline(batch=None, gemm=None, allreduce=None), 2.0, 0.5)
    said = " | ".join(p.assumptions)
    assert "batch: default 1" in said
    assert "dense_gemm: default: ×1, no GEMM prediction from stage 02" in said
    assert "all_reduce: default: ×1, no latency-vs-size curve from stage 03" in said
    assert "(default: ceil(acceptance))" in said and p.draft_tokens == 2


def test_beyond_the_grid_extrapolates_and_says_so():
    p = predict_spec_decode_tpot(_baseline(batch=16.0), 2.0, 0.5, draft_tokens=2)
    gemm = next(x for x in p.parts if x.name == "dense_gemm")
    assert gemm.scale > 1.0 and "extrapolated" in gemm.source


@pytest.mark.parametrize("a,k", [(3.5, 2), (0.5, 2), (2.0, 0)])
def test_impossible_inputs_are_refused(a, k):
    with pytest.raises(StepscopeError, match="predict_spec_decode_tpot|impossible"):
        predict_spec_decode_tpot(_baseline(), a, 0.5, draft_tokens=k)


def test_report_uses_the_measured_batch_and_the_period(tmp_path):
    run = make_synthetic_run(tmp_path / "run")
    p = run / "05_categorize" / "summary.json"
    s = json.loads(p.read_text())
    s["trace_info"]["batch_size"] = 32.0
    p.write_text(json.dumps(s))
    (run / "02_gemm_micro" / "prediction.json").unlink()
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    sec = md.split("## 7.", 1)[1].split("## 8.", 1)[0]
    period = s["decode"]["period_ms"]["mean"]
    assert f"measured decode step of **{period:.3g} ms** (period) at **32 requests per step**" in sec
    assert "no GEMM prediction from stage 02" in sec   # the default, in the table itself
    assert "quant_gemm 4.00" in sec  # the parts table names each part with its measured ms


def test_no_whatif_without_decode_steps(tmp_path):
    run = make_synthetic_run(tmp_path / "run", kind="training")
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    sec = md.split("## 7.", 1)[1].split("## 8.", 1)[0]
    assert "Not projected: this is a training trace" in sec and "| acceptance" not in sec


def test_a_stall_in_the_baseline_is_named_in_the_whatif(tmp_path):
    run = make_synthetic_run(tmp_path / "run", launch_bound=True, stall=True)
    gap = json.loads((run / "05_categorize" / "summary.json").read_text())["decode"]["largest_gap"]["dur_ms"]
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    sec = md.split("## 7.", 1)[1].split("## 8.", 1)[0]
    assert f"**The measured step holds one {gap:.3g} ms stall**" in sec


def test_a_rows_defaults_name_the_parts_and_keep_the_batch_in_full():
    from stepscope.report.build import _defaulted

    said = _defaulted(("batch: default 1 request per step (the trace gave no batch)", "k = 2 drafted tokens per step",
                       "fused_moe: default: ×1, no GEMM prediction from stage 02", "lm_head: default: ×1, no GEMM"))
    assert said == "batch: default 1 request per step (the trace gave no batch); fused_moe, lm_head (below)"
    assert _defaulted(("k = 3 drafted tokens per step",)) == "no default used"


def test_under_load_the_whatif_uses_the_batch_it_was_measured_at(tmp_path, real_traces):
    # Issue 22: the batch-1 capture's what-if said nothing of the plateau's batch. The real c=16
    # CPU load trace decodes 14-15 requests per step; its level is projected at that batch.
    from stepscope import schema
    from stepscope.report.artifacts import load_run_artifacts
    from stepscope.report.build import report_context, writeup_params_from
    from stepscope.report.whatif import load_baselines, whatif_table
    from stepscope.trace import load_anatomy as la
    from stepscope.trace.analyze import analyze_traces

    run = tmp_path / "run"
    analyze_traces(sorted(real_traces.glob("vllm-cpu-tinyllama-tp2-rank*.pt.trace.json.gz")), run / "05_categorize",
                   progress=False, perfetto=False)
    r = analyze_traces(sorted(real_traces.glob("vllm-cpu-tinyllama-tp2-c16-rank*.pt.trace.json.gz")),
                       tmp_path / "scratch", progress=False, perfetto=False).reference
    table, summary = la.build([(16, "04_profiler_capture/c16/traces", r.steps_tot, r.step_categories)], run, rank=0)
    schema.write_table(table, run / "05_categorize" / "load_anatomy.csv", schema.LoadAnatomyRow)
    schema.write(run / "05_categorize" / "load_anatomy.json", summary, schema.LoadAnatomySummary)

    a = load_run_artifacts(run)
    (base,) = load_baselines(a)
    dec = table[table["step_kind"] == "decode"].drop_duplicates("decode_requests")
    want = float((dec["decode_requests"] * dec["n_steps"]).sum() / dec["n_steps"].sum())
    assert base.concurrency == 16 and base.batch == pytest.approx(want) and 13 < base.batch <= 16
    assert base.step_ms == pytest.approx(float((dec["period_ms"] * dec["n_steps"]).sum() / dec["n_steps"].sum()))
    assert sum(p.ms for p in base.parts) >= base.step_ms - 1e-9
    p = predict_spec_decode_tpot(base, 2.0, 0.1 * base.step_ms, draft_tokens=2)
    assert p.batch == base.batch
    assert f"batch: {fmt_num(base.batch)} decode requests per step, as measured in the c=16 load trace" in p.assumptions

    ctx = report_context(a, writeup_params_from(a))
    one = ctx.whatif.predictions[0]
    assert one.batch == 1 and [b.batch for b, _ in ctx.whatif.load] == [base.batch]
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    sec = md.split("### Under load: at the batch each level was measured at", 1)[1].split("## 8.", 1)[0]
    wp = writeup_params_from(a)
    preds = whatif_table(base, wp.acceptance_lengths, wp.draft_cost_fractions, wp.verify_extra_tokens)
    best = max(preds, key=lambda x: x.speedup)
    assert f"| 16 | {fmt_num(base.batch)} | {fmt_num(base.step_ms)} | {fmt_num(best.speedup)} |" in sec
    assert f"At c=16 ({fmt_num(base.batch)} decode requests per step, measured) the best case" in sec
    row = next(ln for ln in sec.splitlines() if ln.startswith("| 16 |"))
    assert "dense_gemm" in row and "all_reduce" in row  # no stage 02/03 here: their x1 is said, per level


def test_the_routed_experts_grow_with_the_distinct_experts_touched():
    """fused_moe scales by D(batch·M) / D(batch), not by the GEMM curve nor ×1: at batch 1 and
    M = 3 a 64-expert top-8 layer touches 8 → 21.1 experts, 2.64× (issue 34's tiny DeepSeek-V3)."""
    parts = (Part("fused_moe", 0.17, "experts"), Part("idle and between steps", 5.0, "unchanged"))
    base = SpecBaseline(step_ms=5.17, step_basis="period", parts=parts, batch=1.0, gemm_us_by_tokens=GEMM,
                        experts=(64, 8))
    (moe, _) = predict_spec_decode_tpot(base, 2.0, 0.0, draft_tokens=2).parts
    assert moe.scale == pytest.approx((1 - (7 / 8) ** 3) / (1 - 7 / 8))   # 2.640625
    assert moe.ms == pytest.approx(0.17 * 2.640625)
    assert "E = 64, top-8: 8.00 → 21.1 experts per layer" in moe.source
    # at batch 16 most experts are already touched: 56.4 → 63.6 per layer, 1.13×
    (moe16, _) = predict_spec_decode_tpot(SpecBaseline(**{**base.__dict__, "batch": 16.0}), 2.0, 0.0,
                                          draft_tokens=2).parts
    assert moe16.scale == pytest.approx((1 - (7 / 8) ** 48) / (1 - (7 / 8) ** 16))
    # without the architecture the experts follow stage 02's GEMM curve, and say so
    (gemm, _) = predict_spec_decode_tpot(SpecBaseline(**{**base.__dict__, "experts": None}), 2.0, 0.0,
                                         draft_tokens=2).parts
    assert gemm.scale == pytest.approx(110.0 / 100.0) and gemm.law.startswith("stage 02's GEMM time")


def test_the_baseline_is_stage_05s_step_basis(tmp_path):
    """Stage 05 chose the span (its period is unreliable here): the what-if's step is that span,
    not a period it chose again for itself."""
    from stepscope.report.analysis import decode_step_totals
    from stepscope.report.artifacts import load_run_artifacts
    from stepscope.report.whatif import spec_baseline

    run = make_synthetic_run(tmp_path / "run")
    p = run / "05_categorize" / "summary.json"
    s = json.loads(p.read_text())
    s["decode"]["denominator"], s["decode"]["denominator_reason"] = "span", "steps overlap"
    p.write_text(json.dumps(s))
    a = load_run_artifacts(run)
    base = spec_baseline(a, decode_step_totals(a), a.decode_categories)
    assert (base.step_basis, base.step_ms) == ("span", pytest.approx(s["decode"]["steps"]["span_ms"]["mean"]))
    assert base.step_ms != pytest.approx(s["decode"]["period_ms"]["mean"])
