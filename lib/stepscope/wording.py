"""How steps and kernels are named, in the report and on figures alike: one place, so a
figure's title never calls a training step a decode step while the sentence beside it does not."""

from __future__ import annotations

import html
import math
import os
import re
from typing import Any, Sequence

from stepscope.thresholds import LOW_CONFIDENCE_STEPS, STALL_GAP_S

STEP_LABELS = {"decode": "decode step", "prefill": "prefill step",
               "mixed": "mixed prefill-and-decode step", "training": "training step",
               "single_step": "step", "unknown": "step", "capture": "step",
               "diffusion": "pipeline step", "vision": "forward step", "encoder": "forward step"}
"""The name of one step of each trace kind (`trace_info.kind`)."""


WINDOW = "window"
"""What a trace with no step marker (stage 05's `whole_trace` steps) is read as: its whole span, one
window. Its figures are the window's, never "per step"."""


def step_label(kind: str | None, window: bool = False) -> str:
    """"decode step" for a decode trace, "training step" for a training trace, else "step";
    "window" for a trace read whole, whatever its kind."""
    return WINDOW if window else STEP_LABELS.get(kind or "unknown", "step")


def per_step(label: str = "step", named: bool = False) -> str:
    """How a figure over steps is read: "per step" ("per decode step", `named`), or "in the
    window" when `label` is `WINDOW` (a trace with no step marker holds one window, not steps)."""
    if label == WINDOW:
        return "in the window"
    return f"per {label}" if named else "per step"


def in_steps(label: str = "step") -> str:
    """Where something ran or did not: "in these steps", or "in the window" for a trace read whole."""
    return "in the window" if label == WINDOW else "in these steps"


def per_step_header(unit: str, label: str = "step") -> str:
    """A column header for a quantity per step: "ms/step"; "ms in window" when `label` is
    `WINDOW`."""
    return f"{unit} in window" if label == WINDOW else f"{unit}/step"



def with_article(word: str) -> str:
    """`word` after its indefinite article, by its first letter ("an encoder", "an unknown", "a vision")."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def plural(noun: str, n: float | None) -> str:
    """The noun as counted: "1 decode step", "3 decode steps" (n None counts as many)."""
    return noun if n == 1 else noun + "s"


def work_unit(cpu: bool) -> str:
    """What one unit of counted work is called: "kernels" on a device, "ops" on a CPU trace
    (where the work is each op's self time)."""
    return "ops" if cpu else "kernels"


def short_name(name: str | None, width: int = 70) -> str:
    """A kernel name cut to `width` characters (templated names run to hundreds), its middle
    elided: generated kernels share long prefixes and differ in their tile sizes at the end."""
    name = name or "?"
    if len(name) <= width:
        return name
    head = (width - 1) * 3 // 5
    return name[:head] + "…" + name[len(name) - (width - 1 - head):]


def short_names(names: Sequence[str | None], width: int = 70) -> list[str]:
    """`short_name` of each name, made distinct: long generated kernel names can differ only in the middle the
    cut hides, so a clash shows the window where they first part, for up to `_MAX_ROUNDS`."""
    full = [n or "?" for n in names]
    out = [short_name(n, width) for n in full]
    for _ in range(_MAX_ROUNDS):
        groups: dict[str, list[int]] = {}
        for i, cut in enumerate(out):
            groups.setdefault(cut, []).append(i)
        clashes = [ix for ix in groups.values() if len({full[i] for i in ix}) > 1]
        if not clashes:
            break
        for ix in clashes:
            parted_at = len(os.path.commonprefix([full[i] for i in ix]))
            for i in ix:
                out[i] = _cut_around(full[i], parted_at, width)
    return out


_MAX_ROUNDS = 4
_WINDOW_LEAD = 12
"""Characters shown before the first difference, so the window starts at a readable field."""


def _cut_around(name: str, at: int, width: int) -> str:
    """`name` in `width` characters: a head, the window from just before index `at`, a tail."""
    if len(name) <= width:
        return name
    head, tail = width // 4, width // 5
    size = width - head - tail - 2
    start = min(max(head, at - _WINDOW_LEAD), len(name) - tail - size)
    window_end = start + size
    return (name[:head] + ("…" if start > head else "") + name[start:window_end]
            + ("…" if window_end < len(name) - tail else "") + name[len(name) - tail:])


# Text from outside stepscope (a trace's names, params, a server's replies, file names) is
# escaped here, once, before it reaches Markdown, HTML or a figure: anyone can write a trace.

class Md(str):
    """Markdown stepscope wrote, with any outside text inside it already escaped (`md_text`,
    `md_code`): a report table passes it as it is, and escapes every other string."""


_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]+")
_MD_SPECIAL_RE = re.compile(r"[\\`*]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])|\](?=\s?[(\[:]|\s*$)")
"""Markdown's code and emphasis marks, and a `]` that could close a link, image or reference
(followed by `(`, `[`, `:` or the end); `_` only where it could open or close emphasis (never
inside a word: `all_reduce` and `ranks [0, 1]` stay readable in report.md)."""
_MD_LINE_START_RE = re.compile(r"^(\s*)(?:(#|[+\-](?=\s|$|[+\-]))|([=~])|(\d+)([.)])(?=\s|$))")
"""A heading, list or fence mark where the text would start a line."""


def one_line(value: Any) -> str:
    """`value` as one line of text: newlines, tabs and other control characters become a space."""
    return _CONTROL_RE.sub(" ", str(value))


def md_text(value: Any) -> Md:
    """Outside text as plain Markdown text that renders as written: `<`, `>` and `&` as HTML
    entities (so no tag, entity or autolink can form), Markdown's emphasis, code and link marks
    backslash-escaped, a line-starting heading or list mark made literal, and one line."""
    s = one_line(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    s = _MD_SPECIAL_RE.sub(lambda m: "\\" + m.group(0), s)
    m = _MD_LINE_START_RE.match(s)
    if m:  # "# x" would be a heading, "1. x" a list item, "~~~" a fence, where the text starts a line
        lead, mark, plain, digits, dot = m.groups()
        made = (f"\\{mark}" if mark else f"&#{ord(plain)};" if plain else f"{digits}\\{dot}")
        s = lead + made + s[m.end():]
    return Md(s)


def md_code(value: Any) -> Md:
    """Outside text as one Markdown code span: fenced by one backtick more than its longest run
    of backticks (a name holding a backtick cannot end it early), padded where it starts or ends
    with one, on one line."""
    s = one_line(value).strip() or "?"
    longest = max((len(r) for r in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if s[0] == "`" or s[-1] == "`" else ""
    return Md(f"{fence}{pad}{s}{pad}{fence}")


def md_fence(body: str, info: str = "") -> Md:
    """`body` as a fenced code block whose fence is longer than any backtick run inside it, so
    no line of it (a params file's, an argv's) can close the block early."""
    longest = max((len(r) for r in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return Md(f"{fence}{info}\n{body.rstrip()}\n{fence}\n")


def html_text(value: Any) -> str:
    """Outside text for HTML stepscope writes itself (a notebook's widget, a findings table):
    `<`, `>`, `&` and quotes as entities."""
    return html.escape(str(value), quote=True)


def figure_text(value: Any) -> str:
    """Outside text for a matplotlib label: `$` escaped, so a name never starts mathtext (two
    `$` in a kernel name otherwise parse as TeX, and a bad one fails the figure)."""
    return one_line(value).replace("$", r"\$")


HEADLINE_MARK = "> **In short:** "
"""How the report's one-paragraph conclusion starts (the report writes it; the CLI reprints it)."""


def capture_delivery(lat) -> str:
    """Why a capture's client-side TPOT measures delivery, not decode (`CaptureLatency.
    tpot_is_delivery`), with the figures that show it: the one wording for stage 05's flag, the
    report, `compare` and the campaign."""
    f = fmt_num
    parts = []
    if lat.bunched():
        share = "" if lat.bunched_chunk_share is None else \
            f"{f(100 * lat.bunched_chunk_share)} % of token chunks arrived together with the previous one; "
        parts.append(f"the server sent the tokens in bursts, e.g. its API process starved of CPU ({share}median "
                     f"TTFT {f(lat.ttft_ms_median)} of {f(lat.e2el_ms_median)} ms end to end)")
    if lat.stalled():
        parts.append(f"the stream stopped for {f(lat.stall_total_s)} s in all, {f(100 * lat.stall_share)} % of the "
                     f"capture, in silences of over {f(STALL_GAP_S)} s that its mean TPOT carries and the engine's "
                     "steps may not")
    return "; and ".join(parts)


# The one number formatter: every number a sentence or table prints goes through `fmt_num`,
# so a test can format a structured value the same way and find it in the text.
NUMBER_RE = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?")
"""A number as `fmt_num` writes it (thousands separators, optional decimals)."""


def fmt_num(v: Any, digits: int = 3) -> str:
    """Human number: integers with separators, floats to about `digits` significant figures."""
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int,)) and not isinstance(v, bool):
        return f"{v:,}"
    try:
        f = float(v)
    except (TypeError, ValueError):
        s = str(v)
        return "–" if s.lower() in ("nan", "none", "") else s
    if math.isnan(f):
        return "–"
    if math.isinf(f):
        return "∞"
    a = abs(f)
    if a >= 10 ** digits:
        return f"{f:,.0f}"
    if a == 0:
        return "0"
    decimals = max(0, digits - 1 - int(math.floor(math.log10(a))))
    return f"{f:,.{decimals}f}"


def fmt_pct(share: Any, digits: int = 2, signed: bool = False) -> str:
    """A share of 0–1 as the report writes a percent: `fmt_num` of its hundredfold to two
    significant figures (a share needs no more), a space, "%" ("91 %", "4.5 %"); `signed` puts "+"
    before a gain. None or NaN reads "–", as in `fmt_num`."""
    if share is None or (isinstance(share, float) and math.isnan(share)):
        return "–"
    pct = 100 * float(share)
    return f"{'+' if signed and pct > 0 else ''}{fmt_num(pct, digits)} %"


def _runs_possessive(runs: Sequence[tuple[str, float]]) -> tuple[str, str]:
    """("B's", "82 %") or ("A's and B's", "82 % and 60 %") for the runs a comparison rule caught."""
    who = " and ".join(f"{name}'s" for name, _ in runs)
    return who, " and ".join(f"{100 * share:.0f} %" for _, share in runs)


def not_compared_words(code: str, runs: Sequence[tuple[str, float]], where: str) -> str:
    """Why a delta is not judged (`report.deltas` reason `code`), for the runs beyond its rule,
    each with its share: the one wording of `compare`, the gate and the campaign."""
    who, shares = _runs_possessive(runs)
    if code == "stalled":
        level = f"level {where}" if where.startswith(("c=", "rate=")) else f"{where} level"
        return (f"{who} {level} lost {shares} of its time to server-wide stalls: its readings are low or late by "
                "up to that share")
    if code == "bunched":
        return f"{who} chunks at {where} arrived bunched ({shares}): its TPOT and TTFT measure delivery"
    raise ValueError(f"not_compared_words: unknown reason code {code!r} (known: stalled, bunched)")


def slo_differs_words(slo_a: object, slo_b: object) -> str:
    """Why goodput is not compared: the two runs counted it under different SLOs."""
    return f"the runs' SLOs differ (A {slo_a or 'none'}, B {slo_b or 'none'})"


def capture_not_compared_words(name: str, lat) -> str:
    """Why a run's capture TPOT is not compared (it measures delivery), with `capture_delivery`'s figures."""
    return f"{name}'s capture TPOT measures delivery, not decode: {capture_delivery(lat)}"


QUANTITY_WORDS = {"output_throughput_tok_s": "output throughput (tok/s)", "tpot_ms_median": "TPOT median (ms)",
                  "ttft_ms_median": "TTFT median (ms)", "tpot_capture_ms": "batch-1 TPOT during capture (ms)",
                  "decode_step_ms": "decode step time (ms)", "category_ms_per_step": "time per decode step (ms)",
                  "stall_pct": "share of the level lost to server-wide stalls (%)"}
"""A compared quantity's name in a sentence, with its unit (`report.deltas` metric codes)."""


def quantity_words(metric: str) -> str:
    """The words for a compared quantity (`QUANTITY_WORDS`), else its code as it stands."""
    return QUANTITY_WORDS.get(metric, metric)


# Stage 05's flags: a flag stores its code and values (`schema.Flag`); its sentence is written
# here, once, for summary.json's `message` and for the report alike.

def _tpot_words(f) -> str:
    """Why the period and the client's TPOT disagree, by the direction (`trace.tpot` judgement)."""
    return ("tokens reached the client in bursts (a starved API process or network), so the "
            "client's decode time is short and its TTFT long; the period is the server's reading"
            if f.judgement == "tpot_below" else
            "time between a token leaving the engine and reaching the client (detokenizing, "
            "streaming) that no step accounts for")


def _other_top(f) -> str:
    return ", ".join(f"{o.name[:60]} ({o.sum_us:.0f} us)" for o in f.top_names or [])


_FLAG_WORDS = {
    "clock_disagreement": (("end_offset_ms",), lambda f: (
        "; ".join(f"rank {r}'s matched collectives end {fmt_num(ms)} ms (median) from rank {f.rank}'s"
                  for r, ms in f.end_offset_ms.items())
        + ": their clocks disagree, so cross-rank skews are not trusted")),
    "low_confidence": (("n_steps", "step_kind"), lambda f: (
        f"only {f.n_steps} {f.step_kind} step(s) with work (under {LOW_CONFIDENCE_STEPS}): per-step figures "
        "rest on too few steps to show their spread")),
    "ranks_missing": (("ranks", "world_size"), lambda f: (
        f"{len(f.ranks)} of {f.world_size} ranks' traces given (ranks {f.ranks}); no cross-rank claim is made")),
    "tp_disagreement": (("tp", "world_size"), lambda f: (
        f"TP from params is {f.tp}, but the traces' distributedInfo.world_size is {f.world_size}; the params "
        "value is used")),
    "no_step_marker": (("rank",), lambda f: (
        f"rank {f.rank}: no step marker (no engine or ProfilerStep annotation, graph launch or execute_model "
        "frame): the whole trace is read as one window, and its figures describe that window, not a step")),
    "step_fallback": (("rank", "step_source"), lambda f: (
        f"rank {f.rank}: no step annotations; steps from {f.step_source}")),
    "unknown_step_annotation": (("rank", "names", "step_source"), lambda f: (
        f"rank {f.rank}: {len(f.names)} annotation name(s) look like an engine step but match no known form: "
        f"{', '.join(f.names[:5])}; steps came from {f.step_source}")),
    "other_share_high": (("rank", "share", "limit_share"), lambda f: (
        f"rank {f.rank}: {f.share:.2%} of kernel time is 'other' (limit {f.limit_share:.1%}); top: "
        f"{_other_top(f)}; add rules in params analysis.extra_rules")),
    "unattributed": (("rank", "n_events", "by_reason"), lambda f: (
        f"rank {f.rank}: {f.n_events} work events belong to no recorded step ({f.by_reason}; before_capture = "
        "launched before the capture's CPU side began, i.e. in an unrecorded earlier step)")),
    "no_launch_events": (("rank", "n_events"), lambda f: (
        f"rank {f.rank}: no device event has its launch in the trace (no runtime events): {f.n_events} are "
        "placed in steps by their own start time, which assumes the host and device clocks agree")),
    "period_from_device": (("n_steps",), lambda f: (
        f"{f.n_steps} step(s): the host-side period was shorter than the device's busy time, so the period is "
        "the device's step (first device event of one step to the next); shares and ceilings divide by it")),
    "kernel_sum_above_tpot": (("kernel_sum_ms", "tpot_ms"), lambda f: (
        f"mean {work_unit(bool(f.cpu))[:-1]} sum per decode step ({f.kernel_sum_ms:.3f} ms) exceeds the mean "
        f"TPOT measured during capture ({f.tpot_ms:.3f} ms): {work_unit(bool(f.cpu))} overlap; read the "
        "union and span instead")),
    "span_below_tpot": (("span_ms", "tpot_ms", "share"), lambda f: (
        f"a decode step's work spans {f.span_ms:.3f} ms (mean) of the {f.tpot_ms:.3f} ms mean TPOT "
        f"({f.share:.0%} of each token has {'no op running' if f.cpu else 'no device work'}: host-side "
        "overhead, scheduling or launch gaps)")),
    "period_tpot_mismatch": (("period_ms", "tpot_ms", "judgement"), lambda f: (
        f"the mean decode period in the trace is {f.period_ms:.3f} ms but the mean TPOT the client measured "
        f"during capture is {f.tpot_ms:.3f} ms ({f.period_ms / f.tpot_ms - 1:+.0%}): {_tpot_words(f)}")),
    "mixed_modes": ((), lambda f: "some ranks are GPU traces and some CPU-only"),
    "bad_timestamps": (("rank", "n_events"), lambda f: (
        f"rank {f.rank}: dropped {f.n_events} annotation or launch events with a non-finite, negative or "
        "out-of-range timestamp or duration (limits: parse.MAX_TS_US, MAX_DUR_US)")),
    "names_capped": (("rank", "n_events", "limit_chars"), lambda f: (
        f"rank {f.rank}: {f.n_events} event names longer than {f.limit_chars:,} characters were cut to that "
        "length before the name rules saw them (the names say how long they were)")),
    "ids_out_of_range": (("rank", "n_events"), lambda f: (
        f"rank {f.rank}: {f.n_events} ids (correlation, stream) outside 64-bit integers were read as no "
        "id, so those events are matched by time instead")),
    "unknown_event_category": (("rank", "categories"), lambda f: (
        f"rank {f.rank}: ignored events of unknown category "
        + ", ".join(f"{c!r} ({n})" for c, n in sorted(f.categories.items())))),
    "unread_device_work": (("rank", "top_names"), lambda f: (
        f"rank {f.rank}: "
        + ", ".join(f"{t.count:,} device events in {t.name!r} ({t.sum_us / 1e3:,.1f} ms)" for t in f.top_names)
        + " are an accelerator's work that stepscope does not read as kernels; "
        + ("the analysis covers the host ops only and claims nothing of the device"
           if f.cpu else "the device figures cover only the kernels it read"))),
    "rank_assumed": (("file",), lambda f: (
        f"{f.file}: no distributedInfo.rank and no rank in the file name; a single trace was given, so it is "
        "treated as rank 0")),
}
"""{flag code: (the values its sentence needs, the sentence)}; codes not here keep the message
stage 05 wrote (`FLAGS_WITHOUT_VALUES`)."""

FLAGS_WITHOUT_VALUES = ("rank_unanalysable", "rank_unreadable", "duplicate_rank",
                        "sglang_stage_split", "bad_durations", "collectives_mismatch",
                        "collective_count_mismatch", "comm_readings_disagree",
                        "capture_evidence", "capture_latency_unreadable", "capture_tpot_is_delivery",
                        "text_table_mismatch")
"""Stage 05's flag codes whose sentence is still written where the flag is raised, not here."""


def flag_message(flag) -> str:
    """The sentence of one of stage 05's flags (a `schema.Flag`), from its values. A flag that
    carries none of the values its code uses (one of an older run folder, or a code in
    `FLAGS_WITHOUT_VALUES`) reads as the message it was written with."""
    words = _FLAG_WORDS.get(flag.code)
    if words is None:
        return flag.message
    needs, sentence = words
    if needs and all(getattr(flag, k, None) is None for k in needs):
        return flag.message
    return sentence(flag)
