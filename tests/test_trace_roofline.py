"""A roofline on the trace: achieved GB/s and TFLOP/s of GEMM categories against peak (issue 14)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from stepscope import schema
from stepscope.model import gemm_bytes, get_preset
from stepscope.trace.analyze import analyze_traces
from stepscope.trace.roofline import MXFP4, model_work, weight_formats


def _roof(real_traces: Path, tmp_path: Path, name: str, preset: str | None, **kw) -> schema.Roofline:
    arch = get_preset(preset) if preset else None
    an = analyze_traces([real_traces / name], tmp_path, arch=arch, progress=False, perfetto=False, **kw)
    return an.summary.roofline


def test_qwen3_8b_dense_gemms_on_mi300x_run_at_half_of_hbm_peak(real_traces: Path, tmp_path: Path):
    r = _roof(real_traces, tmp_path, "sglang-mi300x-qwen3-8b-decode.json.gz", "qwen3-8b")
    assert r.device.known and r.device.peak_mem_bw_gbps == 5300.0
    (row,) = r.rows
    assert row.category == "dense_gemm"
    # 36 layers x 4 GEMMs + the LM head, as the trace counts them.
    assert row.calls_per_step == row.model_gemms_per_step == 145
    assert row.bytes_per_step / 1e9 == pytest.approx(15.29, abs=0.01)   # review: ~15 GB
    assert row.time_ms_per_step == pytest.approx(5.782, abs=0.001)
    assert row.pct_peak_bw == pytest.approx(49.9, abs=0.1)              # review: ~49 %
    assert row.achieved_gbps == pytest.approx(row.bytes_per_step / row.time_ms_per_step / 1e6)
    assert row.pct_peak_flops == pytest.approx(100 * row.achieved_tflops / 1307.4)


def test_gpt_oss_moe_on_mi300x_reads_mxfp4_experts_at_a_quarter_of_peak(real_traces: Path, tmp_path: Path):
    r = _roof(real_traces, tmp_path, "vllm-mi300x-gptoss-decode-fullgraph.json.gz", "gpt-oss-20b")
    # The trace's device name is empty: the properties (gfx 9.4, 304 CUs, 192 GB) settle it.
    assert r.device.name == "AMD Instinct MI300X" and r.device.matched_by.startswith("properties")
    rows = {x.category: x for x in r.rows}
    moe = rows["fused_moe"]
    assert "mxfp4" in moe.source
    assert moe.bytes_per_step / 1e9 == pytest.approx(10.10, abs=0.01)  # review: ~10 GB
    assert moe.pct_peak_bw == pytest.approx(26.1, abs=0.1)              # review: ~27 % (matmul_ogs only)
    assert rows["dense_gemm"].calls_per_step == rows["dense_gemm"].model_gemms_per_step == 72
    # The LM head runs under vLLM's LogitsProcessor module: its own category and row.
    assert rows["lm_head"].calls_per_step == rows["lm_head"].model_gemms_per_step == 1


def test_unknown_peak_and_missing_architecture_are_said(real_traces: Path, tmp_path: Path):
    r = _roof(real_traces, tmp_path / "a", "vllm-cpu-tinyllama-tp1-nostack-rank0.pt.trace.json.gz", None)
    assert r.rows == [] and "no architecture" in r.reason
    r = _roof(real_traces, tmp_path / "b", "sglang-mi300x-qwen3-8b-decode.json.gz", "qwen3-8b",
              peaks={"name": "my board", "peak_mem_bw_gbps": 2000.0, "peak_tflops": None})
    (row,) = r.rows
    assert r.device.matched_by == "params hardware"
    assert row.pct_peak_bw == pytest.approx(100 * row.achieved_gbps / 2000.0)
    assert row.pct_peak_flops is None  # no FLOP/s peak given: unknown, not a guess


def test_prefill_and_training_traces_get_no_decode_roofline(real_traces: Path, tmp_path: Path):
    r = _roof(real_traces, tmp_path, "hf-h100-qwen1.5-0.5b-eager.json.gz", "qwen3-8b")
    assert r.rows == [] and r.device.name == "NVIDIA H100 SXM5 80GB"


def test_stage_02_bandwidth_beside_the_trace(real_traces: Path, tmp_path: Path):
    arch = get_preset("qwen3-8b")
    w = model_work(arch, 1, 32, weight_formats(arch))
    # A stage-02 table for the same shapes at M=32: every GEMM at 2,000 GB/s.
    micro = pd.DataFrame([{"model": "qwen3-8b", "gemm": g, "m": 32, "n": n, "k": k, "mode": "cold",
                           "status": "ok", "bytes": float(gemm_bytes(32, n, k)),
                           "time_us_median": float(gemm_bytes(32, n, k)) / 2000e3}
                          for g, n, k in zip(w["gemm"], w["n"], w["k"])])
    r = _roof(real_traces, tmp_path, "sglang-mi300x-qwen3-8b-decode.json.gz", "qwen3-8b", micro_gemm=micro)
    (row,) = r.rows
    assert row.micro_gbps == pytest.approx(2000.0)
    assert row.micro_vs_trace == pytest.approx(row.achieved_gbps / 2000.0)


def test_weight_formats():
    assert weight_formats(get_preset("gpt-oss-20b"))["routed_expert"] is MXFP4
    assert weight_formats(get_preset("kimi-k2.5"), "compressed-tensors W4A16 g32")["routed_expert"].bits == 4
    assert weight_formats(get_preset("qwen3-8b"))["routed_expert"].bits == 16


def test_fp8_counts_every_linear_layer_at_8_bits_but_the_router_lm_head_and_mla_bmms(real_traces: Path,
                                                                                   tmp_path: Path):
    # Before, "fp8" in params changed nothing: Qwen3-8B's dense GEMMs were read at 49.9 % of
    # HBM peak with bf16 bytes, where FP8 weights would move about half of them.
    bf16 = _roof(real_traces, tmp_path / "a", "sglang-mi300x-qwen3-8b-decode.json.gz", "qwen3-8b").rows[0]
    fp8 = _roof(real_traces, tmp_path / "b", "sglang-mi300x-qwen3-8b-decode.json.gz", "qwen3-8b",
                quantization="fp8").rows[0]
    arch = get_preset("qwen3-8b")
    lm_head = float(gemm_bytes(32, 151936, 4096))  # the LM head stays bf16, at batch 32
    linear = bf16.bytes_per_step - lm_head
    weights = 36 * sum(n * k for n, k in ((6144, 4096), (4096, 4096), (2 * 12288, 4096), (4096, 12288)))
    assert arch.hidden == 4096 and weights * 2 < linear  # the bf16 linear bytes are weights + activations
    assert fp8.bytes_per_step == pytest.approx(bf16.bytes_per_step - weights, rel=1e-9)  # 2 -> 1 byte each
    assert fp8.pct_peak_bw == pytest.approx(bf16.pct_peak_bw * fp8.bytes_per_step / bf16.bytes_per_step)
    # DeepSeek-V3 (MLA, MoE): the router, the LM head and MLA's absorbed per-head matmuls stay 16-bit
    ds = get_preset("deepseek-v3")
    w = model_work(ds, 8, 1, weight_formats(ds, "fp8")).drop_duplicates("gemm").set_index("gemm")["weights"]
    assert {g for g, label in w.items() if label == "bf16"} == {"mla_w_uk", "mla_w_uv", "gate", "lm_head"}
    assert w["expert_gate_up"].startswith("fp8") and w["q_a_proj"].startswith("fp8")


def test_expert_weight_format_comes_from_kernel_names_when_params_do_not_say(real_traces: Path, tmp_path: Path):
    # gpt-oss's MoE kernels name their weights (`..._bf16xbf16xmxfp4_...`). For a family the
    # roofline does not know to be MXFP4 and params that do not say, the bytes must still be
    # counted at 4 bits, not bf16: bf16 would read ~3.8x the bytes and put the kernels far
    # nearer their peak than they are.
    import dataclasses

    arch = dataclasses.replace(get_preset("gpt-oss-20b"), family="unlisted_moe")
    name = "vllm-mi300x-gptoss-decode-fullgraph.json.gz"
    unsaid = analyze_traces([real_traces / name], tmp_path / "a", arch=arch, quantization="none",
                            progress=False, perfetto=False).summary
    moe = {x.category: x for x in unsaid.roofline.rows}["fused_moe"]
    assert moe.bytes_per_step / 1e9 == pytest.approx(10.10, abs=0.01)  # as for the gpt_oss family
    assert "mxfp4" in moe.source and "format from the kernel names" in moe.source
    said = analyze_traces([real_traces / name], tmp_path / "b", arch=arch, quantization="bf16",
                          progress=False, perfetto=False).summary
    moe_bf16 = {x.category: x for x in said.roofline.rows}["fused_moe"]
    assert moe_bf16.bytes_per_step > 3 * moe.bytes_per_step  # params, when they say, win
    assert "kernel names" not in moe_bf16.source


def test_kimi_int4_experts_in_marlins_moe_kernel_are_counted_in_fused_moe():
    """The reference campaign's case: Kimi-K2.5 INT4 at TP=8. Marlin's MoE kernel is an expert
    GEMM and lands in fused_moe (rules.yaml), the bf16 attention, shared-expert and LM-head
    GEMMs in dense_gemm. The expert bytes belong with fused_moe's time: counted against
    dense_gemm's, they would put the bf16 kernels far above their real bandwidth and leave the
    experts' time unread."""
    from stepscope.trace.categorize import classify_name, make_rules
    from stepscope.trace.roofline import roofline

    rules = make_rules()
    assert classify_name("marlin_moe_wna16::Marlin<...>", "kernel", rules) == "fused_moe"
    assert classify_name("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "kernel", rules) == "dense_gemm"
    arch = get_preset("kimi-k2.5")
    cats = pd.DataFrame([{"category": "dense_gemm", "union_ms_mean": 3.0, "calls_per_step": 548.0},
                         {"category": "fused_moe", "union_ms_mean": 6.0, "calls_per_step": 120.0}])
    r = roofline(cats, arch, 8, 1.0, {"peak_mem_bw_gbps": 1792.0, "peak_tflops": None}, quantization="w4a16")
    rows = {x["category"]: x for x in r["rows"]}
    work = model_work(arch, 8, 1, weight_formats(arch, "w4a16"))
    experts = work["layer_kind"] == "routed_expert"
    assert rows["fused_moe"]["gemms"] == "expert_gate_up+expert_down"
    assert rows["fused_moe"]["bytes_per_step"] == pytest.approx(work.loc[experts, "bytes_per_step"].sum())
    assert rows["fused_moe"]["achieved_gbps"] == pytest.approx(rows["fused_moe"]["bytes_per_step"] / 6.0 / 1e6)
    assert "w4a16" in rows["fused_moe"]["source"] and "w4a16" not in rows["dense_gemm"]["source"]
    assert rows["dense_gemm"]["bytes_per_step"] == pytest.approx(work.loc[~experts, "bytes_per_step"].sum())
    assert rows["dense_gemm"]["model_gemms_per_step"] == work.loc[~experts, "calls_per_step"].sum()


def test_an_fp8_models_gemms_split_between_quant_gemm_and_its_16_bit_matmuls():
    """FP8: the linear layers run as scaled_mm (quant_gemm); the router, the LM head and MLA's
    absorbed matmuls stay 16-bit (dense_gemm)."""
    from stepscope.trace.roofline import SIXTEEN_BIT_GEMMS, roofline

    arch = get_preset("deepseek-v3")
    cats = pd.DataFrame([{"category": "dense_gemm", "union_ms_mean": 1.0, "calls_per_step": 300.0},
                         {"category": "quant_gemm", "union_ms_mean": 8.0, "calls_per_step": 900.0}])
    r = roofline(cats, arch, 8, 1.0, {"peak_mem_bw_gbps": 4800.0, "peak_tflops": None}, quantization="fp8")
    rows = {x["category"]: set(x["gemms"].split("+")) for x in r["rows"]}
    assert {"gate", "lm_head", *SIXTEEN_BIT_GEMMS} == rows["dense_gemm"]
    assert {"q_a_proj", "o_proj", "expert_gate_up", "expert_down", "shared_down_proj"} <= rows["quant_gemm"]
