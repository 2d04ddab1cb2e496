"""Stage 02: time every distinct GEMM of the model at its per-GPU shapes, predict per-step GEMM time.

`plan_targets` → `gemm_grid` → `run_gemm_grid` (each row hits gemm.csv as measured) →
`predict_gemm_us_per_step` → prediction.json.
"""

from __future__ import annotations

import csv
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from stepscope import schema
from stepscope.errors import StepscopeError
from stepscope.model import (
    Architecture,
    ArchitectureError,
    architecture_from_params,
    calls_per_step,
    decode_weight_bytes,
    distinct_experts,
    fused_moe_bytes,
    fused_moe_flops,
    gemm_bytes,
    gemm_flops,
    gemm_shapes,
    load_architecture,
)
from stepscope.micro import marlin as marlin_mod
from stepscope.micro import vllm_cpu
from stepscope.micro.timing import cpu_llc_bytes, rotate, summarize_us, time_cpu, time_cuda_graph, torch_threads

log = logging.getLogger(__name__)

GEMM_COLUMNS = [
    "model", "tp", "gemm", "layer_kind", "m", "n", "k", "batch", "experts", "rows_per_expert", "dtype", "backend",
    "kernel", "mode", "device",
    "threads", "time_us_median", "time_us_p10", "time_us_p90", "n_repeats", "flops", "bytes", "tflops",
    "gbps", "pct_peak_bw", "status", "reason",
]
MARLIN_DTYPE = "w4a16-g32"
BACKENDS = ("torch", "marlin", "vllm")
"""torch: torch.matmul / F.linear (the reference); marlin: vLLM's W4A16 Marlin GEMM (CUDA);
vllm: the kernels vllm-cpu's engine runs (`stepscope.micro.vllm_cpu`), for the served model."""
FUSED_MOE_GEMM = "routed_experts_fused"
"""The `gemm` of a grouped routed-expert row: one `_C::cpu_fused_moe` call per MoE layer (gate_up,
activation and down of every expert touched). Not `+`-joined: it is no single GEMM's shape."""
DEFAULT_PRESET_TP = 8
"""TP for presets when neither micro.gemm.preset_tp nor hardware.gpu_count is set: the
reference campaign in docs/methods.md (Kimi-K2.5 on 8 GPUs)."""
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class GemmMicroError(StepscopeError):
    """A GEMM micro-benchmark that cannot be set up as asked."""


@dataclass(frozen=True)
class GemmTarget:
    """One model to time: its architecture, TP size and M grid."""

    label: str
    arch: Architecture
    tp: int
    m_values: tuple[int, ...]
    role: str
    """`served` (the model the server runs) or `preset` (an extra architecture)."""


# --------------------------------------------------------------------------- planning


def plan_targets(params) -> tuple[list[GemmTarget], list[str]]:
    """The served model (at server.tp, micro.gemm.m_values) and each preset (preset_tp, else
    hardware.gpu_count, else 8): (targets, notes saying what could not be planned and why)."""
    g = params.micro.gemm
    targets: list[GemmTarget] = []
    notes: list[str] = []
    served_preset = None
    try:
        arch = architecture_from_params(params)
        label = params.model.served_name or arch.name
        targets.append(GemmTarget(label, arch, params.server.tp, tuple(g.m_values), "served"))
        if arch.source.startswith("preset:"):
            served_preset = arch.source.split(":", 1)[1]
    except ArchitectureError as exc:
        notes.append(f"served model not timed: {exc.render()}")
    preset_tp = g.preset_tp or params.hardware.gpu_count or DEFAULT_PRESET_TP
    for name in g.presets:
        if name == served_preset and preset_tp == params.server.tp:
            notes.append(f"preset {name} is the served model; timed once")
            continue
        arch = load_architecture(preset=name)
        targets.append(GemmTarget(f"{name} (preset)", arch, preset_tp, tuple(g.preset_m_values), "preset"))
    return targets, notes


def planned_backends(backends: Iterable[str]) -> tuple[str, ...]:
    """micro.gemm.backends, plus `vllm` (the engine's own kernels) wherever vLLM is installed:
    the prediction should time what the engine runs, torch staying as the reference."""
    import importlib.util

    backends = tuple(backends)
    if "vllm" in backends or importlib.util.find_spec("vllm") is None:
        return backends
    return backends + ("vllm",)


def distinct_shapes(arch: Architecture, tp: int) -> pd.DataFrame:
    """The model's GEMMs grouped by shape (n, k, batch): each shape is timed once.
    Columns: n, k, batch, gemm ("+"-joined names), layer_kind ("+"-joined)."""
    s = gemm_shapes(arch, tp)
    g = s.groupby(["n", "k", "batch"], sort=False).agg(
        gemm=("gemm", lambda x: "+".join(dict.fromkeys(x))),
        layer_kind=("layer_kind", lambda x: "+".join(dict.fromkeys(x)))).reset_index()
    return g[["gemm", "layer_kind", "n", "k", "batch"]]


def gemm_grid(targets: Iterable[GemmTarget], dtypes: Iterable[str], backends: Iterable[str], *,
              engine_dtype: str | None = None) -> pd.DataFrame:
    """One row per case (model, tp, gemm, shape, m, dtype, backend). Marlin cases are `w4a16-g32`; `vllm`
    cases (the engine's kernels) are the served model's alone at `engine_dtype`, plus one grouped
    routed-expert case per M for an MoE model."""
    dtypes = list(dtypes)
    rows = []
    for t in targets:
        shapes = distinct_shapes(t.arch, t.tp)
        for backend in backends:
            if backend not in BACKENDS:
                raise GemmMicroError(f"unknown GEMM backend {backend!r}", where="micro.gemm.backends",
                                     hint=f"valid backends: {', '.join(BACKENDS)}")
            if backend == "vllm" and t.role != "served":
                continue
            for dtype in _backend_dtypes(backend, dtypes, engine_dtype):
                for sh in shapes.itertuples(index=False):
                    for m in t.m_values:
                        rows.append(dict(model=t.label, tp=t.tp, gemm=sh.gemm, layer_kind=sh.layer_kind,
                                         n=sh.n, k=sh.k, batch=sh.batch, m=int(m), dtype=dtype, backend=backend))
                if backend == "vllm":
                    rows += [dict(c, dtype=dtype, backend=backend) for c in fused_moe_cases(t)]
    return pd.DataFrame(rows, columns=["model", "tp", "gemm", "layer_kind", "n", "k", "batch", "experts",
                                       "rows_per_expert", "m", "dtype", "backend"])


def _backend_dtypes(backend: str, dtypes: list[str], engine_dtype: str | None) -> list[str]:
    if backend == "marlin":
        return [MARLIN_DTYPE]
    if backend == "vllm":  # server.dtype may be vLLM's `auto`: the checkpoint's, bf16 for ours
        engine_dtype = engine_dtype if engine_dtype in _DTYPE_BYTES else None
        out = [engine_dtype or ("bfloat16" if "bfloat16" in dtypes or not dtypes else dtypes[0])]
    else:
        out = dtypes
    for dtype in out:
        if dtype not in _DTYPE_BYTES:
            raise GemmMicroError(f"unknown dtype {dtype!r}", where="micro.gemm.dtypes" if backend == "torch"
                                 else "server.dtype", hint=f"valid dtypes: {', '.join(_DTYPE_BYTES)}")
    return out


def fused_moe_cases(target: GemmTarget) -> list[dict]:
    """The routed experts as the engine runs them, one case per M: one fused call per MoE layer over D(M)
    distinct experts, M·k/D(M) rows each; [] for a dense model."""
    a = target.arch
    if not a.is_moe:
        return []
    inter = a.moe_intermediate // target.tp
    out = []
    for m in target.m_values:
        d = max(a.top_k, min(int(round(float(distinct_experts(a.n_routed_experts, a.top_k, m)))), m * a.top_k))
        out.append(dict(model=target.label, tp=target.tp, gemm=FUSED_MOE_GEMM, layer_kind="routed_expert",
                        n=2 * inter, k=a.hidden, batch=1, experts=d, rows_per_expert=m * a.top_k / d, m=int(m)))
    return out


# --------------------------------------------------------------------------- timing


def _row(case: dict, **kw: Any) -> dict:
    row = {c: np.nan for c in GEMM_COLUMNS}
    row.update({k: case[k] for k in ("model", "tp", "gemm", "layer_kind", "m", "n", "k", "batch", "experts",
                                      "rows_per_expert", "dtype", "backend") if k in case})
    row.update(kw)
    return row


def _metrics(case: dict, stats: dict, peak_bw: float | None) -> dict:
    m, n, k, b = case["m"], case["n"], case["k"], case["batch"]
    if case["backend"] == "marlin":
        nbytes = float(gemm_bytes(m, n, k, weight_bits=4, act_bytes=2, group_size=32, batch=b))
    else:
        eb = _DTYPE_BYTES[case["dtype"]]
        nbytes = float(gemm_bytes(m, n, k, weight_bits=8 * eb, act_bytes=eb, batch=b))
    flops = float(gemm_flops(m, n, k, batch=b))
    t = stats["time_us_median"]
    gbps = nbytes / t / 1e3
    return dict(stats, flops=flops, bytes=nbytes, tflops=flops / t / 1e6, gbps=gbps,
                pct_peak_bw=(100.0 * gbps / peak_bw) if peak_bw else np.nan)


def _torch_weight(n: int, k: int, batch: int, dtype, device: str):
    """A weight with non-trivial values, made fast: one random row tiled (torch.rand of
    10^8 elements takes seconds on a CPU; GEMM speed does not depend on the values)."""
    import torch

    row = torch.rand(1, k, dtype=torch.float32, device=device).to(dtype) * 0.02
    w = row.expand(n, k).contiguous()
    return w.unsqueeze(0).expand(batch, n, k).contiguous() if batch > 1 else w


def _torch_fn(a, w, out):
    import torch
    import torch.nn.functional as F

    if w.dim() == 3:
        wt = w.transpose(1, 2)
        return lambda: torch.bmm(a, wt, out=out)
    return lambda: F.linear(a, w)


def _cold_copies(weight_bytes: float, cache_bytes: int, budget_bytes: float = 4e9) -> int:
    """Weight copies to rotate through so the working set exceeds 2x the cache (a GPU's L2,
    a CPU's last level): each call then reads its weights from memory, as a decode step does."""
    need = math.ceil(2 * cache_bytes / max(weight_bytes, 1)) + 1
    return int(max(2, min(need, budget_bytes // max(weight_bytes, 1))))


def run_gemm_grid(grid: pd.DataFrame, *, warmup: int, repeats: int, threads: int | None = None,
                  peak_bw_gbps: float | None = None, device: str | None = None,
                  csv_path: str | Path | None = None, progress: bool = True,
                  graph_calls: int = 50) -> pd.DataFrame:
    """Time every case of `grid` into GEMM_COLUMNS, appending each row to `csv_path` as measured.

    Cold mode rotates weights through more than 2x the last-level cache, because in the engine other layers'
    weights run between two calls of a layer. CPU: perf_counter at a fixed thread count; GPU: a CUDA graph
    timed with CUDA events. Marlin without CUDA/vLLM: one `skipped` row per model.
    """
    import torch
    from stepscope import progress as _progress

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    rows: list[dict] = []
    writer = _CsvAppender(csv_path) if csv_path else None

    def emit(row: dict) -> None:
        rows.append(row)
        if writer:
            writer.write(row)

    unavailable = {"marlin": marlin_mod.availability() if (grid["backend"] == "marlin").any() else None,
                   "vllm": vllm_cpu.availability(device) if (grid["backend"] == "vllm").any() else None}
    modes = ("hot", "cold") if device == "cuda" else ("hot",)
    # 50 MB when the property is missing: at least the L2 of current data-centre GPUs.
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20) if device == "cuda" else 0
    llc = cpu_llc_bytes()[0] if device == "cpu" else 0
    groups = list(grid.groupby(["model", "tp", "backend", "dtype", "gemm", "n", "k", "batch"], sort=False))
    bar = _progress.bar(total=len(grid), desc="GEMM cases", disable=not progress)
    with torch_threads(threads if device == "cpu" else None):
        thr = torch.get_num_threads() if device == "cpu" else np.nan
        for (model, tp, backend, dtype, gemm, n, k, batch), cases in groups:
            base = dict(model=model, tp=tp, gemm=gemm, layer_kind=cases["layer_kind"].iloc[0], n=n, k=k,
                        batch=batch, dtype=dtype, backend=backend)
            if unavailable.get(backend):
                # One line per model says why, instead of one per shape.
                if not any(r["model"] == model and r["backend"] == backend for r in rows):
                    emit(_row(dict(base, gemm="(all shapes)", layer_kind="", m=np.nan, n=np.nan, k=np.nan,
                                   batch=np.nan), device=device, status="skipped", reason=unavailable[backend]))
                bar.update(len(cases))
                continue
            if backend == "marlin" and (batch != 1 or n % 64 or k % 128):
                for c in cases.to_dict("records"):
                    emit(_row(c, device=device, status="skipped",
                              reason="shape outside Marlin's tiles (needs batch 1, n % 64 == 0, k % 128 == 0)"))
                bar.update(len(cases))
                continue
            start = len(rows)
            try:
                if backend == "vllm":
                    _time_vllm_group(cases, dtype=dtype, warmup=warmup, repeats=repeats, peak_bw=peak_bw_gbps,
                                     threads=thr, emit=emit, bar=bar, cache_bytes=llc)
                else:
                    _time_group(base, cases, backend=backend, dtype=dtype, device=device, modes=modes, l2=l2,
                                warmup=warmup, repeats=repeats, peak_bw=peak_bw_gbps, graph_calls=graph_calls,
                                threads=thr, emit=emit, bar=bar)
            except Exception as exc:  # noqa: BLE001 - one failed shape must not stop the grid
                done = {r["m"] for r in rows[start:]}
                for c in cases.to_dict("records"):
                    if c["m"] not in done:
                        emit(_row(c, device=device, status="failed", reason=f"{type(exc).__name__}: {exc}"[:300]))
                        bar.update(1)
            finally:
                if device == "cuda":
                    torch.cuda.empty_cache()
    bar.close()
    return pd.DataFrame(rows, columns=GEMM_COLUMNS)


def _time_group(base, cases, *, backend, dtype, device, modes, l2, warmup, repeats, peak_bw, graph_calls,
                threads, emit, bar) -> None:
    import torch

    n, k, batch = int(base["n"]), int(base["k"]), int(base["batch"])
    if backend == "marlin":
        weights = [marlin_mod.MarlinGemm(n, k, device=device, seed=0)]
        a0 = torch.randn(max(int(cases["m"].min()), 16), k, dtype=torch.bfloat16, device=device)
        diff = weights[0].mean_rel_diff(a0)
        if not diff < marlin_mod.CORRECTNESS_MAX_MEAN_REL_DIFF:
            for c in cases.to_dict("records"):
                emit(_row(c, device=device, status="failed",
                          reason=f"correctness gate: mean rel diff {diff:.3f} >= "
                                 f"{marlin_mod.CORRECTNESS_MAX_MEAN_REL_DIFF} vs dequantized reference"))
                bar.update(1)
            return
        w_bytes = n * k * 4.5 / 8
        act_dtype = torch.bfloat16
    else:
        act_dtype = getattr(torch, dtype)
        weights = [_torch_weight(n, k, batch, act_dtype, device)]
        w_bytes = batch * n * k * weights[0].element_size()
    for c in cases.to_dict("records"):
        m = int(c["m"])
        for mode in modes:
            if mode == "cold":
                copies = _cold_copies(w_bytes, l2)
                while len(weights) < copies:
                    weights.append(weights[0].copy() if backend == "marlin"
                                   else _torch_weight(n, k, batch, act_dtype, device))
                ws = weights[:copies]
            else:
                ws = weights[:1]
            shape = (batch, m, k) if batch > 1 else (m, k)
            a = torch.rand(*shape, dtype=act_dtype, device=device)
            if backend == "marlin":
                fns = [w.call(a) for w in ws]
            else:
                out = torch.empty(*(shape[:-1] + (n,)), dtype=act_dtype, device=device)
                fns = [_torch_fn(a, w, out) for w in ws]
            if device == "cuda":
                calls = [fns[i % len(fns)] for i in range(max(graph_calls, len(fns)))]
                samples = time_cuda_graph(calls, warmup=warmup, repeats=repeats)
            else:
                samples = time_cpu(fns[0], warmup=warmup, repeats=repeats)
            stats = summarize_us(samples)
            reason = "" if mode == "hot" else f"{len(ws)} weight copies rotated (> 2x L2 = {2 * l2 / 1e6:.0f} MB)"
            kernel = "marlin" if backend == "marlin" else ("aten::bmm" if batch > 1 else vllm_cpu.TORCH_LINEAR)
            emit(_row(c, mode=mode, device=device, threads=threads, status="ok", reason=reason, kernel=kernel,
                      **_metrics(c, stats, peak_bw)))
        bar.update(1)


CPU_MODES = ("hot", "cold")
"""The engine's kernels on CPU: hot (one weight, the kernel's best) and cold (the prediction's)."""


def _cold_reason(calls: int, touched_bytes: float, cache_bytes: int) -> str:
    return (f"{calls} weight copies rotated ({calls * touched_bytes / 1e6:.0f} MB read > 2x last-level cache "
            f"= {2 * cache_bytes / 1e6:.0f} MB)")


def _time_vllm_group(cases: pd.DataFrame, *, dtype: str, warmup: int, repeats: int, peak_bw: float | None,
                     threads, emit, bar, cache_bytes: int) -> None:
    """One shape through the engine's own CPU kernel (`stepscope.micro.vllm_cpu`), packed as the engine packs
    it, timed at each M hot and cold (round-robin packed copies)."""
    import torch

    first = cases.iloc[0]
    if first["gemm"] == FUSED_MOE_GEMM:
        return _time_fused_moe(cases, dtype=dtype, warmup=warmup, repeats=repeats, peak_bw=peak_bw,
                               threads=threads, emit=emit, bar=bar, cache_bytes=cache_bytes)
    n, k, batch = int(first["n"]), int(first["k"]), int(first["batch"])
    act = getattr(torch, dtype)
    weights = [_torch_weight(n, k, batch, act, "cpu")]
    engines = [vllm_cpu.engine_linear(weights[0]) if batch == 1 else None]
    w_bytes = batch * n * k * weights[0].element_size()
    for c in cases.to_dict("records"):
        m = int(c["m"])
        a = torch.rand(*((batch, m, k) if batch > 1 else (m, k)), dtype=act)
        out = torch.empty(*((batch, m, n) if batch > 1 else (m, n)), dtype=act)
        for mode in CPU_MODES:
            count = _cold_copies(w_bytes, cache_bytes) if mode == "cold" else 1
            while len(weights) < count:
                weights.append(weights[0].clone())
                engines.append(vllm_cpu.engine_linear(weights[-1]) if batch == 1 else None)
            fns = [e.call(a, out) if e else _torch_fn(a, w, out) for e, w in zip(engines[:count], weights[:count])]
            stats = summarize_us(time_cpu(rotate(fns), warmup=warmup, repeats=repeats))
            emit(_row(c, mode=mode, device="cpu", threads=threads, status="ok",
                      reason=_cold_reason(count, w_bytes, cache_bytes) if mode == "cold" else "",
                      kernel=engines[0].kernel if engines[0] else "aten::bmm", **_metrics(c, stats, peak_bw)))
        bar.update(1)


def _fused_moe_calls(moes: list, mode: str, m: int, d: int, top_k: int, x, out, cache_bytes: int) -> list:
    """The calls a fused-MoE timing rotates through: one hot; cold, enough to read over 2x the last-level
    cache, each packed copy serving E // d calls on disjoint expert sets. Copies go into `moes`."""
    ids, weights = vllm_cpu.routing(m, top_k, d)
    if mode == "hot":
        return [moes[0].call(x, out, ids, weights)]
    calls, per_copy = _cold_copies(d * moes[0].expert_bytes, cache_bytes), moes[0].experts // d
    while len(moes) * per_copy < calls:
        moes.append(moes[0].copy())
    return [moes[i // per_copy].call(x, out, ids + (i % per_copy) * d, weights) for i in range(calls)]


def _time_fused_moe(cases: pd.DataFrame, *, dtype: str, warmup: int, repeats: int, peak_bw: float | None,
                    threads, emit, bar, cache_bytes: int) -> None:
    """One MoE layer's routed experts as one `_C::cpu_fused_moe` call per M on D(M) experts, hot and cold;
    only the largest D is allocated."""
    import torch

    act = getattr(torch, dtype)
    first = cases.iloc[0]
    inter, hidden = int(first["n"]) // 2, int(first["k"])
    moes = [vllm_cpu.engine_fused_moe(int(cases["experts"].max()), hidden, inter, act)]
    for c in cases.to_dict("records"):
        m, d = int(c["m"]), int(c["experts"])
        top_k = int(round(c["rows_per_expert"] * d / m))
        x, out = torch.rand(m, hidden, dtype=act), torch.empty(m, hidden, dtype=act)
        flops = fused_moe_flops(m, top_k, hidden, inter)
        nbytes = fused_moe_bytes(m, d, hidden, inter, weight_bytes=_DTYPE_BYTES[dtype], act_bytes=_DTYPE_BYTES[dtype])
        for mode in CPU_MODES:
            calls = _fused_moe_calls(moes, mode, m, d, top_k, x, out, cache_bytes)
            stats = summarize_us(time_cpu(rotate(calls), warmup=warmup, repeats=repeats))
            t = stats["time_us_median"]
            gbps = nbytes / t / 1e3
            reason = f"isa {moes[0].isa}; {d} experts x {c['rows_per_expert']:.2f} rows" + (
                "; " + _cold_reason(len(calls), d * moes[0].expert_bytes, cache_bytes) if mode == "cold" else "")
            emit(_row(c, mode=mode, device="cpu", threads=threads, status="ok", kernel=moes[0].kernel,
                      reason=reason, **stats, flops=flops, bytes=nbytes, tflops=flops / t / 1e6, gbps=gbps,
                      pct_peak_bw=(100.0 * gbps / peak_bw) if peak_bw else np.nan))
        bar.update(1)


class _CsvAppender:
    """Append rows to a CSV as they are measured, header once."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("w", newline="") as fh:
            csv.writer(fh).writerow(GEMM_COLUMNS)

    def write(self, row: dict) -> None:
        with self.path.open("a", newline="") as fh:
            csv.writer(fh).writerow(["" if (isinstance(row.get(c), float) and np.isnan(row[c])) else row.get(c)
                                     for c in GEMM_COLUMNS])


# --------------------------------------------------------------------------- prediction


def _interp_time(sub: pd.DataFrame, m_rows: float) -> tuple[float, bool]:
    """Time at m_rows by linear interpolation over the measured M grid; clamped (and
    flagged) outside it."""
    sub = sub.sort_values("m")
    ms, ts = sub["m"].to_numpy(float), sub["time_us_median"].to_numpy(float)
    clamped = m_rows < ms[0] - 1e-9 or m_rows > ms[-1] + 1e-9
    return float(np.interp(m_rows, ms, ts)), clamped


PREDICTION_COLUMNS = ["m", "gemm_us_per_step", "n_gemm_calls", "routed_expert_us_per_step", "clamped_shapes",
                      "missing_shapes"]


def predict_gemm_us_per_step(table: pd.DataFrame, target: GemmTarget, *, backend: str, dtype: str,
                             mode: str, routed_backend: tuple[str, str] | None = None) -> pd.DataFrame:
    """Predicted GEMM time of one decode step at each measured M (PREDICTION_COLUMNS).

    Sum over the GEMMs of calls_per_step × time(m_rows), interpolated in M from this backend/dtype/mode's
    rows; routed experts per distinct expert (D(M)), or one fused call per MoE layer where timed grouped.
    `routed_backend` times the routed experts with another backend (Marlin for W4A16).
    """
    ok = table[(table["model"] == target.label) & (table["status"] == "ok") & (table["mode"] == mode)]
    grouped = _is_fused(ok)
    fused = ok[grouped & (ok["backend"] == backend) & (ok["dtype"] == dtype)]
    if routed_backend or not target.arch.is_moe:
        fused = fused.iloc[0:0]
    ok = ok[~grouped]
    shapes = gemm_shapes(target.arch, target.tp)
    out = []
    for m in sorted(set(int(x) for x in ok["m"].dropna())) or []:
        c = calls_per_step(shapes, m, target.arch)
        if len(fused):
            c = c[c["layer_kind"] != "routed_expert"]
        total, n_calls, routed, clamped, missing = 0.0, 0.0, 0.0, [], []
        for r in c.itertuples(index=False):
            be, dt = (routed_backend if (routed_backend and r.layer_kind == "routed_expert") else (backend, dtype))
            sub = ok[(ok["backend"] == be) & (ok["dtype"] == dt) & (ok["n"] == r.n) & (ok["k"] == r.k)
                     & (ok["batch"] == r.batch)]
            if sub.empty:
                missing.append(r.gemm)
                continue
            t, cl = _interp_time(sub, r.m_rows)
            if cl:
                clamped.append(r.gemm)
            total += t * r.calls_per_step
            n_calls += r.calls_per_step
            routed += t * r.calls_per_step if r.layer_kind == "routed_expert" else 0.0
        if len(fused):
            t, cl = _interp_time(fused, m)
            clamped += [FUSED_MOE_GEMM] if cl else []
            routed = t * target.arch.n_moe_layers
            total, n_calls = total + routed, n_calls + target.arch.n_moe_layers
        out.append(dict(m=m, gemm_us_per_step=total, n_gemm_calls=n_calls,
                        routed_expert_us_per_step=routed if target.arch.is_moe else np.nan,
                        clamped_shapes=",".join(clamped), missing_shapes=",".join(missing)))
    return pd.DataFrame(out, columns=PREDICTION_COLUMNS)


def _is_fused(table: pd.DataFrame) -> pd.Series:
    """The grouped routed-expert rows (gemm.csv files of older stepscope have none)."""
    return table["gemm"].eq(FUSED_MOE_GEMM) if "gemm" in table else pd.Series(False, index=table.index)


def choose_prediction_config(table: pd.DataFrame, params) -> dict:
    """Which measured rows stand for the served model: the engine's kernels where they ran, else torch at
    server.dtype; cold where measured (decode streams weights); Marlin for W4A16 routed experts."""
    ok = table[table["status"] == "ok"]
    engine = ok[ok["backend"] == "vllm"]
    backend = "vllm" if len(engine) else "torch"
    ok = ok[ok["backend"] == backend]
    dtypes = list(dict.fromkeys(ok["dtype"]))
    dtype = params.server.dtype if params.server.dtype in dtypes else (dtypes[0] if dtypes else params.server.dtype)
    mode = "cold" if (ok["mode"] == "cold").any() else "hot"
    q = (params.model.quantization or "").lower()
    marlin_ok = ((table["backend"] == "marlin") & (table["status"] == "ok")).any()
    routed = ("marlin", MARLIN_DTYPE) if marlin_ok and any(s in q for s in ("w4a16", "int4", "marlin")) else None
    fused = not routed and _is_fused(ok).any()
    return dict(backend=backend, dtype=dtype, mode=mode, routed_backend=routed,
                routed_experts="fused" if fused else "per_expert")


def _config_for(table: pd.DataFrame, target: GemmTarget, cfg: dict, params) -> dict:
    """`cfg`, or the torch rows where this target has none of cfg's backend (the engine's
    kernels are timed for the served model only)."""
    mine = table[(table["model"] == target.label) & (table["status"] == "ok")]
    if cfg["backend"] == "torch" or (mine["backend"] == cfg["backend"]).any():
        return cfg
    return choose_prediction_config(table[table["backend"] != cfg["backend"]], params)


def _method(cfg: dict) -> str:
    fused = cfg["routed_experts"] == "fused"
    return (f"sum over the model's GEMMs of calls per decode step x median time "
            f"({cfg['backend']} {cfg['dtype']}, {cfg['mode']}"
            + (f"; routed experts: {cfg['routed_backend'][0]} {cfg['routed_backend'][1]}" if cfg["routed_backend"]
               else "") + "); routed experts: "
            + ("one fused call per MoE layer over D(M)=E(1-(1-k/E)^M) experts, M*k/D(M) rows each" if fused else
               "D(M)=E(1-(1-k/E)^M) calls per MoE layer on M*k/D(M) rows")
            + "; time interpolated linearly in M")


def build_prediction(table: pd.DataFrame, targets: list[GemmTarget], params) -> schema.GemmPrediction:
    """prediction.json as its typed record for the served model, presets under `presets`; `reference_*` sums
    torch rows beside engine kernels, `hot_*` hot rows beside cold ones."""
    cfg = choose_prediction_config(table, params)
    result: dict[str, Any] = {"model": None, "tp": None, "method": _method(cfg), "gemm_us_per_decode_step": {},
                              "config": {k: v for k, v in cfg.items()}, "presets": [], "notes": []}
    for t in targets:
        tcfg = _config_for(table, t, cfg, params)
        entry = _target_prediction(table, t, tcfg)
        if t.role == "served" and result["model"] is None:
            result.update({k: v for k, v in entry.items() if k != "routed_expert_us_per_decode_step"},
                          routed_expert_us_per_decode_step=entry["routed_expert_us_per_decode_step"])
            if cfg["backend"] != "torch" and (table["backend"] == "torch").any():
                ref = choose_prediction_config(table[table["backend"] == "torch"], params)
                result["reference_gemm_us_per_decode_step"] = _target_prediction(table, t, ref)[
                    "gemm_us_per_decode_step"]
                result["reference_config"] = ref
            if cfg["mode"] == "cold":  # the kernel's best beside it: the gap is the weights' trip from memory
                hot = _target_prediction(table, t, dict(tcfg, mode="hot"))
                result["hot_gemm_us_per_decode_step"] = hot["gemm_us_per_decode_step"]
                result["hot_routed_expert_us_per_decode_step"] = hot["routed_expert_us_per_decode_step"]
        else:
            entry.pop("routed_expert_us_per_decode_step")
            result["presets"].append(entry)
    if result["model"] is None:
        result["notes"].append("the served model was not timed; no prediction for it")
    return schema.convert(result, schema.GemmPrediction, "02_gemm_micro/prediction.json")


def _target_prediction(table: pd.DataFrame, t: GemmTarget, cfg: dict) -> dict[str, Any]:
    pred = predict_gemm_us_per_step(table, t, backend=cfg["backend"], dtype=cfg["dtype"], mode=cfg["mode"],
                                    routed_backend=cfg["routed_backend"])
    wb = decode_weight_bytes(t.arch, t.tp, [int(m) for m in pred["m"]],
                             quant_scope="routed_experts" if cfg["routed_backend"] else "none",
                             dense_bytes=_DTYPE_BYTES.get(cfg["dtype"], 2)).groupby("m")["weight_bytes"].sum()
    by_m = pred.set_index("m")
    return {"model": t.label, "tp": t.tp,
            "weight_bytes_per_decode_step": {str(int(m)): float(b) for m, b in wb.items()},
            "gemm_us_per_decode_step": {str(int(m)): float(v) for m, v in by_m["gemm_us_per_step"].items()},
            "gemm_calls_per_decode_step": {str(int(m)): float(v) for m, v in by_m["n_gemm_calls"].items()},
            "routed_expert_us_per_decode_step": {str(int(m)): float(v) for m, v
                                                 in by_m["routed_expert_us_per_step"].dropna().items()},
            "missing_shapes": sorted({s for v in pred["missing_shapes"] for s in v.split(",") if s}),
            "clamped_shapes": sorted({s for v in pred["clamped_shapes"] for s in v.split(",") if s})}


# --------------------------------------------------------------------------- tables and plots


def summary_table(table: pd.DataFrame) -> pd.DataFrame:
    """The measured rows in a compact, readable order (µs, TFLOP/s, GB/s, % of peak)."""
    cols = ["model", "gemm", "m", "n", "k", "batch", "experts", "dtype", "backend", "kernel", "mode", "time_us_median",
            "time_us_p10", "time_us_p90", "tflops", "gbps", "pct_peak_bw", "status", "reason"]
    out = table[cols].round({"time_us_median": 1, "time_us_p10": 1, "time_us_p90": 1, "tflops": 3, "gbps": 2,
                             "pct_peak_bw": 1})
    return out.astype({c: "Int64" for c in ("m", "n", "k", "batch", "experts")})


def describe_run(stage: GemmStage) -> str:
    """How stage 02 timed, against which peak, in one paragraph."""
    t = stage.table
    peak = (f"{stage.peak_mem_bw_gbps:.0f} GB/s" if stage.peak_mem_bw_gbps else "none") + f" ({stage.peak_source})"
    counts = t["status"].value_counts().to_dict()
    return (f"{stage.device}: {stage.prediction.timing}. Peak memory bandwidth: {peak}. "
            f"Rows: {counts}. Times are medians over n_repeats samples; spread is p10..p90.")


def plot_roofline(table: pd.DataFrame, *, peak_bw_gbps: float | None = None, peak_tflops: float | None = None,
                  title_extra: str = ""):
    """Achieved TFLOP/s against arithmetic intensity (docs/methods.md#gemm-byte-model), log-log, one colour
    per backend/dtype/mode, one marker per model; rate columns only, so any gemm.csv draws it."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogFormatter

    ok = table[table["status"] == "ok"].copy() if "status" in table else table.copy()
    ok = ok[(ok["tflops"] > 0) & (ok["gbps"] > 0)]
    fig, ax = plt.subplots(figsize=(8, 5.5), layout="constrained")
    if ok.empty:
        ax.text(0.5, 0.5, "no GEMM measured", ha="center", va="center", transform=ax.transAxes)
        return fig
    ok["ai"] = ok["tflops"] * 1e3 / ok["gbps"]  # (1e12 FLOP/s) / (1e9 B/s) = 1e3 FLOP/B
    if "model" not in ok:
        ok["model"] = "GEMM"
    keys = [c for c in ("backend", "dtype", "mode") if c in ok]
    markers = ["o", "s", "^", "D", "v", "P"]
    models = list(dict.fromkeys(ok["model"]))
    for ci, (key, g) in enumerate(ok.groupby(keys, sort=False, dropna=False)):
        what = " ".join(str(k) for k in (key if isinstance(key, tuple) else (key,)))
        for mi, model in enumerate(models):
            s = g[g["model"] == model]
            if s.empty:
                continue
            ax.scatter(s["ai"], s["tflops"], s=18, marker=markers[mi % len(markers)], color=f"C{ci}", alpha=0.8,
                       label=f"{model} · {what}")
    if peak_bw_gbps:
        x = np.logspace(np.log10(ok["ai"].min() / 2), np.log10(ok["ai"].max() * 2), 100)
        roof = x * peak_bw_gbps / 1e3
        if peak_tflops:
            roof = np.minimum(roof, peak_tflops)
        ax.plot(x, roof, "k--", lw=1, label=f"roof: {peak_bw_gbps:g} GB/s"
                + (f", {peak_tflops:g} TFLOP/s" if peak_tflops else ""))
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _pos: f"{v:g}")  # 0.01 and 10 read faster than 10^-2 and 10^1
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plain)
        # matplotlib labels a few minor ticks when an axis spans under ~2 decades; plainly too
        axis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved; bytes = weights + scales + activations)")
    ax.set_ylabel("achieved TFLOP/s (FLOPs = 2·M·N·K, median time)")
    dev = ", ".join(sorted(set(ok["device"].dropna().astype(str)))) if "device" in ok else ""
    if not peak_bw_gbps:
        title_extra += "\n(no roof drawn: peak bandwidth unknown; set hardware.peak_mem_bw_gbps)"
    ax.set_title(f"GEMM roofline: {len(ok)} timed cases" + (f" on {dev}" if dev else "") + title_extra,
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return fig


# --------------------------------------------------------------------------- the stage


def prediction_table(prediction: schema.GemmPrediction) -> pd.DataFrame:
    """prediction.json as rows: model, tp, m, gemm_us_per_decode_step, gemm_calls_per_decode_step,
    weight_bytes_per_decode_step and the weight-streaming rate that time implies (GB/s)."""
    rows = []
    for e in ([prediction] if prediction.model else []) + list(prediction.presets):
        for m, us in e.gemm_us_per_decode_step.items():
            wb = e.weight_bytes_per_decode_step.get(m)
            rows.append(dict(model=e.model, tp=e.tp, m=int(m), gemm_us_per_decode_step=us,
                             gemm_calls_per_decode_step=e.gemm_calls_per_decode_step.get(m),
                             weight_bytes_per_decode_step=wb,
                             implied_weight_gbps=(wb / us / 1e3) if wb and us else np.nan))
    return pd.DataFrame(rows, columns=["model", "tp", "m", "gemm_us_per_decode_step", "gemm_calls_per_decode_step",
                                       "weight_bytes_per_decode_step", "implied_weight_gbps"])


def describe_plan(targets: list[GemmTarget], grid: pd.DataFrame, notes: list[str]) -> str:
    """What will be timed, in words."""
    lines = []
    for t in targets:
        g = grid[grid["model"] == t.label]
        lines.append(f"{t.label} ({t.role}, {t.arch.family}, {t.arch.source}) at TP={t.tp}: "
                     f"{g[['n', 'k', 'batch']].drop_duplicates().shape[0]} distinct GEMM shapes x M in "
                     f"{list(t.m_values)} -> {len(g)} cases")
    return "\n".join(lines + notes) or "nothing to time"


@dataclass(frozen=True)
class GemmStage:
    """What stage 02 measured and predicted, as it wrote it (gemm.csv, prediction.json)."""

    targets: list[GemmTarget]
    grid: pd.DataFrame
    """The cases planned (`gemm_grid`)."""
    table: pd.DataFrame
    """gemm.csv: one row per case and mode, times in µs (`schema.GemmRow`)."""
    prediction: schema.GemmPrediction
    peak_mem_bw_gbps: float | None
    peak_source: str
    notes: list[str]
    device: str
    """`cuda` or `cpu`."""


def run_stage(params, out_dir: str | Path, *, progress: bool = True) -> GemmStage:
    """Stage 02 end to end: plan, time (rows appended to gemm.csv as measured), predict
    (prediction.json)."""
    import msgspec
    import torch

    from stepscope.micro.timing import peak_mem_bw_gbps

    out_dir = Path(out_dir)
    g = params.micro.gemm
    targets, notes = plan_targets(params)
    grid = gemm_grid(targets, g.dtypes, planned_backends(g.backends), engine_dtype=params.server.dtype)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    peak, peak_source = peak_mem_bw_gbps(params.hardware.peak_mem_bw_gbps, device)
    table = run_gemm_grid(grid, warmup=g.warmup, repeats=g.repeats, threads=g.threads, peak_bw_gbps=peak,
                          device=device, csv_path=out_dir / "gemm.csv", progress=progress,
                          graph_calls=g.graph_calls)
    prediction = build_prediction(table, targets, params)
    prediction = msgspec.structs.replace(
        prediction, device=device, peak_mem_bw_gbps=peak, peak_source=peak_source,
        timing=("CUDA graph of %d calls, CUDA events, hot and cold" % g.graph_calls if device == "cuda" else
                f"perf_counter, warm-up {g.warmup}, {g.repeats} samples, "
                f"{g.threads or torch.get_num_threads()} torch thread(s); torch: one weight (hot); the "
                f"engine's kernels hot and cold (weights rotated through > 2x the last-level cache, "
                f"{cpu_llc_bytes()[0] >> 20} MiB: {cpu_llc_bytes()[1]})"),
        notes=list(notes) + prediction.notes)
    schema.check_frame(table, schema.GemmRow, str(out_dir / "gemm.csv"))
    log.info("stage 02: %d GEMM points timed, %d skipped or failed", int((table["status"] == "ok").sum()),
             int((table["status"] != "ok").sum()))
    schema.write(out_dir / "prediction.json", schema.to_builtins(prediction), schema.GemmPrediction)
    return GemmStage(targets=targets, grid=grid, table=table, prediction=prediction, peak_mem_bw_gbps=peak,
                     peak_source=peak_source, notes=notes, device=device)
