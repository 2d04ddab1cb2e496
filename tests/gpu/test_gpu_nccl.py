"""NCCL all-reduce at world size 1 and at every GPU count present: eager, and a burst of K
all-reduces captured in one CUDA graph, through stage 03's own code path."""

from __future__ import annotations

import pytest

from stepscope.config import deep_merge, load_params, params_from_dict, params_to_dict
from stepscope.micro import collectives as coll
from stepscope.paths import REPO_ROOT

KIMI = REPO_ROOT / "params" / "kimi-k25-int4-tp8-pcie.yaml"
MAX_GPUS = 8


def plan_for(world: int, backend: str) -> coll.CollectivePlan:
    base = params_to_dict(load_params(KIMI))
    over = {"micro": {"collectives": {"backend": backend, "world_size": world, "warmup": 5, "iters": 40,
                                      "burst_repeats": 10, "sizes_bytes": [14336, 1 << 20, 16 << 20],
                                      "timeout_s": 120}}}
    return coll.plan_collectives(params_from_dict(deep_merge(base, over)))


def check_tables(results: list[dict], plan: coll.CollectivePlan) -> None:
    n = plan.world_size
    table = coll.collective_table(results)
    assert len(table) == len(plan.sizes_bytes) + len(plan.all_gather_sizes_bytes)
    for r in table.itertuples(index=False):
        assert r.time_us_rank_median > 0
        assert r.algbw_gbps == pytest.approx(r.size_bytes / r.time_us_rank_median / 1e3, rel=1e-12)
        factor = 2 * (n - 1) / n if r.op == "all_reduce" else (n - 1) / n  # nccl-tests' formulas
        assert r.busbw_gbps == pytest.approx(r.algbw_gbps * factor, rel=1e-12, abs=1e-12)
    burst = coll.burst_table(results, plan)
    want_modes = {"eager", "cuda_graph"}
    assert set(burst["mode"]) == want_modes
    ok = burst[burst["status"] == "ok"]
    measured = want_modes if plan.backend == "nccl" else {"eager"}
    assert set(ok["mode"]) == measured, burst[["mode", "status", "reason"]]
    assert (ok["k"] == plan.burst_k).all()
    assert (ok["per_op_us"] > 0).all()
    assert ok["per_op_us"].to_numpy() == pytest.approx((ok["total_us"] / ok["k"]).to_numpy(), rel=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("world", range(1, MAX_GPUS + 1))
def test_nccl_eager_and_graph_burst(world, tmp_path):
    import torch

    have = torch.cuda.device_count()
    if world > have:
        pytest.skip(f"world size {world} needs {world} GPUs; this machine has {have}")
    plan = plan_for(world, "nccl")
    assert plan.burst_k == 2 * 61 + 1  # Kimi-K2.5: 61 layers, 2 all-reduces each, plus one
    check_tables(coll.run_collectives(plan, tmp_path, progress=False), plan)


def test_world_size_one_runs_on_gloo_too(tmp_path):
    # The single-rank path the GPU test takes, on CPU: one process, busbw 0 by the formula.
    plan = plan_for(1, "gloo")
    assert plan.burst_k == 123
    results = coll.run_collectives(plan, tmp_path, progress=False)
    check_tables(results, plan)
    assert (coll.collective_table(results)["busbw_gbps"] == 0).all()
