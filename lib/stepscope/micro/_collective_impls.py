"""The collective implementations stage 03 times, each behind one small interface.

Built inside a rank's process the way the engine builds them, so a timing covers the engine's code. Each
constructor is collective: every rank builds the same list, and one a rank cannot build is given up by all
(`_agree`).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

GLOO, NCCL, VLLM_CPU_SHM, PYNCCL, CUSTOM_AR = "gloo", "nccl", "vllm_cpu_shm", "pynccl", "custom_ar"


@dataclass
class Impl:
    """One implementation as a rank uses it: all-reduce in place (or returning its output),
    all-gather into a given output, and the context a CUDA graph is captured in (None: the
    implementation has no graph mode here)."""

    name: str
    all_reduce: Callable[[Any], object]
    all_gather: Callable[[Any, Any], object] | None
    """None: the engine does not all-gather through it (not timed)."""
    capture: Callable[[], ContextManager] | None = None
    usable: Callable[[Any], str] = lambda _x: ""
    """The reason the engine would not use it for this tensor ('' when it would)."""
    unavailable: str = ""
    """Why it could not be built on these ranks ('' when it was)."""


def build(names: list[str], *, dist, torch, device, cpu_group, world: int, ident: str) -> list[Impl]:
    """The implementations in `names`, in order; those that cannot run here carry the reason."""
    out = []
    for name in names:
        maker = _MAKERS.get(name)
        if maker is None:
            out.append(Impl(name, _none, _none, unavailable=f"unknown implementation {name!r}"))
            continue
        out.append(maker(dist=dist, torch=torch, device=device, group=cpu_group, world=world, ident=ident))
    return out


def _none(*_a) -> None:
    return None


def _agree(dist, torch, group, ok: bool) -> bool:
    """True when every rank says ok (a MIN all-reduce over the CPU group)."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def _torch_distributed(name: str):
    def make(*, dist, torch, device, group, world, ident) -> Impl:
        cap = contextlib.nullcontext if name == NCCL else None
        return Impl(name, lambda x: dist.all_reduce(x), lambda out, x: dist.all_gather_into_tensor(out, x), cap)
    return make


def _import_failure(load: Callable[[], object]) -> tuple[object | None, str]:
    try:
        return load(), ""
    except Exception as exc:  # noqa: BLE001 - any import failure is a reason, reported as such
        return None, f"{type(exc).__name__}: {exc}"[:300]


def _vllm_cpu_shm(*, dist, torch, device, group, world, ident) -> Impl:
    """vLLM's CPU communicator (`CpuCommunicator`), built as the engine builds its TP group's:
    it takes the shared-memory path (`init_shm_manager`, then `_C::shm_allreduce` /
    `_C::shm_all_gather`) when the build has it and every rank agrees on the group name."""
    def load():
        import vllm._custom_ops  # noqa: F401 - registers torch.ops._C, the shm ops among them
        from vllm.distributed.device_communicators import cpu_communicator

        if not hasattr(torch.ops._C, "init_shm_manager"):
            raise RuntimeError("this vLLM build has no torch.ops._C.init_shm_manager")
        return cpu_communicator

    mod, why = _import_failure(load) if world > 1 else (None, "world size 1: the engine runs no collectives")
    if not _agree(dist, torch, group, mod is not None):
        return Impl(VLLM_CPU_SHM, _none, _none, unavailable=why or "another rank could not load vLLM's CPU communicator")
    os.environ["VLLM_DIST_IDENT"] = ident  # the shm segment's name; unique per run
    comm = mod.CpuCommunicator(group, torch.device("cpu"), group, unique_name="tp:0")
    if not isinstance(comm.dist_module, mod._CPUSHMDistributed):
        return Impl(VLLM_CPU_SHM, _none, _none,
                    unavailable="vLLM's CPU communicator fell back to torch.distributed (no shared-memory path)")
    shm = comm.dist_module
    return Impl(VLLM_CPU_SHM, comm.all_reduce, lambda out, x: shm.all_gather_into_tensor(out, x))


def _pynccl(*, dist, torch, device, group, world, ident) -> Impl:
    """NCCL through vLLM's own bindings (`PyNcclCommunicator`), on a gloo group as vLLM does."""
    def load():
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator

        return PyNcclCommunicator

    cls, why = _import_failure(load)
    if not _agree(dist, torch, group, cls is not None):
        return Impl(PYNCCL, _none, _none, unavailable=why or "another rank could not load PyNccl")
    pc = cls(group=group, device=device)
    if pc.disabled:
        return Impl(PYNCCL, _none, _none, unavailable="PyNccl disabled here (world size 1, or no NCCL library)")
    return Impl(PYNCCL, lambda x: pc.all_reduce(x), lambda out, x: pc.all_gather(out, x), contextlib.nullcontext)


def _custom_ar(*, dist, torch, device, group, world, ident) -> Impl:
    """vLLM's custom all-reduce (`CustomAllreduce`: one-shot or two-shot IPC kernels,
    `cross_device_reduce_1stage` / `_2stage` in traces). Eager calls copy into its registered
    buffer first, as the engine's eager mode does; a CUDA graph runs on registered buffers."""
    def load():
        from vllm.distributed.device_communicators.custom_all_reduce import CustomAllreduce

        return CustomAllreduce

    cls, why = _import_failure(load)
    if not _agree(dist, torch, group, cls is not None):
        return Impl(CUSTOM_AR, _none, _none, unavailable=why or "another rank could not load the custom all-reduce")
    ca = cls(group=group, device=device)
    if ca.disabled:
        return Impl(CUSTOM_AR, _none, _none, unavailable="custom all-reduce disabled here (world size 1, more than 8 "
                                                         "GPUs, no P2P access, or not fully connected beyond 2)")
    usable = lambda x: "" if ca.should_custom_ar(x) else (  # noqa: E731
        f"the engine would not use it for {x.numel() * x.element_size()} B (over max_size "
        f"{ca.max_size} B, not a multiple of 16 B, or world size > 2 without full NVLink)")
    return Impl(CUSTOM_AR, ca.custom_all_reduce, None, ca.capture, usable)


_MAKERS: dict[str, Callable[..., Impl]] = {
    GLOO: _torch_distributed(GLOO), NCCL: _torch_distributed(NCCL), VLLM_CPU_SHM: _vllm_cpu_shm,
    PYNCCL: _pynccl, CUSTOM_AR: _custom_ar,
}
