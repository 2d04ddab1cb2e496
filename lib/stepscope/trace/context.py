"""The CPU-side frames around each piece of work: what it was launched for.

`work_context` sweeps each thread once in time order with a stack of open frames, returning per query the
innermost frame a context rule matched and the innermost module frame.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from stepscope.trace.frames import MODULE_PREFIX
from stepscope.trace.codes import in_values

if TYPE_CHECKING:
    from stepscope.trace.categorize import ContextRule

logger = logging.getLogger(__name__)

FRAME_CATS = ("python_function", "cpu_op", "user_annotation")
"""Event categories that open a frame on a CPU thread."""


@dataclass
class WorkContext:
    """Per query: the context decision ("" for none), the frame that decided it, and the innermost module,
    each a Categorical (code 0 is always "")."""

    category: pd.Categorical
    frame: pd.Categorical
    module: pd.Categorical

    @classmethod
    def empty(cls, n: int) -> WorkContext:
        blank = pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), categories=pd.Index([""], dtype=object))
        return cls(blank, blank.copy(), blank.copy())

    @classmethod
    def of_frames(cls, frame_idx: np.ndarray, module_idx: np.ndarray, names: np.ndarray,
                  decision: dict[int, str]) -> WorkContext:
        """From each query's deciding frame and innermost module frame (indexes into `names`,
        -1 for none) and each deciding frame's decision."""
        return cls(_by_frame(frame_idx, lambda j: decision[j]), _by_frame(frame_idx, lambda j: str(names[j])),
                   _by_frame(module_idx, lambda j: str(names[j])[len(MODULE_PREFIX):]))


def _by_frame(idx: np.ndarray, value_of) -> pd.Categorical:
    """Per query, `value_of(frame index)` ("" for -1), as codes into the distinct values; each
    frame used is read once."""
    shifted = idx + 1  # -1 (none) becomes 0
    used = np.zeros(int(shifted.max()) + 1 if len(shifted) else 1, dtype=bool)
    used[shifted] = True
    used[0] = True
    frames = np.flatnonzero(used)
    values = ["" if j == 0 else value_of(int(j) - 1) for j in frames]
    table = list(dict.fromkeys(values))
    at = {v: i for i, v in enumerate(table)}
    lut = np.zeros(len(used), dtype=np.int32)
    lut[frames] = [at[v] for v in values]
    return pd.Categorical.from_codes(lut[shifted], categories=pd.Index(table, dtype=object))


def context_frames(ev: pd.DataFrame) -> pd.DataFrame:
    """The frame events of a rank (CPU threads only), in start order, outer frame first on ties."""
    fr = ev[in_values(ev["cat"], FRAME_CATS)]
    fr = fr.assign(end=fr["ts"] + fr["dur"], neg_dur=-fr["dur"])
    return fr.sort_values(["pid", "tid", "ts", "neg_dur"], kind="stable")


def work_context(frames: pd.DataFrame, rules: list[ContextRule], pids: np.ndarray, tids: np.ndarray,
                 ts: np.ndarray, *, frame_rows: np.ndarray | None = None) -> WorkContext:
    """Context of each query: a point `ts` on thread (`pids`, `tids`), or with `frame_rows` a cpu_op frame
    itself; pid -10**9 (no launch) gets none."""
    n = len(ts)
    if not len(frames) or not n or not rules:
        return WorkContext.empty(n)
    names = frames["name"].astype(str).to_numpy()
    decide = _Decider(rules)
    row_pos = None
    if frame_rows is not None:
        row_pos = pd.Series(np.arange(len(frames)), index=frames.index).reindex(frame_rows).to_numpy()
    starts = np.r_[0, np.flatnonzero((np.diff(frames["pid"].to_numpy()) != 0)
                                     | (np.diff(frames["tid"].to_numpy()) != 0)) + 1, len(frames)]
    fts, fend = frames["ts"].to_numpy(float), frames["end"].to_numpy(float)
    fpid, ftid = frames["pid"].to_numpy(), frames["tid"].to_numpy()
    ctx_of = np.full(len(frames), -1, dtype=np.int64)
    mod_of = np.full(len(frames), -1, dtype=np.int64)
    # Per query: the frame deciding its context and its innermost module's frame, in int32 (millions of
    # launches on one thread).
    frame_idx = np.full(n, -1, dtype=np.int32)
    module_idx = np.full(n, -1, dtype=np.int32)
    for lo, hi in zip(starts[:-1], starts[1:]):
        on = (row_pos >= lo) & (row_pos < hi) if frame_rows is not None else \
            (pids == fpid[lo]) & (tids == ftid[lo])
        q = None if on.all() else np.flatnonzero(on)  # None: every query (one thread holds them all)
        del on
        if q is not None and not len(q):
            continue
        top = _sweep(lo, hi, fts, fend, names, decide, ctx_of, mod_of,
                     None if frame_rows is not None else (ts if q is None else ts[q]))
        sel = (row_pos if q is None else row_pos[q]).astype(np.int64) if frame_rows is not None else top
        del top
        for a in range(0, len(sel), CONTEXT_CHUNK_ROWS):
            s = sel[a:a + CONTEXT_CHUNK_ROWS]
            ok = s >= 0
            qs = (np.arange(a, a + len(s)) if q is None else q[a:a + CONTEXT_CHUNK_ROWS])[ok]
            frame_idx[qs] = ctx_of[s[ok]]
            module_idx[qs] = mod_of[s[ok]]
    return WorkContext.of_frames(frame_idx, module_idx, names, decide.own)


CONTEXT_CHUNK_ROWS = 1 << 16
"""Queries `work_context` writes back at a time."""


class _Decider:
    """Context rules, judged once per (frame name, enclosing module name)."""

    def __init__(self, rules: list[ContextRule]) -> None:
        self.rules = rules
        self.memo: dict[tuple[str, str], str] = {}
        self.own: dict[int, str] = {}

    def __call__(self, name: str, parent_module: str) -> str:
        key = (name, parent_module)
        got = self.memo.get(key)
        if got is None:
            got = self.memo[key] = next(
                (r.decision for r in self.rules if r.regex.search(name)
                 and (r.parent is None or (parent_module and r.parent_regex.search(parent_module)))), "")
        return got


def _sweep(lo: int, hi: int, fts: np.ndarray, fend: np.ndarray, names: np.ndarray, decide: _Decider,
           ctx_of: np.ndarray, mod_of: np.ndarray, qts: np.ndarray | None) -> np.ndarray:
    """Push frames lo..hi (one thread) on a stack, filling ctx_of/mod_of; per query time in `qts`, the frame
    on top then (-1: none)."""
    stack: list[int] = []
    # int32 positions, and no sort when the queries come in time order (launches do)
    in_order = qts is not None and bool((qts[1:] >= qts[:-1]).all())
    order = (np.arange(0) if qts is None else np.arange(len(qts), dtype=np.int32) if in_order
             else np.argsort(qts, kind="stable").astype(np.int32))
    top = np.full(len(order), -1, dtype=np.int32)
    k = 0
    for j in range(lo, hi):
        t = fts[j]
        while k < len(order) and qts[order[k]] < t:
            _pop_ended(stack, fend, qts[order[k]])
            top[order[k]] = stack[-1] if stack else -1
            k += 1
        _pop_ended(stack, fend, t)
        parent = stack[-1] if stack else -1
        pmod = mod_of[parent] if parent >= 0 else -1
        name = names[j]
        cat = decide(name, names[pmod] if pmod >= 0 else "")
        if cat:
            ctx_of[j] = j
            decide.own[j] = cat
        else:
            ctx_of[j] = ctx_of[parent] if parent >= 0 else -1
        mod_of[j] = j if name.startswith(MODULE_PREFIX) else pmod
        stack.append(j)
    while k < len(order):
        _pop_ended(stack, fend, qts[order[k]])
        top[order[k]] = stack[-1] if stack else -1
        k += 1
    return top


def _pop_ended(stack: list[int], fend: np.ndarray, t: float) -> None:
    while stack and fend[stack[-1]] <= t:
        stack.pop()


def launch_context(ev: pd.DataFrame, pids: np.ndarray, tids: np.ndarray, ts: np.ndarray) -> WorkContext:
    """Context of device work from its launches (pid -10**9: launch not in the trace)."""
    from stepscope.trace.categorize import context_rules

    return work_context(context_frames(ev), context_rules(), pids, tids, ts)


def op_context(ev: pd.DataFrame, op_rows: np.ndarray) -> WorkContext:
    """Context of CPU work: each cpu_op (row label in `ev`) with the frames open around it, and
    the MoE routing spans (`moe_routing_spans`) as frames of their own."""
    from stepscope.trace.categorize import context_rules

    n = len(op_rows)
    frames = context_frames(ev)
    spans = moe_routing_spans(frames)
    if len(spans):
        frames = pd.concat([frames, spans]).sort_values(["pid", "tid", "ts", "neg_dur"], kind="stable")
    return work_context(frames, context_rules(), np.zeros(n, np.int64),
                        np.zeros(n, np.int64), np.zeros(n), frame_rows=op_rows)


MOE_ROUTING_SPAN = "MoE routing, before "
"""Name of a `moe_routing_spans` frame, followed by the experts op's name (rules.yaml `context:`
gives it moe_routing, and `decided_by` reads `inside MoE routing, before _C::cpu_fused_moe`)."""
_NOT_LANDMARKS = frozenset({"elementwise", "unattributed_elementwise", "sampling", "other", "framework"})
"""Name categories of the ops a routing span may hold: anything else (a GEMM, attention, a
collective, the experts, an activation) ends the layer's work before the router's."""


def moe_routing_spans(frames: pd.DataFrame) -> pd.DataFrame:
    """Frames standing for an MoE layer's routing on a CPU trace, which records none: per routed-experts op,
    from the end of the last op with a purpose of its own (the router gate) to the experts op's start. Empty
    when no op is fused_moe."""
    from stepscope.trace.categorize import builtin_rules, categorize

    ops = frames[(frames["cat"] == "cpu_op").to_numpy()]
    cats = categorize(ops["name"].astype(str), ops["cat"], builtin_rules()) if len(ops) else np.array([])
    moe = cats == "fused_moe"
    if not moe.any():
        return frames.iloc[:0]
    landmark = ~np.isin(cats, list(_NOT_LANDMARKS))
    rows = []
    for (pid, tid), at in ops.groupby(["pid", "tid"], sort=False).indices.items():
        ends = np.sort(ops["end"].to_numpy(float)[at[landmark[at] & ~moe[at]]])
        for j in at[moe[at]]:
            start = float(ops["ts"].iloc[j])
            k = np.searchsorted(ends, start, side="right")
            if k:
                rows.append({"pid": pid, "tid": tid, "ts": ends[k - 1], "dur": start - ends[k - 1],
                             "name": MOE_ROUTING_SPAN + str(ops["name"].iloc[j]), "cat": "user_annotation"})
    out = pd.DataFrame(rows, columns=["pid", "tid", "ts", "dur", "name", "cat"])
    out = out.assign(end=out["ts"] + out["dur"], neg_dur=-out["dur"])
    out.index = -1 - np.arange(len(out))  # no event's label
    return out
