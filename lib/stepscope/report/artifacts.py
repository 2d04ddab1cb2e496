"""Read a run folder's artifacts for the report, tolerating anything missing.

The report is rebuilt from the run folder alone, possibly long after the run and on a
machine with none of the stages installed, so this module only reads files. A missing
file is `None` plus an entry in `missing`; a file that exists but cannot be read is
`None` plus an entry in `problems`. Unknown extra keys and columns are ignored.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from stepscope.errors import StageInputMissing

STAGE_TITLES = {
    "00_deploy": "server deployment",
    "01_macro_sweep": "macro sweep",
    "02_gemm_micro": "GEMM micro-benchmark",
    "03_nccl_burst": "collective micro-benchmark",
    "04_profiler_capture": "profiler capture",
    "05_categorize": "trace categorization",
}


@dataclass
class RunArtifacts:
    """Everything the report reads. Each field is None when its file is absent or unreadable."""

    run_dir: Path
    run: dict | None = None
    params_text: str | None = None
    params: dict | None = None
    server: dict | None = None
    levels: pd.DataFrame | None = None
    sweep_summary: dict | None = None
    gemm: pd.DataFrame | None = None
    gemm_prediction: dict | None = None
    collectives: pd.DataFrame | None = None
    burst: pd.DataFrame | None = None
    comm_prediction: dict | None = None
    manifest: dict | None = None
    capture_latency: dict | None = None
    trace_summary: dict | None = None
    decode_categories: pd.DataFrame | None = None
    """The reference rank's decode table in the report's columns (see `_normalise_decode`)."""
    decode_categories_all: pd.DataFrame | None = None
    """The same for every rank (a `rank` column tells them apart)."""
    amdahl: pd.DataFrame | None = None
    rank_categories: pd.DataFrame | None = None
    steps: pd.DataFrame | None = None
    cross_rank: pd.DataFrame | None = None
    timeline: pd.DataFrame | None = None
    missing: list[str] = field(default_factory=list)
    """Relative paths of expected files that are not there."""
    problems: list[str] = field(default_factory=list)
    """Files that exist but could not be read, each with the reason."""

    def stage_present(self, stage_id: str) -> bool:
        d = self.run_dir / stage_id
        return d.is_dir() and any(p.name != "not_built.json" for p in d.iterdir())

    @property
    def decode(self) -> dict:
        return (self.trace_summary or {}).get("decode") or {}


def load_run_artifacts(run_dir: str | Path) -> RunArtifacts:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise StageInputMissing("run folder not found", where=str(run_dir),
                                hint="pass the folder under outputs/ that `stepscope run` created")
    a = RunArtifacts(run_dir=run_dir)
    a.run = _json(a, "run.json")
    a.params_text = _text(a, "params.yaml")
    if a.params_text is not None:
        try:
            loaded = yaml.safe_load(a.params_text)
            a.params = loaded if isinstance(loaded, dict) else None
        except yaml.YAMLError as exc:
            # PyYAML's message quotes the offending lines: redact them like the text itself.
            from stepscope.config import redact_params_text

            a.problems.append(f"params.yaml: not valid YAML ({redact_params_text(str(exc))})")
    if a.params is None and isinstance((a.run or {}).get("params"), dict):
        a.params = a.run["params"]
    a.server = _json(a, "00_deploy/server.json")
    a.levels = _csv(a, "01_macro_sweep/levels.csv")
    a.sweep_summary = _json(a, "01_macro_sweep/summary.json")
    a.gemm = _csv(a, "02_gemm_micro/gemm.csv")
    a.gemm_prediction = _json(a, "02_gemm_micro/prediction.json")
    a.collectives = _csv(a, "03_nccl_burst/collectives.csv")
    if a.collectives is not None:
        # stage 03 names the across-rank spread of per-rank medians time_us_rank_{min,median,max}
        a.collectives = a.collectives.rename(columns={
            f"time_us_rank_{k}": f"time_us_{k}" for k in ("min", "median", "max")
            if f"time_us_{k}" not in a.collectives.columns})
    a.burst = _csv(a, "03_nccl_burst/burst.csv")
    a.comm_prediction = _json(a, "03_nccl_burst/prediction.json")
    a.manifest = _json(a, "04_profiler_capture/manifest.json")
    a.capture_latency = _json(a, "04_profiler_capture/capture_latency.json")
    a.trace_summary = _json(a, "05_categorize/summary.json")
    ref = a.decode.get("rank")
    dec_all = _csv(a, "05_categorize/decode_categories.csv")
    if dec_all is None and a.decode.get("categories"):
        dec_all = _frame(a.decode["categories"])
    a.decode_categories_all = _normalise_decode(dec_all)
    a.decode_categories = _reference_rank(a.decode_categories_all, ref)
    amdahl = _csv(a, "05_categorize/amdahl.csv")
    if amdahl is None and a.decode.get("amdahl"):
        amdahl = _frame(a.decode["amdahl"])
    if amdahl is not None:
        amdahl = amdahl.rename(columns={"exposed_ms": "exposed_ms_per_step", "speedup_ceiling": "max_speedup"})
    a.amdahl = _reference_rank(amdahl, ref)
    a.rank_categories = _csv(a, "05_categorize/rank_categories.csv")
    a.steps = _csv(a, "05_categorize/steps.csv")
    a.cross_rank = _csv(a, "05_categorize/cross_rank.csv")
    if a.cross_rank is None and (a.trace_summary or {}).get("cross_rank"):
        a.cross_rank = _frame(a.trace_summary["cross_rank"])
    a.timeline = _csv(a, "05_categorize/timeline_rank0_step.csv")
    return a


# --------------------------------------------------------------------------- tolerant readers


def _path(a: RunArtifacts, rel: str) -> Path | None:
    p = a.run_dir / rel
    if not p.is_file():
        a.missing.append(rel)
        return None
    return p


def _json(a: RunArtifacts, rel: str) -> dict | None:
    p = _path(a, rel)
    if p is None:
        return None
    try:
        obj = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        a.problems.append(f"{rel}: not readable as JSON ({exc})")
        return None
    if not isinstance(obj, dict):
        a.problems.append(f"{rel}: expected a JSON object, found {type(obj).__name__}")
        return None
    return obj


def _text(a: RunArtifacts, rel: str) -> str | None:
    p = _path(a, rel)
    if p is None:
        return None
    try:
        return p.read_text()
    except OSError as exc:
        a.problems.append(f"{rel}: not readable ({exc})")
        return None


def _csv(a: RunArtifacts, rel: str) -> pd.DataFrame | None:
    p = _path(a, rel)
    if p is None:
        return None
    try:
        df = pd.read_csv(p)
    except (OSError, ValueError) as exc:  # pandas' EmptyDataError/ParserError are ValueErrors
        a.problems.append(f"{rel}: not readable as CSV ({exc})")
        return None
    return df if len(df) else None


_DECODE_RENAMES = {
    # stage 05's names -> the report's: per-category busy (union) time is "ms per step"
    "union_ms_mean": "ms_per_step_mean", "union_ms_median": "ms_per_step_median",
    "union_ms_p90": "ms_per_step_p90", "share_of_span": "share_of_step",
}


def _normalise_decode(df: pd.DataFrame | None) -> pd.DataFrame | None:
    if df is None:
        return None
    df = df.rename(columns={k: v for k, v in _DECODE_RENAMES.items() if v not in df.columns})
    if "category" not in df or "ms_per_step_mean" not in df:
        return None
    return df


def _reference_rank(df: pd.DataFrame | None, ref: Any) -> pd.DataFrame | None:
    """Rows of the rank stage 05 reported on (its `decode.rank`), else the lowest rank."""
    if df is None or "rank" not in df or not len(df):
        return df
    ranks = pd.to_numeric(df["rank"], errors="coerce")
    want = ref if ref is not None and (ranks == ref).any() else ranks.min()
    return df[ranks == want].reset_index(drop=True)


def _frame(rows: Any) -> pd.DataFrame | None:
    if isinstance(rows, list) and rows and all(isinstance(r, dict) for r in rows):
        return pd.DataFrame(rows)
    if isinstance(rows, dict) and rows:
        try:
            return pd.DataFrame(rows)
        except ValueError:
            return None
    return None


def pick(d: dict | None, *names: str, default: Any = None) -> Any:
    """The first of several key spellings present in `d` with a usable value.

    Stages may rename a key between versions; the report reads every spelling it knows.
    """
    if not isinstance(d, dict):
        return default
    for name in names:
        v = d.get(name)
        if v is None:
            continue
        if isinstance(v, float) and math.isnan(v):
            continue
        return v
    return default


def num(v: Any) -> float | None:
    """A finite float, or None."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def collective_count(v: Any) -> float | None:
    """A per-step collective count, given flat or as stage 05's {median, min, max}."""
    if isinstance(v, dict):
        v = pick(v, "median", "mean")
    return num(v)


def collective_counts(d: Any) -> dict[str, float | None]:
    """{collective: count per step} from an expected/observed mapping, skipping metadata keys."""
    if not isinstance(d, dict):
        return {}
    return {k: collective_count(v) for k, v in d.items()
            if k not in ("steps_used", "n_steps", "rank", "tp") and (isinstance(v, dict) or num(v) is not None)}


def words(v: Any) -> str:
    """An explanation given as a string or a list of clauses, as one sentence."""
    if isinstance(v, (list, tuple)):
        parts = [str(x).strip().rstrip(".") for x in v if str(x).strip()]
        return ("; ".join(parts) + ".") if parts else ""
    return str(v or "").strip()


def name_of(v: Any) -> str:
    """A kernel name from a plain string or a {name, sum_us, ...} record."""
    return str(v.get("name", v)) if isinstance(v, dict) else str(v)
