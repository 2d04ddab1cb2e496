"""Marlin W4A16 through vLLM's own ops at one Kimi-K2.5 routed-expert shape (TP=8)."""

from __future__ import annotations

import pandas as pd
import pytest

from stepscope.micro import gemm, marlin

pytestmark = pytest.mark.gpu

# Kimi-K2.5's routed expert gate_up at TP=8: 2 x 2048 / 8 = 512 outputs, 7168 inputs.
N, K = 512, 7168


@pytest.fixture(scope="module")
def marlin_ready() -> None:
    reason = marlin.availability()
    if reason:
        pytest.skip(reason)


def test_marlin_passes_the_correctness_gate(marlin_ready):
    import torch

    w = marlin.MarlinGemm(N, K, device="cuda", seed=0)
    a = torch.randn(16, K, dtype=torch.bfloat16, device="cuda")
    diff = w.mean_rel_diff(a)
    assert diff < marlin.CORRECTNESS_MAX_MEAN_REL_DIFF, f"{w.entry_point}: mean rel diff {diff:.4f}"
    # The gate can fail: a wrong weight is far off.
    other = marlin.MarlinGemm(N, K, device="cuda", seed=1)
    other.w_ref = w.w_ref
    assert other.mean_rel_diff(a) > marlin.CORRECTNESS_MAX_MEAN_REL_DIFF


def test_marlin_is_timed_by_the_stage_code_path(marlin_ready):
    grid = pd.DataFrame([dict(model="kimi-k2.5", tp=8, gemm="expert_gate_up", layer_kind="routed_expert",
                              n=N, k=K, batch=1, m=m, dtype=gemm.MARLIN_DTYPE, backend="marlin")
                         for m in (1, 16)])
    t = gemm.run_gemm_grid(grid, warmup=3, repeats=10, device="cuda", progress=False)
    assert set(t["status"]) == {"ok"}, t[["m", "mode", "status", "reason"]]
    assert sorted(t["mode"]) == ["cold", "cold", "hot", "hot"]
    assert (t["time_us_median"] > 0).all()
