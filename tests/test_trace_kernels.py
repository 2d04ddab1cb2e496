"""The largest kernels of each category (category_kernels.csv, the notebook's table and the
report's): checked against the raw trace and against the category totals they split."""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest

from stepscope.report import build_report
from stepscope.report.numbers import fmt_num
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
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    k = pd.read_csv(run / "05_categorize" / "category_kernels.csv")
    top = k[k["rank"] == 0].iloc[0]
    assert (top["category"], top["name"]) == ("all_reduce", "_c10d_functional::wait_tensor")
    assert 0.55 < top["share_of_category"] < 0.65
    assert "The largest ops of the 3 largest categories" in md and "| category | op |" in md
    assert (f"| all_reduce | `_c10d_functional::wait_tensor` | of {int(top['n_names'])} | "
            f"{fmt_num(top['sum_ms_per_step'])} | {fmt_num(100 * top['share_of_category'])} | "
            f"{fmt_num(int(top['calls_per_step']))} | {fmt_num(top['us_per_call'])} |") in md


def test_a_run_folder_without_the_table_still_reports(tmp_path, real_traces):
    # Run folders written before category_kernels.csv existed: no section, no error.
    run = tmp_path / "run"
    analyze_traces([real_traces / GPTOSS], run / "05_categorize", progress=False, perfetto=False)
    (run / "05_categorize" / "category_kernels.csv").unlink()
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    assert "The largest kernels" not in md and "## 4. Profiler breakdown" in md
