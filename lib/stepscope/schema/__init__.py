"""The run folder's artifacts, typed in one place: every key, column, unit and meaning.

Stages talk only through files in `outputs/<run-id>/`. Each JSON file is a
`msgspec.Struct` here and each CSV table a `Row` (one field per column; fields without a
default are required columns). Writers check what they write (`write`, `validate`,
`check_frame`), the report and `compare` read through `read` and `check_frame`, and
`docs/artifacts.md` is generated from `ARTIFACTS` (`python -m stepscope.schema`).

Reading ignores unknown keys (a newer file still reads) and fills documented defaults for
keys an older stage did not write; a missing required key or a wrong type is an
`ArtifactError` naming the file and the key path. Times are µs unless the key says `_ms`
or `_s`; shares are 0-1 unless the key says `pct`.
"""

from __future__ import annotations

from stepscope.schema._base import (SCHEMA_VERSION, Artifact, ArtifactError, Record, Row, check_frame,
                                    columns, convert, read, read_if_present, record_of, required_columns,
                                    to_builtins,
                                    update, validate, write, write_table)
from stepscope.schema.campaign import (CampaignRecord, CampaignRun, ReusedFrom, SpecDecodeCounters,
                                       SpecDecodeWindow)
from stepscope.schema.capture import CaptureFile, CaptureLatency, CaptureManifest, StartProfileBody
from stepscope.schema.categorize import (AmdahlRow, CategoryKernelRow, CategoryLeverRow, ClockFlag,
                                         CollectiveCategoryStats, CollectiveInstanceRow, CollectivesMatched,
                                         CollectiveSizeRow, CollectivesCheck, CrossRankRow, ExpectedCollectives,
                                         ModuleRow, NamedTime, ObservedCollectives, Percentiles, RankReconcile,
                                         TextTableCheck,
                                         DecodeCategoryRow, DecodeSummary, Flag, HostGapTime, KindCategoryRow,
                                         LargestGap, PeriodStat,
                                         RankCategoryRow, RankSummary, Roofline, RooflineDevice, RooflineRow,
                                         SpecDecodeSteps, CategoryTotals, ClassTotals, CountStat, MixedReading,
                                         StepRow, StepSourceChoice, StepTimes, TimelineRow, TraceInfo,
                                         TraceSummary)
from stepscope.schema.deploy import ModelCard, ModelsResponse, ServerRecord
from stepscope.schema.load import (ExpertGrowth, ExpertLevel, LoadAnatomyRow, LoadAnatomySummary, LoadFit, LoadLevel,
                                   LoadReconciliation, LoadReconciliationLevel, LoadWindow, MicroCurve,
                                   MicroCurveLevel, MicroCurveReconciled, ServerMetricsInfo, ServerMetricsRow)
from stepscope.schema.micro import BurstRow, CollectiveRow, CommPrediction, GemmConfig, GemmPrediction, GemmRow
from stepscope.schema.run import HostHardware, RunEvent, RunRecord, StageStatus
from stepscope.schema.sweep import (GpuTelemetryInfo, GpuTelemetryRow, LevelRow, SweepPlan, SweepRequestRow,
                                   SweepSummary, VllmBenchResult, AiperfExport, AiperfStats)
from stepscope.schema.verdict import (Agreement, BetweenSteps, BiggestLever, Boundness, Caveat, CommSplit,
                                      Communication, Component, Dominant, GapLever, Guard, KindApart, KindCategory,
                                      LevelAnatomy, Lever, LoadGrowth, Overlap, Plateau, RooflineFinding,
                                      SpecDecodeSeen, StepBasis, StepPrediction, TpotGap, TraceIdentity, Verdict,
                                      VerdictFile, VerdictSentence)

ARTIFACTS: tuple[Artifact, ...] = (
    Artifact("run.json", "run", "git commit, package versions, hardware, params (redacted), "
             "per-stage status/duration/error, `schema_version`", RunRecord),
    Artifact("params.yaml", "run", "the params snapshot, secrets redacted (`stepscope.config.Params`; "
             "keys in the params reference below)"),
    Artifact("notebooks/NN_name.ipynb", "run", "the executed notebooks"),
    Artifact("figures/*.png", "run", "every figure, named for what it shows"),
    Artifact("profiler_raw/", "run", "where the launched server writes its traces", optional=True),
    Artifact("00_deploy/server.json", "00_deploy", "url, engine + version, /v1/models, argv and env "
             "redacted, profiler_dir, tp", ServerRecord),
    Artifact("00_deploy/server.log", "00_deploy", "the launched server's log", optional=True),
    Artifact("01_macro_sweep/levels/<level>.jsonl", "01_macro_sweep",
             "raw per-request records of the measured requests; an interrupted level leaves "
             "`<level>.partial.jsonl` (its finished requests); run folders written before warm-ups had a "
             "file of their own hold them here too, flagged `\"warmup\": true`"),
    Artifact("01_macro_sweep/levels/<level>.warmup.jsonl", "01_macro_sweep",
             "the level's warm-up requests, raw records (absent when it sent none)", optional=True),
    Artifact("01_macro_sweep/levels/<level>.meta.json", "01_macro_sweep",
             "level settings, client CPU, server /metrics snapshots; marks a finished level"),
    Artifact("01_macro_sweep/levels.csv", "01_macro_sweep", "one row per level", LevelRow),
    Artifact("01_macro_sweep/vllm_bench/<level>.vllm.json", "01_macro_sweep", "each level as `vllm bench serve "
             "--save-result` writes a run (vLLM 0.32.0's keys and units)", VllmBenchResult, optional=True),
    Artifact("01_macro_sweep/aiperf/<level>/profile_export_aiperf.json", "01_macro_sweep", "each level as AIPerf's "
             "summary export (its schema 1.4: per metric `unit`, `avg`, percentiles p1-p99; warm-ups apart)",
             AiperfExport, optional=True),
    Artifact("01_macro_sweep/requests.csv", "01_macro_sweep", "one row per measured request of every level "
             "(AIPerf's per-request export): latencies, tokens, times, success and error (absent in run "
             "folders of older stepscope)", SweepRequestRow, optional=True),
    Artifact("01_macro_sweep/imported_vllm_bench.csv", "01_macro_sweep",
             "the `sweep.import_results` files (`vllm bench serve --save-result`) in the same columns, "
             "one row per imported result", LevelRow, optional=True),
    Artifact("01_macro_sweep/summary.json", "01_macro_sweep", "knee, plateau, batch-1 latency, "
             "failures, flags", SweepSummary),
    Artifact("01_macro_sweep/plan.json", "01_macro_sweep", "the levels this sweep measures: the planned "
             "ones, then each SLO-search level, written before it is measured (--resume keeps only "
             "these)", SweepPlan, optional=True),
    Artifact("01_macro_sweep/gpu_telemetry.csv", "01_macro_sweep", "every GPU's clocks, power, "
             "temperature, memory and utilisation about every 0.5 s during each level (NVML; only where "
             "it is present)", GpuTelemetryRow, optional=True),
    Artifact("01_macro_sweep/gpu_telemetry.json", "01_macro_sweep", "whether GPU telemetry was recorded, "
             "and why not", GpuTelemetryInfo, optional=True),
    Artifact("01_macro_sweep/server_metrics.csv", "01_macro_sweep", "every /metrics scrape during the "
             "levels (about every `METRICS_POLL_S`): requests running/waiting, KV use, preemptions, "
             "prefix cache, iteration tokens", ServerMetricsRow, optional=True),
    Artifact("01_macro_sweep/server_metrics.json", "01_macro_sweep", "the scrape interval, what a scrape "
             "cost, and the series the server does not expose", ServerMetricsInfo, optional=True),
    Artifact("02_gemm_micro/gemm.csv", "02_gemm_micro", "one row per timed GEMM shape and setting", GemmRow),
    Artifact("02_gemm_micro/prediction.json", "02_gemm_micro", "GEMM time per decode step by batch size",
             GemmPrediction),
    Artifact("03_nccl_burst/collectives.csv", "03_nccl_burst", "latency and bandwidth per collective "
             "and size", CollectiveRow),
    Artifact("03_nccl_burst/burst.csv", "03_nccl_burst", "bursts of one decode step's all-reduces",
             BurstRow),
    Artifact("03_nccl_burst/prediction.json", "03_nccl_burst", "communication time per decode step",
             CommPrediction),
    Artifact("03_nccl_burst/ranks/", "03_nccl_burst", "raw per-rank timings, progress and logs"),
    Artifact("04_profiler_capture/traces/", "04_profiler_capture",
             "rank traces, `profiler_out` tables, the front end's trace"),
    Artifact("04_profiler_capture/manifest.json", "04_profiler_capture",
             "what was captured: ranks, files with sizes and hashes, profiler settings", CaptureManifest),
    Artifact("04_profiler_capture/capture_latency.json", "04_profiler_capture",
             "client-side TTFT/TPOT of the capture's requests", CaptureLatency),
    Artifact("04_profiler_capture/metrics.<before|after>.prom", "04_profiler_capture",
             "the server's /metrics just before /start_profile and just after /stop_profile: its "
             "counters over exactly the profiled requests", optional=True),
    Artifact("04_profiler_capture/gpu_telemetry.csv", "04_profiler_capture", "every GPU's clocks, power, "
             "temperature, memory and utilisation about every 0.5 s from /start_profile to /stop_profile "
             "(NVML; only where it is present)", GpuTelemetryRow, optional=True),
    Artifact("04_profiler_capture/gpu_telemetry.json", "04_profiler_capture", "whether GPU telemetry was "
             "recorded during the capture, and why not", GpuTelemetryInfo, optional=True),
    Artifact("04_profiler_capture/c<C>/", "04_profiler_capture", "a load capture at concurrency C "
             "(`capture.concurrency`): `traces/`, `manifest.json`, `capture_requests.jsonl`, "
             "`server_metrics.csv`, `gpu_telemetry.csv`/`.json` (as the batch-1 capture's)", optional=True),
    Artifact("04_profiler_capture/c<C>/load_window.json", "04_profiler_capture", "how the load level's "
             "window was bounded, and the client's tokens over exactly it", LoadWindow, optional=True),
    Artifact("05_categorize/load_anatomy.csv", "05_categorize", "per captured concurrency, step kind, "
             "batch and category: ms per step and share of the period", LoadAnatomyRow, optional=True),
    Artifact("05_categorize/load_anatomy.json", "05_categorize", "per captured concurrency: steps, "
             "trace-predicted against measured throughput; per category the fit against batch",
             LoadAnatomySummary, optional=True),
    Artifact("05_categorize/load_reconciliation.json", "05_categorize", "per captured sweep level: its wall "
             "time cut into measured parts (its own decode and prefill steps, stalls, client overhead, ramp-up, "
             "turnaround, drain) and the unexplained remainder, the steps against the engine's count, and the "
             "trace's steps beside them", LoadReconciliation, optional=True),
    Artifact("05_categorize/micro_curve.json", "05_categorize", "per closed-loop sweep level: the decode step "
             "the micro-benchmarks predict (GEMM, collectives, attention and KV writes, rest) and its tok/s beside "
             "the measured; per reconciled level its time rebuilt from the prediction, the error by component",
             MicroCurve, optional=True),
    Artifact("05_categorize/c<C>/", "05_categorize", "stage 05's whole analysis of the load capture at "
             "concurrency C", optional=True),
    Artifact("05_categorize/summary.json", "05_categorize", "per-rank totals, the decode summary, "
             "checks and flags (below)", TraceSummary),
    Artifact("05_categorize/decode_categories.csv", "05_categorize", "per rank and category over "
             "decode steps", DecodeCategoryRow),
    Artifact("05_categorize/steps.csv", "05_categorize", "one row per step and rank", StepRow),
    Artifact("05_categorize/kind_categories.csv", "05_categorize", "per rank, step kind and category: "
             "the kinds side by side (prefill, decode, verify, warm-up, ...), never averaged together",
             KindCategoryRow, optional=True),
    Artifact("05_categorize/rank_categories.csv", "05_categorize", "per rank and category, whole trace",
             RankCategoryRow),
    Artifact("05_categorize/cross_rank.csv", "05_categorize", "per category across ranks", CrossRankRow),
    Artifact("05_categorize/amdahl.csv", "05_categorize", "per category: speed-up ceiling", AmdahlRow),
    Artifact("05_categorize/category_kernels.csv", "05_categorize",
             "per rank and category: its largest kernels over the decode steps", CategoryKernelRow,
             optional=True),
    Artifact("05_categorize/category_levers.csv", "05_categorize",
             "per rank and category: its top kernels, its module, and whether it is one lever or a grab-bag",
             CategoryLeverRow, optional=True),
    Artifact("05_categorize/modules.csv", "05_categorize",
             "per rank and module path: device time over the decode steps (empty without module frames)",
             ModuleRow, optional=True),
    Artifact("05_categorize/collective_sizes.csv", "05_categorize",
             "per rank and collective: op, dtype, message size, calls and bandwidth per call",
             CollectiveSizeRow, optional=True),
    Artifact("05_categorize/timeline_rank0_step.csv", "05_categorize",
             "the work of one representative decode step", TimelineRow),
    Artifact("05_categorize/collective_instances.csv", "05_categorize",
             "collectives matched across ranks", CollectiveInstanceRow, optional=True),
    Artifact("05_categorize/text_tables.csv", "05_categorize", "the `profiler_out` tables, parsed",
             optional=True),
    Artifact("05_categorize/perfetto/", "05_categorize", "categorized Chrome traces for Perfetto"),
    Artifact("05_categorize/cache/", "05_categorize", "slim per-rank event tables (Parquet)"),
    Artifact("06_writeup/report.md", "06_writeup", "the report"),
    Artifact("06_writeup/report.html", "06_writeup", "the same as one self-contained HTML file"),
    Artifact("06_writeup/appendix.md", "06_writeup", "linked from the report: the measurements its figures show, "
             "in full (the GEMM table the prediction reads and the other models', the largest ops per category, the "
             "step kinds side by side, the step read several ways, collective transfer and wait, collectives per "
             "size, the load reconciliation and micro-predicted curve, growth with the batch, the spread across "
             "ranks, the what-if tables when their figure is drawn), then command lines, stages, packages, the params file (secrets redacted) and every "
             "file in the run folder (absent in run folders of older stepscope)", optional=True),
    Artifact("06_writeup/appendix.html", "06_writeup", "the same as one self-contained HTML file", optional=True),
    Artifact("06_writeup/verdict.json", "06_writeup", "the verdict itself: every finding (trace identity, step "
             "basis, dominant cost, levers with their ceilings, guards, caveats, ...), with the headline's and the "
             "verdict section's sentences and the finding each came from (absent in run folders of older stepscope; "
             "version 2's digest is read as it)", VerdictFile, optional=True),
)
ARTIFACT_BY_PATH = {a.path: a for a in ARTIFACTS}

CAMPAIGN_ARTIFACTS: tuple[Artifact, ...] = (
    Artifact("campaign.json", "campaign", "the plan and every run's status, wall time, reused and "
             "measured stages", CampaignRecord),
    Artifact("params.yaml", "campaign", "the campaign params, secrets redacted"),
    Artifact("<variant>[/repeat-<k>]/", "campaign", "one ordinary run folder per run (above), plus "
             "`variant_params.yaml` (its merged params)"),
    Artifact("<run>/<stage>/reused_from.json", "campaign", "in a stage copied from another run: which",
             ReusedFrom, optional=True),
    Artifact("<run>/campaign_metrics/<stage>.spec_decode.json", "campaign", "the server's "
             "speculative-decoding counters over stage 01 and over stage 04's profiled requests (and the "
             "`.before/.after.prom` scrapes around each stage)", SpecDecodeWindow),
    Artifact("campaign_report.md", "campaign", "the campaign report"),
    Artifact("campaign_report.html", "campaign", "the same as one self-contained HTML file"),
    Artifact("figures/*.png", "campaign", "the campaign report's figures"),
)
"""The campaign folder (`stepscope campaign`): its own files, beside one run folder per run."""


def artifact(path: str) -> Artifact:
    return ARTIFACT_BY_PATH[path]


def check_run_folder(run_dir) -> dict[str, object]:
    """Every typed artifact present in `run_dir`, read through its schema: {path: Struct or
    DataFrame}. Raises ArtifactError at the first file that does not match."""
    from pathlib import Path

    import pandas as pd

    out: dict[str, object] = {}
    for a in ARTIFACTS:
        p = Path(run_dir) / a.path
        if a.type is None or not p.is_file():
            continue
        out[a.path] = read(p, a.type) if a.kind == "json" else check_frame(pd.read_csv(p), a.type, str(p))
    return out


__all__ = [
    "ARTIFACTS", "ARTIFACT_BY_PATH", "SCHEMA_VERSION", "AmdahlRow", "Artifact", "ArtifactError",
    "Agreement", "BetweenSteps", "BiggestLever", "Boundness", "Caveat", "CommSplit", "Communication",
    "Component", "Dominant", "GapLever", "Guard", "KindApart", "KindCategory", "LevelAnatomy", "Lever",
    "LoadGrowth", "Overlap", "Plateau", "RooflineFinding", "SpecDecodeSeen", "StepBasis", "StepPrediction",
    "TpotGap", "TraceIdentity", "Verdict", "VerdictFile", "VerdictSentence",
    "BurstRow", "CAMPAIGN_ARTIFACTS", "CampaignRecord", "CampaignRun", "CaptureFile", "CaptureLatency", "CaptureManifest", "CategoryKernelRow",
    "CategoryLeverRow", "CollectiveSizeRow", "ModuleRow",
    "CollectiveInstanceRow",
    "CollectiveRow", "CollectivesCheck", "CommPrediction", "CrossRankRow", "DecodeCategoryRow",
    "DecodeSummary", "Flag", "GemmPrediction", "GemmRow", "GpuTelemetryInfo", "GpuTelemetryRow", "LevelRow", "ExpertGrowth", "ExpertLevel", "LoadAnatomyRow", "LoadAnatomySummary", "LoadFit", "LoadLevel", "LoadReconciliation", "LoadReconciliationLevel", "LoadWindow",
    "MicroCurve", "MicroCurveLevel", "MicroCurveReconciled", "RankCategoryRow", "RankSummary",
    "Record", "ReusedFrom", "Row", "RunRecord", "ServerMetricsInfo", "ServerMetricsRow", "ServerRecord", "SpecDecodeCounters", "SpecDecodeWindow", "StageStatus", "StepRow", "StepSourceChoice", "StepTimes", "SweepPlan", "SweepRequestRow", "SweepSummary",
    "VllmBenchResult",
    "AiperfExport",
    "AiperfStats",
    "TimelineRow", "TraceInfo", "TraceSummary", "artifact", "check_frame", "check_run_folder", "columns", "convert", "read",
    "record_of", "required_columns", "to_builtins", "validate", "write", "write_table", "read_if_present", "update",
    "ClockFlag", "CollectiveCategoryStats", "CollectivesMatched", "ExpectedCollectives", "GemmConfig", "HostHardware",
    "ModelCard", "ModelsResponse", "NamedTime", "ObservedCollectives", "Percentiles", "RankReconcile", "RunEvent",
    "StartProfileBody", "TextTableCheck", "LargestGap", "PeriodStat", "Roofline", "RooflineDevice", "RooflineRow",
    "SpecDecodeSteps", "CategoryTotals", "ClassTotals", "CountStat", "MixedReading", "HostGapTime", "KindCategoryRow",
]
