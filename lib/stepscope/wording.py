"""How steps and kernels are named, in the report and on figures alike: one place, so a
figure's title never calls a training step a decode step while the sentence beside it does not."""

from __future__ import annotations

STEP_LABELS = {"decode": "decode step", "prefill": "prefill step",
               "mixed": "mixed prefill-and-decode step", "training": "training step",
               "single_step": "step", "unknown": "step"}
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


HEADLINE_MARK = "> **In short:** "
"""How the report's one-paragraph conclusion starts (the report writes it; the CLI reprints it)."""
