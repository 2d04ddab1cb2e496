"""One rank of the collective micro-benchmark (`python -m stepscope.micro._collective_worker CONFIG RANK`),
started by `run_collectives`; writes `rank<R>.json` and a per-phase `rank<R>.progress` so the parent can say
which rank hung."""

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

    from stepscope.micro import _collective_impls

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
    # vLLM builds its communicators on a gloo group beside the device one; so do we.
    cpu_group = dist.new_group(backend="gloo") if use_cuda else dist.group.WORLD
    names = list(cfg.get("implementations") or [backend])
    progress(f"building {', '.join(names)}")
    impls = _collective_impls.build(names, dist=dist, torch=torch,
                                    device=device, cpu_group=cpu_group, world=world,
                                    ident=f"stepscope-{cfg['port']}")
    result: dict = {"rank": rank, "world_size": world, "backend": backend, "dtype": cfg["dtype"],
                    "device": str(device), "eager": [], "burst": [], "unavailable": {}}
    timing = dict(dtype=dtype, elem=elem, device=device, cfg=cfg, sync=sync, world=world)
    for impl in impls:
        if impl.unavailable:
            result["unavailable"][impl.name] = impl.unavailable
            continue
        progress(f"{impl.name}: built")
        _time_impl(impl, result, dist, torch, timing, use_cuda, progress)
    dist.barrier()
    dist.destroy_process_group()
    return result


def _time_impl(impl, result: dict, dist, torch, timing: dict, use_cuda: bool, progress) -> None:
    """Every eager size, then every burst, of one implementation, into `result`."""
    cfg = timing["cfg"]
    for op, size in [("all_reduce", s) for s in cfg["sizes_bytes"]] + [("all_gather", s) for s in
                                                                      cfg.get("all_gather_sizes_bytes", [])]:
        if op == "all_gather" and impl.all_gather is None:
            continue
        progress(f"{impl.name}: eager {op} {size} B")
        entry = _eager(dist, torch, impl, op, int(size), **timing)
        if entry is not None:
            result["eager"].append(dict(entry, implementation=impl.name))
    for m, size in zip(cfg["burst_batch_sizes"], cfg["burst_sizes_bytes"]):
        for b in _bursts(dist, torch, impl, int(m), int(size), use_cuda=use_cuda, progress=progress, **timing):
            result["burst"].append(dict(b, implementation=impl.name))


def _eager(dist, torch, impl, op: str, size: int, *, world: int, dtype, elem: int, device, cfg: dict,
           sync) -> dict | None:
    """One collective at one size, timed call by call after `warmup` calls and a barrier;
    None when the engine would not use this implementation at this size."""
    if op == "all_reduce":
        numel = max(1, size // elem)
        x = torch.ones(numel, dtype=dtype, device=device)
        fn = lambda: impl.all_reduce(x)  # noqa: E731
        nbytes = numel * elem
    else:  # size is the gathered output (nccl-tests' convention); each rank sends size / world
        numel = max(1, size // elem // world)
        x = torch.ones(numel, dtype=dtype, device=device)
        out = torch.empty(numel * world, dtype=dtype, device=device)
        fn = lambda: impl.all_gather(out, x)  # noqa: E731
        nbytes = numel * world * elem
    if op == "all_reduce" and impl.usable(x):
        return None
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


def _bursts(dist, torch, impl, m: int, size: int, *, world: int, dtype, elem: int, device, cfg: dict, sync,
            use_cuda: bool, progress) -> list[dict]:
    """K back-to-back all-reduces of one decode step's size, timed as a whole: eager, and on a
    GPU also replayed from one CUDA graph."""
    k = int(cfg["burst_k"])
    numel = max(1, size // elem)
    x = torch.ones(numel, dtype=dtype, device=device)
    base = {"batch_m": m, "size_bytes": numel * elem, "k": k}
    modes = ["eager"] + (["cuda_graph"] if use_cuda and cfg.get("graph", True) and impl.capture else [])
    why = impl.usable(x)
    if why:
        return [dict(base, mode=mode, totals_us=[], status="skipped", reason=why) for mode in modes]
    progress(f"{impl.name}: burst {k} x {size} B eager")
    for _ in range(int(cfg["warmup"])):
        impl.all_reduce(x)
    sync()
    totals = []
    for _ in range(int(cfg["burst_repeats"])):
        dist.barrier()
        # A barrier's ranks leave it up to a millisecond apart (gloo); one all-reduce of the
        # implementation itself lines them up as a decode step finds them, so the burst does
        # not time the barrier's skew.
        impl.all_reduce(x)
        sync()
        t0 = time.perf_counter()
        for _ in range(k):
            impl.all_reduce(x)
        sync()
        totals.append((time.perf_counter() - t0) * 1e6)
    out = [dict(base, mode="eager", totals_us=totals, status="ok", reason="")]
    if "cuda_graph" in modes:
        progress(f"{impl.name}: burst {k} x {size} B cuda_graph")
        out.append(dict(base, **_graph_burst(dist, torch, impl, x, k, int(cfg["burst_repeats"]), device, sync)))
    return out


def _graph_burst(dist, torch, impl, x, k, repeats, device, sync) -> dict:
    """K all-reduces captured in one CUDA graph and replayed, as vLLM's decode does (inside the
    implementation's own capture context: the custom all-reduce registers its buffers there)."""
    try:
        graph = torch.cuda.CUDAGraph()
        with impl.capture():
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(3):
                    impl.all_reduce(x)
            torch.cuda.current_stream(device).wait_stream(side)
            sync()
            with torch.cuda.graph(graph):
                for _ in range(k):
                    impl.all_reduce(x)
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
        return dict(mode="cuda_graph", totals_us=totals, status="ok", reason="")
    except Exception as exc:  # noqa: BLE001 - graph capture of collectives varies by build
        return dict(mode="cuda_graph", totals_us=[], status="failed", reason=f"{type(exc).__name__}: {exc}"[:300])


if __name__ == "__main__":
    code = main(sys.argv[1], int(sys.argv[2]))
    # The result is on disk: leave without the interpreter's teardown, whose destructors of the
    # shared-memory and gloo communicators aborted one rank (exit -6) and hung its peer on a
    # loaded 2-core machine, failing a run whose numbers were all written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
