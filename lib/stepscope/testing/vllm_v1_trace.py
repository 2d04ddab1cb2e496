"""A fake vLLM V1 serving trace, built event by event, of the structure real ones have.

Rank 0 of a TP group serving a Llama decoder under piecewise CUDA graphs, by a release with no step
annotation: `execute_model` frames as steps, an eager prefill, decode steps replaying `n_layers + 1` graph
pieces, 2L+1 all-reduces and one all-gather each. Times are invented; for tests, never a measurement.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

RUNNER_FRAME = "vllm/v1/worker/gpu_model_runner.py(1862): execute_model"
WORKER_FRAME = "vllm/v1/worker/gpu_worker.py(328): execute_model"
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
ALL_GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "nvjet_tst_128x64_64x8_1x1_v_bz_coopA_NTT"
ATTENTION_DECODE = "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>, true>(Flash_fwd_params)"
ATTENTION_PREFILL = "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>, true>(Flash_fwd_params)"
RMS_NORM = "void vllm::rms_norm_kernel<c10::BFloat16>(c10::BFloat16*, c10::BFloat16 const*, float, int, int)"
ACT = "void vllm::act_and_mul_kernel<c10::BFloat16, &vllm::silu_kernel<c10::BFloat16>, true>(c10::BFloat16*, int)"
ROPE = "void vllm::rotary_embedding_kernel<c10::BFloat16, true>(long const*, c10::BFloat16*, int)"
SAMPLER = ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
           "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)")
ARGMAX = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4> >(at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4>)"
PID, TID, STREAM = 4242, 4242, 7

# (name, µs) of the work in one layer, at decode and at prefill: before attention, then after it
_PRE = ((RMS_NORM, 3.0, 12.0), (GEMM, 25.0, 170.0), (ROPE, 3.0, 10.0))
_POST = ((GEMM, 20.0, 130.0), (ALL_REDUCE, 15.0, 100.0), (RMS_NORM, 3.0, 12.0), (GEMM, 60.0, 280.0),
         (ACT, 3.0, 20.0), (GEMM, 35.0, 150.0), (ALL_REDUCE, 15.0, 100.0))


@dataclass
class _Trace:
    """Host and device cursors (µs) and the events written so far."""

    host: float = 0.0
    device: float = 0.0
    corr: int = 0
    events: list[dict] = field(default_factory=list)

    def x(self, cat: str, name: str, ts: float, dur: float, tid: int = TID, **args) -> dict:
        ev = {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": round(ts, 3), "dur": round(dur, 3)}
        if args:
            ev["args"] = args
        self.events.append(ev)
        return ev

    def launch(self, call: str, kernels, op: str | None = None) -> None:
        """One runtime call at the host cursor (inside `op` when given) and its kernels, queued on
        the device behind the work before them."""
        self.corr += 1
        call_us = 8.0 if "Graph" in call else 4.0
        if op:
            self.x("cpu_op", op, self.host, call_us + 4.0)
            self.host += 2.0
        self.x("cuda_runtime", call, self.host, call_us, correlation=self.corr)
        self.device = max(self.device, self.host + 5.0)
        for name, dur in kernels:
            self.x("kernel", name, self.device, dur, tid=STREAM, correlation=self.corr, stream=STREAM)
            self.device += dur + 1.0
        self.host += call_us + (2.0 if op else 1.0)

    def step(self, frame_body=None, gap_us: float = 300.0) -> None:
        """An `execute_model` step: the worker's frame around the runner's, ending once the
        sampled tokens are copied back (the host waits for the device); with no `frame_body`,
        a call with nothing scheduled, which launches nothing."""
        start = self.host
        self.host += 20.0
        if frame_body is not None:
            frame_body()
            self.launch("cudaMemcpyAsync", ())
            self.x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", self.device, 2.0, tid=STREAM,
                   correlation=self.corr, stream=STREAM)
            self.device += 3.0
        self.host = max(self.host, self.device) + 10.0
        self.x("python_function", RUNNER_FRAME, start + 5.0, self.host - start - 10.0)
        self.x("python_function", WORKER_FRAME, start, self.host - start)
        self.host += gap_us


def _tail(t: _Trace, decode: bool) -> None:
    """The lm_head GEMM, the logits all-gather and the sampler, launched eagerly."""
    t.launch("cudaLaunchKernel", [(GEMM, 150.0 if decode else 300.0)], op="aten::mm")
    t.launch("cudaLaunchKernel", [(ALL_GATHER, 20.0)], op="vllm::all_gather")
    t.launch("cudaLaunchKernel", [(SAMPLER, 12.0)], op="aten::softmax")
    t.launch("cudaLaunchKernel", [(ARGMAX, 8.0)], op="aten::argmax")


def _prefill(t: _Trace, n_layers: int) -> None:
    """Eager: each kernel its own launch, each collective inside `vllm::all_reduce`."""
    t.launch("cudaLaunchKernel", [(GEMM, 60.0)], op="aten::embedding")
    t.launch("cudaLaunchKernel", [(ALL_REDUCE, 100.0)], op="vllm::all_reduce")
    for _ in range(n_layers):
        for name, _, us in _PRE:
            t.launch("cudaLaunchKernel", [(name, us)])
        t.launch("cudaLaunchKernel", [(ATTENTION_PREFILL, 60.0)], op="vllm::unified_attention")
        for name, _, us in _POST:
            t.launch("cudaLaunchKernel", [(name, us)], op="vllm::all_reduce" if name == ALL_REDUCE else None)
    _tail(t, decode=False)


def _decode(t: _Trace, n_layers: int) -> None:
    """Piecewise graphs: piece 0 (embedding, its all-reduce, layer 0 up to attention), one piece
    after each layer's attention (its o_proj to the next layer's attention), attention eager."""
    first = [(GEMM, 4.0), (ALL_REDUCE, 10.0)] + [(n, us) for n, us, _ in _PRE]
    t.launch("cudaGraphLaunch", first)
    for layer in range(n_layers):
        t.launch("cudaLaunchKernel", [(ATTENTION_DECODE, 40.0)], op="vllm::unified_attention")
        piece = [(n, us) for n, us, _ in _POST]
        piece += [(n, us) for n, us, _ in _PRE] if layer + 1 < n_layers else [(RMS_NORM, 3.0)]
        t.launch("cudaGraphLaunch", piece)
    _tail(t, decode=True)


def fake_vllm_v1_trace(n_layers: int = 80, n_decode: int = 9, tp: int = 4) -> dict:
    """The trace as a dict: one idle `execute_model` call, one eager prefill step, then
    `n_decode` decode steps replaying `n_layers + 1` graph pieces each."""
    t = _Trace()
    t.step(gap_us=500.0)  # nothing scheduled: no work launched
    t.step(lambda: _prefill(t, n_layers))
    for _ in range(n_decode):
        t.step(lambda: _decode(t, n_layers))
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": tp},
            "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85029158912}],
            "traceEvents": t.events}


def write_fake_vllm_v1_trace(path: str | Path, **kwargs) -> Path:
    """`fake_vllm_v1_trace(**kwargs)` written gzipped to `path` (`...pt.trace.json.gz`)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(p, "wt") as fh:
        json.dump(fake_vllm_v1_trace(**kwargs), fh)
    return p
