"""Findings into sentences: each prints only its finding's fields, with no arithmetic, so a test can
find every printed number in the value it came from (`sentences`).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from stepscope.wording import fmt_num as f
from stepscope.wording import WINDOW, in_steps, per_step, plural, with_article, work_unit
from stepscope.wording import fmt_pct, md_code, md_text
from stepscope.wording import short_name as _short
from stepscope.report.artifacts import STAGE_TITLES, words
from stepscope.report.verdict import headline_findings, rests_on
from stepscope.schema.verdict import (Agreement, BetweenSteps, Boundness, Caveat, CommSplit, Communication, Dominant,
                                      GapLever, Guard, KindApart, Lever, Overlap, Plateau, RooflineFinding,
                                      SpecDecodeSeen, StepPrediction, TpotGap, TraceIdentity, Verdict)

Sentence = tuple[tuple[Any, ...], str]
"""A sentence and the findings its numbers come from."""




def _job(host_ops) -> str:
    """Whose trace a host-only export is: device events of a category stepscope does not read
    (an MTIA's) make it an accelerator's, not a GPU's."""
    return "an accelerator job's" if any("not read" in str(h) for h in host_ops or ()) else "a GPU job's"

def steps(n: int | None, label: str) -> str:
    """"1 decode step", "155 decode steps"; for a trace read whole (`label` `WINDOW`) "the whole
    trace, one window" (it holds no steps to count)."""
    if label == WINDOW:
        return "the whole trace, one window"
    return f"{f(n)} {plural(label, n)}"


KIND_PHRASES = {"prefill": "a prefill trace", "training": "a training trace", "single_step": "a single-step trace",
                "capture": "a CUDA-graph capture or warm-up trace", "diffusion": "diffusion inference",
                "vision": "a vision model's inference", "encoder": "an encoder's inference pass"}
"""What each trace kind is called in a sentence (`trace_info.kind`)."""


def _evidence(i: TraceIdentity, kind: str, lead: str = " (") -> str:
    found = i.evidence_for(kind)
    return f"{lead}from the trace: {', '.join(found)}" + (")" if lead == " (" else "") if found else ""


def identity_sentences(i: TraceIdentity) -> list[str]:
    out = []
    if not i.analysed:
        return ["No trace was analysed (stage 05 wrote no summary; the profiler breakdown says why), so nothing here is a "
                "verdict."]
    if i.kind == "capture":
        out.append(f"This is {KIND_PHRASES['capture']}{_evidence(i, 'capture')}: kernels inside a capture are "
                   f"recorded, not run, and its gaps are one-off start-up time, so it gets a description, not a "
                   f"verdict.")
    elif i.kind == "mixed" and i.mixed:
        out.append(mixed_sentence(i))
    elif not i.has_decode and i.step_label == WINDOW:
        kind = "a trace" if i.kind in ("single_step", "unknown") else KIND_PHRASES.get(i.kind, "a trace")
        out.append(f"This is {kind}{_evidence(i, i.kind)} with no step marker (no engine or ProfilerStep "
                   f"annotation, graph launch or execute_model frame): the whole trace was read as one window, so "
                   f"every figure below is that window's, not a step's, with no decode verdict and no "
                   f"speculative-decoding what-if.")
    elif not i.has_decode:
        n = steps(i.n_judged_steps, i.step_label) if i.n_judged_steps else f"{i.step_label}s"
        kind = KIND_PHRASES.get(i.kind, "a trace with no step labelled decode")
        passes = (f"; its {i.step_label} holds {f(i.model_passes)} forward passes of the denoiser, so the figures "
                  f"describe that step, not one pass" if i.model_passes and i.model_passes > 1 else "")
        # steps labelled training say the kind themselves: the evidence is listed where it alone decided
        found = "" if i.kind == "training" and i.n_judged_steps else _evidence(i, i.kind, "; ")
        out.append(f"This is {kind} ({n}{found}), not decode{passes}: what follows summarises its "
                   f"steps, with no decode verdict and no speculative-decoding what-if.")
    if i.low_confidence and i.n_judged_steps is not None:
        out.append(f"Low confidence: only {steps(i.n_judged_steps, i.step_label)} judged, fewer than "
                   f"{f(i.min_steps)}, so one odd step can move every figure below.")
    return out


def mixed_sentence(i: TraceIdentity) -> str:
    """A mixed step's own reading: its prefill beside its decode requests (the annotations)."""
    m = i.mixed or {}
    toks = f" of {f(m.get('prefill_tokens'))} tokens" if m.get("prefill_tokens") is not None else ""
    return (f"The trace holds {steps(m.get('n_steps'), i.step_label)}: each runs {f(m.get('prefill_requests'))} prefill "
            f"requests{toks} beside {f(m.get('decode_requests'))} decode requests (median, from the step "
            f"annotations), so its GEMMs do a prefill's work rather than read the weights for a few tokens: what "
            f"follows describes the mixed step, with no speculative-decoding what-if.")


def guard_sentence(g: Guard, step_label: str = "step") -> str:
    """Why one failed invariant withdrew the claims resting on it: the one wording of each, for
    the report and verdict.json's sentences."""
    v = g.value
    if g.invariant == "kind_takes_verdict":
        return ("Withdrawn, as the trace is a capture: the dominant category, the levers and their ceilings, "
                "boundness and communication (each would describe a steady step this trace does not hold).")
    if g.invariant == "device_work_recorded":
        return (f"Withdrawn, the levers and their ceilings, boundness and communication: this is {_job(v('host_ops'))} trace "
                f"({v('host_ops')[0]}) with no device activity, so its times are host ops and what the GPUs did, "
                f"which any of these would describe, is not in it. Profile with the device activities on.")
    if g.invariant == "share_at_most_step":
        return (f"Withdrawn, as a share passed 100 %: {md_text(v('category'))} is {f(v('share_pct'))} % of the {step_label}, "
                f"so the step basis cannot hold the work it divides; the dominant share, boundness and the levers "
                f"rest on it.")
    if g.invariant == "busy_at_most_period":
        return (f"Withdrawn, as busy exceeds the step: the device is busy {f(v('busy_ms'))} ms of a "
                f"{f(v('step_ms'))} ms {v('denominator') or 'step'}, which cannot be; the dominant share, "
                f"boundness and the levers rest on that denominator.")
    if g.invariant == "steps_apart":
        return (f"Withdrawn, the idle split and the gap levers: a {step_label}'s own work spans {f(v('span_ms'))} ms, "
                f"past its {f(v('period_ms'))} ms period, so consecutive steps overlap on the device (the next "
                f"begins before this one's work ends, as in a pipelined step) and a gap inside one step can hold "
                f"the next one's work; such gaps measure no idle.")
    if g.invariant == "below_peak":
        bw = f"{f(v('pct_peak_bw'))} % of peak memory bandwidth" if v("pct_peak_bw") is not None else ""
        fl = f"{f(v('pct_peak_flops'))} % of peak compute" if v("pct_peak_flops") is not None else ""
        return (f"Withdrawn, {md_text(g.subject)}'s roofline: it reads {' and '.join(x for x in (bw, fl) if x)} of the "
                f"{md_text(v('device'))}, above the physical peak, so the bytes and FLOPs model does not fit this trace; "
                f"it is no sign the kernels run at the roofline.")
    if g.invariant == "clocks_agree":
        return ("Withdrawn, as the ranks' clocks disagree (stage 05 flagged them): every cross-rank claim, transfer "
                "against waiting and what a faster collective alone would buy.")
    if g.invariant == "classes_add_up":
        return (f"Withdrawn, as the classes do not add up: the categories' exposed times sum to "
                f"{f(v('exposed_sum_ms'))} ms against {f(v('busy_ms'))} ms busy, so no lever's exposed time is "
                f"trusted.")
    if g.invariant == "communication_has_collectives":
        k = v("kernels") or ()
        named = f" (its largest: {md_code(_short(k[0]))})" if k else ""
        return (f"Withdrawn, the communication claims: {f(v('comm_ms'))} ms {per_step(step_label)} is filed as communication on "
                f"one rank with no collective kernel{named}, so it is other work misfiled, not communication.")
    if g.invariant == "steady_state" and "gap_levers" in g.withdrawn and "levers" not in g.withdrawn:
        return (f"The gaps inside the step are not offered as a lever: its long gaps hold "
                f"{f(v('stall_pct'))} % of the {step_label} ({f(v('long_gaps_ms'))} of {f(v('step_ms'))} ms), over the "
                f"{f(v('stall_bound_pct'))} % a steady state allows: the step is mostly host stall, so remove the "
                f"stall and profile again before reading any ceiling.")
    if g.invariant == "steady_state":
        return (f"Withdrawn, every lever: the biggest, {v('lever')}, would make a {step_label} {f(v('ceiling_x'))}× "
                f"faster, above the {f(v('bound_x'))}× a steady state allows: one part holding that much of the step "
                f"says the trace is no run of repeated steps (a capture, a warm-up, one stall).")
    if g.invariant == "steps_match_architecture":
        return (f"Withdrawn, the dominant share, boundness, the levers and communication: none of the "
                f"{f(v('n_steps'))} decode {step_label}s holds the {f(v('all_reduce'))} all-reduces the architecture "
                f"runs in one forward pass, so each is a graph piece, merged steps or a cut step, not the step these "
                f"claims would describe. Check the model and TP given, or profile whole steps.")
    if g.invariant == "lever_coherent":
        return (f"{md_text(g.subject)} is not named as a lever: its {f(v('n_names'))} distinct kernels are a grab-bag, the "
                f"largest {f(v('top_kernels'))} holding only {f(v('top_share_pct'))} % of its time (one lever from "
                f"{f(v('dominant_share_pct'))} %), so no one fix reaches it.")
    return f"Withdrawn, as the invariant {g.invariant} failed."


def guard_clause(g: Guard, step_label: str = "step") -> str:
    """A failed invariant in a few words, for the headline's caveat (`guard_sentence` has
    the whole of it): what the trace is, and what is withdrawn for it."""
    v = g.value
    if g.invariant == "steady_state" and "gap_levers" in g.withdrawn and "levers" not in g.withdrawn:
        return f"the {step_label} is mostly one host stall ({f(v('stall_pct'))} % in long gaps): remove it and profile again"
    if g.invariant == "steps_apart":
        return (f"consecutive {step_label}s overlap on the device (each spans {f(v('span_ms'))} ms of a "
                f"{f(v('period_ms'))} ms period), so its idle is not split")
    if g.invariant == "device_work_recorded":
        return f"{_job(v('host_ops'))} trace with no device activity ({v('host_ops')[0]}): its times are host ops, so no lever is given"
    clauses = {
        "kind_takes_verdict": "the trace is a capture, so no lever or ceiling is given",
        "share_at_most_step": f"a share passed 100 % of the {step_label}, so the shares and levers are withdrawn",
        "busy_at_most_period": f"the device is busy longer than the {step_label}, so the shares and levers are withdrawn",
        "below_peak": f"{md_text(g.subject)}'s roofline reads above the device's peak, so it is withdrawn",
        "clocks_agree": "the ranks' clocks disagree, so the cross-rank claims are withdrawn",
        "classes_add_up": "the categories' exposed times do not add up to busy, so no lever is trusted",
        "communication_has_collectives": "work filed as communication has no collective kernel, so the communication "
                                         "claims are withdrawn",
        "steady_state": (f"one part would make the {step_label} {f(v('ceiling_x'))}× faster, more than a steady state "
                         "allows, so no lever is named"),
        "steps_match_architecture": (f"no decode {step_label} holds the architecture's {f(v('all_reduce'))} "
                                     "all-reduces, so nothing is claimed of the step"),
        "lever_coherent": f"{md_text(g.subject)} is a grab-bag of {f(v('n_names'))} kernels, not one lever",
    }
    return clauses.get(g.invariant, f"the invariant {g.invariant} failed, so the claims resting on it are withdrawn")


def spec_decode_sentence(s: SpecDecodeSeen) -> str:
    scored = (f", scoring {f(s.scored_tokens_per_verify_step)} tokens each" if s.scored_tokens_per_verify_step
              is not None else "")
    times = (f" ({f(s.verify_step_ms)} ms against {f(s.plain_step_ms)} ms for a plain step)"
             if s.verify_step_ms is not None and s.plain_step_ms is not None else "")
    accepted = (f" Over the profiled requests the server accepted {f(s.accepted_tokens)} of {f(s.draft_tokens)} drafted "
                f"tokens ({f(s.acceptance_pct)} %), {f(s.tokens_per_decode_step)} tokens per decode step (its /metrics "
                "counters)" if s.accepted_tokens is not None and s.tokens_per_decode_step is not None else "")
    per_token = (f", so a token costs {f(s.ms_per_token)} ms of decode time (the decode step over those tokens)"
                 if s.ms_per_token is not None else "")
    return (f"This run already decodes speculatively: {f(s.n_verify_steps)} of its {f(s.n_decode_steps)} decode "
            f"steps verify drafted tokens{scored}{times}, so the figures below describe that mixture."
            + (f"{accepted}{per_token}." if accepted else ""))


def dominant_sentence(d: Dominant) -> str:
    over = f" over {steps(d.n_steps, d.step_label)}" if d.n_steps else ""
    share = (f", {f(d.share_pct)} % of a {f(d.step_ms)} ms {d.step_label} ({d.denominator})"
             if d.share_pct is not None and d.step_ms else "")
    return f"{md_text(d.category)} is the largest category{over}: {f(d.ms_per_step)} ms {per_step(d.step_label)}{share}."


def kind_apart_sentence(k: KindApart, step_label: str) -> str:
    """Another kind of step, read on its own steps: its largest categories and their shares of its span."""
    parts = [f"{md_text(c.category)}, {f(c.ms_per_step)} ms ({f(c.pct_of_span)} %)" for c in k.top]
    largest = ", then ".join(parts)
    return (f"The {f(k.n_steps)} {md_text(k.kind)} {plural('step', k.n_steps)} {'is' if k.n_steps == 1 else 'are'} "
            f"read apart, never averaged into the {step_label}s: per step, of its {f(k.span_ms)} ms span, "
            f"{largest}.")


def communication_sentence(c: Communication, step_label: str = "step") -> str:
    per = per_step(step_label)
    if c.status == "none":
        return (f"No collective ran {in_steps(step_label)} (one rank, or no tensor parallelism), so communication "
                "plays no part.")
    if c.status == "unknown":
        return (f"Communication takes {f(c.comm_ms)} ms {per}; how much of it is hidden under compute was "
                f"not measured.")
    if c.status == "exposed":
        return (f"Communication is exposed: {f(c.exposed_ms)} of its {f(c.comm_ms)} ms {per} "
                f"({f(c.exposed_pct)} %; exposed from {f(c.exposed_threshold_pct)} %) runs with no compute alongside.")
    if c.status == "hidden":
        return (f"Communication is mostly hidden under compute: only {f(c.exposed_ms)} of its {f(c.comm_ms)} ms "
                f"{per} ({f(c.exposed_pct)} %; hidden up to {f(c.hidden_threshold_pct)} %) is exposed, so faster "
                f"collectives would buy little.")
    return (f"Communication is partly hidden: {f(c.exposed_ms)} of its {f(c.comm_ms)} ms {per} "
            f"({f(c.exposed_pct)} %) is exposed.")


def comm_split_sentences(s: CommSplit, step_label: str = "step") -> list[str]:
    per = per_step(step_label)
    if s.status == "ranks missing":
        return [f"Only {f(s.ranks_present)} of {f(s.world_size)} ranks' traces are here, so no cross-rank claim "
                f"is made: transfer and waiting cannot be told apart."]
    if s.status == "not matched":
        return ["Whether that time is transfer or ranks waiting for each other was not measured: the trace "
                "analysis did not match collectives across ranks."]
    out = []
    if s.transfer_ms is not None:
        out.append(f"Communication costs {f(s.transfer_ms)} ms {per} in transfer (from the last rank's "
                   f"arrival to completion, over {f(s.n_instances)} matched collectives): faster or fewer "
                   f"collectives (fusion, a custom all-reduce, a faster link) shorten that part.")
    if s.wait_ms is not None:
        who = f", straggler rank {f(s.straggler_rank)}" if s.straggler_rank is not None else ""
        of = f" of the {md_text(s.skew_category)} calls" if s.skew_category else ""
        skew = f"; p90 arrival skew{of} {f(s.skew_p90_us)} µs{who}" if s.skew_p90_us is not None else ""
        spread = (f", from {f(s.least_wait_ms)} ms on rank {f(s.least_wait_rank)} to {f(s.most_wait_ms)} ms on rank "
                  f"{f(s.most_wait_rank)}" if s.least_wait_rank is not None else "")
        out.append(f"Ranks wait {f(s.wait_ms)} ms {per} for each other (mean over ranks{spread}{skew}): evening out the ranks' work "
                   f"and host jitter before each collective shortens that part; a faster collective does not.")
    if s.clock_flag:
        out.append("The ranks' clocks disagree (stage 05 flagged them), so the skew above is approximate.")
    return out


def boundness_sentence(b: Boundness, step_label: str = "step") -> str:
    each = "the window" if step_label == WINDOW else "each step"
    dev, basis = b.device_word, f"{b.denominator} {f(b.step_ms)} ms, busy {f(b.busy_ms)} ms"
    unit = work_unit(b.cpu)
    if b.status == "device-bound":
        return (f"The {dev} is busy {f(b.busy_pct)} % of {each} ({basis}, idle {f(b.idle_pct)} %; "
                f"device-bound up to {f(b.device_bound_pct)} % idle), so the step is bound by the work itself, "
                f"not by launch gaps.")
    if b.status == "host gap":
        return host_gap_sentence(b, step_label)
    if b.status == "host-bound":
        if b.cpu:
            fix = "per-op overhead (Python, scheduling, synchronisation) comes before faster ops"
        elif b.graph_replay:
            fix = ("the step already replays a graph, so fewer and larger kernels (fusion) or a faster host "
                   "come before faster kernels")
        else:
            fix = "CUDA graphs, fewer launches or a faster host come before faster kernels"
        delay = (f"; kernels start {f(b.launch_delay_median_us)} µs after their launch (median), so the queue "
                 f"runs dry" if b.launch_delay_median_us is not None and not b.cpu else "")
        return (f"The {dev} idles {f(b.idle_pct)} % of {each} ({basis}), {f(b.micro_idle_pct)} % in short "
                f"gaps between {unit} (host-bound from {f(b.micro_threshold_pct)} %){delay}: the step is "
                f"host-bound, so {fix}.")
    if b.status == "stall":
        where = (f" between {md_code(_short(b.gap_before))} and {md_code(_short(b.gap_after))}" if b.gap_before or b.gap_after
                 else "")
        if b.gap_host_call:
            where += f", while the host was in {md_code(_short(b.gap_host_call))}"
        return (f"The {dev} idles {f(b.idle_pct)} % of {each} ({basis}), but gaps of {f(b.macro_gap_ms)} ms "
                f"or more hold {f(b.macro_pct_of_idle)} % of that idle (the longest, {f(b.largest_gap_ms)} ms"
                f"{where}), while short gaps between {unit} are only {f(b.micro_idle_pct)} %: a stall to "
                f"remove, not a host-bound step; faster {unit} or launches would not touch it.")
    if b.status == "host-ahead gaps":
        return (f"The {dev} idles {f(b.idle_pct)} % of {each} ({basis}), {f(b.micro_idle_pct)} % in short "
                f"gaps, yet kernels start {f(b.launch_delay_median_us)} µs after their launch (median, above "
                f"{f(b.host_ahead_us)} µs): the host runs ahead, so the gaps are waits inside the device work "
                f"(synchronisation, dependencies), not launch overhead.")
    if b.status == "undetermined":
        return (f"The {dev} idles {f(b.idle_pct)} % of {each} ({basis}), but idle was not split into short "
                f"gaps between {unit} and long stalls, so host-bound cannot be told from one stall.")
    return (f"The {dev} idles {f(b.idle_pct)} % of {each} ({basis}){_idle_split(b)}: gaps matter, but the "
            f"work itself dominates.")


def _host_frame_clause(frame: str | None, in_frame: int | None, n: int | None, what: str = "steps") -> str:
    """Where the host was during a gap: its frame, and in how many of the steps or intervals."""
    if not frame:
        return ", while no recorded host frame holds it"
    of = f" (in {f(in_frame)} of {f(n)} {what})" if in_frame is not None and n and in_frame < n else ""
    return f", while the host was in {md_code(_short(frame))}{of}"


PYTHON_TRACING = ("the profiler recorded Python frames inside it (Python-stack tracing, `with_stack`, ran then), "
                  "and that tracing adds its own cost to every Python call, so the gap may be shorter untraced")
"""The note on a host gap holding Python frames: the stack tracer may inflate it."""


def host_gap_sentence(b: Boundness, step_label: str = "step") -> str:
    """A mostly idle step whose idle is one gap per step: host-bound, by the host frame running then."""
    unit = work_unit(b.cpu)
    longest = f"; the longest {f(b.largest_gap_ms)} ms" if b.largest_gap_ms is not None else ""
    where = _host_frame_clause(b.host_frame, b.host_frame_steps, b.n_steps)
    note = f" {PYTHON_TRACING[0].upper()}{PYTHON_TRACING[1:]}." if b.python_frames else ""
    return (f"The {b.device_word} idles {f(b.idle_pct)} % of each {step_label} ({b.denominator} {f(b.step_ms)} ms, "
            f"busy {f(b.busy_ms)} ms), and one gap per step holds {f(b.host_gap_pct_of_idle)} % of that idle "
            f"({f(b.host_gap_ms)} ms {per_step(step_label)}{longest}){where}: the step is host-bound (over "
            f"{f(b.host_gap_idle_pct)} % idle, most of it in one gap), so faster {unit} would not touch it; shorten "
            f"that host work or overlap it with the device's.{note}")


def host_gap_headline(b: Boundness, step_label: str) -> str:
    """The headline's host-bound sentence: the share of idle in one gap, and where the host was."""
    where = f"while the host runs {md_code(_short(b.host_frame))}" if b.host_frame else "in no recorded host frame"
    note = " (Python-stack tracing may inflate it)" if b.python_frames else ""
    steps = (f"in {f(b.host_frame_steps)} of {f(b.n_steps)} steps" if b.host_frame and b.host_frame_steps is not None
             and b.n_steps and b.host_frame_steps < b.n_steps else "per step")
    return (f"The {step_label} is host-bound: the {b.device_word} idles {f(b.idle_pct)} %, {f(b.host_gap_pct_of_idle)} % "
            f"of it in one gap {steps}, {where}{note}.")


def _idle_split(b: Boundness) -> str:
    """Where the idle lies: short gaps, long gaps, between steps (each when measured)."""
    parts = []
    if b.micro_idle_pct is not None:
        parts.append(f"{f(b.micro_idle_pct)} % in short gaps between {work_unit(b.cpu)}")
    if b.macro_idle_pct is not None:
        parts.append(f"{f(b.macro_idle_pct)} % in gaps of {f(b.macro_gap_ms)} ms or more")
    if b.between_steps_pct is not None:
        parts.append(f"{f(b.between_steps_pct)} % between steps (period minus span: host work outside the "
                     f"step's device work)")
    return ", " + ", ".join(parts) if parts else ""


def overlap_sentence(o: Overlap) -> str:
    return (f"Kernels overlap (summed {f(o.kernel_sum_ms)} ms against {f(o.union_ms)} ms busy), so per-kernel "
            f"totals overstate the step by {f(o.overstate_pct)} %.")


def tpot_gap_sentence(t: TpotGap) -> str:
    return (f"{f(t.gap_ms)} ms of the {f(t.tpot_ms)} ms TPOT ({f(t.gap_pct)} %) lies outside the device steps' "
            f"{t.denominator} of {f(t.step_ms)} ms, on the host side; no kernel fix reaches it.")


def between_steps_sentence(b: BetweenSteps, step_label: str, biggest: bool = False) -> str:
    over = f", mean over {f(b.n_intervals)} intervals" if b.n_intervals else ""
    lead = "The biggest lever lies between steps: " if biggest else "Between steps, "
    what = ("the engine's host work outside the step (scheduling, input preparation, output processing)"
            if not b.host_frame else "host work outside the step")
    where = _host_frame_clause(b.host_frame, b.host_frame_intervals, b.n_intervals, "intervals") if b.host_frame else ""
    return (f"{lead}{f(b.gap_ms)} ms {per_step(step_label)} ({f(b.gap_pct)} % of the {f(b.period_ms)} ms period{over}) "
            f"pass with none of the steps' recorded work running{where}: {what}, which no kernel or collective "
            f"fix reaches. "
            f"Removing it would make a {step_label} at most {f(b.ceiling_x)}× faster (period / span of "
            f"{f(b.span_ms)} ms){', more than any other lever' if biggest else ''}.")


def lever_name(lv: Lever | BetweenSteps | GapLever) -> str:
    """What a lever is called, in the headline and the verdict alike."""
    if isinstance(lv, Lever):
        return lv.category
    if isinstance(lv, BetweenSteps):
        return "the time between steps"
    return f"the short gaps between {work_unit(lv.cpu)}" if lv.kind == "short gaps" else "the long gaps inside the step"


def gap_lever_sentence(g: GapLever, step_label: str) -> str:
    """Said only of the biggest lever: the idle inside the step that beats every category."""
    bound = f"each under {f(g.macro_gap_ms)} ms" if g.kind == "short gaps" else f"each {f(g.macro_gap_ms)} ms or more"
    what = f"{lever_name(g)} ({bound})"
    return (f"The biggest lever is {what}: removing their {f(g.idle_ms)} ms {per_step(step_label)} would make a {step_label} "
            f"at most {f(g.ceiling_x)}× faster (Amdahl, on the {g.denominator} of {f(g.step_ms)} ms), more than "
            f"any category.")


def lever_sentence(levers: tuple[Lever, ...], step_label: str, among_categories: bool = False,
                   at_peak: RooflineFinding | None = None) -> str:
    """The best category lever and the next; `at_peak`, the best one's roofline finding, adds
    what kernels at the device's peaks would buy (less than removing the category)."""
    best = levers[0]
    lead = "Among the categories, the biggest lever is" if among_categories else "The biggest single lever is"
    txt = (f"{lead} {md_text(best.category)}: removing all of its exposed time "
           f"({f(best.exposed_ms)} ms {per_step(step_label)}) would make a {step_label} at most {f(best.ceiling_x)}× faster "
           f"(Amdahl, on the {best.denominator} of {f(best.step_ms)} ms)")
    what = lever_what_clause(best)
    if what:
        txt += "; " + what
    if at_peak is not None and at_peak.at_peak_ms is not None:
        txt += "; " + _at_peak_clause(at_peak, step_label)
    if best.transfer_ms is not None and best.transfer_ms < best.exposed_ms:
        txt += (f"; of it, {f(best.transfer_ms)} ms {per_step(step_label)} is transfer (last arrival to completion) and the rest is "
                f"time the ranks wait for each other, so a faster {md_text(best.category)} alone makes a {step_label} at most "
                f"{f(best.transfer_ceiling_x)}× faster")
    elif best.transfer_ms is not None:
        txt += (f"; its matched calls spend {f(best.transfer_ms)} ms {per_step(step_label)} from the last rank's arrival to "
                f"completion, all of its exposed time: transfer, not ranks waiting, so a faster {md_text(best.category)} "
                f"reaches it")
    if len(levers) > 1:
        txt += f"; next is {md_text(levers[1].category)} at {f(levers[1].ceiling_x)}×"
    return txt + "."


def lever_what_clause(lv: Lever) -> str:
    """What a fix to the lever would fix: the module holding most of its time, if one does, and its
    largest kernels with their share. Empty without stage 05's category_levers.csv."""
    from stepscope.thresholds import LEVER_DOMINANT_SHARE

    parts = []
    if lv.module and lv.module_share_pct is not None and lv.module_share_pct >= 100 * LEVER_DOMINANT_SHARE:
        parts.append(f"{f(lv.module_share_pct)} % of it runs inside {md_code(lv.module)}")
    names = [md_code(_short(n, 60)) for n in lv.top_kernels]
    if len(names) == 1 and lv.n_names == 1:
        parts.append(f"its one kernel is {names[0]}")
    elif names and lv.top_share_pct is not None:
        listed = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
        parts.append(f"of its {f(lv.n_names)} kernels, {listed} hold {f(lv.top_share_pct)} % of its time")
    return ", and ".join(parts)


def agreement_sentence(g: Agreement) -> str:
    other = g.same_implementation is False
    impl = (f"stage 03 timed {md_text(g.micro_backend)}, but the engine ran {g.trace_implementation}" if other else "")
    if g.agree:
        return (f"The trace's {g.quantity} per step ({f(g.trace_ms)} ms) agrees with the micro-benchmark's "
                f"prediction ({f(g.predicted_ms)} ms; ratio {f(g.ratio)}, within ±{f(g.tolerance_pct)} %)"
                + (f", though by chance: {impl}." if other else "."))
    if other:
        why = f"{impl}: the prediction times another implementation"
    elif g.quantity == "communication" and g.ratio > 1:
        why = "beyond the transfer itself, ranks wait for each other or the engine's collectives differ"
    else:
        why = "the isolated benchmark does not describe the running engine" + (
            f" (its largest GEMM is {g.trace_implementation})"
            if g.quantity == "GEMM time" and g.trace_implementation else "")
    return (f"The trace's {g.quantity} per step ({f(g.trace_ms)} ms) is {f(g.ratio)}× the micro-benchmark's "
            f"prediction ({f(g.predicted_ms)} ms): {why}.")


def offsetting_clause(sp: StepPrediction) -> str:
    """What an offsetting agreement is made of: the total, then the components off their bands."""
    off = "; ".join(f"{c.name} {f(c.predicted_ms)} ms predicted against {f(c.trace_ms)} ms" for c in sp.components if c.off)
    return (f"the micro-predicted step ({f(sp.predicted_ms)} ms) agrees with the trace's ({f(sp.trace_ms)} ms) only "
            f"because its errors offset: {off}")


def step_prediction_sentence(sp: StepPrediction) -> str:
    """The micro-predicted step against the trace's, said by its components when they offset."""
    if sp.offsetting:
        return f"An offsetting agreement: {offsetting_clause(sp)}."
    verb = "agrees with" if sp.agree else f"is {f(sp.trace_ms / sp.predicted_ms)}× of"
    return (f"The trace's step ({f(sp.trace_ms)} ms) {verb} the micro-predicted one ({f(sp.predicted_ms)} ms, "
            f"within ±{f(sp.tolerance_pct)} % counts as agreeing).")


def step_prediction_table(sp: StepPrediction | None) -> str:
    """The micro-predicted step beside the trace's, one row per component and the total."""
    from stepscope.report.markdown_util import md_table

    if sp is None:
        return ""
    rows = [{"component": c.name, "trace": c.trace_ms, "predicted": c.predicted_ms,
             "within": "**no**" if c.off else "yes"} for c in sp.components]
    rows.append({"component": "**step**", "trace": sp.trace_ms, "predicted": sp.predicted_ms,
                 "within": "**offsetting**" if sp.offsetting else "yes" if sp.agree else "**no**"})
    return ("\nThe micro-predicted step by component (stage 02's GEMMs and stage 03's transfer in place of the "
            "trace's; a burst predicts no waiting; attention and the rest are the trace's own). A total that "
            "agrees while its components are off both ways is an offsetting agreement:\n\n"
            + md_table(pd.DataFrame(rows), [("component", "component"), ("trace", "trace ms/step"),
                                            ("predicted", "predicted ms/step"), ("within", f"within ±{f(sp.tolerance_pct)} %?")],
                       md_columns=("component", "within")) + "\n")


def roofline_sentence(r: RooflineFinding, step_label: str = "step", at_peak: bool = True) -> str:
    """The category's achieved bandwidth and compute against the device's peaks; with `at_peak`,
    what kernels at the roofline would buy (the lever sentence says it for the biggest lever)."""
    micro = (f"; stage 02's micro-benchmark reaches {f(r.micro_gbps)} GB/s at the same shapes (trace / micro "
             f"{f(r.micro_vs_trace)})" if r.micro_gbps is not None and r.micro_vs_trace is not None else "")
    if not r.peak_known or r.pct_peak_bw is None:
        dev = f" ({md_text(r.device)})" if r.device else ""
        return (f"On the trace {md_text(r.category)} moves {f(r.achieved_gbps)} GB/s; the device's peak{dev} is unknown, so "
                f"no % of peak is given{micro}.")
    flops = (f" and {f(r.achieved_tflops)} TFLOP/s ({f(r.pct_peak_flops)} % of peak compute)"
             if r.pct_peak_flops is not None else "")
    at_peak = f": {_at_peak_clause(r, step_label)}" if at_peak and r.at_peak_ms is not None else ""
    return (f"On the trace {md_text(r.category)} moves {f(r.achieved_gbps)} GB/s, {f(r.pct_peak_bw)} % of the {md_text(r.device)}'s "
            f"peak memory bandwidth{flops}{micro}{at_peak}.")


def _at_peak_clause(r: RooflineFinding, step_label: str = "step") -> str:
    if r.at_peak_ms >= r.time_ms_per_step:
        return (f"its kernels already run at the roofline (its bytes and FLOPs need {f(r.at_peak_ms)} ms {per_step(step_label)} at "
                f"the device's peaks), so only less work (fewer bytes moved: lower precision, fusion) shortens it")
    return (f"at the device's peaks its bytes and FLOPs would still need {f(r.at_peak_ms)} ms {per_step(step_label)}, so faster "
            f"kernels alone make a {step_label} at most {f(r.at_peak_ceiling_x)}× faster (Amdahl, on the "
            f"{r.denominator} of {f(r.step_ms)} ms)")


def plateau_sentence(p: Plateau) -> str:
    if p.reached:
        return (f"Throughput levels off from concurrency {f(p.knee_concurrency)}: the plateau is "
                f"{f(p.plateau_tok_s)} output tok/s{plateau_stall_clause(p)}.")
    upto = (f" up to concurrency {f(p.best_concurrency)} ({f(p.best_tok_s)} output tok/s)"
            if p.best_concurrency is not None else "")
    return (f"No plateau was reached: output tok/s still grew by at least {f(p.knee_gain_pct)} % per doubling of "
            f"concurrency{upto}{no_plateau_tail(p)}.")


def no_plateau_tail(p: Plateau) -> str:
    """How a "no plateau" reading ends: the sweep stopped short of saturation, unless server-wide
    stalls took a large share of some level, when the growth may be the stalls' doing."""
    if p.stall_pct is None:
        return ", so the sweep stopped short of saturation"
    return (f", but server-wide stalls (every stream silent at once) took up to {f(p.stall_pct)} % of a level's "
            f"time (at concurrency {f(p.stall_concurrency)}): each level is low by up to its own share, so the "
            "growth between levels may be the stalls', not the server's (longer levels, "
            "sweep.min_level_duration_s, make one stall weigh less)")


def plateau_stall_clause(p: Plateau) -> str:
    """What server-wide stalls at or beyond the knee did to the plateau; empty when they were small."""
    if p.stall_pct is None:
        return ""
    return (f", but server-wide stalls (every stream silent at once) took up to {f(p.stall_pct)} % of a level's "
            f"time from the knee on (at concurrency {f(p.stall_concurrency)}), so it is low by up to that share")


LEVER_GUARDS = ("lever_coherent", "steady_state", "below_peak")
"""Guards whose withdrawal the verdict states beside the levers rather than before it all."""


def sentences(v: Verdict) -> list[Sentence]:
    """The verdict, in order, each sentence with the findings it was written from."""
    out: list[Sentence] = [((v.identity,), s) for s in identity_sentences(v.identity)]
    # A withdrawn lever or roofline is said at the levers; other withdrawals up front, as all rests on them.
    at_levers = [g for g in v.failed_guards if g.invariant in LEVER_GUARDS]
    out += [((g,), guard_sentence(g, v.identity.step_label)) for g in v.failed_guards if g not in at_levers]
    if v.spec_decode is not None:
        out.append(((v.spec_decode,), spec_decode_sentence(v.spec_decode)))
    if v.dominant is not None:
        out.append(((v.dominant,), dominant_sentence(v.dominant)))
    out += [((k, *k.top), kind_apart_sentence(k, v.identity.step_label)) for k in v.kinds_apart]
    if v.communication is not None:
        out.append(((v.communication,), communication_sentence(v.communication, v.identity.step_label)))
    # A split of hidden communication would advertise a lever the step cannot feel.
    if v.comm_split is not None and v.communication is not None and v.communication.status != "hidden":
        out += [((v.comm_split,), s) for s in comm_split_sentences(v.comm_split, v.identity.step_label)]
    if v.boundness is not None:
        out.append(((v.boundness,), boundness_sentence(v.boundness, v.identity.step_label)))
    if v.overlap is not None:
        out.append(((v.overlap,), overlap_sentence(v.overlap)))
    if v.tpot_gap is not None:
        out.append(((v.tpot_gap,), tpot_gap_sentence(v.tpot_gap)))
    out += [((g,), guard_sentence(g, v.identity.step_label)) for g in at_levers]
    out += _lever_sentences(v)
    in_lever = _lever_at_peak(v)
    out += [((r,), roofline_sentence(r, v.identity.step_label, at_peak=r is not in_lever)) for r in v.roofline]
    out += [((g,), agreement_sentence(g)) for g in v.agreements]
    if v.step_prediction is not None:
        out.append(((v.step_prediction,), step_prediction_sentence(v.step_prediction)))
    if v.plateau is not None:  # the sweep's reading, said once the step's are (no longer in the headline)
        out.append(((v.plateau,), plateau_sentence(v.plateau)))
    return out


def _lever_sentences(v: Verdict) -> list[Sentence]:
    """The biggest lever first, then the category levers and the time between steps; a lever
    that is not the biggest is never called so."""
    label, kind = v.identity.step_label, v.biggest.kind if v.biggest is not None else None
    out: list[Sentence] = []
    gap = next((g for g in v.gap_levers if g.kind == kind), None)
    if gap is not None:
        out.append(((gap,), gap_lever_sentence(gap, label)))
    between = v.between_steps
    if between is not None and kind == "between steps":
        out.append(((between,), between_steps_sentence(between, label, biggest=True)))
    if v.levers:
        peak = _lever_at_peak(v)
        host_gap = v.boundness is not None and v.boundness.status == "host gap"  # the gap outranks every category
        out.append((v.levers[:2] + ((peak,) if peak else ()),
                    lever_sentence(v.levers, label, among_categories=host_gap or kind not in (None, "category"),
                                   at_peak=peak)))
    if between is not None and kind != "between steps":
        out.append(((between,), between_steps_sentence(between, label)))
    return out


def _lever_at_peak(v: Verdict) -> RooflineFinding | None:
    """The roofline finding of the best category lever, when it says what the roofline buys."""
    best = v.levers[0].category if v.levers else None
    return next((r for r in v.roofline if r.category == best and r.at_peak_ms is not None), None)


def verdict_sentences(v: Verdict) -> list[str]:
    return [s for _, s in sentences(v)]


def headline_sentences(v: Verdict) -> list[Sentence]:
    """The report's "In short" and the terminal's closing lines: at most three sentences
    (`verdict.headline_findings`)."""
    h, label = headline_findings(v), v.identity.step_label
    out: list[Sentence] = []
    if h.dominant is not None:
        src = (h.dominant,) if h.idle is None else (h.dominant, h.idle)
        out.append((src, dominant_headline(h.dominant, h.idle)))
    if h.host_gap is not None:
        out.append(((h.host_gap,), host_gap_headline(h.host_gap, label)))
    if h.lever is not None:
        same = isinstance(h.lever, Lever) and h.dominant is not None and h.lever.category == h.dominant.category
        out.append(((h.lever,), lever_headline(h.lever, label, same_as_dominant=same, buys_little=h.lever_buys_little)))
    if h.caveat is not None:
        out.append(((rests_on(v, h.caveat), h.caveat), "Caveat: " + caveat_clause(h.caveat, v) + "."))
    return out


def dominant_headline(d: Dominant, idle: Boundness | None = None) -> str:
    share = f", {f(d.share_pct)} % of its {d.denominator}" if d.share_pct is not None and d.denominator else ""
    idles = f"; the {idle.device_word} idles {f(idle.idle_pct)} %" if idle is not None else ""
    return (f"{md_text(d.category)} takes the most time: {f(d.ms_per_step)} ms {per_step(d.step_label, named=True)}"
            f"{share}{idles}.")


def lever_headline(lv: Lever | BetweenSteps | GapLever, step_label: str, same_as_dominant: bool = False,
                   buys_little: bool = False) -> str:
    """The biggest lever in one sentence: what it is, the time it removes, its Amdahl ceiling."""
    if buys_little:
        return (f"No lever is worth naming: the biggest, {lever_name(lv)}, would make a {step_label} at most "
                f"{f(lv.ceiling_x)}× faster.")
    if same_as_dominant:
        return (f"It is also the biggest lever: removing its {f(lv.exposed_ms)} ms of exposed time {per_step(step_label)} would "
                f"make a {step_label} at most {f(lv.ceiling_x)}× faster.")
    if isinstance(lv, Lever):
        removed = f"its {f(lv.exposed_ms)} ms of exposed time {per_step(step_label)}"
    elif isinstance(lv, BetweenSteps):
        removed = f"its {f(lv.gap_ms)} ms of host work {per_step(step_label)}"
    else:
        removed = f"their {f(lv.idle_ms)} ms {per_step(step_label)}"
    return (f"The biggest lever is {lever_name(lv)}: removing {removed} would make a {step_label} at most "
            f"{f(lv.ceiling_x)}× faster.")


def caveat_clause(c: Caveat, v: Verdict) -> str:
    """One of the verdict's own caveats in a few words, from the finding it rests on."""
    x, step_label = rests_on(v, c), v.identity.step_label
    if c.code == "not_analysed":
        return "no trace was analysed, so there is no verdict: the profiler breakdown says why"
    if c.code == "host_only":
        return guard_clause(x, step_label)
    if c.code == "not_decode" and step_label == WINDOW and x.kind in ("single_step", "unknown"):
        return ("the trace has no step marker, so its figures describe the whole trace, one window, and no decode "
                "verdict applies")
    if c.code == "not_decode":
        whole = " read whole (no step marker)" if step_label == WINDOW else ""
        return f"this is {with_article(x.kind)} trace{whole}, not decode, so no decode verdict applies"
    if c.code == "claims_withdrawn":
        return guard_clause(x, step_label)
    if c.code == "ranks_missing":
        return f"only {f(x.ranks_present)} of {f(x.world_size)} ranks' traces are here, so cross-rank figures are partial"
    if c.code == "low_confidence":
        return (f"only {steps(x.n_judged_steps, step_label)} judged, fewer than {f(x.min_steps)}, so one odd step "
                "moves every figure")
    if c.code == "tpot_gap":
        return (f"{f(x.gap_ms)} ms of the {f(x.tpot_ms)} ms TPOT ({f(x.gap_pct)} %) lies outside the device steps, "
                "where no kernel fix reaches")
    if c.code == "offsetting_agreement":
        return offsetting_clause(x)
    if c.code == "prediction_disagrees":
        other = "; the engine ran other collectives than stage 03 timed" if x.same_implementation is False else ""
        return (f"the micro-benchmarks predict {f(x.predicted_ms)} ms of {x.quantity} per step, the trace shows "
                f"{f(x.trace_ms)} ms{other}")
    if c.code == "overlap":
        return f"kernels overlap, so per-kernel totals overstate the step by {f(x.overstate_pct)} %"
    if c.code == "plateau_stalls":
        return (f"server-wide stalls took up to {f(x.stall_pct)} % of a sweep level's time, so the plateau is low "
                "by up to that")
    return (f"this run already decodes speculatively ({f(x.n_verify_steps)} of {f(x.n_decode_steps)} decode steps "
            "verify drafts), so the figures describe that mixture")


def caveat_text(c: Caveat, v: Verdict) -> str:
    """A caveat as the report's Caveats section lists it: the verdict's own as its clause, an
    artifact's flag or check in the words of `ARTIFACT_CAVEATS`."""
    if c.code not in ARTIFACT_CAVEATS:
        clause = caveat_clause(c, v)
        return clause[0].upper() + clause[1:] + "."
    return artifact_caveat_text(c, v.identity.step_label)


def artifact_caveat_text(c: Caveat, step_label: str) -> str:
    """An artifact's flag or failed check (`report.analysis.artifact_caveats`) in words."""
    return ARTIFACT_CAVEATS[c.code](c, step_label)


def _names(c: Caveat) -> str:
    return ", ".join(md_code(n[:80]) for n in c.value("top_names") or []) or "none listed"


def _counts(c: Caveat, which: str) -> str:
    return ", ".join(f"{k.split(':', 1)[1]} {f(x) if isinstance(x, float) else x}" for k, x in c.values
                     if k.startswith(which + ":"))


def _stage(c: Caveat) -> str:
    stage = f"Stage {c.subject} ({STAGE_TITLES.get(c.subject or '', c.subject)})"
    err = f": {md_text(c.value('error'))}" if c.value("error") else ""
    if c.code == "stage_failed":
        return f"{stage} failed{err}; its artifacts may be incomplete."
    return f"{stage} was not measured ({md_text(c.value('status')) if c.value('status') else 'no artifacts'}{err})."


def _sweep_failures(c: Caveat) -> str:
    ex = "; ".join(f"{md_text(lv)}: {md_text(e)}" for lv, e in zip(c.value("levels") or [], c.value("errors") or []))
    return (f"{c.value('n_failures')} sweep requests failed and are left out of the latency statistics"
            + (f" (first: {ex})" if ex else "") + ".")


def _sweep_stalls(c: Caveat) -> str:
    where = f" (concurrency {f(c.value('concurrency'))})" if c.value("concurrency") is not None else ""
    return (f"Server-wide stalls took up to {fmt_pct(c.value('stall_share'))} of a sweep level's time{where}: that "
            "level's throughput is low by up to that share.")


ARTIFACT_CAVEATS = {
    "tpot_is_delivery": lambda c, label: f"The capture's TPOT measures delivery, not decode: {c.value('reason')}.",
    "sweep_delivery": lambda c, label: (f"At {f(c.value('n_levels'))} of {f(c.value('of_levels'))} sweep levels the TPOT "
                                        f"and ITL measure delivery, not decode: up to {fmt_pct(c.value('max_share'))} of "
                                        "token chunks arrived together with the previous one; read the engine's step "
                                        "period instead."),
    "sweep_stalls": lambda c, label: _sweep_stalls(c),
    "other_share": lambda c, label: (f"\"other\" holds at most {fmt_pct(c.value('share'))} of kernel time (rank "
                                     f"{c.value('rank')}); its top names: {_names(c)}."),
    "catch_all": lambda c, label: (f"Only a catch-all rule matched {fmt_pct(c.value('share'))} of kernel time (at most, "
                                   f"rank {c.value('rank')}; filed as unattributed elementwise); its top names: {_names(c)}."),
    "unattributed_events": lambda c, label: (f"{c.value('n_events')} device events were not attributed to any step "
                                             f"(ranks {', '.join(c.value('ranks'))}); they are left out of per-step figures."),
    "no_step_marker": lambda c, label: ("No step boundaries: the trace has no step marker, so it was read whole, as one "
                                        f"window ({md_text(', '.join(c.value('sources')))}); its figures are the window's, "
                                        "not a step's."),
    "fallback_steps": lambda c, label: (f"Step boundaries come from: {md_text(', '.join(c.value('sources')))} — a "
                                        "fallback, so step counts and per-step figures are approximate."),
    "collectives_mismatch": lambda c, label: (f"Collectives {per_step(label, named=True)} do not match the architecture: "
                                              f"expected {_counts(c, 'expected')}, observed {_counts(c, 'observed')}. "
                                              f"{words(c.value('explanation'))}").strip(),
    "collectives_unchecked": lambda c, label: (f"Collectives {per_step(label, named=True)} were not checked against the "
                                               f"architecture: {words(c.value('explanation')) or 'no expectation given'}"),
    "trace_flag": lambda c, label: f"[05 {md_text(c.value('severity'))}] {md_text(c.subject)}: {md_text(c.value('message'))}",
    "sweep_flag": lambda c, label: f"[01] {md_text(c.value('message'))}",
    "client_bound": lambda c, label: ("The load generator may have been the bottleneck at "
                                      f"{md_text(', '.join(c.value('levels')))}; treat those levels' throughput as a "
                                      "lower bound."),
    "server_died": lambda c, label: (f"The server died during the sweep at level {md_text(c.value('level'))}"
                                     + (f" ({md_text(c.value('message'))})" if c.value("message") else "")
                                     + "; later levels are absent."),
    "sweep_failures": lambda c, label: _sweep_failures(c),
    "capture_failures": lambda c, label: (f"{c.value('n_failed')} of the capture's requests failed; its TPOT comes "
                                          "from the others."),
    "capture_ranks_missing": lambda c, label: f"Ranks missing from the capture: [{', '.join(c.value('ranks'))}].",
    "capture_partial": lambda c, label: ("The profiler capture is partial: not every rank's trace was complete (see the "
                                         "manifest)."),
    "stage_not_measured": lambda c, label: _stage(c),
    "stage_failed": lambda c, label: _stage(c),
    "unreadable_artifact": lambda c, label: f"Unreadable artifact: {md_text(c.value('problem'))}",
}
"""How the report words each artifact caveat (`report.analysis.artifact_caveats`), from its values."""


def headline(v: Verdict) -> list[str]:
    return [s for _, s in headline_sentences(v)]


def perfetto_sentence(step_id: int, rank: int, step_label: str, href: str, file_name: str, ui_url: str) -> str:
    """Where to look at the drawn step by eye: the merged Perfetto file and the step to find."""
    return (f"To look at it by eye, open [{file_name}]({href}) (every rank, one process each, on one clock) in "
            f"[{ui_url.removeprefix('https://')}]({ui_url}) (*Open trace file*): the {step_label} drawn above is "
            f"step {f(step_id)} of rank {f(rank)}; type `step {step_id} ` in its search box. "
            "The folder's README.md says where in the file it starts.")
