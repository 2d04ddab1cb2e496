"""GEMM timing on a GPU: Kimi-K2.5's dense GEMMs at TP=8 in bf16, through stage 02's own
code path (`run_gemm_grid`: a CUDA graph of N calls, hot and cold)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from stepscope.micro import gemm
from stepscope.model import load_architecture

pytestmark = pytest.mark.gpu

TP = 8
M_VALUES = (1, 16, 128)
GRAPH_CALLS = 50
# Two readings of one GEMM agree "within noise": 25 % or 3 µs (event and launch gaps
# inside a graph are about a microsecond; tiny GEMMs run in a few).
REL_TOL, ABS_TOL_US = 0.25, 3.0


def kimi_dense_target() -> gemm.GemmTarget:
    arch = load_architecture(preset="kimi-k2.5")
    return gemm.GemmTarget("kimi-k2.5", arch, TP, M_VALUES, "preset")


def dense_grid() -> pd.DataFrame:
    grid = gemm.gemm_grid([kimi_dense_target()], ["bfloat16"], ["torch"])
    # Routed experts alone are Marlin's (W4A16) job; a shape shared with the shared
    # expert stays, since the shared expert is dense.
    return grid[grid["layer_kind"] != "routed_expert"].reset_index(drop=True)


@pytest.fixture(scope="module")
def measured() -> pd.DataFrame:
    return gemm.run_gemm_grid(dense_grid(), warmup=5, repeats=20, device="cuda", progress=False,
                              graph_calls=GRAPH_CALLS)


def test_every_dense_shape_is_timed_hot_and_cold(measured):
    assert set(measured["status"]) == {"ok"}, measured[measured["status"] != "ok"][["gemm", "m", "reason"]]
    n_shapes = dense_grid()[["n", "k", "batch"]].drop_duplicates().shape[0]
    assert n_shapes >= 10  # q_a, q_b, kv_a, w_uk, w_uv, o, gate_up, down, router, shared, lm_head
    assert len(measured) == n_shapes * len(M_VALUES) * 2
    assert (measured["time_us_median"] > 0).all()
    assert (measured["time_us_p10"] <= measured["time_us_median"]).all()


def test_cold_is_not_faster_than_hot(measured):
    key = ["gemm", "n", "k", "batch", "m"]
    both = measured.pivot_table(index=key, columns="mode", values="time_us_median")
    slack = np.maximum(both["hot"] * 0.1, 1.0)  # noise: 10 % or 1 µs
    faster = both[both["cold"] < both["hot"] - slack]
    assert faster.empty, f"cold faster than hot:\n{faster}"


def test_cold_bandwidth_stays_under_the_device_peak(measured):
    from stepscope.micro.timing import peak_mem_bw_gbps

    peak, source = peak_mem_bw_gbps(None, "cuda")  # stepscope.hardware's known-device table
    if peak is None:
        pytest.skip(source)
    # Cold rotates weights through more than 2x L2, so its bytes come from HBM; a hot
    # GEMM may read an L2-resident weight faster than HBM's peak.
    cold = measured[measured["mode"] == "cold"]
    over = cold[cold["gbps"] > peak]
    assert over.empty, f"faster than {peak} GB/s ({source}):\n{over[['gemm', 'm', 'gbps']]}"
    assert cold["gbps"].max() > 0.05 * peak  # and the byte model is not off by orders


@pytest.mark.parametrize("m", [1, 128])
def test_graph_per_call_time_matches_separately_timed_calls(m):
    import torch

    from stepscope.micro.timing import time_cuda_each, time_cuda_graph

    target = kimi_dense_target()
    shapes = gemm.distinct_shapes(target.arch, TP)
    for sh in shapes[shapes["batch"] == 1].itertuples(index=False):
        w = gemm._torch_weight(sh.n, sh.k, 1, torch.bfloat16, "cuda")
        a = torch.rand(m, sh.k, dtype=torch.bfloat16, device="cuda")
        out = torch.empty(m, sh.n, dtype=torch.bfloat16, device="cuda")
        fn = gemm._torch_fn(a, w, out)
        graph = float(np.median(time_cuda_graph([fn] * GRAPH_CALLS, warmup=3, repeats=20)))
        each = time_cuda_each(fn, GRAPH_CALLS, warmup=3)
        sep = float(np.median(each))
        noise = max(REL_TOL * sep, ABS_TOL_US, float(np.percentile(each, 90) - np.percentile(each, 10)))
        assert abs(graph - sep) <= noise, (f"{sh.gemm} m={m}: graph {graph:.2f} us/call vs "
                                           f"{sep:.2f} us timed one by one (noise {noise:.2f})")
