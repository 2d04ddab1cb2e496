"""The campaign plan: which runs, in which order, into which folders, and what is reused (pure).

Repeats interleave, so a shared machine's drift spreads over the variants; a stage is reused
when its declared inputs (`stepscope.stages`) match (docs/campaigns.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from stepscope.config import Params, params_from_dict, params_to_dict, variant_params_dict
from stepscope.runfolder import short_hash
from stepscope.stages import STAGE_BY_ID, STAGES, Stage, param_inputs

REUSABLE_STAGES: tuple[Stage, ...] = tuple(s for s in STAGES if s.reusable)
"""Stages measured once and copied when their params inputs match (02, 03): their params paths,
the figures they write (`figures`) and their fallbacks are their entries in `stepscope.stages`."""


@dataclass(frozen=True)
class PlannedRun:
    variant: str
    repeat: int
    """1-based."""
    run_dir: Path
    params: Params
    params_dict: dict
    """The variant's full params file (baseline merged with its overrides)."""
    description: str | None

    @property
    def key(self) -> str:
        return f"{self.variant}#{self.repeat}"


@dataclass(frozen=True)
class CampaignPlan:
    campaign_dir: Path
    baseline: str
    variants: tuple[str, ...]
    """Baseline first, then the variants in file order."""
    repeats: int
    runs: tuple[PlannedRun, ...]


def run_folder(campaign_dir: Path, variant: str, repeat: int, repeats: int) -> Path:
    """`<campaign>/<variant>/` for one run per variant, `<variant>/repeat-<k>/` for several."""
    return campaign_dir / variant if repeats == 1 else campaign_dir / variant / f"repeat-{repeat}"


def plan_campaign(raw: Mapping[str, Any], params: Params, campaign_dir: Path,
                  repeats: int | None = None, source: str = "<params>") -> CampaignPlan:
    """Every run of the campaign, interleaved by repeat. Raises ParamsError for a bad variant."""
    c = params.campaign
    if c is None:
        from stepscope.errors import ParamsError

        raise ParamsError("no campaign section", where=source,
                          hint="add 'campaign: {variants: [{name: ..., overrides: {...}}]}' (docs/campaigns.md)")
    n = repeats if repeats is not None else c.repeats
    if n < 1:
        from stepscope.errors import StepscopeError

        raise StepscopeError(f"--repeats must be at least 1, got {n}", where="--repeats")
    entries: list[tuple[str, dict, str | None]] = [(c.baseline, variant_params_dict(raw, None), "baseline")]
    for v in c.variants:
        entries.append((v.name, variant_params_dict(raw, v), v.description))
    built = [(name, d, desc, params_from_dict(d, source=f"{source} (variant {name})")) for name, d, desc in entries]
    runs = tuple(PlannedRun(name, k, run_folder(campaign_dir, name, k, n), p, d, desc)
                 for k in range(1, n + 1) for name, d, desc, p in built)
    return CampaignPlan(campaign_dir, c.baseline, tuple(e[0] for e in entries), n, runs)


def stage_fingerprint(params: Params, stage_id: str) -> str | None:
    """A hash of the params a reusable stage reads; None for a stage that is never reused."""
    stage = STAGE_BY_ID.get(stage_id)
    if stage is None or not stage.reusable:
        return None
    return short_hash(param_inputs(stage, params_to_dict(params)))


def reuse_source(run: PlannedRun, stage_id: str, finished: Mapping[str, Mapping[str, str]]) -> str | None:
    """Key of an earlier run whose stage had the same inputs and finished measuring (never a copy), else None."""
    fp = stage_fingerprint(run.params, stage_id)
    if fp is None:
        return None
    for key, stages in finished.items():
        if key != run.key and stages.get(stage_id) == fp:
            return key
    return None
