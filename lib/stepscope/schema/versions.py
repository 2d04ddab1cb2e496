"""The one versioned reader's upgrades: an older run folder's JSON (its run.json's `schema_version`,
none: 1) in this version's shape, by type name and oldest first, so readers see one shape. A file
with no run.json above it is taken as current.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

Upgrade = Callable[[dict], dict]

_V2_SUMMARY_KEYS = ("trace_info", "collectives_matched", "roofline")
_V2_DECODE_KEYS = ("period_ms", "denominator", "idle_micro_ms", "idle_macro_ms")


def _summary_v1(obj: dict) -> dict:
    """Stage 05 before version 2 wrote no trace_info, class totals, period, idle split,
    matched collectives or roofline: each reads as null (not measured), not as zero."""
    for key in _V2_SUMMARY_KEYS:
        obj.setdefault(key, None)
    decode = obj.setdefault("decode", {})
    if isinstance(decode, dict):
        for key in _V2_DECODE_KEYS:
            decode.setdefault(key, None)
    for rank in obj.get("ranks") or []:
        if isinstance(rank, dict):
            rank.setdefault("class_totals_us", None)
    return obj


def _run_v1(obj: dict) -> dict:
    """run.json before version 2 listed GPUs as {name, memory, driver} records; version 2
    keeps nvidia-smi's line per GPU."""
    hw = obj.get("hardware")
    if isinstance(hw, dict) and isinstance(hw.get("gpus"), list):
        hw["gpus"] = [", ".join(str(g[k]) for k in ("name", "memory", "driver") if g.get(k) is not None)
                      if isinstance(g, dict) else str(g) for g in hw["gpus"]]
    return obj


_OLD_CAVEAT_CONCERNS = {"tpot_gap": "capture", "prediction_disagrees": "micro", "offsetting_agreement": "micro",
                        "plateau_stalls": "sweep"}


def _verdict_v2(obj: dict) -> dict:
    """An older verdict.json (a digest) in the Verdict's shape, claiming nothing it did not hold."""
    if "identity" in obj:
        return obj
    d, big, cav = obj.get("dominant") or None, obj.get("biggest_lever") or None, obj.get("caveat") or None
    analysed = (obj.get("ranks") or {}).get("analysed")
    out = {"identity": {"kind": obj.get("kind") or "unknown", "step_label": obj.get("step_label") or "step",
                        "source": "none" if analysed == 0 else "older verdict.json", "n_judged_steps": (d or {}).get("n_steps")},
           "basis": {"denominator": (d or {}).get("denominator"), "step_ms": (d or {}).get("step_ms")},
           "headline": obj.get("headline") or [], "sentences": obj.get("sentences") or []}
    if d:
        out["dominant"] = {**d, "step_label": out["identity"]["step_label"]}
    if big:
        out["biggest"] = {k: big.get(k) for k in ("name", "ceiling_x", "kind")}
    if cav:
        out["caveats"] = [{"code": cav.get("code"), "concerns": _OLD_CAVEAT_CONCERNS.get(cav.get("code"), "trace")}]
    return out


UPGRADES: dict[str, dict[int, Upgrade]] = {
    "TraceSummary": {1: _summary_v1},
    "RunRecord": {1: _run_v1},
    "VerdictFile": {2: _verdict_v2},
}
"""{type name: {version it upgrades from: upgrade to the next version}}."""


def run_folder_version(path: Path) -> int | None:
    """The schema version of the run folder holding `path` (an artifact, or run.json itself);
    None when no run.json is beside or above it (an artifact read on its own)."""
    for folder in (path.parent, path.parent.parent):
        record = folder / "run.json"
        if record.is_file():
            try:
                data = json.loads(record.read_text())
            except (OSError, ValueError):
                return None  # an unreadable run.json is reported where it is read, not here
            return int(data.get("schema_version") or 1) if isinstance(data, dict) else None
    return None


def upgrade(obj: object, type_name: str, version: int | None, current: int) -> object:
    """`obj` as version `current` writes it, from `version` (None: already current)."""
    steps = UPGRADES.get(type_name)
    if not steps or version is None or not isinstance(obj, dict):
        return obj
    for v in range(version, current):
        if v in steps:
            obj = steps[v](obj)
    return obj
