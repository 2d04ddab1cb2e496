"""Where a trace's steps come from: every source it holds, ranked, the strongest that passes its check chosen,
and why each other one was not.

The ranking and the check (a source whose steps are pieces of another's is refused) are in
docs/trace-analysis.md#step-sources.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from stepscope.thresholds import STEP_SOURCE_PIECES_RATIO
from stepscope.trace.codes import in_values, used_values
from stepscope.trace.load import LAUNCH_CATS


@dataclass(frozen=True)
class StepSource:
    """One source of steps: its name in `step_source`, what it reads and the check it passes."""

    name: str
    reads: str
    check: str


STEP_SOURCES = (
    StepSource("annotation:vllm", "vLLM's step annotation `execute_context_N(T)_generation_M(U)`",
               "none: the engine's word on its own step"),
    StepSource("annotation:sglang", "SGLang's step annotation `step[DECODE bs=N]`",
               "none: the engine's word on its own step"),
    StepSource("engine_frames", "the engine's step frames: vLLM's `execute_model`, SGLang's `run_batch`, "
               "TensorRT-LLM's `_forward_step` (the outermost per thread)",
               "a frame that launches no device work (on a CPU trace: runs no op) is no step"),
    StepSource("annotation:profiler_step", "`ProfilerStep#N`, an annotation or a 2021-format `Operator`",
               "not many more steps than a coarser source that encloses them"),
    StepSource("iteration_markers", "one `Optimizer.step#...` per training iteration, each step ending "
               "where its optimizer step ends; the first, from the trace's start, is kind `warmup` when it is "
               "many iterations long (the set-up before the loop)", "as ProfilerStep"),
    StepSource("benchmark_annotations", "a benchmark's `[param|...|warmup|...]` and "
               "`[param|...|measure|...]` annotations; warm-up steps are kind `warmup`", "as ProfilerStep"),
    StepSource("graph_launches", "one step per `cudaGraphLaunch`/`hipGraphLaunch`", "as ProfilerStep"),
)
"""Every step source, strongest first."""
RANK = {s.name: i for i, s in enumerate(STEP_SOURCES)}
ENGINE_SOURCES = frozenset({"annotation:vllm", "annotation:sglang", "engine_frames"})
"""The engine's own steps: never refused for a coarser source around them."""
OFF_ARCHITECTURE = "off_architecture"
"""The kind a decode step is given when its collectives are not the architecture's while other
decode steps' are (`analyze.set_apart_off_architecture`): no forward pass, so never judged."""
EXCLUDED_KINDS = ("warmup", OFF_ARCHITECTURE)
"""Step kinds never judged, nor averaged with the others (`account.select_decode_steps`)."""
NOT_ANNOTATED = frozenset(s.name for s in STEP_SOURCES if not s.name.startswith("annotation:"))
"""Sources whose steps no step annotation marks (the `step_fallback` flag names them)."""
HOST_MARK_CATS = ("user_annotation", "cpu_op")
"""Where a host-side step marker is recorded: an annotation, or an op (2021 traces' `Operator`)."""

ENGINE_STEP_FRAME = re.compile(r"\): (?:execute_model|run_batch|forward_batch_generation|_forward_step)$")
"""A frame that runs one engine step: vLLM's model runners and workers, SGLang's scheduler and TP worker,
TensorRT-LLM's PyTorch executor."""
_FRAME_KIND = re.compile(r"\): forward_(decode|extend|idle)$")
"""SGLang's model runner names the step's kind in its forward frame."""
_FRAME_LABEL = {"decode": "decode", "extend": "prefill", "idle": "idle"}
_ITERATION = re.compile(r"^Optimizer\.step#")
_BENCHMARK = re.compile(r"^\[param\|.*\|(warmup|measure)\|[^|\]]*\]$")
_GRAPH_LAUNCH = re.compile(r"^(cuda|hip)GraphLaunch")
GRAPH_KIND_READING = ("graph replay: a vLLM step that replays the captured graphs ran at most the largest "
                      "captured batch (a decode step); one run eagerly beside such steps ran more tokens than "
                      "any captured size (a prefill)")
"""How `engine_frames` steps of vLLM get their kind when no frame names it."""
_DECODE_ATTENTION = re.compile(r"paged_attention")
_PREFILL_ATTENTION = re.compile(r"scaled_dot_product_attention|varlen")
ATTENTION_KIND_READING = ("attention ops: vLLM V0 attends decode tokens with `paged_attention` over the KV cache "
                          "and prompts with dense attention (`scaled_dot_product_attention`, a varlen kernel): "
                          "a step with only the first is a decode, with only the second a prefill, with both mixed")
"""How `engine_frames` steps get their kind with no graph replay to read (a V0 trace, a CPU trace)."""


def step_row(name: str, pid, tid, ts: float, dur: float, kind: str = "unknown", label: str = "unknown") -> dict:
    """A step with no request or token counts (-1: not said)."""
    return dict(name=name, label=label, kind=kind, n_requests=-1, n_tokens=-1, prefill_requests=-1,
                prefill_tokens=-1, decode_requests=-1, decode_tokens=-1, pid=pid, tid=tid, ts=ts, dur=dur)


def named(ev: pd.DataFrame, cats, pattern: re.Pattern[str]) -> pd.DataFrame:
    """The rows of `cats` whose name matches `pattern` (judged once per distinct name), by start."""
    names = [n for n in used_values(ev["name"]) if isinstance(n, str) and pattern.search(n)]
    if not names:
        return ev.iloc[0:0]
    return ev[in_values(ev["cat"], cats) & in_values(ev["name"], names)].sort_values("ts", kind="stable")


def _outermost(fr: pd.DataFrame) -> pd.DataFrame:
    """Per thread, the frames no other frame of the set encloses (a V1 worker's `execute_model`
    around its model runner's)."""
    keep = np.zeros(len(fr), dtype=bool)
    pos = {k: i for i, k in enumerate(fr.index)}
    for _, g in fr.groupby(["pid", "tid"], sort=False):
        end = -np.inf
        for idx, ts, dur in zip(g.index, g["ts"].to_numpy(float), g["dur"].to_numpy(float)):
            if ts >= end:
                keep[pos[idx]] = True
                end = ts + dur
    return fr[keep]


def _inside_count(steps: pd.DataFrame, ev: pd.DataFrame) -> np.ndarray:
    """Per step, the rows of `ev` starting inside it on its own thread."""
    out = np.zeros(len(steps), dtype=np.int64)
    if ev.empty:
        return out
    by_thread = {k: np.sort(g["ts"].to_numpy(float)) for k, g in ev.groupby(["pid", "tid"], sort=False)}
    for i, (pid, tid, ts, dur) in enumerate(zip(steps["pid"], steps["tid"], steps["ts"].to_numpy(float),
                                                steps["dur"].to_numpy(float))):
        t = by_thread.get((pid, tid))
        if t is not None:
            out[i] = np.searchsorted(t, ts + dur, side="right") - np.searchsorted(t, ts, side="left")
    return out


def engine_frame_steps(ev: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """(steps from the engine's step frames, how their kind was read). Frames that launch (or, on a CPU trace,
    run) nothing are dropped; the kind comes from SGLang's forward frames, else graph replay, else attention
    ops."""
    fr = named(ev, ("python_function",), ENGINE_STEP_FRAME)
    if fr.empty:
        return pd.DataFrame(), None
    fr = _outermost(fr)
    launches = ev[in_values(ev["cat"], LAUNCH_CATS) & (ev["correlation"].to_numpy() >= 0)]
    fr = fr[_inside_count(fr, launches if len(launches) else ev[in_values(ev["cat"], ("cpu_op",))]) > 0]
    if fr.empty:
        return pd.DataFrame(), None
    labels = _sglang_labels(ev, fr)
    how = "SGLang's forward_decode / forward_extend frames" if labels is not None else None
    if labels is None:
        graphs = _inside_count(fr, launches[launches["name"].astype(str).str.match(_GRAPH_LAUNCH).to_numpy(bool)])
        labels, how = _graph_labels(graphs)
    if how is None:
        labels, how = _attention_labels(ev, fr, labels)
    rows = [step_row(str(r.name), r.pid, r.tid, r.ts, r.dur, kind=k, label=k)
            for r, k in zip(fr.itertuples(index=False), labels)]
    return pd.DataFrame(rows), how


def _sglang_labels(ev: pd.DataFrame, fr: pd.DataFrame) -> list[str] | None:
    """Per step, the kind its innermost SGLang forward frame names; None when none does."""
    kinds = named(ev, ("python_function",), _FRAME_KIND)
    if kinds.empty:
        return None
    out = []
    for pid, tid, ts, dur in zip(fr["pid"], fr["tid"], fr["ts"].to_numpy(float), fr["dur"].to_numpy(float)):
        k = kinds[(kinds["pid"] == pid) & (kinds["tid"] == tid) & (kinds["ts"] >= ts) & (kinds["ts"] <= ts + dur)]
        m = _FRAME_KIND.search(str(k["name"].iloc[-1])) if len(k) else None
        out.append(_FRAME_LABEL[m.group(1)] if m else "unknown")
    return out


def _graph_labels(graphs: np.ndarray) -> tuple[list[str], str | None]:
    """Kinds from graph replay: decode where a step replays graphs, prefill where it runs
    eagerly beside steps that do; unknown throughout where none or every step is eager."""
    if not (graphs > 0).any():
        return ["unknown"] * len(graphs), None
    return ["decode" if g > 0 else "prefill" for g in graphs], GRAPH_KIND_READING


def _attention_labels(ev: pd.DataFrame, fr: pd.DataFrame, labels: list[str]) -> tuple[list[str], str | None]:
    """Kinds from the attention ops inside each step (`ATTENTION_KIND_READING`); `labels`
    unchanged where no step attends with paged attention (no V0 decode to tell apart)."""
    paged = _inside_count(fr, named(ev, ("cpu_op",), _DECODE_ATTENTION))
    if not (paged > 0).any():
        return labels, None
    dense = _inside_count(fr, named(ev, ("cpu_op",), _PREFILL_ATTENTION))
    return (["mixed" if p and d else "decode" if p else "prefill" if d else "unknown" for p, d in zip(paged, dense)],
            ATTENTION_KIND_READING)


def iteration_steps(ev: pd.DataFrame) -> pd.DataFrame:
    """One training step per optimizer step of the most frequent optimizer (`Optimizer.step#SGD.step`):
    from the end of the previous one (the trace's start for the first) to the end of its own."""
    marks = named(ev, HOST_MARK_CATS, _ITERATION)
    if marks.empty:
        return pd.DataFrame()
    top = marks["name"].astype(str).value_counts().index[0]
    marks = marks[marks["name"].astype(str) == top]
    ends = marks["ts"].to_numpy(float) + marks["dur"].to_numpy(float)
    starts = np.r_[min(float(ev["ts"].min()), float(marks["ts"].iloc[0])), ends[:-1]]
    kinds = ["training"] * len(ends)
    # no mark starts the first iteration: from the trace's start it also holds the script's set-up
    # (1 s before PARAM's 25 ms linear iterations), so when it is many iterations long it is a warm-up
    if len(ends) > 1 and ends[0] - starts[0] > STEP_SOURCE_PIECES_RATIO * float(np.median(np.diff(ends))):
        kinds[0] = "warmup"
    return pd.DataFrame([step_row(top, pid, tid, s, e - s, kind=k)
                         for pid, tid, s, e, k in zip(marks["pid"], marks["tid"], starts, ends, kinds)])


def benchmark_steps(ev: pd.DataFrame) -> pd.DataFrame:
    """One step per warm-up or measure pass of a benchmark (warm-ups of kind `warmup`); of two nested
    annotations the inner one is the measured pass."""
    marks = named(ev, HOST_MARK_CATS, _BENCHMARK)
    ts, end = marks["ts"].to_numpy(float), marks["ts"].to_numpy(float) + marks["dur"].to_numpy(float)
    same = marks["name"].astype(str).to_numpy()
    rows = []
    for i, r in enumerate(marks.itertuples(index=False)):
        inner = (same == same[i]) & (ts >= ts[i]) & (end <= end[i]) & (np.arange(len(ts)) != i)
        if not inner.any():
            rows.append(step_row(str(r.name), r.pid, r.tid, r.ts, r.dur, kind=_BENCHMARK.match(same[i]).group(1)))
    return pd.DataFrame(rows)


def graph_steps(ev: pd.DataFrame, t0: float, t1: float) -> pd.DataFrame:
    """One step per graph launch, from it to the next on its thread; the first also takes the
    work before it, the last the work after it (`t0`, `t1`: the work's span)."""
    graph = named(ev, LAUNCH_CATS, _GRAPH_LAUNCH)
    rows = []
    for (pid, tid), g in graph.groupby(["pid", "tid"], sort=False):
        ts = g["ts"].to_numpy(float)
        starts = np.r_[min(t0, ts[0]), ts[1:]]
        ends = np.r_[ts[1:], max(t1, ts[-1])]
        rows += [step_row(str(n), pid, tid, s, e - s) for n, s, e in zip(g["name"].astype(str), starts, ends)]
    return pd.DataFrame(rows)


def refusal(source: str, steps: pd.DataFrame, candidates: dict[str, pd.DataFrame]) -> str | None:
    """Why `source` is refused (its steps are pieces of a coarser source's), or None."""
    if source in ENGINE_SOURCES or steps.empty:
        return None
    starts = steps["ts"].to_numpy(float)
    ends = starts + steps["dur"].to_numpy(float)
    for other, o in candidates.items():
        if other == source or o.empty or len(steps) < STEP_SOURCE_PIECES_RATIO * len(o):
            continue
        o_ts = o["ts"].to_numpy(float)
        o_end = o_ts + o["dur"].to_numpy(float)
        inside = float(np.mean([((o_ts <= s) & (e <= o_end)).any() for s, e in zip(starts, ends)]))
        if inside >= 0.5:
            return (f"{len(steps)} steps, {len(steps) / len(o):.1f}x the {len(o)} of {other}, which enclose "
                    f"{inside:.0%} of them: pieces of a step, not steps")
    return None


def choose(candidates: dict[str, pd.DataFrame], kind_readings: dict[str, str | None]
           ) -> tuple[str | None, list[dict]]:
    """(the strongest source present that is not refused, or None; a record per source present:
    source, n_steps, status `chosen`/`refused`/`outranked`, reason, kind_from)."""
    present = {s: c for s, c in candidates.items() if not c.empty}
    chosen, record = None, []
    for src in sorted(present, key=RANK.__getitem__):
        why = refusal(src, present[src], present)
        status = "refused" if why else "outranked" if chosen else "chosen"
        if status == "chosen":
            chosen = src
        record.append({"source": src, "n_steps": int(len(present[src])), "status": status,
                       "reason": why or (f"{chosen} ranks above it" if status == "outranked" else None),
                       "kind_from": kind_readings.get(src)})
    return chosen, record

