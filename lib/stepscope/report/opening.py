"""The report's opening screen: "In short", what to try, and the caveats that change a decision,
read in a minute before any section."""

from __future__ import annotations


from stepscope.report import prose
from stepscope.report import verdict as vd
from stepscope.report.artifacts import RunArtifacts
from stepscope.report.try_next import try_next
from stepscope.schema.writeup import APPENDIX_MD
from stepscope.wording import HEADLINE_MARK, WINDOW, Md

DECISION_CAVEATS = ("not_analysed", "host_only", "not_decode", "claims_withdrawn", "ranks_missing",
                    "low_confidence", "tpot_gap", "spec_decode", "tpot_is_delivery", "sweep_delivery", "sweep_stalls")
"""Caveats that change what to do next; the others qualify one reading and stay in the verdict and
the Caveats section. Stalls are said from every sweep level (`sweep_stalls`), not only those past the knee."""
MEASURING_STAGES = ("00_deploy", "01_macro_sweep", "02_gemm_micro", "03_nccl_burst", "04_profiler_capture")


def trace_only(a: RunArtifacts, stages: frozenset[str]) -> bool:
    """A `stepscope analyze` run (no stage that measures a server, among the stage folders holding a
    file): its report is about the trace alone, not a run with stages missing."""
    if "05_categorize" not in stages or any(s in stages for s in MEASURING_STAGES):
        return False
    params = a.params if isinstance(a.params, dict) else {}
    return bool((params.get("analysis") or {}).get("trace_paths")) or (a.run is None and a.params is None)


def decision_caveats(v: vd.Verdict) -> list[Md]:
    """The caveats that change what to do next, in the verdict's order (`report.verdict.caveats`):
    its own, then whether the client's latencies measure decode at all, then stalls in the sweep."""
    headline_caveat = vd.headline_findings(v).caveat
    return [Md(prose.caveat_text(c, v)) for c in v.caveats if c.code in DECISION_CAVEATS and c != headline_caveat]


def opening(a: RunArtifacts, v: vd.Verdict, title: Md, stages: frozenset[str]) -> str:
    """Title, "In short", what to try, the caveats that change a decision, and what the report covers
    (`stages`: the stage folders holding a file)."""
    text = f"# {title}\n\n"
    short = prose.headline(v)
    if short:
        text += HEADLINE_MARK + " ".join(short) + "\n\n"
    t = try_next(v, a.params, cpu=bool(a.ranks) and a.ranks[0].mode == "cpu")
    if t is not None:
        text += f"**What to try first:** {t.change}. *Evidence:* {t.evidence}.\n\n"
    cav = decision_caveats(v)
    if cav:
        text += "**Read with care:**\n\n" + "".join(f"- {c}\n" for c in cav) + "\n"
    if trace_only(a, stages):
        text += ("*This report covers the trace only (`stepscope analyze`): an analyze run has no load sweep, "
                 "micro-benchmarks, capture latency or server settings.*\n\n")
    step = v.identity.step_label
    times = "for the whole trace, read as one window," if step == WINDOW else f"per {step}"
    return text + (f"*Written by stepscope from the run folder's artifacts alone. Times are {times} unless stated; "
                   f"units are in every column header. Params, command lines and the run's files: "
                   f"[appendix]({APPENDIX_MD}).*\n\n")

