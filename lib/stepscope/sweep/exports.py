"""The sweep in the shapes other tools read: `vllm bench serve --save-result` JSON and AIPerf's summary per
level, and `requests.csv`; rewritten from disk whenever stage 01 finishes
(docs/methods.md#exports-for-other-tools)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd

from stepscope import schema
from stepscope.sweep.metrics import (LATENCY_METRICS, RequestRecord, output_tok_s_per_request, percentile_word,
                                     request_table)

VLLM_DIR = "vllm_bench"
VLLM_SUFFIX = ".vllm.json"
"""`vllm_bench/c0004.vllm.json`: a name no other run-folder JSON file ends in."""
REQUESTS_CSV = "requests.csv"

REQUEST_COLUMNS = ["level", "mode", "concurrency", "request_rate", "request_id", "success", "error",
                   "http_status", "input_tokens", "output_tokens", "output_tokens_from_usage", "n_chunks",
                   "start_s", "end_s", "ttft_ms", "tpot_ms", "e2el_ms", "output_tok_s"]

_TOTALS = {"duration": "duration_s", "completed": "n_completed", "failed": "n_failed",
           "total_input_tokens": "total_input_tokens", "total_output_tokens": "total_output_tokens",
           "request_throughput": "request_throughput_rps", "request_goodput": "goodput_rps",
           "output_throughput": "output_throughput_tok_s", "total_token_throughput": "total_throughput_tok_s",
           "max_output_tokens_per_s": "peak_output_tok_s_1s"}
"""vLLM's result key: the levels.csv column it is read from."""


def _plain(v: Any) -> Any:
    """A JSON value: NaN (not measured) as null, numpy numbers as Python's."""
    if v is None:
        return None
    if hasattr(v, "item"):
        v = v.item()
    return None if isinstance(v, float) and math.isnan(v) else v


def vllm_latency_keys(metric: str, percentiles: Iterable[float]) -> dict[str, str]:
    """{vLLM key: levels.csv column} of one latency: `mean_ttft_ms`, `median_ttft_ms`,
    `std_ttft_ms`, then `p<P>_ttft_ms` per chosen percentile (p50 is the median's column)."""
    keys = {f"{s}_{metric}_ms": f"{metric}_ms_{s}" for s in ("mean", "median", "std")}
    for p in percentiles:
        word = percentile_word(float(p))
        keys[f"p{word}_{metric}_ms"] = f"{metric}_ms_median" if float(p) == 50.0 else f"{metric}_ms_p{word}"
    return keys


def vllm_result(row: Mapping[str, Any], percentiles: Iterable[float],
                settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One level (its levels.csv row and meta `settings`) as `vllm bench serve --save-result` writes a run."""
    settings = settings or {}
    closed = row.get("mode") == "concurrency"
    out: dict[str, Any] = {"label": f"stepscope {row.get('level')}", "model_id": settings.get("served_model"),
                           "num_prompts": _plain(row.get("n_requests")),
                           "request_rate": "inf" if closed else _plain(row.get("request_rate")),
                           "burstiness": settings.get("burstiness", 1.0),
                           "max_concurrency": _plain(row.get("concurrency")) if closed else None}
    ramp = settings.get("ramp")
    if isinstance(ramp, dict):
        out.update({"ramp_up_strategy": ramp.get("strategy"), "ramp_up_start_rps": ramp.get("start_rps"),
                    "ramp_up_end_rps": ramp.get("end_rps"), "request_rate": None})
    out.update({key: _plain(row.get(col)) for key, col in _TOTALS.items()})
    for metric in LATENCY_METRICS:
        out.update({key: _plain(row.get(col)) for key, col in vllm_latency_keys(metric, percentiles).items()})
    if isinstance(out["max_concurrency"], float):
        out["max_concurrency"] = int(out["max_concurrency"])
    return out


def level_requests(meta: Mapping[str, Any], records: list[RequestRecord]) -> pd.DataFrame:
    """The measured requests of one level, REQUEST_COLUMNS (warm-ups of an older run folder's
    mixed file left out)."""
    measured = [r for r in records if not r.warmup]
    table = request_table(measured)
    table["output_tok_s"] = output_tok_s_per_request(table)
    table["http_status"] = pd.array([r.http_status for r in measured], dtype="Int64")
    table["level"], table["mode"] = meta.get("level"), meta.get("mode")
    for key in ("concurrency", "request_rate"):  # numbers in every row: a ramp level has neither
        table[key] = math.nan if meta.get(key) is None else float(meta[key])
    return table[REQUEST_COLUMNS]


def requests_table(done: list[tuple[Mapping[str, Any], list[RequestRecord]]]) -> pd.DataFrame:
    """`level_requests` of every finished level ((meta, records), `run.finished_levels`), in order."""
    frames = [level_requests(meta, records) for meta, records in done]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=REQUEST_COLUMNS)


AIPERF_SCHEMA = "1.4"
AIPERF_DIR = "aiperf"
AIPERF_NAME = "profile_export_aiperf.json"
AIPERF_PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)
_AIPERF_RECORD = {"request_latency": ("e2el_ms", "ms"), "time_to_first_token": ("ttft_ms", "ms"),
                  "inter_token_latency": ("tpot_ms", "ms"), "input_sequence_length": ("input_tokens", "tokens"),
                  "output_sequence_length": ("output_tokens", "tokens"),
                  "output_token_throughput_per_user": ("output_tok_s", "tokens/sec/user")}
"""AIPerf's per-request metric: (requests.csv column, AIPerf's unit). Its inter-token latency is
vLLM's TPOT: (last token - first) / (output tokens - 1)."""
_AIPERF_RUN = {"request_count": ("n_completed", "requests"), "error_request_count": ("n_failed", "requests"),
               "request_throughput": ("request_throughput_rps", "requests/sec"),
               "output_token_throughput": ("output_throughput_tok_s", "tokens/sec"),
               "benchmark_duration": ("duration_s", "sec")}
"""AIPerf's run-level metric (`unit` and `avg` only): (levels.csv column, unit)."""


def aiperf_stats(values: Iterable[float], unit: str) -> dict[str, Any] | None:
    """One per-request metric's block: mean, extremes, sample std, count, sum and AIPerf's
    percentiles (numpy's linear interpolation); None with no finite sample."""
    import numpy as np

    v = np.asarray(list(values), float)
    v = v[np.isfinite(v)]
    if not len(v):
        return None
    out = {"unit": unit, "avg": float(v.mean()), "min": float(v.min()), "max": float(v.max()),
           "std": float(v.std(ddof=1)) if len(v) > 1 else 0.0, "count": int(len(v)), "sum": float(v.sum())}
    return out | {f"p{p}": float(np.percentile(v, p)) for p in AIPERF_PERCENTILES}


def _aiperf_metrics(table: pd.DataFrame) -> dict[str, Any]:
    ok = table[table["success"].astype(bool)] if len(table) else table
    blocks = {name: aiperf_stats(ok[col], unit) for name, (col, unit) in _AIPERF_RECORD.items()}
    return {k: v for k, v in blocks.items() if v is not None}


def aiperf_result(row: Mapping[str, Any], table: pd.DataFrame, warmups: pd.DataFrame,
                  settings: Mapping[str, Any] | None = None, run_id: str = "") -> dict[str, Any]:
    """One level as AIPerf's `profile_export_aiperf.json`: per-request metrics from `table`, run-level ones
    from `row`, warm-ups under `warmup_metrics`."""
    from stepscope import __version__

    settings = settings or {}
    closed = row.get("mode") == "concurrency"
    errors = table.loc[~table["success"].astype(bool), "error"].fillna("unknown") if len(table) else pd.Series([])
    out: dict[str, Any] = {
        "schema_version": AIPERF_SCHEMA, "aiperf_version": None, "producer": f"stepscope {__version__}",
        "benchmark_id": f"stepscope-{run_id}-{row.get('level')}".replace("--", "-"), "was_cancelled": False,
        "input_config": {"model": settings.get("served_model"), "endpoint_type": "completions", "streaming": True,
                         "concurrency": _plain(row.get("concurrency")) if closed else None,
                         "request_rate": None if closed else _plain(row.get("request_rate"))},
        "error_summary": [{"error": str(e), "count": int(n)} for e, n in errors.value_counts().items()]}
    out.update(_aiperf_metrics(table))
    for name, (col, unit) in _AIPERF_RUN.items():
        if (v := _plain(row.get(col))) is not None:
            out[name] = {"unit": unit, "avg": float(v)}
    if (warm := _aiperf_metrics(warmups)):
        out["warmup_metrics"] = warm
    return out


FORMATS = ("vllm", "aiperf", "csv")
"""`stepscope export --format`: vLLM's per-level result JSON, AIPerf's per-level summary, the
per-request table (AIPerf's per-request kind)."""


def write_exports(out_dir: str | Path, levels: pd.DataFrame,
                  done: list[tuple[Mapping[str, Any], list[RequestRecord]]],
                  percentiles: Iterable[float], formats: Iterable[str] = FORMATS,
                  warmups: Mapping[str, list[RequestRecord]] | None = None) -> dict[str, Path]:
    """The exports `formats` asks for; vLLM JSON of levels no longer on disk is removed, imported levels are
    vLLM's already."""
    out_dir = Path(out_dir)
    written: dict[str, Path] = {}
    if "csv" in formats:
        written["requests"] = schema.write_table(requests_table(done), out_dir / REQUESTS_CSV, schema.SweepRequestRow)
    if "aiperf" in formats:
        written.update(write_aiperf(out_dir, levels, done, warmups or {}))
    if "vllm" not in formats:
        return written
    vdir = out_dir / VLLM_DIR
    vdir.mkdir(parents=True, exist_ok=True)
    settings = {meta["level"]: meta.get("settings") or {} for meta, _ in done}
    for stale in vdir.glob(f"*{VLLM_SUFFIX}"):
        if stale.name[: -len(VLLM_SUFFIX)] not in settings:
            stale.unlink()
    for _, row in levels.iterrows():
        name = str(row["level"])
        written[name] = schema.write(vdir / f"{name}{VLLM_SUFFIX}", vllm_result(row, percentiles, settings.get(name)),
                                     schema.VllmBenchResult)
    return written


def write_aiperf(out_dir: Path, levels: pd.DataFrame, done: list[tuple[Mapping[str, Any], list[RequestRecord]]],
                 warmups: Mapping[str, list[RequestRecord]]) -> dict[str, Path]:
    """`aiperf/<level>/profile_export_aiperf.json` for every level measured here (`aiperf_result`),
    with its warm-ups (`warmups[level]`, and any flagged among an older folder's records)."""
    from dataclasses import replace

    by_level = {meta["level"]: (meta, records) for meta, records in done}
    run_id = out_dir.parent.name
    written: dict[str, Path] = {}
    for _, row in levels.iterrows():
        name = str(row["level"])
        if name not in by_level:  # imported from vLLM's own result: no request records
            continue
        meta, records = by_level[name]
        warm = [r for r in records if r.warmup] + list(warmups.get(name, ()))
        warm_table = request_table([replace(r, warmup=False) for r in warm])
        warm_table["output_tok_s"] = output_tok_s_per_request(warm_table)
        result = aiperf_result(row, level_requests(meta, records), warm_table, meta.get("settings"), run_id)
        written[f"aiperf:{name}"] = schema.write(out_dir / AIPERF_DIR / name / AIPERF_NAME, result, schema.AiperfExport)
    return written
