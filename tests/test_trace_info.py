"""What a trace is: step kinds, engine, device, batch, world size and TP (issues 10, 14)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepscope.trace.analyze import analyze_traces
from stepscope.trace.steps import unknown_step_names


def _analyse(paths, out: Path, **kw):
    return analyze_traces(paths, out, progress=False, perfetto=False, **kw)


def _ann(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}


def _launch(ts: float, corr: int) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts,
            "dur": 1.0, "args": {"correlation": corr}}


def _kernel(ts: float, corr: int, dur: float = 5.0, name: str = "nvjet_tst_gemm") -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "stream": 7}}


def _write(tmp_path: Path, events, name="rank0.json", top=None) -> Path:
    p = tmp_path / name
    p.write_text(json.dumps({"distributedInfo": {"rank": 0}, **(top or {}), "traceEvents": events}))
    return p


def test_prefill_with_token_square_is_not_a_decode_step(tmp_path: Path):
    # One vLLM version writes a prefill of 888 tokens as `(888_788544)`: tokens, then their
    # square. Today's main fell back to execute_model frames and called it "1 decode steps".
    ev = [_ann("execute_context_1(888_788544)_generation_0(0)", 0.0, 100.0),
          _launch(10.0, 1), _kernel(20.0, 1), _launch(30.0, 2), _kernel(40.0, 2)]
    an = _analyse([_write(tmp_path, ev)], tmp_path / "out")
    st = an.steps
    assert st["source"].tolist() == ["annotation:vllm"]
    assert (st["kind"].iloc[0], st["prefill_requests"].iloc[0], st["prefill_tokens"].iloc[0]) == (
        "prefill", 1, 888)
    info = an.summary.trace_info
    assert info.kind == "prefill" and info.n_decode_steps == 0
    assert info.step_kinds == {"prefill": 1} and info.low_confidence is True
    assert an.summary.ranks[0].step_kinds == {"prefill": 1}
    assert an.summary.decode.steps.steps_used != "decode"


def test_step_like_annotation_of_no_known_form_is_flagged_by_name(tmp_path: Path):
    odd = "execute_context_2[7]_generation_1[1]"
    ev = [_ann("execute_context_0(0)_generation_1(1)", 0.0, 50.0), _ann(odd, 100.0, 50.0),
          _launch(10.0, 1), _kernel(20.0, 1), _kernel(30.0, 1)]  # two: one event alone is refused
    an = _analyse([_write(tmp_path, ev)], tmp_path / "out")
    flag = [f for f in an.flags if f.code == "unknown_step_annotation"]
    assert len(flag) == 1 and odd in flag[0].message
    assert unknown_step_names([odd, "gloo:all_reduce", "step[DECODE bs=2]", "ProfilerStep#3"]) == [odd]


@pytest.mark.parametrize("files,kind,engine,device,batch,kinds", [
    (["sglang-mi300x-qwen3-8b-decode.json.gz"], "decode", "sglang", "AMD Instinct MI300X", 32.0,
     {"decode": 1}),
    # An empty device name: the properties (gfx 9.4, 304 CUs, 192 GB) name it.
    (["vllm-mi300x-gptoss-decode-fullgraph.json.gz"], "decode", "vllm", "AMD Instinct MI300X", 32.0,
     {"decode": 1}),
    (["hf-h100-qwen1.5-0.5b-eager.json.gz"], "prefill", "unknown", "NVIDIA H100 80GB HBM3", 16.0,
     {"profiler_step": 1}),
    (["hta-a100-ddp-nccl.json.gz"], "training", "unknown", "NVIDIA A100-PG509-200", None,
     {"training": 3}),
    (["vllm-cpu-tinyllama-tp2-rank0.pt.trace.json.gz", "vllm-cpu-tinyllama-tp2-rank1.pt.trace.json.gz"],
     "decode", "vllm", "CPU", 1.0, {"decode": 10, "prefill": 2, "idle": 2}),
])
def test_trace_info_on_real_traces(real_traces: Path, tmp_path: Path, files, kind, engine, device,
                                   batch, kinds):
    info = _analyse([real_traces / f for f in files], tmp_path).summary.trace_info
    assert (info.kind, info.engine, info.device_name, info.batch_size) == (
        kind, engine, device, batch)
    assert info.step_kinds == kinds
    assert info.low_confidence is (sum(kinds.values()) < 5 or kind != "decode")


def test_hf_prefill_batch_and_sequence_come_from_the_input_shape(real_traces: Path, tmp_path: Path):
    info = _analyse([real_traces / "hf-h100-qwen1.5-0.5b-eager.json.gz"], tmp_path).summary.trace_info
    assert info.input_shape == [16, 559] and info.batch_source == "input shapes"


def test_tp_comes_from_the_world_size_and_disagreement_is_flagged(real_traces: Path, tmp_path: Path):
    files = [real_traces / f"vllm-cpu-tinyllama-tp2-rank{i}.pt.trace.json.gz" for i in (0, 1)]
    an = _analyse(files, tmp_path / "a")
    info = an.summary.trace_info
    assert (info.world_size, info.tp, info.tp_source, info.tp_disagreement) == (
        2, 2, "trace", False)
    assert an.summary.collectives_check.tp == 2
    an = _analyse(files, tmp_path / "b", tp=4)
    info = an.summary.trace_info
    assert (info.tp, info.tp_source, info.tp_disagreement) == (4, "params", True)
    assert any(f.code == "tp_disagreement" for f in an.flags)


def test_ranks_missing_from_the_world_are_flagged(real_traces: Path, tmp_path: Path):
    an = _analyse([real_traces / f"hta-sampled-rank-{i}.json.gz" for i in (0, 1)], tmp_path)
    info = an.summary.trace_info
    assert (info.world_size, info.ranks_present, info.kind) == (128, [0, 1], "training")
    assert info.tp_source == "default"  # a data-parallel world is not a TP group
    msg = [f.message for f in an.flags if f.code == "ranks_missing"]
    assert msg and "2 of 128" in msg[0]


def test_class_totals_are_exact_where_category_exposed_times_overlap(real_traces: Path, tmp_path: Path):
    an = _analyse([real_traces / "sglang-mi300x-qwen3-8b-decode.json.gz"], tmp_path)
    r = an.summary.ranks[0]
    ct = r.class_totals_us
    assert ct.compute_us + ct.comm_exposed_us + ct.memory_exposed_us == pytest.approx(
        ct.busy_us, rel=1e-12)
    # Compute kernels overlap each other here (their sum was 0.058 % above busy before the shared
    # time was split between them): per-category exposed times now add up to busy exactly.
    over = sum(c.exposed_us for c in r.categories.values()) / ct.busy_us - 1
    assert over == pytest.approx(0.0, abs=1e-9)
    assert "add up to busy_us" in an.summary.notes["exposed_us"]
    st = an.steps
    assert (st["compute_us"] + st["comm_exposed_us"] + st["memory_exposed_us"]
            - st["busy_us"]).abs().max() < 1e-6


def test_stage_05_of_stepscope_analyze_takes_tp_from_the_traces(real_traces: Path, tmp_path: Path):
    # `stepscope analyze` without --tp: main wrote TP=1 (server.tp's default) for these TP=2
    # traces. Stage 05 is run the way the analyze command runs it.
    from stepscope.config import params_from_dict
    from stepscope.runner import analyze_params
    from stepscope.trace.analyze import run_stage

    files = [real_traces / f"vllm-cpu-tinyllama-tp2-rank{i}.pt.trace.json.gz" for i in (0, 1)]
    params = params_from_dict(analyze_params(files, model_config=None, tp=None), source="test")
    an = run_stage(params, tmp_path, tmp_path / "05_categorize", progress=False)
    check = an.summary.collectives_check
    assert (check.tp, check.tp_source) == (2, "trace")
    assert an.summary.trace_info.tp_disagreement is False


def test_catch_all_share_and_names_per_rank(real_traces: Path, tmp_path: Path):
    an = _analyse([real_traces / "vllm-mi300x-gptoss-decode-fullgraph.json.gz"], tmp_path)
    r = an.summary.ranks[0]
    assert [(n.name, n.sum_us, n.count) for n in r.catch_all_top_names] == [
        ("triton_poi_fused_0", pytest.approx(10.598), 1)]
    assert r.catch_all_share == pytest.approx(10.598 / r.kernel_sum_us)


@pytest.mark.parametrize("trace,expected", [
    ("vllm-mi300x-gptoss-decode-fullgraph.json.gz", (True, 421, 434)),   # one hipGraphLaunch per step
    ("sglang-mi300x-qwen3-8b-decode.json.gz", (True, 544, 558)),          # SGLang's CUDA-graph decode
    ("hf-h100-qwen1.5-0.5b-eager.json.gz", (False, 0, 1198)),             # eager: one launch per kernel
    ("vllm-cpu-tinyllama-tp1-nostack-rank0.pt.trace.json.gz", (None, None, None))])  # CPU: nothing launched
def test_graph_replay_is_read_from_the_launches(tmp_path: Path, real_traces: Path, trace, expected):
    info = _analyse([real_traces / trace], tmp_path / "out").summary.trace_info
    assert (info.graph_replay, info.graph_launched_events, info.device_events) == expected


def test_weight_formats_named_by_real_gemm_kernels(real_traces: Path, tmp_path: Path):
    gptoss = _analyse([real_traces / "vllm-mi300x-gptoss-decode-fullgraph.json.gz"], tmp_path / "a")
    (named,) = gptoss.summary.trace_info.weight_formats_named
    assert named.format == "mxfp4" and named.n_kernels == 2
    # the two _matmul_ogs_..._mxfp4 kernels: 3.761878 + 3.272717 ms per step
    assert named.ms_per_step == pytest.approx(7.034595, abs=1e-6)
    assert named.example_kernel == "_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1"
    # hipBLASLt bf16 GEMMs name no low-bit format: nothing is claimed
    qwen = _analyse([real_traces / "sglang-mi300x-qwen3-8b-decode.json.gz"], tmp_path / "b")
    assert qwen.summary.trace_info.weight_formats_named == []


def test_weight_format_patterns_and_the_rooflines_choice():
    import pandas as pd

    from stepscope.trace.info import weight_formats_named
    from stepscope.trace.roofline import roofline_quantization

    kernels = pd.DataFrame({
        "category": ["fused_moe", "fused_moe", "quant_gemm", "dense_gemm", "kv_cache_write"],
        "name": ["fused_marlin_moe_kernel", "moe_align_block_size", "cutlass_scaled_mm_fp8_e4m3",
                 "_matmul_bf16xbf16xmxfp4", "reshape_and_cache_fp8"],
        "sum_ms_per_step": [2.0, 0.1, 1.0, 0.5, 0.3]})
    named = weight_formats_named(kernels)
    # most time first; the fp8 KV-cache write is not a GEMM and names no weight format
    assert [(r["format"], r["n_kernels"], r["ms_per_step"]) for r in named] == [
        ("w4a16", 1, 2.0), ("fp8", 1, 1.0), ("mxfp4", 1, 0.5)]
    assert roofline_quantization("int4", named) == ("int4", "params")
    assert roofline_quantization("none", named) == (None, "none")  # a mixture of formats: no guess
    assert roofline_quantization(None, named[:1]) == ("w4a16", "kernel names")
    assert roofline_quantization(None, named[1:2]) == ("fp8", "kernel names")
    assert roofline_quantization("none", []) == (None, "none")
