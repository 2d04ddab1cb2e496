"""Read a run folder's artifacts for the report through the artifact schema, and nothing else: the
report is rebuilt from the folder alone, maybe on a machine with no stage installed. A missing file
is None plus an entry in `missing`; an unreadable or off-schema one, None plus one in `problems`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from stepscope import schema
from stepscope.errors import StageInputMissing
from stepscope.micro.collectives import prediction_for_trace
from stepscope.server_metrics import METRICS_SCRAPES, SpecDecodeStats, spec_decode_delta, stage_scrapes

log = logging.getLogger(__name__)

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
    """Everything the report reads, typed by `stepscope.schema`. Each field is None when its
    file is absent, unreadable, or does not match its schema (then named in `problems`)."""

    run_dir: Path
    run: schema.RunRecord | None = None
    params_text: str | None = None
    params: dict | None = None
    """The params snapshot (params.yaml, else run.json's copy) as a mapping."""
    server: schema.ServerRecord | None = None
    levels: pd.DataFrame | None = None
    server_metrics: pd.DataFrame | None = None
    """01_macro_sweep/server_metrics.csv: every /metrics scrape of the sweep."""
    sweep_summary: schema.SweepSummary | None = None
    verdict: schema.VerdictFile | None = None
    """Stage 06's findings (`06_writeup/verdict.json`), what `compare` sets side by side."""
    gemm: pd.DataFrame | None = None
    gemm_prediction: schema.GemmPrediction | None = None
    collectives: pd.DataFrame | None = None
    burst: pd.DataFrame | None = None
    comm_prediction: schema.CommPrediction | None = None
    """Stage 03's prediction, re-pointed at the collective implementation the reference rank's
    trace shows the engine ran (`micro.collectives.prediction_for_trace`)."""
    manifest: schema.CaptureManifest | None = None
    capture_latency: schema.CaptureLatency | None = None
    trace_summary: schema.TraceSummary | None = None
    decode_categories: pd.DataFrame | None = None
    """decode_categories.csv rows of the reference rank (stage 05's columns)."""
    decode_categories_all: pd.DataFrame | None = None
    """The same for every rank (a `rank` column tells them apart)."""
    amdahl: pd.DataFrame | None = None
    """amdahl.csv rows of the reference rank."""
    category_kernels: pd.DataFrame | None = None
    """category_kernels.csv rows of the reference rank (absent in run folders of older stepscope)."""
    category_levers: pd.DataFrame | None = None
    """category_levers.csv rows of the reference rank: stage 05's reading of each category as a
    lever (top kernels, module, `coherent`); absent in run folders of older stepscope."""
    rank_categories: pd.DataFrame | None = None
    steps: pd.DataFrame | None = None
    cross_rank: pd.DataFrame | None = None
    timeline: pd.DataFrame | None = None
    load_anatomy: pd.DataFrame | None = None
    """load_anatomy.csv: ms per step by category at each captured concurrency (only with load captures)."""
    load_summary: schema.LoadAnatomySummary | None = None
    """load_anatomy.json: the captured levels, the per-category fits against the batch, the routed experts."""
    load_reconciliation: schema.LoadReconciliation | None = None
    """load_reconciliation.json: each captured sweep level's wall time, part by part."""
    micro_curve: schema.MicroCurve | None = None
    """micro_curve.json: the micro-predicted step at each sweep level, each reconciled level rebuilt from it."""
    capture_counters: SpecDecodeStats | None = None
    """The server's speculative-decoding counters over the capture's profiled requests (stage
    04's reads of /metrics); None when it has none or stage 04 could not read them."""
    missing: list[str] = field(default_factory=list)
    """Relative paths of expected files that are not there."""
    problems: list[str] = field(default_factory=list)
    """Files that exist but could not be read, each with the reason."""

    def stage_present(self, stage_id: str) -> bool:
        d = self.run_dir / stage_id
        return d.is_dir() and any(d.iterdir())

    @property
    def decode(self) -> schema.DecodeSummary:
        """Stage 05's decode summary (empty when stage 05 did not run)."""
        return self.trace_summary.decode if self.trace_summary is not None else schema.DecodeSummary.empty()

    def step_basis(self) -> tuple[str | None, float | None, str | None]:
        """(denominator, ms, why not the period) of every share and ceiling: stage 05's choice, read
        here, never made (an older summary's through amdahl.csv's, else the span)."""
        d, amd = self.decode, self.amdahl
        old = amd["denominator"].iloc[0] if amd is not None and len(amd) and "denominator" in amd else None
        name = d.denominator or (old if isinstance(old, str) else None) or ("span" if d.period_ms is None else None)
        ms = {"period": d.period_ms.mean if d.period_ms else None, "span": d.steps.span_ms.mean,
              "union": d.steps.union_ms.mean}.get(name or "")
        why = words(d.denominator_reason) or ("stage 05 gave no step period" if d.period_ms is None else None)
        return name, num(ms), None if name == "period" else why

    @property
    def ranks(self) -> list[schema.RankSummary]:
        return self.trace_summary.ranks if self.trace_summary is not None else []

    def stage_status(self, stage_id: str) -> schema.StageStatus | None:
        return self.run.stages.get(stage_id) if self.run is not None else None


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
            # Not str(exc): PyYAML quotes the offending text, which could be a secret.
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1}: " if mark is not None else ""
            _problem(a, "params.yaml", f"not valid YAML ({where}{getattr(exc, 'problem', None) or 'parse error'})")
    if a.params is None and a.run is not None and a.run.params is not None:
        a.params = a.run.params
    a.server = _json(a, "00_deploy/server.json")
    a.levels = _csv(a, "01_macro_sweep/levels.csv")
    a.server_metrics = _csv(a, "01_macro_sweep/server_metrics.csv")
    a.sweep_summary = _json(a, "01_macro_sweep/summary.json")
    a.verdict = _json(a, "06_writeup/verdict.json")
    a.gemm = _csv(a, "02_gemm_micro/gemm.csv")
    a.gemm_prediction = _json(a, "02_gemm_micro/prediction.json")
    a.collectives = _csv(a, "03_nccl_burst/collectives.csv")
    a.burst = _csv(a, "03_nccl_burst/burst.csv")
    a.comm_prediction = _json(a, "03_nccl_burst/prediction.json")
    a.manifest = _json(a, "04_profiler_capture/manifest.json")
    a.capture_latency = _json(a, "04_profiler_capture/capture_latency.json")
    a.capture_counters = _capture_counters(a)
    a.trace_summary = _json(a, "05_categorize/summary.json")
    ref = a.decode.rank
    a.decode_categories_all = _csv(a, "05_categorize/decode_categories.csv")
    a.decode_categories = _reference_rank(a.decode_categories_all, ref)
    a.amdahl = _reference_rank(_csv(a, "05_categorize/amdahl.csv"), ref)
    a.category_kernels = _reference_rank(_csv(a, "05_categorize/category_kernels.csv"), ref)
    # Stage 03 timed every collective implementation it could; predict with the one the trace ran.
    k = a.category_kernels
    a.comm_prediction = prediction_for_trace(
        a.comm_prediction, k.groupby("name")["sum_ms_per_step"].sum().to_dict() if k is not None else None)
    a.category_levers = _reference_rank(_csv(a, "05_categorize/category_levers.csv"), ref)
    a.rank_categories = _csv(a, "05_categorize/rank_categories.csv")
    a.steps = _csv(a, "05_categorize/steps.csv")
    a.cross_rank = _csv(a, "05_categorize/cross_rank.csv")
    a.timeline = _csv(a, "05_categorize/timeline_rank0_step.csv")
    a.load_anatomy = _csv(a, "05_categorize/load_anatomy.csv")
    a.load_summary = _json(a, "05_categorize/load_anatomy.json")
    a.load_reconciliation = _json(a, "05_categorize/load_reconciliation.json")
    a.micro_curve = _json(a, "05_categorize/micro_curve.json")
    return a


# --------------------------------------------------------------------------- tolerant readers


def _path(a: RunArtifacts, rel: str) -> Path | None:
    p = a.run_dir / rel
    if not p.is_file():
        a.missing.append(rel)
        return None
    return p


def _capture_counters(a: RunArtifacts) -> SpecDecodeStats | None:
    try:
        scrapes = stage_scrapes(a.run_dir / "04_profiler_capture")  # optional: None without both
        return spec_decode_delta(*scrapes) if scrapes is not None else None
    except OSError as exc:
        _problem(a, f"04_profiler_capture/{METRICS_SCRAPES[0]}", f"not readable ({exc})")
        return None


def _problem(a: RunArtifacts, rel: str, why: str) -> None:
    a.problems.append(f"{rel}: {why}")
    log.warning("%s: %s", a.run_dir / rel, why)


def _json(a: RunArtifacts, rel: str) -> Any:
    """The file as its schema's Struct (`stepscope.schema.ARTIFACTS`), or None."""
    p = _path(a, rel)
    if p is None:
        return None
    try:
        return schema.read(p, schema.artifact(rel).type)
    except OSError as exc:
        _problem(a, rel, f"not readable ({exc})")
    except schema.ArtifactError as exc:
        _problem(a, rel, exc.message)
    return None


def _text(a: RunArtifacts, rel: str) -> str | None:
    p = _path(a, rel)
    if p is None:
        return None
    try:
        return p.read_text()
    except OSError as exc:
        _problem(a, rel, f"not readable ({exc})")
        return None


def _csv(a: RunArtifacts, rel: str) -> pd.DataFrame | None:
    """The table checked against its schema's Row, or None (also when it has no rows)."""
    p = _path(a, rel)
    if p is None:
        return None
    try:
        df = schema.check_frame(pd.read_csv(p), schema.artifact(rel).type, str(p))
    except (OSError, ValueError) as exc:  # pandas' EmptyDataError/ParserError are ValueErrors
        _problem(a, rel, f"not readable as CSV ({exc})")
        return None
    except schema.ArtifactError as exc:
        _problem(a, rel, exc.message)
        return None
    return df if len(df) else None


def _reference_rank(df: pd.DataFrame | None, ref: int | None) -> pd.DataFrame | None:
    """Rows of the rank stage 05 reported on (its `decode.rank`), else the lowest rank."""
    if df is None or not len(df):
        return df
    want = ref if ref is not None and (df["rank"] == ref).any() else df["rank"].min()
    return df[df["rank"] == want].reset_index(drop=True)


def num(v: Any) -> float | None:
    """A finite float, or None."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def collective_counts(d: schema.ObservedCollectives | schema.ExpectedCollectives | None) -> dict[str, float | None]:
    """{collective: calls per step} of collectives_check's `expected` or `observed` (medians)."""
    return {k: num(v) for k, v in d.per_step().items()} if d is not None else {}


def words(v: Any) -> str:
    """An explanation given as a string or a list of clauses, as one sentence."""
    if isinstance(v, (list, tuple)):
        parts = [str(x).strip().rstrip(".") for x in v if str(x).strip()]
        return ("; ".join(parts) + ".") if parts else ""
    return str(v or "").strip()


def name_of(v: Any) -> str:
    """A kernel name from a {name, sum_us, count} record (Struct or mapping) or a plain string."""
    if isinstance(v, dict):
        return str(v.get("name", v))
    return str(getattr(v, "name", v))
