"""Serving metrics from raw per-request records: the one place they are defined.

Definitions follow `vllm bench serve` (docs/methods.md#serving-metrics). Failed requests count in `n_failed`
and are left out of every latency statistic and token total.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from stepscope.thresholds import BUNCHED_GAP_MS

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
LEGACY_PERCENTILES = (90.0, 99.0)
"""Always in levels.csv, whatever `sweep.percentiles` says: the columns readers had first."""
DEFAULT_PERCENTILES = (25.0, 50.0, 75.0, 90.0, 95.0, 99.0)
"""`sweep.percentiles`' default (stepscope.config.SweepParams)."""
SPREAD_STATS = ("std", "min", "max")


def percentile_word(p: float) -> str:
    """`99` for 99.0, `99.9` for 99.9: vLLM's spelling of a percentile in its keys."""
    return str(int(p)) if int(p) == p else str(p)


def latency_stat_names(percentiles: Iterable[float] = DEFAULT_PERCENTILES) -> list[str]:
    """One metric's statistics, as levels.csv suffixes: mean, median, p90, p99 (the first
    columns), std, min, max, then every other chosen percentile in order (p50 is the median)."""
    extra = sorted({float(p) for p in percentiles} - {50.0, *LEGACY_PERCENTILES})
    return ["mean", "median", *(f"p{percentile_word(p)}" for p in LEGACY_PERCENTILES), *SPREAD_STATS,
            *(f"p{percentile_word(p)}" for p in extra)]


def latency_columns(percentiles: Iterable[float] = DEFAULT_PERCENTILES) -> list[str]:
    """levels.csv's latency columns: `<metric>_ms_<stat>` for TTFT, TPOT, ITL and E2EL."""
    stats = latency_stat_names(percentiles)
    return [f"{m}_ms_{s}" for m in LATENCY_METRICS for s in stats]


@dataclass
class RequestRecord:
    """One request as the client saw it. Times are `time.perf_counter()` seconds."""

    start_s: float
    """When the request was dispatched."""
    chunk_times_s: list[float] = field(default_factory=list)
    """Arrival time of every token-bearing chunk (a chunk with a non-empty `choices`)."""
    end_s: float | None = None
    """When the response finished (stream closed, or the error was seen)."""
    input_tokens: int = 0
    output_tokens: int | None = None
    """`usage.completion_tokens`; None when the server sent no usage."""
    success: bool = False
    error: str | None = None
    http_status: int | None = None
    request_id: int = 0
    warmup: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "warmup": self.warmup,
            "start_s": self.start_s,
            "end_s": self.end_s,
            "chunk_times_s": self.chunk_times_s,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "success": self.success,
            "error": self.error,
            "http_status": self.http_status,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RequestRecord":
        return cls(
            start_s=float(d["start_s"]),
            chunk_times_s=[float(t) for t in d.get("chunk_times_s") or []],
            end_s=None if d.get("end_s") is None else float(d["end_s"]),
            input_tokens=int(d.get("input_tokens") or 0),
            output_tokens=None if d.get("output_tokens") is None else int(d["output_tokens"]),
            success=bool(d.get("success")),
            error=d.get("error"),
            http_status=d.get("http_status"),
            request_id=int(d.get("request_id", 0)),
            warmup=bool(d.get("warmup", False)),
        )


def _as_records(records: Iterable[RequestRecord | Mapping[str, Any]]) -> list[RequestRecord]:
    return [r if isinstance(r, RequestRecord) else RequestRecord.from_dict(r) for r in records]


def _ok(r: RequestRecord) -> bool:
    return r.success and len(r.chunk_times_s) > 0


def request_table(records: Iterable[RequestRecord | Mapping[str, Any]]) -> pd.DataFrame:
    """One row per measured (non-warm-up) request, latencies in ms (NaN when failed)."""
    rows = []
    for r in _as_records(records):
        if r.warmup:
            continue
        ok = _ok(r)
        n_chunks = len(r.chunk_times_s)
        out = r.output_tokens if r.output_tokens is not None else n_chunks
        ttft = e2el = tpot = math.nan
        if ok:
            ttft = r.chunk_times_s[0] - r.start_s
            e2el = r.chunk_times_s[-1] - r.start_s
            if out > 1:
                tpot = (e2el - ttft) / (out - 1)
        error = r.error
        if r.success and not ok:
            error = error or "stream ended without a token-bearing chunk"
        rows.append({
            "request_id": r.request_id,
            "success": ok,
            "error": error,
            "input_tokens": r.input_tokens,
            "output_tokens": out if ok else 0,
            "output_tokens_from_usage": r.output_tokens is not None,
            "n_chunks": n_chunks,
            "start_s": r.start_s,
            "end_s": r.end_s if r.end_s is not None else (r.chunk_times_s[-1] if n_chunks else r.start_s),
            "ttft_ms": ttft * 1e3,
            "tpot_ms": tpot * 1e3,
            "e2el_ms": e2el * 1e3,
        })
    table = pd.DataFrame(rows, columns=[
        "request_id", "success", "error", "input_tokens", "output_tokens",
        "output_tokens_from_usage", "n_chunks", "start_s", "end_s", "ttft_ms", "tpot_ms", "e2el_ms",
    ])
    # Typed even when empty (a level the watchdog ended in its warm-up): an empty object
    # column used as a mask selects columns, not rows, and every reader then missed its keys.
    return table.astype({"success": bool, "output_tokens_from_usage": bool,
                         "output_tokens": "int64", "input_tokens": "int64"})



def itl_ms(records: Iterable[RequestRecord | Mapping[str, Any]]) -> np.ndarray:
    """Inter-chunk gaps in ms, pooled over the completed measured requests."""
    gaps = [np.diff(r.chunk_times_s) for r in _as_records(records) if not r.warmup and _ok(r)]
    return np.concatenate(gaps) * 1e3 if gaps else np.array([], dtype=float)


def _stats(values: np.ndarray | pd.Series, name: str,
           percentiles: Iterable[float] = DEFAULT_PERCENTILES) -> dict[str, float]:
    """`<name>_ms_<stat>` for every stat of `latency_stat_names`; NaN for all when no value."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    stats = latency_stat_names(percentiles)
    if v.size == 0:
        return {f"{name}_ms_{s}": math.nan for s in stats}
    known = {"mean": np.mean(v), "median": np.median(v), "std": np.std(v), "min": np.min(v), "max": np.max(v)}
    return {f"{name}_ms_{s}": float(known[s] if s in known else np.percentile(v, float(s[1:]))) for s in stats}


def output_tok_s_per_request(table: pd.DataFrame) -> pd.Series:
    """Each request's output tokens / its E2EL in s (`request_table` rows); NaN for a failed one."""
    e2el_s = table["e2el_ms"] / 1e3
    return (table["output_tokens"] / e2el_s.where(e2el_s > 0)).where(table["success"])


def peak_output_tok_s_1s(records: Iterable[RequestRecord | Mapping[str, Any]]) -> float:
    """Most output tokens landing in one whole-second bucket (vLLM's peak method)."""
    ok = [r for r in _as_records(records) if not r.warmup and _ok(r)]
    if not ok:
        return 0.0
    t0 = min(r.start_s for r in ok)
    t_end = max(r.chunk_times_s[-1] for r in ok)
    buckets = np.zeros(int(np.ceil(t_end - t0)) + 1)
    for r in ok:
        out = r.output_tokens if r.output_tokens is not None else len(r.chunk_times_s)
        weight = out / len(r.chunk_times_s)
        idx = ((np.asarray(r.chunk_times_s) - t0)).astype(int)
        np.add.at(buckets, idx[(idx >= 0) & (idx < buckets.size)], weight)
    return float(buckets.max())


def merged_token_share(done: pd.DataFrame) -> float:
    """Share of output tokens that did not arrive in a chunk of their own (vLLM coalesces outputs when its API
    process falls behind): ITL then pools fewer, longer gaps, TPOT is unaffected. NaN without usage counts."""
    d = done[done["output_tokens_from_usage"]] if len(done) else done
    tokens = int(d["output_tokens"].sum()) if len(d) else 0
    if tokens == 0:
        return math.nan
    return max(0.0, (tokens - int(d["n_chunks"].sum())) / tokens)


def level_metrics(records: Iterable[RequestRecord | Mapping[str, Any]],
                  percentiles: Iterable[float] = DEFAULT_PERCENTILES) -> dict[str, Any]:
    """Every serving metric of one load level, from its raw records (warm-ups ignored), with
    `percentiles` of each latency (`latency_stat_names`)."""
    recs = [r for r in _as_records(records) if not r.warmup]
    table = request_table(recs)
    done = table[table["success"]]
    n = len(table)
    if n:
        duration_s = float(table["end_s"].max() - table["start_s"].min())
    else:
        duration_s = math.nan
    total_out = int(done["output_tokens"].sum())
    total_in = int(done["input_tokens"].sum())

    def per_s(x: float) -> float:
        return x / duration_s if duration_s and duration_s > 0 else math.nan

    out: dict[str, Any] = {
        "n_requests": n,
        "n_completed": int(len(done)),
        "n_failed": int(n - len(done)),
        "duration_s": duration_s,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput_rps": per_s(len(done)),
        "output_throughput_tok_s": per_s(total_out),
        "total_throughput_tok_s": per_s(total_in + total_out),
    }
    gaps = itl_ms(recs)
    for name, values in (("ttft", done["ttft_ms"]), ("tpot", done["tpot_ms"]), ("itl", gaps),
                         ("e2el", done["e2el_ms"])):
        out.update(_stats(values, name, percentiles))
    per_user = output_tok_s_per_request(done).dropna()
    out["output_tok_s_per_user"] = float(per_user.mean()) if len(per_user) else math.nan
    # Chunks that land in the same network read (gap under BUNCHED_GAP_MS) were held back
    # somewhere (a starved API process, a proxy's buffer): per-token latencies then
    # describe the delivery, not the decode. The share makes that visible.
    out["bunched_chunk_share"] = float(np.mean(gaps < BUNCHED_GAP_MS)) if gaps.size else math.nan
    out["merged_token_share"] = merged_token_share(done)
    out["littles_concurrency"] = per_s(float(done["e2el_ms"].sum()) / 1e3)
    out["peak_output_tok_s_1s"] = peak_output_tok_s_1s(recs)
    out["output_tokens_from_usage"] = bool(done["output_tokens_from_usage"].all()) if len(done) else True
    return out


def failures_table(records: Iterable[RequestRecord | Mapping[str, Any]]) -> pd.DataFrame:
    """Failed measured requests with their messages: request_id, http_status, error."""
    rows = [{"request_id": r.request_id, "http_status": r.http_status,
             "error": r.error or "stream ended without a token-bearing chunk"}
            for r in _as_records(records) if not r.warmup and not _ok(r)]
    return pd.DataFrame(rows, columns=["request_id", "http_status", "error"])
