"""What to try for the biggest lever: one concrete change, stated against the run's own params
and the trace's evidence, so the headline's lever comes with the setting that moves it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from stepscope.palette import COMMUNICATION_CATEGORIES, GEMM_CATEGORIES
from stepscope.report.verdict import BetweenSteps, GapLever, Lever, Verdict, headline_findings
from stepscope.wording import Md, fmt_num, md_code, md_text, per_step

UNQUANTIZED = ("", "none", "none (bf16)", "bf16", "bfloat16", "fp16", "float16", "fp32", "float32")
"""`model.quantization` values that mean the weights are read at full width."""
NEAR_ROOFLINE_PCT = 60.0
"""GEMMs at or above this % of peak bandwidth are near the roofline: only fewer bytes help."""


@dataclass(frozen=True)
class ServerSettings:
    """The server's settings a change is stated against, None where the run does not know them:
    `stepscope analyze` never saw the server, and an attached server's flags are someone else's."""

    engine: str | None = None
    enforce_eager: bool | None = None
    extra_args: tuple[str, ...] = ()
    quantization: str | None = None
    cpu: bool = False
    """The trace ran on CPUs (vLLM's CPU backend): there are no CUDA graphs; `enforce_eager: false`
    compiles the model with torch.compile (Inductor) instead."""


@dataclass(frozen=True)
class TryNext:
    """The change to try first: the lever it moves, the change and the evidence it rests on."""

    lever: str
    change: Md
    evidence: Md


def server_settings(params: dict[str, Any] | None, cpu: bool = False) -> ServerSettings:
    """What the params snapshot says of the server; its defaults describe no server it did not launch."""
    p = params if isinstance(params, dict) else {}
    server, model = p.get("server") or {}, p.get("model") or {}
    quant = model.get("quantization")
    quant = str(quant) if quant is not None else None
    if (p.get("analysis") or {}).get("trace_paths") or server.get("mode") == "attach":
        return ServerSettings(quantization=quant, cpu=cpu)
    eager = server.get("enforce_eager")
    return ServerSettings(engine=server.get("engine"), enforce_eager=eager if isinstance(eager, bool) else None,
                          extra_args=tuple(str(x) for x in server.get("extra_args") or ()), quantization=quant,
                          cpu=cpu)


def lever_kind(lever: Lever | BetweenSteps | GapLever) -> str | None:
    """The row of `CHANGES` a lever reads: a gap kind, `between steps`, or its category's family."""
    if isinstance(lever, GapLever):
        return lever.kind
    if isinstance(lever, BetweenSteps):
        return "between steps"
    if lever.category in COMMUNICATION_CATEGORIES:
        return "communication"
    if lever.category in GEMM_CATEGORIES:
        return "gemm"
    return "attention" if lever.category.startswith("attention") else None


def _short_gaps(v: Verdict, lv: Any, s: ServerSettings) -> TryNext:
    label = v.identity.step_label
    ev = Md(f"the short gaps between ops take {fmt_num(lv.idle_ms)} ms {per_step(label)}; removing them would make "
            f"a {label} at most {fmt_num(lv.ceiling_x)}× faster")
    graphs = v.boundness.graph_replay if v.boundness is not None else None
    if s.cpu:
        return TryNext("short gaps", Md(
            "the model runs op by op (`server.enforce_eager: true`): try `enforce_eager: false`, which on vLLM's "
            "CPU backend compiles it with torch.compile (Inductor; there are no CUDA graphs on CPU), fusing the "
            "small ops whose gaps these are" if s.enforce_eager else
            "the gaps are host work between ops: profile the host with `server.profiler.with_stack: true` to "
            "name it"), ev)
    if s.enforce_eager and not graphs:
        return TryNext("short gaps", Md("CUDA graphs are off (`server.enforce_eager: true`): try "
                                        "`enforce_eager: false`"), ev)
    if graphs or s.enforce_eager is False:
        how = "the trace replays CUDA graphs" if graphs else "CUDA graphs are on (`server.enforce_eager: false`)"
        return TryNext("short gaps", Md(f"{how}, so the gaps are host work the graphs leave: profile the host with "
                                        "`server.profiler.with_stack: true` to name it"), ev)
    return TryNext("short gaps", Md("if the server ran with `--enforce-eager` (the run does not say), try it "
                                    "without: CUDA graphs replay a step's launches without the host"), ev)


def _between_steps(v: Verdict, lv: Any, s: ServerSettings) -> TryNext:
    ev = Md(f"{fmt_num(lv.gap_ms)} ms {per_step(v.identity.step_label)} ({fmt_num(lv.gap_pct)} % of the period) "
            "pass between steps with no op running: the engine's scheduling and input/output processing")
    if s.engine == "sglang":
        change = ("try removing `--disable-overlap-schedule` from `server.extra_args`"
                  if "--disable-overlap-schedule" in s.extra_args else
                  "SGLang overlaps scheduling already: profile the host with `server.profiler.with_stack: true`")
    elif s.engine == "vllm" and "--async-scheduling" not in s.extra_args:
        change = ("try `--async-scheduling` in `server.extra_args`: vLLM then schedules the next step while "
                  "this one runs")
    else:
        change = "profile the host with `server.profiler.with_stack: true` to name the work between steps"
    return TryNext("time between steps", Md(change), ev)


def _long_gaps(v: Verdict, lv: Any, s: ServerSettings) -> TryNext:
    b = v.boundness
    where = ""
    if b is not None and b.gap_before and b.gap_after:
        where = f" (after {md_code(b.gap_before)}, before {md_code(b.gap_after)})"
    if b is not None and b.gap_host_call:
        where += f" while the host ran {md_code(b.gap_host_call)}"
    return TryNext("long gaps", Md(f"remove the wait in the longest gap{where}: it is one stall, not overhead"),
                   Md(f"the long gaps take {fmt_num(lv.idle_ms)} ms {per_step(v.identity.step_label)}"))


def _communication(v: Verdict, lv: Any, s: ServerSettings) -> TryNext:
    cat, label = md_text(lv.category), v.identity.step_label
    split = v.comm_split
    if lv.transfer_ms is not None and lv.transfer_ms < lv.exposed_ms / 2:
        who = (f": rank {fmt_num(split.straggler_rank)} arrives last" if split is not None
               and split.straggler_rank is not None else "")
        return TryNext(lv.category, Md(f"even out the ranks' work before each {cat}{who}; a faster collective "
                                       "would not shorten the wait"),
                       Md(f"of its {fmt_num(lv.exposed_ms)} ms {per_step(label)}, {fmt_num(lv.transfer_ms)} ms is "
                          "transfer; the rest is ranks waiting for each other"))
    change = ("try removing `--disable-custom-all-reduce` from `server.extra_args`"
              if "--disable-custom-all-reduce" in s.extra_args else
              "fewer or faster collectives: a custom all-reduce, all-reduce fused with the next norm, or a faster link")
    return TryNext(lv.category, Md(change), Md(f"{cat} runs exposed for {fmt_num(lv.exposed_ms)} ms {per_step(label)}"))


def _gemm(v: Verdict, lv: Any, s: ServerSettings) -> TryNext:
    roof = next((r for r in v.roofline if r.category == lv.category and r.pct_peak_bw is not None), None)
    ev = Md(f"{md_text(lv.category)} takes {fmt_num(lv.exposed_ms)} ms {per_step(v.identity.step_label)}"
            + (f" at {fmt_num(roof.pct_peak_bw)} % of peak bandwidth" if roof is not None else ""))
    if s.quantization is not None and s.quantization.strip().lower() in UNQUANTIZED:
        return TryNext(lv.category, Md(f"the weights are not quantized (`model.quantization: "
                                       f"{md_text(s.quantization)}`): try a weight-only INT4 or FP8 checkpoint, "
                                       "since a decode GEMM reads every weight once per step"), ev)
    if roof is not None and roof.pct_peak_bw >= NEAR_ROOFLINE_PCT:
        return TryNext(lv.category, Md("the GEMMs are near the roofline: only fewer bytes (a smaller weight "
                                       "format) make them faster"), ev)
    top = f" (the trace ran {md_code(lv.top_kernels[0])})" if lv.top_kernels else ""
    return TryNext(lv.category, Md(f"try another GEMM kernel for these shapes{top}"), ev)


def _attention(v: Verdict, lv: Any, s: ServerSettings) -> TryNext:
    top = f", mostly {md_code(lv.top_kernels[0])}" if lv.top_kernels else ""
    knob = ("`VLLM_ATTENTION_BACKEND` in `server.env`" if s.engine != "sglang"
            else "`--attention-backend` in `server.extra_args`")
    return TryNext(lv.category, Md(f"try another attention backend ({knob})"),
                   Md(f"{md_text(lv.category)} takes {fmt_num(lv.exposed_ms)} ms "
                      f"{per_step(v.identity.step_label)}{top}"))


CHANGES: dict[str, Callable[[Verdict, Any, ServerSettings], TryNext]] = {
    "short gaps": _short_gaps, "long gaps": _long_gaps, "between steps": _between_steps,
    "communication": _communication, "gemm": _gemm, "attention": _attention,
}
"""Lever kind (`lever_kind`) -> the change to try, written from the lever, the verdict and the settings."""


def try_next(v: Verdict, params: dict[str, Any] | None, cpu: bool = False) -> TryNext | None:
    """The change to try for the verdict's biggest lever; None when there is no lever worth
    naming or no change on file for its kind."""
    h = headline_findings(v)
    if h.lever is None or h.lever_buys_little:
        return None
    rule = CHANGES.get(lever_kind(h.lever) or "")
    return rule(v, h.lever, server_settings(params, cpu)) if rule is not None else None
