"""Guards before any claim (issue 23): each invariant on a real trace that breaks it or keeps it,
the claims it withdraws, the sentence that says why, and the guards as verdict.json records them."""

from __future__ import annotations

import json
import re
from msgspec.structs import replace
from pathlib import Path

import pandas as pd

from stepscope.testing.report import section
from stepscope import schema
from stepscope.cli import main
from stepscope.errors import TraceError
from stepscope.report import guards
from stepscope.report.artifacts import load_run_artifacts
from stepscope.report.build import build_report, report_context, writeup_params_from
from stepscope.trace import analyze_traces


def _run(tmp_path: Path, traces: list[Path], **kw) -> Path:
    run = tmp_path / "run"
    analyze_traces(traces, run / "05_categorize", progress=False, perfetto=False, **kw)
    return run


def _report(run: Path):
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    a = load_run_artifacts(run)
    ctx = report_context(a, writeup_params_from(a))
    g = schema.read(run / "06_writeup" / "verdict.json", schema.VerdictFile)
    return md, ctx, g, a


def _failed(g: schema.VerdictFile) -> dict[str, schema.Guard]:
    return {(r.invariant + (f":{r.subject}" if r.subject else "")): r for r in g.failed_guards}


def test_capture_gets_a_description_not_a_verdict(tmp_path, real_traces):
    # SGLang's batch-32 capture: the verdict once said "the biggest single lever is elementwise ...
    # at most 9,464x faster".
    md, ctx, g, _ = _report(_run(tmp_path, [real_traces / "tracelens-mi300x-sglang-qwen3-8b-capture.json.gz"]))
    v = ctx.verdict
    assert v.identity.kind == "capture" and list(_failed(g)) == ["kind_takes_verdict"]
    assert v.dominant is None and v.levers == () and v.biggest is None and v.boundness is None
    assert "9,464" not in md and "biggest single lever" not in md
    assert "**Verdict withheld.**\n\n- This is a CUDA-graph capture" in md
    assert "`capture_32_DECODE` ×2" in md and "Not projected: this is a CUDA-graph capture" in md


def test_mixed_step_gets_its_reading_and_no_whatif(tmp_path, real_traces):
    # vLLM piecewise: 9 prefills (8,155 tokens) beside 37 decodes once got a what-if at batch 1.
    md, ctx, g, _ = _report(_run(tmp_path, [real_traces / "tracelens-mi300x-vllm-gptoss-mixed-piecewise.json.gz"]))
    assert ctx.whatif is None and g.failed_guards == ()
    assert "each runs 9 prefill requests of 8,155 tokens beside 37 decode requests" in md
    assert "Not projected: this is a mixed trace" in md and "Projected from the measured decode step" not in md


def test_denominator_holds_the_work_on_the_ddp_trace(tmp_path, real_traces):
    # ResNet DDP: host period 16.4 ms, busy 18.7 ms; the ceiling read 3.54x instead of about 2.6x.
    md, ctx, g, _ = _report(_run(tmp_path, [real_traces / "tracelens-mi300x-resnet-ddp-rank0.json.gz"]))
    v, dec = ctx.verdict, ctx.decode
    busy = next(r for r in g.guards if r.invariant == "busy_at_most_period")
    assert busy.holds and busy.value("busy_ms") <= busy.value("step_ms")
    assert (dec["share_of_step"] <= 1).all() and v.basis.denominator == "period"
    assert 2.55 < v.biggest.ceiling_x < 2.7 and v.biggest.name == "all_reduce"


def test_a_grab_bag_is_not_the_lever(tmp_path, real_traces):
    # HTA's rank 3 of 8: elementwise, 78 kernel names with no dominant one, was "the biggest single
    # lever"; and the tables said "rank 0 unless stated" though rank 3 was the only one.
    md, ctx, g, a = _report(_run(tmp_path, [real_traces / "hta-rank3-of-8-sendrecv-training.json.gz"]))
    v = ctx.verdict
    bag = _failed(g)["lever_coherent:elementwise"]
    assert bag.value("n_names") == 78 and bag.value("top_share_pct") < 50
    assert bag.withdrawn == ("lever:elementwise",) and "elementwise" not in [lv.category for lv in v.levers]
    assert v.biggest.name != "elementwise" and "The biggest single lever is elementwise" not in md
    assert "elementwise is not named as a lever: its 78 distinct kernels are a grab-bag" in md
    assert "rank 3, the only one here" in md and "rank 0" not in md
    lever = next(r for _, r in a.category_levers.iterrows() if r["category"] == "elementwise")
    assert not lever["coherent"] and bag.value("module") is None


def test_roofline_above_peak_is_withdrawn_not_at_the_roofline(tmp_path, real_traces):
    # The gpt-oss decode step against a peak of 500 GB/s: its GEMMs read above that peak, which
    # says the bytes model does not fit, not that the kernels are "already at the roofline".
    from stepscope.model.arch import get_preset

    run = _run(tmp_path, [real_traces / "vllm-mi300x-gptoss-decode-fullgraph.json.gz"],
               arch=get_preset("gpt-oss-20b"), peaks={"name": "a 500 GB/s device", "peak_mem_bw_gbps": 500.0})
    md, ctx, g, _ = _report(run)
    over = {k: r for k, r in _failed(g).items() if k.startswith("below_peak:")}
    assert over and all(r.value("pct_peak_bw") > 100 for r in over.values())
    cats = {r.subject for r in over.values()}
    assert not cats & {r.category for r in ctx.verdict.roofline}
    assert "already run at the roofline" not in md
    for c in cats:
        assert f"Withdrawn, {c}'s roofline" in md


def test_cross_rank_claims_need_clocks_that_agree(tmp_path, real_traces):
    # Two real CPU ranks whose clocks agree; the same verdict with stage 05's clock flag raised
    # loses its transfer/wait split and the transfer ceiling of every lever.
    run = _run(tmp_path, [real_traces / f"vllm-cpu-tinyllama-tp2-rank{r}.pt.trace.json.gz" for r in (0, 1)])
    a = load_run_artifacts(run)
    ctx = report_context(a, writeup_params_from(a))
    v = ctx.verdict
    assert v.comm_split is not None and v.comm_split.status == "split"
    flagged = replace(v, comm_split=replace(v.comm_split, clock_flag=True), guards=())
    checks = guards.check(flagged, a, ctx.totals, ctx.decode)
    clock = next(c for c in checks if c.invariant == "clocks_agree")
    assert not clock.holds
    out = guards.withdraw(flagged, checks)
    assert out.comm_split is None and all(lv.transfer_ms is None for lv in out.levers)


def test_communication_on_one_rank_needs_a_collective_kernel(tmp_path, real_traces):
    # ATen's type_specialized_broadcast_kernel filed as a collective on a one-GPU trace gave
    # "Communication is exposed: 0.605 of its 0.605 ms". World size 1 and no collective kernel.
    run = _run(tmp_path, [real_traces / "sglang-mi300x-qwen3-8b-decode.json.gz"])
    a = load_run_artifacts(run)
    ctx = report_context(a, writeup_params_from(a))
    v = ctx.verdict
    from stepscope.report.verdict import Communication

    misfiled = replace(v, communication=Communication(status="exposed", comm_ms=0.605, exposed_ms=0.605,
                                                      exposed_pct=100.0), guards=())
    a.category_kernels = pd.concat([a.category_kernels, pd.DataFrame([{
        "category": "other_collective", "name": "void at::native::type_specialized_broadcast_kernel<...>",
        "sum_ms_per_step": 0.605, "share_of_category": 1.0, "n_names": 1}])], ignore_index=True)
    g = next(c for c in guards.check(misfiled, a, ctx.totals, ctx.decode)
             if c.invariant == "communication_has_collectives")
    assert not g.holds and g.value("world_size") == 1 and g.value("collective_kernels") == 0
    assert guards.withdraw(misfiled, (g,)).communication is None
    # a real collective's name passes, world size 1 or not
    assert guards.COLLECTIVE_NAME.search("ncclDevKernel_AllReduce_Sum_bf16_RING_LL")
    assert not guards.COLLECTIVE_NAME.search("type_specialized_broadcast_kernel")


def test_a_cpu_only_nccl_job_keeps_its_communication(tmp_path, real_traces):
    # HTA's CPU-only export: its six nccl:all_to_all calls run inside record_param_comms, c10d's
    # own op. It once read "filed as communication ... with no collective kernel", withdrawn.
    md, ctx, g, _ = _report(_run(tmp_path, [real_traces / "hta-cpu-only.json.gz"]))
    comm = next(r for r in g.guards if r.invariant == "communication_has_collectives")
    # record_param_comms twice: the six calls under nccl:all_to_all are all_to_all, the six waits
    # after them (outside the annotation) other_collective
    assert comm.holds and comm.value("collective_kernels") == 2
    # Its collectives are real, but their 1.87 ms are the host's time in the call: whether the
    # device's transfer was exposed is not in a trace without device events, so the guard for
    # a GPU job's host-only export withdraws the claim (it read "Communication is exposed:
    # 1.87 of its 1.87 ms per step").
    host = next(r for r in g.guards if r.invariant == "device_work_recorded")
    assert not host.holds and {"communication", "comm_split", "levers"} <= set(host.withdrawn)
    said = section(md, "Verdict")
    assert "Communication is exposed" not in said and "Whether that time is transfer or ranks waiting" not in said
    assert "of – ranks" not in md


def test_verdict_json_records_every_check_and_why(tmp_path, real_traces):
    # verdict.json carries the guards (guards.json, which repeated them, is gone) and the sentence
    # that says why a failed one withdrew its claims.
    run = _run(tmp_path, [real_traces / "tracelens-mi300x-sglang-qwen3-8b-capture.json.gz"])
    build_report(run, draw_figures=False)
    assert not (run / "06_writeup" / "guards.json").exists()
    d = json.loads((run / "06_writeup" / "verdict.json").read_text())
    failed = [g for g in d["guards"] if not g["holds"]]
    assert d["identity"]["kind"] == "capture" and len(failed) == 1 and "levers" in failed[0]["withdrawn"]
    why = [s["text"] for s in d["sentences"] if s["finding"] == "guard"]
    assert len(why) == 1 and why[0].startswith("Withdrawn, as the trace is a capture")
    # an older run folder's guards.json is ignored: the report renders, and no reader asks for it
    (run / "06_writeup" / "guards.json").write_text('{"kind": "capture", "guards": "an older shape"}')
    assert build_report(run, draw_figures=False)["markdown"].read_text().startswith("# ")
    assert "06_writeup/verdict.json" in schema.check_run_folder(run)
    assert not any("guards" in k for k in schema.check_run_folder(run))


def test_setup_counts_the_devices_the_run_used(tmp_path, real_traces):
    # One MI300X of an eight-GPU node: the trace's deviceProperties list 8, its world size is 1.
    run = _run(tmp_path, [real_traces / "sglang-mi300x-qwen3-8b-decode.json.gz"])
    md, ctx, _, _ = _report(run)
    line = next(ln for ln in md.splitlines() if ln.startswith("| Device |"))
    assert "1 × AMD Instinct MI300X (from the trace, world size" in line and "8 ×" not in line
    appendix = (run / "06_writeup" / "appendix.md").read_text()  # the step readings' table (issue 37)
    assert re.search(r"device-time sum \(every kernel's, memcpy's and memset's duration", appendix)


def test_unknown_arch_preset_exits_2_and_lists_the_presets(tmp_path, real_traces, capsys):
    code = main(["analyze", str(real_traces / "sglang-mi300x-qwen3-8b-decode.json.gz"), "--arch-preset",
                 "qwen9", "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "unknown architecture preset 'qwen9'" in err and "qwen3-8b" in err
    assert not (tmp_path / "out").exists()


def test_no_speculative_baseline_for_a_step_that_is_not_decode(tmp_path, real_traces):
    # The campaign reads its baseline through spec_baseline directly: the mixed step's what-if
    # ran at batch 1 with constant GEMM time before.
    from stepscope.report import whatif

    for name in ("tracelens-mi300x-vllm-gptoss-mixed-piecewise.json.gz", "tracelens-mi300x-sglang-qwen3-8b-capture.json.gz"):
        run = _run(tmp_path / name, [real_traces / name])
        a = load_run_artifacts(run)
        ctx = report_context(a, writeup_params_from(a))
        assert whatif.spec_baseline(a, ctx.totals, ctx.decode) is None, name
    run = _run(tmp_path / "dec", [real_traces / "sglang-mi300x-qwen3-8b-decode.json.gz"])
    a = load_run_artifacts(run)
    ctx = report_context(a, writeup_params_from(a))
    assert whatif.spec_baseline(a, ctx.totals, ctx.decode) is not None


REFUSED_TRACE = "hta-cpu-ops-outside-step.json.gz"
TRACES_WITH_A_CEILING_ABOVE_BOUND: frozenset[str] = frozenset()
"""None so far: each trace here is a run of steps or called a capture."""


def test_guards_are_the_first_test_of_every_trace(tmp_path, real_traces):
    # Each trace file alone, as `stepscope analyze` would read it: no share past 100 %, busy
    # within the period, no verdict for a capture, no grab-bag called the biggest lever.
    refused = []
    for p in sorted(real_traces.glob("*.json.gz")):
        try:
            run = _run(tmp_path / p.name, [p])
        except TraceError:
            refused.append(p.name)
            continue
        md, ctx, g, _ = _report(run)
        v, failed = ctx.verdict, _failed(g)
        assert "share_at_most_step" not in failed and "busy_at_most_period" not in failed, (p.name, list(failed))
        if ctx.decode is not None and "share_of_step" in ctx.decode:
            assert (ctx.decode["share_of_step"] <= 1.01).all(), p.name
        if v.identity.kind == "capture":
            assert v.biggest is None and v.dominant is None and "biggest single lever" not in md, p.name
        bags = {r.subject for r in g.guards if r.invariant == "lever_coherent" and not r.holds}
        assert v.biggest is None or v.biggest.name not in bags, p.name
        assert ("steady_state" in failed) == (p.name in TRACES_WITH_A_CEILING_ABOVE_BOUND), p.name
        assert "steps_apart" not in failed, p.name  # none of these pipelines its steps (the corpus has one)
        if not v.identity.takes_decode_verdict:
            assert ctx.whatif is None, p.name
    assert refused == [REFUSED_TRACE]  # no work to analyse (test_verdict_json says what the report says)


def test_the_guard_reads_stage_05s_mark_not_its_own_copy(tmp_path, real_traces):
    # One home for the grab-bag test (trace.account.lever_coherent): the guard withdraws the lever
    # stage 05 marked incoherent, and only it. Flip the mark on disk and the guard follows it.
    run = _run(tmp_path, [real_traces / "sglang-mi300x-qwen3-8b-decode.json.gz"])
    a = load_run_artifacts(run)
    ctx = report_context(a, writeup_params_from(a))
    v = ctx.verdict
    best = v.levers[0]
    assert best.category == "dense_gemm" and best.coherent is True and best.n_names == 5
    p = run / "05_categorize" / "category_levers.csv"
    lv = pd.read_csv(p)
    lv.loc[lv["category"] == "dense_gemm", "coherent"] = False
    lv.to_csv(p, index=False)
    a2 = load_run_artifacts(run)
    ctx2 = report_context(a2, writeup_params_from(a2))
    v2 = ctx2.verdict
    bag = next(g for g in v2.guards if g.invariant == "lever_coherent" and g.subject == "dense_gemm")
    assert not bag.holds and bag.withdrawn == ("lever:dense_gemm",)
    assert "dense_gemm" not in [x.category for x in v2.levers] and v2.biggest.name != "dense_gemm"


def test_one_operation_is_one_lever_in_stage_05_too(tmp_path, real_traces):
    # HTA's rank 3: dense_gemm runs 64 GEMM names, its largest 3 holding 19 %. Stage 05 called it a
    # grab-bag while the report's own copy of the test exempted GEMMs: two homes that disagreed.
    run = _run(tmp_path, [real_traces / "hta-rank3-of-8-sendrecv-training.json.gz"])
    lv = pd.read_csv(run / "05_categorize" / "category_levers.csv").set_index("category")
    assert lv.loc["dense_gemm", "n_names"] == 64 and lv.loc["dense_gemm", "top_share"] < 0.2
    assert bool(lv.loc["dense_gemm", "coherent"]) and "one operation" in lv.loc["dense_gemm", "why"]
    assert not bool(lv.loc["elementwise", "coherent"])


def test_many_kernels_inside_one_module_are_one_lever():
    from stepscope.trace.account import lever_coherent

    assert not lever_coherent("elementwise", 78, 0.26)
    assert not lever_coherent("elementwise", 78, 0.26, module_share=0.49)
    assert lever_coherent("elementwise", 78, 0.26, module_share=0.5)
    assert lever_coherent("attention", 78, 0.26) and lever_coherent("elementwise", 39, 0.1)


def test_the_lever_sentence_names_its_kernels_and_module(tmp_path, real_traces):
    # HF Qwen1.5 eager: dense_gemm is one cuBLAS kernel; rotary's 11 names run 99.7 % inside
    # Qwen2Attention, so a fix to it is a fix to that module.
    from stepscope.wording import fmt_num
    from stepscope.report.prose import lever_sentence, lever_what_clause

    md, ctx, _, _ = _report(_run(tmp_path, [real_traces / "hf-h100-qwen1.5-0.5b-eager.json.gz"]))
    v = ctx.verdict
    best, rot = v.levers[0], next(lv for lv in v.levers if lv.category == "rotary")
    assert best.category == "dense_gemm" and best.n_names == 1 and best.module_share_pct < 50
    txt = lever_sentence(v.levers, v.identity.step_label)
    assert "; its one kernel is `sm90_xmma_gemm_bf16bf16_bf16f32_f32" in txt and "runs inside" not in txt
    assert txt.split("; next is")[0] in md
    assert rot.n_names == 11 and rot.module == "Qwen2Model/Qwen2DecoderLayer/Qwen2Attention"
    clause = lever_what_clause(rot)
    assert clause.startswith("99.7 % of it runs inside `Qwen2Model/Qwen2DecoderLayer/Qwen2Attention`, and of its "
                             "11 kernels, `void at::native::elem")
    assert clause.endswith(f" hold {fmt_num(rot.top_share_pct)} % of its time") and len(rot.top_kernels) == 3


def test_a_real_clock_offset_withdraws_the_cross_rank_claims(tmp_path, real_traces):
    """The two real CPU ranks with rank 1's clock set 20 ms ahead (every `ts` shifted, as an
    unsynchronised host would write it): stage 05 flags the clocks from the matched collectives'
    ends, and the verdict withdraws the transfer/wait split with the headline saying why."""
    import gzip

    paths = []
    for r in (0, 1):
        d = json.load(gzip.open(real_traces / f"vllm-cpu-tinyllama-tp2-rank{r}.pt.trace.json.gz"))
        for e in d["traceEvents"] if r == 1 else ():
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] += 20_000.0
        paths.append(tmp_path / f"rank{r}.pt.trace.json.gz")
        with gzip.open(paths[-1], "wt") as fh:
            json.dump(d, fh)
    md, ctx, g, a = _report(_run(tmp_path, paths))
    assert list(_failed(g)) == ["clocks_agree"]
    flag = next(f for f in a.trace_summary.flags if f.code == "clock_disagreement")
    assert flag.message == ("rank 1's matched collectives end 20.0 ms (median) from rank 0's: their clocks disagree, "
                            "so cross-rank skews are not trusted")
    assert ctx.verdict.comm_split is None and all(lv.transfer_ms is None for lv in ctx.verdict.levers)
    assert "Caveat: the ranks' clocks disagree, so the cross-rank claims are withdrawn." in md
