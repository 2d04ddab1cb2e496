"""Timers shared by the GEMM and collective micro-benchmarks, and the devices' peaks.

CPU: `repeats` samples of `inner` calls with `perf_counter` (one small call is shorter than Python's
overhead); GPU: a CUDA graph replayed `repeats` times, timed with CUDA events.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

CPU_CACHE_SYSFS = "/sys/devices/system/cpu/cpu0/cache"
LLC_FALLBACK_BYTES = 64 << 20
"""The last-level cache assumed where sysfs does not say: more than any current server CPU's
per-core-complex L3, so a rotation sized on it still spills to memory."""

def summarize_us(samples_us: np.ndarray) -> dict[str, float]:
    """Median and p10/p90 (linear interpolation) of per-call times in µs."""
    s = np.asarray(samples_us, dtype=np.float64)
    return {"time_us_median": float(np.median(s)), "time_us_p10": float(np.percentile(s, 10)),
            "time_us_p90": float(np.percentile(s, 90)), "n_repeats": int(s.size)}


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Fix torch's intra-op thread count for the block (None: leave it alone)."""
    import torch

    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(old)


def time_cpu(fn: Callable[[], object], *, warmup: int, repeats: int, target_sample_s: float = 2e-3,
             max_inner: int = 1000) -> np.ndarray:
    """Per-call µs of `fn`, one value per sample: warm-up, calibrate `inner`, then repeat."""
    for _ in range(max(warmup, 1)):
        fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    inner = int(min(max_inner, max(1, target_sample_s // one)))
    out = np.empty(repeats)
    for r in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        out[r] = (time.perf_counter() - t0) / inner * 1e6
    return out


def rotate(calls: list[Callable[[], object]]) -> Callable[[], object]:
    """One call that runs the next of `calls` each time, round robin: `time_cpu` of it times a
    rotation through weight copies (cold) where `calls` use different copies."""
    if len(calls) == 1:  # hot: the call itself, no round-robin step in the timed loop
        return calls[0]
    nxt = itertools.cycle(calls).__next__
    return lambda: nxt()()


def _cache_size_bytes(text: str) -> int:
    """sysfs's cache `size` ("32768K", "2M", "512") in bytes."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def cpu_llc_bytes(sysfs: str | Path = CPU_CACHE_SYSFS) -> tuple[int, str]:
    """The CPU's last-level cache in bytes (the largest cache sysfs lists for cpu0) and where
    the figure came from; `LLC_FALLBACK_BYTES` where sysfs has none (not Linux, or a VM
    that hides it)."""
    sizes = []
    for index in sorted(Path(sysfs).glob("index*")):
        try:
            sizes.append((_cache_size_bytes((index / "size").read_text()), (index / "level").read_text().strip()))
        except (OSError, ValueError):
            continue
    if not sizes:
        return LLC_FALLBACK_BYTES, f"no cache sizes in {sysfs}; assumed {LLC_FALLBACK_BYTES >> 20} MiB"
    size, level = max(sizes)
    return size, f"L{level} of cpu0 ({sysfs})"


def time_cuda_graph(calls: list[Callable[[], object]], *, warmup: int, repeats: int) -> np.ndarray:
    """Per-call µs of a CUDA graph running each of `calls` once: no launch overhead, as vLLM's decode replays;
    different weight copies make the cold variant."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside capture (allocations, autotuning)
        for _ in range(2):
            for c in calls:
                c()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    for _ in range(max(warmup, 1)):
        graph.replay()
    torch.cuda.synchronize()
    out = np.empty(repeats)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(repeats):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        out[r] = start.elapsed_time(end) * 1e3 / len(calls)
    del graph
    return out


def time_cuda_each(fn: Callable[[], object], n: int, *, warmup: int, hold_cycles: int = 20_000_000
                   ) -> np.ndarray:
    """Per-call µs of `n` calls of `fn`, each between its own CUDA events; a sleep kernel holds the stream
    meanwhile so the events time the GPU, not the host's launch rate."""
    import torch

    for _ in range(max(warmup, 1)):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    torch.cuda._sleep(hold_cycles)
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return np.array([start.elapsed_time(end) * 1e3 for start, end in events])


def peak_mem_bw_gbps(configured: float | None, device: str) -> tuple[float | None, str]:
    """The peak memory bandwidth to compare against, and where it came from: params, else
    the one known-device table (`stepscope.hardware`), else None with the reason."""
    if configured:
        return float(configured), "params hardware.peak_mem_bw_gbps"
    if device == "cuda":
        import torch

        from stepscope.hardware import lookup_device

        props = torch.cuda.get_device_properties(0)
        match = lookup_device(props.name, {"totalGlobalMem": props.total_memory})
        if match.device is not None and match.device.mem_bw_gbps:
            return match.device.mem_bw_gbps, f"stepscope.hardware: {match.device.source}"
        return None, f"{props.name}: {match.matched_by}; set hardware.peak_mem_bw_gbps"
    return None, "CPU: no peak known; set hardware.peak_mem_bw_gbps to get % of peak"
