"""How steps and kernels are named, in the report and on figures alike: one place, so a
figure's title never calls a training step a decode step while the sentence beside it does not."""

from __future__ import annotations

import os
from typing import Sequence

from stepscope.thresholds import STALL_GAP_S

STEP_LABELS = {"decode": "decode step", "prefill": "prefill step",
               "mixed": "mixed prefill-and-decode step", "training": "training step",
               "single_step": "step", "unknown": "step", "capture": "step",
               "diffusion": "pipeline step", "vision": "forward step", "encoder": "forward step"}
"""The name of one step of each trace kind (`trace_info.kind`)."""


def step_label(kind: str | None) -> str:
    """"decode step" for a decode trace, "training step" for a training trace, else "step"."""
    return STEP_LABELS.get(kind or "unknown", "step")


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
    """`short_name` of each name, made distinct where the names are: generated kernels
    (hipBLASLt's Tensile names run to 450 characters) can share their first and last 200 and
    differ only inside, where the middle cut hides it. A clash shows, between a shorter head
    and tail, the window where its names first part; names still alike there get the next
    window, for as many rounds as they have differences apart (at most `_MAX_ROUNDS`)."""
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


HEADLINE_MARK = "> **In short:** "
"""How the report's one-paragraph conclusion starts (the report writes it; the CLI reprints it)."""


def capture_delivery(lat) -> str:
    """Why a capture's client-side TPOT measures delivery, not decode (`CaptureLatency.
    tpot_is_delivery`), with the figures that show it: the one wording for stage 05's flag, the
    report, `compare` and the campaign."""
    from stepscope.report.numbers import fmt_num as f

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
