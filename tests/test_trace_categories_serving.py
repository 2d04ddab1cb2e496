"""The category from the op where the kernel's name is generic (issue 35, classes 3 and 4), on
real vLLM V1 serving traces (a Llama with 80 layers at TP=4, 32 requests in flight, rank 0; H100
and MI300X, excerpts in tests/data/corpus) and on HTA's DLRM training ranks: an RCCL
`ncclDevKernel_Generic_2` inside `vllm::all_reduce` is an all-reduce, NCCL's send/recv kernels
inside `nccl:all_to_all` an all-to-all, Triton's `_fwd_kernel` inside vLLM's attention op
attention; an Inductor kernel whose name lists `all_reduce` among the ops it fused is none."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from stepscope.trace.analyze import analyze_rank
from stepscope.trace.categorize import COLLECTIVE_CATEGORIES, categorize_work, classify_name, make_rules

RULES = make_rules()
CORPUS = Path(__file__).parent / "data" / "corpus"
MI300X = CORPUS / "tracemap-mi300x-vllm-v1-llama80l-tp4-c32.json.gz"
H100 = CORPUS / "tracemap-h100-vllm-v1-llama80l-tp4-c32.json.gz"
INDUCTOR_ADD = "triton_poi_fused_add_all_reduce_bitwise_and_bitwise_or_embedding_ge_lt_masked_fill_mul_sub_0"


@cache
def _rank(path: Path):
    from stepscope.trace.load import load_rank

    return analyze_rank(load_rank(path, allow_no_rank=True), RULES)


def _steps(r) -> pd.DataFrame:
    return r.steps_tot[r.steps_tot["n_events"] > 0]


def test_rccl_generic_kernels_inside_vllm_all_reduce_are_all_reduces():
    """MI300X prefill: vLLM's all-reduce runs through RCCL as 161 `ncclDevKernel_Generic_2`
    (42.4 ms, the largest communication item); by name alone they were other_collective and the
    step read 0 all-reduces. The same kernel under `nccl:_all_gather_base` is the all-gather."""
    r = _rank(MI300X)
    w = r.work
    g = w[w["name"].str.startswith("ncclDevKernel_Generic_2")]
    by_op = g.groupby("op_context")["category"].agg(lambda c: sorted(set(c.astype(str)))).to_dict()
    assert by_op == {"vllm::all_reduce": ["all_reduce"], "nccl:_all_gather_base": ["all_gather"]}
    under_ar = g[g["op_context"] == "vllm::all_reduce"]
    assert len(under_ar) == 161 and set(under_ar["category_source"].astype(str)) == {"context"}
    assert round(float(under_ar["dur_us"].sum()), 3) == pytest.approx(42393.971, abs=0.01)
    steps = _steps(r)
    # the prefill step and the 9 decode steps (custom all-reduce inside the graphs): 161 + 1 each
    assert steps["kind"].tolist() == ["prefill"] + ["decode"] * 9
    assert steps["all_reduce_calls"].tolist() == [161] * 10
    assert steps["all_gather_calls"].tolist() == [1] * 10
    assert steps["other_collective_calls"].tolist() == [0] * 10
    assert not (w["category"].astype(str) == "other_collective").any()


def test_triton_prefill_attention_inside_the_attention_op_is_attention():
    """vLLM's Triton prefill attention `_fwd_kernel` (80 calls, one per layer, 7.1 ms): no name
    rule knows it; the attention op around it names it."""
    w = _rank(MI300X).work
    fwd = w[w["name"] == "_fwd_kernel"]
    assert len(fwd) == 80 and set(fwd["category"].astype(str)) == {"attention"}
    assert set(fwd["op_context"].astype(str)) == {"vllm::unified_attention_with_output"}
    assert round(float(fwd["dur_us"].sum()), 3) == pytest.approx(7115.506, abs=0.01)
    assert not (w["category"].astype(str) == "other").any()


def test_an_inductor_kernel_that_fused_the_add_before_an_all_reduce_is_no_collective():
    """H100: Inductor's `triton_poi_fused_add_all_reduce_..._0` is the 1.6 µs residual add before
    `vllm.all_reduce`, once per step; read as an all-reduce, every step had 162 of them."""
    r = _rank(H100)
    w = r.work
    k = w[w["name"] == INDUCTOR_ADD]
    assert len(k) == 10 and set(k["category"].astype(str)) == {"elementwise"}
    steps = _steps(r)
    assert steps["all_reduce_calls"].tolist() == [161] * 10
    assert steps["all_gather_calls"].tolist() == [1] * 10
    # names that merely list a collective among fused ops, against real collectives' names
    for name in (INDUCTOR_ADD, "triton_red_fused_all_gather_into_tensor_cat_0", "triton_poi_fused_all_to_all_1"):
        assert classify_name(name, "kernel", RULES) not in COLLECTIVE_CATEGORIES, name
    for name, cat in (("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 4>(...)", "all_reduce"),
                      ("ncclDevKernel_AllToAll_RING_LL", "all_to_all"),
                      ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "other_collective")):
        assert classify_name(name, "kernel", RULES) == cat, name


def test_sendrecv_kernels_inside_all_to_all_are_all_to_all(real_traces: Path):
    """DLRM training, rank 3 of 8 (HTA): its 21 `ncclKernel_SendRecv_...` kernels run inside
    `nccl:all_to_all` and are the step's largest communication; once other_collective, the
    headline led with 'other_collective'. all_to_all is a category of its own, and each is still
    a collective call (matched across ranks, counted per step)."""
    w = _rank(real_traces / "hta-rank3-of-8-sendrecv-training.json.gz").work
    sr = w[w["name"].str.startswith("ncclKernel_SendRecv")]
    assert len(sr) == 21
    assert set(sr["category"].astype(str)) == {"all_to_all"}
    assert set(sr["op_context"].astype(str)) == {"nccl:all_to_all"}
    assert sr["collective_call"].all()
    assert round(float(sr["dur_us"].sum()), 3) == pytest.approx(54296.0, abs=0.01)


def test_one_rule_for_every_op_the_op_decides_what_the_name_leaves_open():
    """The same context decides differently by what the name says: a generic collective kernel
    takes a collective op's category, a kernel that names its collective keeps it, a copy inside
    the custom all-reduce stays a copy, and a generic kernel inside a compute op keeps its name's."""
    names = pd.Series(["ncclDevKernel_Generic_2(x)", "ncclDevKernel_AllGather_RING_LL",
                       "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>>",
                       "ncclDevKernel_Generic_2(x)", "_fwd_kernel", "_fwd_kernel"])
    ctx = np.array(["all_reduce", "all_reduce", "all_reduce", "norm", "attention|dense_gemm,other", ""],
                   dtype=object)
    cats, src = categorize_work(names, pd.Series(["kernel"] * 6), RULES, ctx)
    assert list(cats) == ["all_reduce", "all_gather", "elementwise", "other_collective", "attention", "other"]
    assert list(src) == ["context", "name", "name", "name", "context", "none"]
