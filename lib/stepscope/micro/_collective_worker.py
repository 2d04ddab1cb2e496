"""One rank of the collective micro-benchmark: `python -m stepscope.micro._collective_worker CONFIG RANK`.

Started by `stepscope.micro.collectives.run_collectives`, never by hand. Writes its raw
timings to `<out_dir>/rank<R>.json` and its progress to `<out_dir>/rank<R>.progress`
(one line per phase: step, unix time, phase) so the parent can say which rank hung.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

from stepscope.runfolder import write_json


class _Progress:
    def __init__(self, path: Path):
        self.path = path
        self.step = 0

    def __call__(self, phase: str) -> None:
        self.step += 1
        with self.path.open("a") as fh:
            fh.write(f"{self.step}\t{time.time():.6f}\t{phase}\n")


def main(cfg_path: str, rank: int) -> int:
    cfg = json.loads(Path(cfg_path).read_text())
    out_dir = Path(cfg["out_dir"])
    progress = _Progress(out_dir / f"rank{rank}.progress")
    progress("started")
    try:
        result = _run(cfg, rank, progress)
    except Exception as exc:  # noqa: BLE001 - report any failure to the parent, then exit non-zero
        progress(f"error: {type(exc).__name__}: {exc}".replace("\n", " ")[:400])
        traceback.print_exc()
        return 1
    write_json(out_dir / f"rank{rank}.json", result)  # atomic, through an exclusive temp file
    progress("done")
    return 0


def _run(cfg: dict, rank: int, progress) -> dict:
    import torch
    import torch.distributed as dist

    world = int(cfg["world_size"])
    backend = cfg["backend"]
    torch.set_num_threads(int(cfg.get("threads") or 1))
    use_cuda = backend == "nccl"
    device = torch.device(f"cuda:{rank % max(torch.cuda.device_count(), 1)}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dtype = getattr(torch, cfg["dtype"])
    elem = torch.tensor([], dtype=dtype).element_size()

    def sync() -> None:
        if use_cuda:
            torch.cuda.synchronize(device)

    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=float(cfg["timeout_s"])))
    progress("initialized")
    fault = cfg.get("fault") or {}
    if fault.get("rank") == rank:  # test hook: a rank that dies or hangs stops reporting progress
        print(f"rank {rank}: injected fault {fault['kind']!r}", flush=True)
        if fault["kind"] == "exit":
            os._exit(3)
        time.sleep(3600)

    result: dict = {"rank": rank, "world_size": world, "backend": backend, "dtype": cfg["dtype"],
                    "device": str(device), "eager": [], "burst": []}
    for op, size in [("all_reduce", s) for s in cfg["sizes_bytes"]] + [("all_gather", s) for s in
                                                                      cfg.get("all_gather_sizes_bytes", [])]:
        progress(f"eager {op} {size} B")
        result["eager"].append(_eager(dist, torch, op, int(size), world, dtype, elem, device, cfg, sync))
    for m, size in zip(cfg["burst_batch_sizes"], cfg["burst_sizes_bytes"]):
        result["burst"] += _bursts(dist, torch, int(m), int(size), dtype, elem, device, cfg, use_cuda, sync,
                                   progress)
    dist.barrier()
    dist.destroy_process_group()
    return result


def _eager(dist, torch, op: str, size: int, world: int, dtype, elem: int, device, cfg: dict, sync) -> dict:
    """One collective at one size, timed call by call after `warmup` calls and a barrier."""
    if op == "all_reduce":
        numel = max(1, size // elem)
        x = torch.ones(numel, dtype=dtype, device=device)
        fn = lambda: dist.all_reduce(x)  # noqa: E731
        nbytes = numel * elem
    else:  # size is the gathered output (nccl-tests' convention); each rank sends size / world
        numel = max(1, size // elem // world)
        x = torch.ones(numel, dtype=dtype, device=device)
        out = torch.empty(numel * world, dtype=dtype, device=device)
        fn = lambda: dist.all_gather_into_tensor(out, x)  # noqa: E731
        nbytes = numel * world * elem
    for _ in range(int(cfg["warmup"])):
        fn()
    sync()
    dist.barrier()
    times = []
    for _ in range(int(cfg["iters"])):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e6)
    return {"op": op, "size_bytes": nbytes, "count": numel, "times_us": times}


def _bursts(dist, torch, m: int, size: int, dtype, elem: int, device, cfg: dict, use_cuda: bool, sync,
            progress) -> list[dict]:
    """K back-to-back all-reduces of one decode step's size, timed as a whole: eager, and on a
    GPU also replayed from one CUDA graph."""
    k = int(cfg["burst_k"])
    numel = max(1, size // elem)
    x = torch.ones(numel, dtype=dtype, device=device)
    progress(f"burst {k} x {size} B eager")
    for _ in range(int(cfg["warmup"])):
        dist.all_reduce(x)
    sync()
    totals = []
    for _ in range(int(cfg["burst_repeats"])):
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        for _ in range(k):
            dist.all_reduce(x)
        sync()
        totals.append((time.perf_counter() - t0) * 1e6)
    out = [{"mode": "eager", "batch_m": m, "size_bytes": numel * elem, "k": k, "totals_us": totals,
            "status": "ok", "reason": ""}]
    if use_cuda and cfg.get("graph", True):
        progress(f"burst {k} x {size} B cuda_graph")
        out.append(_graph_burst(dist, torch, x, k, m, numel * elem, int(cfg["burst_repeats"]), device, sync))
    return out


def _graph_burst(dist, torch, x, k, m, nbytes, repeats, device, sync) -> dict:
    """K all-reduces captured in one CUDA graph and replayed, as vLLM's decode does."""
    base = {"mode": "cuda_graph", "batch_m": m, "size_bytes": nbytes, "k": k}
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(3):
                dist.all_reduce(x)
        torch.cuda.current_stream(device).wait_stream(side)
        sync()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(k):
                dist.all_reduce(x)
        graph.replay()
        sync()
        totals = []
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(repeats):
            dist.barrier()
            sync()
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            totals.append(start.elapsed_time(end) * 1e3)
        return dict(base, totals_us=totals, status="ok", reason="")
    except Exception as exc:  # noqa: BLE001 - graph capture of c10d collectives varies by build
        return dict(base, totals_us=[], status="failed", reason=f"{type(exc).__name__}: {exc}"[:300])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
