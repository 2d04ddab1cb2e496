"""The report's opening screen: "In short", what to try, and the caveats that change a decision,
read in a minute before any section."""

from __future__ import annotations

import pandas as pd

from stepscope.report import prose
from stepscope.report import verdict as vd
from stepscope.report.artifacts import RunArtifacts
from stepscope.report.try_next import try_next
from stepscope.schema.writeup import APPENDIX_MD
from stepscope.thresholds import BUNCHED_FLAG_SHARE, STALLED_LEVEL_SHARE
from stepscope.wording import HEADLINE_MARK, WINDOW, Md, capture_delivery, fmt_num, fmt_pct

DECISION_CAVEATS = ("not_analysed", "host_only", "not_decode", "claims_withdrawn", "ranks_missing",
                    "low_confidence", "tpot_gap", "spec_decode")
"""Verdict caveats that change what to do next; the others qualify one reading and stay in the
verdict. Stalls are said from every sweep level (`_sweep_stalls`), not only those past the knee."""
MEASURING_STAGES = ("00_deploy", "01_macro_sweep", "02_gemm_micro", "03_nccl_burst", "04_profiler_capture")


def trace_only(a: RunArtifacts, stages: frozenset[str]) -> bool:
    """A `stepscope analyze` run: stage 05 on traces captured elsewhere, no stage that measures a
    server. Its report is about the trace alone, not a run with stages missing. `stages`: the stage
    folders holding a file (`RunFolderListing.stages_present`)."""
    if "05_categorize" not in stages or any(s in stages for s in MEASURING_STAGES):
        return False
    params = a.params if isinstance(a.params, dict) else {}
    return bool((params.get("analysis") or {}).get("trace_paths")) or (a.run is None and a.params is None)


def _sweep_delivery(levels: pd.DataFrame | None) -> Md | None:
    """Sweep levels whose TPOT and ITL measure delivery (bunched chunks), said once for all of them."""
    if levels is None or "bunched_chunk_share" not in levels:
        return None
    share = levels["bunched_chunk_share"].astype(float)
    bunched = share[share > BUNCHED_FLAG_SHARE]
    if bunched.empty:
        return None
    return Md(f"At {fmt_num(len(bunched))} of {fmt_num(len(levels))} sweep levels the TPOT and ITL measure delivery, "
              f"not decode: up to {fmt_pct(bunched.max())} of token chunks arrived together with the "
              "previous one; read the engine's step period instead.")


def _sweep_stalls(levels: pd.DataFrame | None) -> Md | None:
    """The largest share of a sweep level lost to server-wide stalls, when it moves throughput."""
    if levels is None or "stall_share" not in levels or not levels["stall_share"].notna().any():
        return None
    worst = levels.loc[levels["stall_share"].astype(float).idxmax()]
    if float(worst["stall_share"]) <= STALLED_LEVEL_SHARE:
        return None
    where = f" (concurrency {fmt_num(int(worst['concurrency']))})" if "concurrency" in worst else ""
    return Md(f"Server-wide stalls took up to {fmt_pct(float(worst['stall_share']))} of a sweep level's "
              f"time{where}: that level's throughput is low by up to that share.")


def decision_caveats(a: RunArtifacts, v: vd.Verdict) -> list[Md]:
    """The caveats that change what to do next, most decisive first: the verdict's own, then
    whether the client's latencies measure decode at all, then stalls in the sweep."""
    headline_caveat = vd.headline_findings(v).caveat
    clauses = [prose.caveat_clause(c, v) for c in v.caveats if c.code in DECISION_CAVEATS and c != headline_caveat]
    out = [Md(s[0].upper() + s[1:] + ".") for s in clauses]
    cl = a.capture_latency
    if cl is not None and cl.tpot_is_delivery():
        out.append(Md(f"The capture's TPOT measures delivery, not decode: {capture_delivery(cl)}."))
    out += [c for c in (_sweep_delivery(a.levels), _sweep_stalls(a.levels)) if c is not None]
    return out


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
    cav = decision_caveats(a, v)
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

