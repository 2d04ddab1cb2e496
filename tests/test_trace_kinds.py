"""The trace's kind from evidence in the trace (issue 23, item 2): capture, mixed, SGLang's
extend step, non-LLM inference, and the denominator a host-side period cannot supply."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope import schema
from stepscope.trace.analyze import Analysis, analyze_traces
from stepscope.trace.steps import parse_step_name, unknown_step_names


def _analysed(real_traces: Path, name: str, tmp_path: Path) -> Analysis:
    return analyze_traces([real_traces / name], tmp_path, progress=False, perfetto=False)


def _info(real_traces: Path, name: str, tmp_path: Path) -> schema.TraceInfo:
    return _analysed(real_traces, name, tmp_path).summary.trace_info


@pytest.mark.parametrize("name,kind,evidence_kind,must_list", [
    # SGLang's capture of batch 32: once judged as one step with a 9,464x ceiling.
    ("tracelens-mi300x-sglang-qwen3-8b-capture.json.gz", "capture", "capture",
     ["annotation `capture_32_DECODE` ×2", "runtime call `hipStreamBeginCapture`"]),
    # vLLM's FULL-graph capture and compile warm-up: the frames name it.
    ("tracelens-mi300x-vllm-gptoss-capture-full.json.gz", "capture", "capture",
     ["annotation `capture_32_FULL` ×2", "frame `vllm/v1/worker/gpu_model_runner.py(5467): _capture_cudagraphs`",
      "frame `vllm/v1/worker/gpu_worker.py(522): compile_or_warm_up_model`"]),
    # Stable Diffusion 3.5: text encoders and a denoiser in one profiler step, not a prefill.
    ("tracelens-mi300x-xdit-sd3.5-two-passes.json.gz", "diffusion", "diffusion",
     ["annotation `execute_diffusion_1_256x256`", "module `SD3Transformer2DModel` ×2"]),
    ("tracelens-h100-vit-image-classifier.json.gz", "vision", "vision", ["module `ViTModel`"]),
    # BERT's token ids [1, 141] once made it "a prefill trace" with batch 1 "from the input shapes".
    ("tracelens-h100-bert-small-encoder.json.gz", "encoder", "encoder", ["module `BertModel`"]),
    # The HF Qwen chat model stays a prefill: a decoder-only LM on [16, 559] token ids.
    ("hf-h100-qwen1.5-0.5b-eager.json.gz", "prefill", "llm", ["module `Qwen2DecoderLayer` ×24"]),
])
def test_kind_comes_from_evidence_listed_in_trace_info(real_traces, tmp_path, name, kind, evidence_kind, must_list):
    info = _info(real_traces, name, tmp_path)
    assert info.kind == kind
    for item in must_list:
        assert item in info.kind_evidence[evidence_kind]


CORPUS = Path(__file__).parent / "data" / "corpus"


@pytest.mark.parametrize("path,kind,evidence_kind,evidence", [
    # OWLv2: its head class names the task, though no backbone class ends in "Model"
    ("traces/tracelens-h100-owlv2-dataloader.json.gz", "vision", "vision", ["module `Owlv2ForObjectDetection` ×5"]),
    # AlexNet without module frames: its 2-D convolutions beside the pooling kernels
    ("corpus/hta-alexnet-benchmark.json.gz", "vision", "vision",
     ["op `aten::conv2d` ×10", "kernel `max_pool_forward_nchw` ×6", "kernel `adaptive_average_pool` ×2"]),
    # a kernel-only MI210 trace (no cpu_op, no annotation): its backward kernels, by base name
    ("corpus/tracelens-mi210-gpu-only.json.gz", "training", "training",
     ["kernel `batch_norm_backward_kernel` ×20"]),
])
def test_kind_without_engine_steps_comes_from_modules_ops_or_kernels(tmp_path, path, kind, evidence_kind, evidence):
    info = _info(CORPUS.parent, path, tmp_path)
    assert info.kind == kind
    assert info.kind_evidence[evidence_kind][:len(evidence)] == evidence


def test_igemm_backward_kernels_are_training_evidence(tmp_path):
    info = _info(CORPUS, "tracelens-mi210-gpu-only.json.gz", tmp_path)
    listed = info.kind_evidence["training"]
    assert len(listed) == 4 and listed[1].startswith("kernel `igemm_wrw_gtcx2_nhwc_bf16") and listed[1].endswith("×10")
    assert "vision" not in info.kind_evidence  # no conv2d op: a kernel-only trace's convolutions are no CNN claim


def test_no_step_marker_reads_one_window(tmp_path):
    # torch.compile's one call: no step marker, so no step is counted; stage 05 says it read a window
    an = _analysed(CORPUS, "tracelens-torch-compile-triton.json.gz", tmp_path)
    info = an.summary.trace_info
    assert (info.n_steps, info.step_source, info.kind) == (None, "whole_trace", "single_step")
    flags = {f.code: f.message for f in an.summary.flags}
    assert "low_confidence" not in flags and "step_fallback" not in flags
    assert "the whole trace is read as one window" in flags["no_step_marker"]
    assert an.summary.decode.denominator_reason.startswith("no step marker")


def test_non_llm_inference_takes_no_batch_from_token_ids(real_traces, tmp_path):
    # The text encoder's [1, 77] token ids are no batch of requests.
    an = _analysed(real_traces, "tracelens-mi300x-xdit-sd3.5-two-passes.json.gz", tmp_path)
    info = an.summary.trace_info
    assert info.batch_size is None and info.batch_source is None
    # one profiler step holding two passes of the denoiser (the excerpt keeps 2 of 4)
    assert info.step_kinds == {"profiler_step": 1} and info.model_passes == 2
    assert "unknown_step_annotation" not in [f.code for f in an.flags]
    enc = _info(real_traces, "tracelens-h100-bert-small-encoder.json.gz", tmp_path / "bert")
    # the shape is kept as read, but names no batch of requests
    assert enc.batch_size is None and enc.input_shape == [1, 141]


def test_mixed_step_has_its_own_reading(real_traces, tmp_path):
    info = _info(real_traces, "tracelens-mi300x-vllm-gptoss-mixed-piecewise.json.gz", tmp_path)
    assert (info.kind, info.judged_kind) == ("mixed", "mixed")
    assert info.mixed == schema.MixedReading(n_steps=1, prefill_requests=9.0, prefill_tokens=8155.0,
                                             decode_requests=37.0, decode_tokens=37.0)
    assert info.batch_size is None  # no decode step: the what-if's batch is not invented


def test_sglang_extend_step_with_token_count_is_parsed(real_traces, tmp_path):
    p = parse_step_name("step[EXTEND bs=15 toks=15360]")
    assert (p["label"], p["prefill_requests"], p["prefill_tokens"], p["n_tokens"]) == ("prefill", 15, 15360, 15360)
    assert parse_step_name("step[DECODE bs=32]")["decode_requests"] == 32
    assert unknown_step_names(["step[EXTEND bs=15 toks=15360]", "execute_diffusion_1_256x256"]) == []
    an = _analysed(real_traces, "tracelens-mi300x-sglang-qwen3-8b-extend.json.gz", tmp_path)
    assert (an.summary.trace_info.kind, an.summary.trace_info.engine) == ("prefill", "sglang")
    assert "unknown_step_annotation" not in [f.code for f in an.flags]


def test_period_is_at_least_the_device_step(real_traces, tmp_path):
    # ResNet DDP on MI300X: the host's steps came 16.4 ms apart while the device was busy
    # 18.7 ms per step, so busy exceeded the period and the shares summed past 100 %.
    an = analyze_traces([real_traces / "tracelens-mi300x-resnet-ddp-rank0.json.gz"], tmp_path,
                        progress=False, perfetto=False)
    st = an.ranks[0].steps_tot
    host = st["annotation_ts_us"].diff().shift(-1)
    fixed = st[st["period_from_device"]]
    assert len(fixed) == 2 and (host[fixed.index] < fixed["busy_us"]).all()
    assert (fixed["period_us"] == st["first_start_us"].diff().shift(-1)[fixed.index]).all()
    d = an.summary.decode
    assert d.period_from_device_n == 2 and 18.9 < d.period_ms.mean < 19.1
    assert d.steps.union_ms.mean <= d.period_ms.mean
    assert "period_from_device" in [f.code for f in an.flags]
