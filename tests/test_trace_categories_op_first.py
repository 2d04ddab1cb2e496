"""Categories from the op first, the name second (issue 23, item 3), each on a real trace
that shows it: a generic NCCL kernel named by the op that issued it, MoE GEMMs by their
naming families, MX formats read weights and activations apart, attention by its module,
resampling and a vision model's argmax kept out of sampling, MIOpen's layout transposes
with the convolutions they serve."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.trace.analyze import analyze_rank
from stepscope.trace.categorize import COLLECTIVE_CATEGORIES, classify_name, make_rules
from stepscope.trace.info import weight_formats_named
from stepscope.trace.load import load_rank
from stepscope.trace.roofline import kernel_formats, roofline_quantization

RULES = make_rules()
RESNET_DDP = "tracelens-mi300x-resnet-ddp-rank0.json.gz"
GPTOSS_B200 = "tracelens-b200-gptoss-tp8-rank0.json.gz"
TIMESFORMER = "tracelens-mi300x-timesformer.json.gz"


def _rank(real_traces: Path, name: str):
    return analyze_rank(load_rank(real_traces / name, allow_no_rank=True), RULES)


def _us(work, mask) -> float:
    return round(float(work.loc[mask, "dur_us"].sum()), 3)


def test_generic_nccl_kernel_is_named_by_the_op_that_issued_it(real_traces: Path):
    """ResNet DDP on MI300X (RCCL 2.22): every collective runs as `ncclDevKernel_Generic`.
    Under `nccl:all_reduce` it is an all-reduce, under `nccl:broadcast` a broadcast; by name
    alone all 17 were other_collective and the check read 0 all-reduces per step."""
    r = _rank(real_traces, RESNET_DDP)
    w = r.work
    generic = w[w["name"].str.startswith("ncclDevKernel_Generic")]
    assert len(generic) == 17
    assert generic.groupby("op_context")["category"].agg(set).to_dict() == {
        "nccl:all_reduce": {"all_reduce"}, "nccl:broadcast": {"other_collective"},
        "": {"other_collective"}}  # 5 launched before the capture began: no op to name them
    assert (generic["op_context"] == "").sum() == (generic["attribution"] == "before_capture").sum() == 5
    steps = r.steps_tot[r.steps_tot["n_events"] > 0]
    assert steps["all_reduce_calls"].tolist() == [2, 2, 2]
    assert steps["other_collective_calls"].tolist() == [2, 2, 2]
    assert _us(w, w["category"] == "all_reduce") == pytest.approx(47137.038, abs=0.01)
    # A kernel whose own name says its collective keeps it whatever encloses it.
    assert classify_name("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", "kernel", RULES) == "other_collective"


def test_atens_broadcast_kernel_is_elementwise_not_a_collective():
    """ATen's `type_specialized_broadcast_kernel` broadcasts operands of an elementwise op; on
    a one-GPU trace it made 'Communication is exposed' at world size 1."""
    name = ("void at::native::type_specialized_broadcast_kernel<at::native::CUDAFunctor_add<float>, "
            "std::array<char*, 3ul>>(long, std::array<char*, 3ul>)")
    assert classify_name(name, "kernel", RULES) not in COLLECTIVE_CATEGORIES
    assert classify_name("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
                         "kernel", RULES) == "other_collective"


def test_trtllm_gen_moe_gemms_are_fused_moe_on_the_b200_gptoss_trace(real_traces: Path):
    """vLLM gpt-oss at TP=8 on B200 (rank 0, one 888-token prefill step): the experts run as
    TRT-LLM-gen batched GEMMs over a dynamic per-expert batch. The down projection's
    `bmm_Bfloat16_MxE2m1MxE4m3_..._dynBatch_...` (no swiGlu in its name) was dense_gemm, 73 %
    of it, leaving fused_moe at 3.44 ms. An independent sum over the raw JSON (every
    `bmm_*dynBatch*` and `finalizeKernel*` kernel) gives 5,468.308 µs."""
    r = _rank(real_traces, GPTOSS_B200)
    w = r.work
    assert _us(w, w["category"] == "fused_moe") == pytest.approx(5468.308, abs=0.01)
    assert set(w.loc[w["name"].str.contains("dynBatch"), "category"]) == {"fused_moe"}
    assert (w["category"] == "fused_moe").sum() == 108
    dense = w[w["category"] == "dense_gemm"]
    assert not dense["name"].str.startswith("bmm_").any()


def test_mx_formats_are_read_weights_and_activations_apart(real_traces: Path):
    """MxE2m1 is MXFP4 (the weights), MxE4m3 MXFP8 (the activations): the name used to be
    read as "fp8" because it contains E4m3."""
    assert kernel_formats("bmm_Bfloat16_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_dynBatch_sm100f") == ("mxfp4", "mxfp8")
    assert kernel_formats("bmm_MxE4m3_MxE2m1MxE4m3_Fp32_t128x16x256u2_swiGlu_dynBatch") == ("mxfp4", "mxfp8")
    assert kernel_formats("bmm_Bfloat16_E2m1E4m3_Fp32_t128x8x512_dynBatch") == ("nvfp4", "fp8")
    assert kernel_formats("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1_swiglu") == ("mxfp4", "bf16")
    assert kernel_formats("nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT") == (None, None)
    named = weight_formats_named(_rank(real_traces, GPTOSS_B200).kernels)
    assert [(n["format"], n["activations"], n["n_kernels"]) for n in named if n["format"] != "fp8"] == [
        ("mxfp4", "mxfp8", 2)]
    assert roofline_quantization(None, named) == ("mxfp4", "kernel names")


def test_marlin_moe_and_cutlass_grouped_gemms_are_fused_moe():
    for name in ("marlin_moe_wna16::Marlin<(vllm::ScalarTypeId)4, 256, 1, 8, 8, true>(...)",
                 "void cutlass::Kernel2<cutlass_moe_mm_sm90_fp8>(Params)",
                 "void cutlass::gemm::kernel::GemmGrouped<cutlass::gemm::threadblock::MmaMultistage<...>>",
                 "_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1_swiglu"):
        assert classify_name(name, "kernel", RULES) == "fused_moe", name
    assert classify_name("marlin::Marlin<...>", "kernel", RULES) == "quant_gemm"  # a dense INT4 GEMM


def test_eager_attention_softmax_follows_its_module_and_upsampling_is_not_sampling(real_traces: Path):
    """TimeSformer on MI300X, eager attention: its softmax (`cunn_SoftMaxForwardReg`, 41.7 ms of
    the pass) runs inside `TimesformerSelfAttention`, and is attention; by name it was
    elementwise. `upsample_nearest1d_out_frame` was sampling ("sampl")."""
    w = _rank(real_traces, TIMESFORMER).work
    soft = w[w["name"].str.contains("SoftMaxForward")]
    assert set(soft["category"]) == {"attention"}
    assert set(soft["op_context"].str.replace(r"_\d+$", "", regex=True)) == {"nn.Module: TimesformerSelfAttention"}
    assert _us(w, w["name"].str.contains("SoftMaxForward")) == pytest.approx(41722.677, abs=0.01)
    # The attention module's projections are GEMMs still (a Linear inside it stops its rule).
    linear = w[w["op_context"].str.startswith("nn.Module: Linear")]
    assert len(linear) and "attention" not in set(linear["category"])
    assert set(w.loc[w["name"].str.contains("upsample"), "category"]) == {"elementwise"}
    assert "sampling" not in set(w["category"])


def test_argmax_is_sampling_inside_an_llm_sampler_only(real_traces: Path):
    """SGLang's argmax runs inside `nn.Module: Sampler_0` (sampling); OWLv2's argmax over its
    detection labels (the same ATen kernel, no sampler) is not."""
    w = _rank(real_traces, "sglang-mi300x-qwen3-8b-decode.json.gz").work
    argmax = w[w["name"].str.contains("ArgMaxOps")]
    assert len(argmax) == 1 and argmax["category"].tolist() == ["sampling"]
    assert argmax["op_context"].tolist() == ["nn.Module: Sampler_0"]
    owlv2 = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<int, at::native::ArgMaxOps<int>, "
             "unsigned int, long, 4, 4> >(at::native::ReduceOp<int, at::native::ArgMaxOps<int>, unsigned int, long, 4, 4>)")
    assert classify_name(owlv2, "kernel", RULES) == "elementwise"


def test_miopen_layout_transposes_are_conv(real_traces: Path):
    """MIOpen converts layouts around its convolutions (`batched_transpose_*`,
    `transpose_NCHW2CNHW_*`); by name they are conv, with or without the op around them."""
    for name in ("batched_transpose_32x16_half", "transpose_NCHW2CNHW_V2_2D_WG_off64",
                 "transpose_CNHW2NCHW_V2_2D_WG_off64"):
        assert classify_name(name, "kernel", RULES) == "conv", name
    w = _rank(real_traces, RESNET_DDP).work
    assert set(w.loc[w["name"].str.contains("transpose"), "category"]) == {"conv"}


def test_collective_sizes_dtypes_and_groups_come_from_the_args(real_traces: Path, tmp_path: Path):
    """Per collective: its op, the args' dtype, message size, group and process group, and
    nccl-tests' algbw / busbw from one rank's kernel time (issue 23, item 6)."""
    import pandas as pd

    from stepscope import schema
    from stepscope.trace.analyze import analyze_traces

    analyze_traces([real_traces / RESNET_DDP], tmp_path, progress=False, perfetto=False)
    t = pd.read_csv(tmp_path / "collective_sizes.csv")
    schema.check_frame(t, schema.CollectiveSizeRow, "collective_sizes.csv")
    ar = t[t["collective"] == "all_reduce"].set_index("nelems")
    # DDP's two gradient buckets per step, bf16 from the args (the generic kernel's name says nothing)
    assert sorted(ar.index) == [2873320, 8816192] and set(ar["dtype"]) == {"bfloat16"}
    assert set(ar["dtype_source"]) == {"args"} and set(ar["group_size"]) == {8} and set(ar["process_group"]) == {0}
    big = ar.loc[8816192]
    assert big["bytes"] == 8816192 * 2 and big["calls_per_step"] == 1.0
    assert big["algbw_gbps"] == pytest.approx(big["bytes"] / big["us_per_call_median"] / 1e3)
    assert big["busbw_gbps"] == pytest.approx(big["algbw_gbps"] * 2 * 7 / 8)
    bc = t[t["collective"] == "broadcast"]
    assert len(bc) == 2 and set(bc["category"]) == {"other_collective"}
    assert bc["busbw_gbps"].tolist() == pytest.approx(bc["algbw_gbps"].tolist())


def test_a_broadcasts_dtype_is_the_tensors_not_the_kernels(real_traces: Path, tmp_path: Path):
    """NCCL broadcasts bytes (`ncclKernel_Broadcast_..._int8_t`); the args say the tensor is
    float: 53,120 elements are 212,480 bytes, not 53,120."""
    import pandas as pd

    from stepscope.trace.analyze import analyze_traces

    analyze_traces([real_traces / "hta-a100-ddp-nccl.json.gz"], tmp_path, progress=False, perfetto=False)
    t = pd.read_csv(tmp_path / "collective_sizes.csv")
    row = t[(t["collective"] == "broadcast") & (t["nelems"] == 53120)].iloc[0]
    assert (row["dtype"], row["bytes"]) == ("float", 212480.0)
    assert t.loc[t["collective"] == "all_reduce", "calls_per_step"].sum() == 5.0
