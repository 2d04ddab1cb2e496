"""What a trace is before it is judged: kind of steps, engine, device, batch, world size, TP.

Everything here is read from the traces themselves (annotations, kernel names, the
file's `deviceProperties` and `distributedInfo`), never from the analysing machine.
TP comes from params when they give it, else from `distributedInfo.world_size`; when both
exist and differ, `tp_disagreement` says so.

Method and sources: docs/trace-analysis.md#what-the-trace-is.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stepscope.thresholds import GRAPH_REPLAY_MIN_SHARE, LOW_CONFIDENCE_STEPS

_SGLANG_NAMES = re.compile(r"^step\[|sglang|sgl_kernel|sgl::", re.I)
_VLLM_NAMES = re.compile(r"^execute_(?:context|new|\d+_context)|vllm::|^_C::", re.I)
SHAPE_SCAN_MAX_BYTES = 32 << 20
"""A trace file this small (on disk) may be read a second time for input shapes, which the
slim event table does not keep, to tell a prefill from a decode pass in `ProfilerStep`s."""


def detect_engine(ev: pd.DataFrame, meta: dict[str, Any]) -> str:
    """`sglang`, `vllm` or `unknown`, from annotations and names (SGLang's `step[...]` wins:
    an SGLang capture can carry a vLLM-style `execute_...` annotation too)."""
    names = pd.Series(ev["name"].astype(str).unique())
    if names.str.contains(_SGLANG_NAMES).any():
        return "sglang"
    if meta.get("vllm_version") or names.str.contains(_VLLM_NAMES).any():
        return "vllm"
    return "unknown"


def input_token_shape(path: str | Path) -> tuple[int, int] | None:
    """(batch, sequence) of the first `aten::embedding` input in a small trace, or None.

    The token ids' shape tells a prefill ([16, 559]) from a decode pass ([B, 1]) where no
    engine annotation does. Only files up to SHAPE_SCAN_MAX_BYTES are read, and only when
    the profiler recorded shapes.
    """
    p = Path(path)
    if not p.is_file() or p.stat().st_size > SHAPE_SCAN_MAX_BYTES:
        return None
    opener = gzip.open if p.name.endswith(".gz") else open
    try:
        with opener(p, "rt") as fh:
            data = json.load(fh)
    except (OSError, ValueError, EOFError):
        return None
    events = data.get("traceEvents") if isinstance(data, dict) else None
    for e in events or ():
        if isinstance(e, dict) and e.get("name") == "aten::embedding":
            dims = (e.get("args") or {}).get("Input Dims") or []
            if len(dims) > 1 and isinstance(dims[1], list) and len(dims[1]) == 2:
                return int(dims[1][0]), int(dims[1][1])
    return None


def _kind(kinds: dict[str, int], shape: tuple[int, int] | None) -> tuple[str, str]:
    """The trace's kind and the step kind it is judged on."""
    for k in ("decode", "training", "prefill", "mixed"):
        if kinds.get(k):
            return k, k
    n = sum(kinds.values())
    if kinds.get("profiler_step") and shape is not None:
        return ("decode" if shape[1] == 1 else "prefill"), "profiler_step"
    if n == 1:
        return "single_step", next(iter(kinds))
    return "unknown", "unknown"


def _device_name(r) -> str | None:
    """The trace's device name; a ROCm trace with an empty name, by its properties."""
    if r.mode == "cpu":
        return "CPU"
    if r.meta.get("device_name"):
        return str(r.meta["device_name"])
    from stepscope.hardware import lookup_device

    m = lookup_device(None, r.meta.get("device_properties"))
    return m.device.name if m.known else None


def graph_replay(r, step_ids) -> tuple[bool | None, int, int]:
    """(replays a graph, device events launched by graph launches, device events) over the
    given steps of one rank; None on a CPU trace, where nothing is launched."""
    if r.mode == "cpu" or "graph_launch" not in r.work:
        return None, 0, 0
    w = r.work[r.work["step_id"].isin(step_ids)]
    n, g = int(len(w)), int(w["graph_launch"].sum())
    return (g >= GRAPH_REPLAY_MIN_SHARE * n if n else None), g, n


def trace_info(ranks: list, tp_params: int | None, shape_hint: tuple[int, int] | None = None
               ) -> dict[str, Any]:
    """The `trace_info` block of summary.json from analysed ranks (`RankResult`s with `meta`)."""
    ref = ranks[0]
    st = ref.steps_tot
    with_work = st[st["n_events"] > 0]
    kinds = {str(k): int(v) for k, v in with_work["kind"].value_counts().items()}
    kind, judged = _kind(kinds, shape_hint)
    dec = with_work[with_work["kind"] == "decode"]
    reqs = dec["decode_requests"].to_numpy()
    reqs = reqs[reqs >= 0]
    batch = float(np.median(reqs)) if len(reqs) else None
    if batch is None and kind == "prefill" and shape_hint is not None:
        batch = float(shape_hint[0])
    worlds = {r.meta.get("world_size") for r in ranks} - {None}
    world = max(worlds) if worlds else None
    if tp_params:
        tp, source = int(tp_params), "params"
    elif world and kind != "training":  # a data-parallel world is not a TP group
        tp, source = int(world), "trace"
    else:
        tp, source = 1, "default"
    names = {_device_name(r) for r in ranks} - {None}
    n_judged = int(kinds.get(judged, 0)) if judged != "unknown" else int(len(with_work))
    judged_ids = (with_work if judged == "unknown" else with_work[with_work["kind"] == judged])["step_id"]
    replay, n_graph, n_dev = graph_replay(ref, judged_ids)
    return {
        "kind": kind,
        "engine": ref.meta.get("engine", "unknown"),
        "device_name": sorted(names)[0] if names else None,
        "device_count": ref.meta.get("device_count"),
        "batch_size": batch,
        "batch_source": ("annotation" if len(reqs) else
                         "input shapes" if batch is not None else None),
        "input_shape": list(shape_hint) if shape_hint else None,
        "world_size": int(world) if world else None,
        "ranks_present": sorted(int(r.rank) for r in ranks),
        "tp": tp,
        "tp_source": source,
        "tp_disagreement": bool(tp_params and world and int(tp_params) != int(world)),
        "n_steps": int(len(st)),
        "n_decode_steps": int(kinds.get("decode", 0)),
        "step_kinds": kinds,
        "judged_kind": judged,
        "graph_replay": replay,
        "graph_launched_events": n_graph if replay is not None else None,
        "device_events": n_dev if replay is not None else None,
        "low_confidence": n_judged < LOW_CONFIDENCE_STEPS,
    }


WEIGHT_FORMAT_NAMES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("mxfp4", re.compile(r"mxfp4", re.I)),
    ("nvfp4", re.compile(r"nvfp4", re.I)),
    ("w4a16", re.compile(r"w4a16|int4|marlin|awq|gptq|machete", re.I)),
    ("fp8", re.compile(r"fp8|e4m3|e5m2", re.I)),
    ("int8", re.compile(r"w8a8|int8", re.I)),
)
"""Weight formats a GEMM kernel's name can state, most specific first; a name counts for the
first that matches (`..._bf16xbf16xmxfp4_...` is mxfp4, not fp8's neighbour)."""


def weight_formats_named(kernels: pd.DataFrame) -> list[dict[str, Any]]:
    """The weight formats the GEMM kernels' names state (category_kernels rows of one rank:
    the largest kernels of each category over the decode steps), the format carrying the most
    time first: format, how many kernel names, their ms per step, the longest-running name.

    Read from names only: a format no kernel names (a bf16 GEMM library kernel running
    dequantized weights) is not seen, and none means "not named", not "bf16"."""
    from stepscope.palette import GEMM_CATEGORIES

    if kernels.empty:
        return []
    gemm = kernels[kernels["category"].isin(GEMM_CATEGORIES)]
    found: dict[str, list[tuple[float, str]]] = {}
    for name, ms in zip(gemm["name"].astype(str), gemm["sum_ms_per_step"].astype(float)):
        fmt = next((f for f, pattern in WEIGHT_FORMAT_NAMES if pattern.search(name)), None)
        if fmt is not None:
            found.setdefault(fmt, []).append((ms, name))
    out = [{"format": fmt, "n_kernels": len(hits), "ms_per_step": sum(ms for ms, _ in hits),
            "example_kernel": max(hits)[1]} for fmt, hits in found.items()]
    return sorted(out, key=lambda r: -r["ms_per_step"])

