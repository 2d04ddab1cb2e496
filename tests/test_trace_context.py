"""Categories that follow the op: the enclosing module / function / op / annotation first,
the kernel's name second; catch-all matches in their own labelled bucket; training traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stepscope.trace.analyze import analyze_rank
from stepscope.trace.categorize import CATCH_ALL_CATEGORY, categorize, make_rules
from stepscope.trace.load import load_rank

RULES = make_rules()


def _work(real_traces: Path, name: str):
    rt = load_rank(real_traces / name, allow_no_rank=True)
    return analyze_rank(rt, RULES).work


def _us(work, mask) -> float:
    return round(float(work.loc[mask, "dur_us"].sum()), 3)


def test_h100_eager_norm_and_rotary_follow_their_modules(real_traces: Path):
    w = _work(real_traces, "hf-h100-qwen1.5-0.5b-eager.json.gz")
    # By kernel name alone only rsqrt is "norm" and rotary is empty ...
    by_name = categorize(w["name"], np.full(len(w), "kernel"), RULES)
    assert _us(w, by_name == "norm") == 113.572 and _us(w, by_name == "rotary") == 0.0
    # ... by the enclosing frames (module frames nn.Module: Qwen2RMSNorm_N, function frames
    # apply_rotary_pos_emb / rotate_half) both are populated.
    assert _us(w, w["category"] == "norm") == 7412.492 and (w["category"] == "norm").sum() == 413
    assert _us(w, w["category"] == "rotary") == 6972.257 and (w["category"] == "rotary").sum() == 249
    norm = w[w["category"] == "norm"]
    assert set(norm["op_context"].str.extract(r"nn\.Module: (\w+)_\d+")[0].dropna()) == {"Qwen2RMSNorm"}
    # RMSNorm in eager mode is pow, mean, add, rsqrt, mul and dtype copies.
    for piece in ("pow_tensor_scalar", "MeanOps", "rsqrt", "MulFunctor"):
        assert norm["name"].str.contains(piece).any(), piece
    rot = w[w["category"] == "rotary"]
    assert rot["name"].str.contains("CatArrayBatchedCopy").any() and rot["name"].str.contains("neg_kernel").any()
    assert rot["op_context"].astype(str).value_counts().to_dict() == {  # a Categorical counts its unused names too
        "transformers/models/qwen2/modeling_qwen2.py(68): apply_rotary_pos_emb": 144,
        "transformers/models/qwen2/modeling_qwen2.py(61): rotate_half": 96,
        "nn.Module: Qwen2RotaryEmbedding_0": 9}
    assert (w["module"] == "Qwen2RMSNorm_0").sum() == 8  # the innermost module of each kernel
    # The attention module's own copies (q/k/v made contiguous and repeated for GQA around
    # SDPA) are attention, by the module; its projections' GEMMs are not (issue 23, item 3).
    assert w.loc[w["category_source"] == "context", "category"].isin({"norm", "rotary", "attention"}).all()
    assert _us(w, (w["category"] == "attention") & (w["category_source"] == "context")) == 2766.267


def test_lm_head_from_vllm_logits_processor(real_traces: Path):
    w = _work(real_traces, "vllm-mi300x-gptoss-decode-fullgraph.json.gz")
    head = w[w["category"] == "lm_head"]
    assert len(head) == 1 and _us(w, w["category"] == "lm_head") == 276.678
    assert head["op_context"].tolist() == ["nn.Module: LogitsProcessor_0"]


def test_training_conv_norm_optimizer_loss_by_context(real_traces: Path):
    w = _work(real_traces, "hta-a100-ddp-nccl.json.gz")
    ctx = w[w["category_source"] == "context"].groupby("category")["dur_us"].sum().round(3).to_dict()
    assert set(ctx) == {"conv", "norm", "optimizer", "loss"}
    # Conv kernels (implicit GEMM, layout transforms) under aten::cudnn_convolution /
    # convolution_backward; batch-norm under cudnn_batch_norm(_backward); the SGD step's
    # foreach kernels under the Optimizer.step#SGD.step annotation; the loss under
    # aten::cross_entropy_loss.
    by_frame = w[w["category_source"] == "context"].groupby("op_context")["category"].first().to_dict()
    assert by_frame["aten::cudnn_convolution"] == "conv"
    assert by_frame["aten::cudnn_batch_norm_backward"] == "norm"
    assert by_frame["Optimizer.step#SGD.step"] == "optimizer"
    assert by_frame["aten::cross_entropy_loss"] == "loss"
    # A convolution is not a dense GEMM any more.
    assert _us(w, w["category"] == "dense_gemm") < 0.01 * _us(w, w["category"] == "conv")


def test_communication_keeps_its_name_inside_any_frame(real_traces: Path):
    w = _work(real_traces, "hta-a100-ddp-nccl.json.gz")
    nccl = w[w["name"].str.startswith("ncclKernel")]
    assert len(nccl) and set(nccl["category"]) <= {"all_reduce", "other_collective"}
    assert set(nccl["category_source"]) == {"name"}


def test_sendrecv_kernels_are_named_by_the_collective_that_issued_them(real_traces: Path):
    # The sampled 128-rank trace runs its all-reduces and all-gathers as ncclKernel_SendRecv
    # too: once 10 other_collective kernels, "0 all_reduce per step". Its all-to-alls (under
    # nccl:all_to_all) are all_to_all, a category of their own.
    w = _work(real_traces, "hta-sampled-rank-0.json.gz")
    sr = w[w["name"].str.startswith("ncclKernel_SendRecv")]
    assert sr["category"].astype(str).value_counts().to_dict() == {"all_reduce": 4, "all_to_all": 4,
                                                                   "all_gather": 2}
    assert set(sr["category_source"]) == {"context"}
    assert set(sr.loc[sr["category"] == "all_gather", "op_context"]) == {"nccl:_all_gather_base"}


def test_inference_foreach_copy_is_not_an_optimizer(real_traces: Path):
    # SGLang copies its graph inputs with aten::_foreach_copy_: not an optimizer step.
    w = _work(real_traces, "sglang-mi300x-qwen3-8b-decode.json.gz")
    assert not (w["category"] == "optimizer").any()


@pytest.mark.parametrize("name, catch_all_us, top", [
    ("vllm-mi300x-gptoss-decode-fullgraph.json.gz", 10.598, "triton_poi_fused_0"),
    ("hf-h100-qwen1.5-0.5b-eager.json.gz", 0.0, None),
])
def test_catch_all_bucket_is_labelled(real_traces: Path, name, catch_all_us, top):
    w = _work(real_traces, name)
    catch = w[w["category"] == CATCH_ALL_CATEGORY]
    assert (catch["category_source"] == "catch_all").all()
    assert _us(w, w["category"] == CATCH_ALL_CATEGORY) == pytest.approx(catch_all_us, abs=0.01)
    if top:
        assert catch.groupby("name")["dur_us"].sum().idxmax() == top


@pytest.mark.parametrize("name", ["hta-a100-ddp-nccl.json.gz", "hta-sampled-rank-0.json.gz",
                                  "hta-sampled-rank-1.json.gz", "hta-no-distributed-info.json.gz",
                                  "hta-cpu-only.json.gz"])
def test_training_traces_leave_at_most_half_a_percent_in_other(real_traces: Path, name):
    w = _work(real_traces, name)
    total = float(w["dur_us"].sum())
    other = _us(w, w["category"] == "other") / total
    catch = _us(w, w["category"] == CATCH_ALL_CATEGORY) / total
    assert other <= 0.005
    assert catch <= 0.01  # what no specific rule names is small and listed by name


def test_training_optimizer_step_by_its_annotation(real_traces: Path):
    # Everything launched inside Optimizer.step#<Optim>.step is the optimizer's, GEMMs
    # included: Shampoo's preconditioner multiplies matrices.
    want = {"hta-sampled-rank-0.json.gz": {"Optimizer.step#EMAOptimizer.step": (619.0, 16),
                                           "Optimizer.step#Shampoo.step": (5296.0, 57)},
            "hta-sampled-rank-1.json.gz": {"Optimizer.step#EMAOptimizer.step": (652.0, 16),
                                           "Optimizer.step#Shampoo.step": (5061.0, 51)}}
    for name, frames in want.items():
        w = _work(real_traces, name)
        opt = w[w["category"] == "optimizer"]
        got = {f: (round(float(g["dur_us"].sum()), 3), len(g)) for f, g in opt.groupby("op_context")}
        assert got == frames
        assert opt["name"].str.contains("multi_tensor_apply_kernel").any()
        assert opt["name"].str.contains("gemm").any()


def test_docs_name_every_category_and_context_rule():
    from stepscope.trace.categorize import CATEGORY_CLASS, context_rules

    doc = (Path(__file__).resolve().parents[1] / "docs" / "categories.md").read_text()
    for cat, klass in CATEGORY_CLASS.items():
        assert f"| `{cat}` | {klass} |" in doc, cat
    assert {r.category for r in context_rules()} == {"norm", "rotary", "conv", "lm_head", "loss", "optimizer",
                                                     "all_reduce", "all_gather", "all_to_all", "other_collective", "attention",
                                                     "sampling", "moe_routing", "kv_cache_write", "name"}


def test_summary_reports_catch_all_beside_other(real_traces: Path, tmp_path: Path):
    from stepscope.trace.analyze import analyze_traces

    an = analyze_traces([real_traces / "vllm-mi300x-gptoss-decode-fullgraph.json.gz"], tmp_path,
                        progress=False, perfetto=False)
    (r,) = an.summary.ranks
    assert r.other_share == 0.0 and r.other_top_names == []
    assert r.catch_all_share == pytest.approx(10.598 / r.kernel_sum_us, rel=1e-6)
    assert [(x.name, x.count) for x in r.catch_all_top_names] == [("triton_poi_fused_0", 1)]


def test_fbgemm_in_a_kernels_template_arguments_does_not_make_it_a_gemm(real_traces: Path):
    # The sampled DLRM ranks: FBGEMM's embedding, FP8 conversion and permute kernels carry
    # `fbgemm_gpu::` in their signatures, and "fbgemm" contains "gemm". They once made up
    # 85 % of rank 1's dense_gemm time.
    w = _work(real_traces, "hta-sampled-rank-1.json.gz")
    by_name = w.groupby("name")["category"].first()

    def category_of(prefix: str) -> str:
        return by_name[by_name.index.str.startswith(prefix)].iloc[0]

    assert category_of("void split_embedding_codegen_forward_unweighted_kernel") == "embedding"
    assert category_of("void split_embedding_backward_codegen_rowwise_adagrad") == "embedding"
    assert category_of("void fbgemm_gpu::permute_2D_data_kernel") == "elementwise"
    assert category_of("void bounds_check_indices_kernel") == "embedding"
    assert category_of("void fbgemm_gpu::(anonymous namespace)::_compute_FP8_quantize_cuda_kernel") == "quantize"
    assert category_of("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm") == "dense_gemm"
    assert category_of("ampere_sgemm_128x64_nn") == "dense_gemm"
    gemm = w[w["category"] == "dense_gemm"]
    assert not gemm["name"].str.contains("embedding|fbgemm_gpu::").any()
    # the embeddings are this recommender's largest compute: a category of their own
    us = w.groupby("category")["dur_us"].sum()
    assert us["embedding"] > us["dense_gemm"] and us["embedding"] > us["elementwise"]


def test_torch_logit_is_elementwise_math_not_sampling(real_traces: Path):
    # torch.logit (inverse sigmoid) and its backward in a training step: "logit" once made them sampling.
    w = _work(real_traces, "hta-sampled-rank-0.json.gz")
    logit = w[w["name"].str.contains("at::native::logit_(?:backward_)?kernel_cuda")]
    assert len(logit) and set(logit["category"]) == {"elementwise"}
    assert not (w["category"] == "sampling").any()
