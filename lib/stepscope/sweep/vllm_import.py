"""Read `vllm bench serve --save-result` JSON into stepscope's levels table.

Per-request arrays (`--save-detailed`) go through stepscope's own metrics; otherwise the summary keys map by
name, tolerating their absence across releases. `--append-result` files give one row per line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from stepscope.errors import StepscopeError
from stepscope.paths import REPO_ROOT
from stepscope.sweep.metrics import LATENCY_METRICS, RequestRecord, latency_stat_names, level_metrics
from stepscope.sweep.run import LEVEL_COLUMNS


class ResultImportError(StepscopeError):
    """A benchmark result file that cannot be read."""


def _load_objects(path: Path) -> list[dict[str, Any]]:
    text = path.read_text()
    try:
        obj = json.loads(text)
        objs = obj if isinstance(obj, list) else [obj]
    except json.JSONDecodeError:
        objs = []
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    objs.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ResultImportError(f"line {i} is not JSON: {exc.msg}", where=str(path),
                                       hint="pass the file written by `vllm bench serve --save-result`") from None
    objs = [o for o in objs if isinstance(o, dict)]
    if not objs or not any(k in objs[0] for k in ("duration", "completed", "request_throughput")):
        raise ResultImportError("not a `vllm bench serve` result (no duration/completed/request_throughput)",
                           where=str(path), hint="pass the file written by `vllm bench serve --save-result`")
    return objs


def _num(d: dict[str, Any], *keys: str) -> float:
    for k in keys:
        v = d.get(k)
        if v is None:
            continue
        try:
            return float(v)
        except (TypeError, ValueError):
            continue
    return math.nan


def _detailed_records(d: dict[str, Any]) -> list[RequestRecord] | None:
    ttfts, latencies, itls = d.get("ttfts"), d.get("latencies"), d.get("itls")
    if not ttfts or latencies is None or itls is None:
        return None
    n = len(ttfts)
    starts = d.get("start_times") or [0.0] * n
    in_lens = d.get("input_lens") or [0] * n
    out_lens = d.get("output_lens") or [None] * n
    errors = d.get("errors") or [""] * n
    recs = []
    for i in range(n):
        st = float(starts[i] or 0.0)
        ok = not errors[i] and (out_lens[i] is None or out_lens[i] > 0) and ttfts[i] and ttfts[i] > 0
        chunks: list[float] = []
        if ok:
            t = st + float(ttfts[i])
            chunks.append(t)
            for gap in itls[i] or []:
                t += float(gap)
                chunks.append(t)
        recs.append(RequestRecord(start_s=st, chunk_times_s=chunks,
                                  end_s=st + float(latencies[i] or 0.0), input_tokens=int(in_lens[i] or 0),
                                  output_tokens=None if out_lens[i] is None else int(out_lens[i]),
                                  success=bool(ok), error=errors[i] or None, request_id=i))
    return recs


def _vllm_keys(metric: str, stat: str) -> tuple[str, ...]:
    """The keys vLLM may hold one statistic under (`p90_ttft_ms`, or `p90.0_ttft_ms` from
    releases that did not round the percentile's name); none for min and max, which it does not write."""
    if stat in ("min", "max"):
        return ()
    if stat == "median":
        return (f"median_{metric}_ms", f"p50_{metric}_ms")
    if stat.startswith("p") and "." not in stat:
        return (f"{stat}_{metric}_ms", f"{stat}.0_{metric}_ms")
    return (f"{stat}_{metric}_ms",)


def result_row(d: dict[str, Any], source: str = "vllm bench serve") -> dict[str, Any]:
    """One levels-table row from one result object."""
    rate = d.get("request_rate")
    rate_f = math.inf if rate in (None, "inf", "Infinity") else float(rate)
    max_conc = d.get("max_concurrency")
    if math.isfinite(rate_f):
        mode, conc, req_rate = "rate", (int(max_conc) if max_conc else None), rate_f
    else:
        # rate inf without a cap sends every prompt at once: the concurrency is the prompt count
        mode, conc, req_rate = "concurrency", int(max_conc or d.get("num_prompts") or 0) or None, None
    duration = _num(d, "duration")
    row: dict[str, Any] = {"mode": mode, "concurrency": conc, "request_rate": req_rate}
    recs = _detailed_records(d)
    if recs is not None:
        m = level_metrics(recs)
        if not math.isnan(duration):
            # vLLM's own benchmark duration, so throughputs match what the file reports
            m["duration_s"] = duration
            for key, num in (("request_throughput_rps", m["n_completed"]),
                             ("output_throughput_tok_s", m["total_output_tokens"]),
                             ("total_throughput_tok_s", m["total_input_tokens"] + m["total_output_tokens"])):
                m[key] = num / duration if duration else math.nan
            done = [r for r in recs if r.success and r.chunk_times_s]
            m["littles_concurrency"] = sum(r.chunk_times_s[-1] - r.start_s for r in done) / duration
        row.update(m)
        if d.get("start_times") is None:
            row["peak_output_tok_s_1s"] = _num(d, "max_output_tokens_per_s")
    else:
        completed = _num(d, "completed")
        failed = _num(d, "failed")
        row.update({
            "n_completed": completed, "n_failed": failed,
            "n_requests": completed + (0 if math.isnan(failed) else failed),
            "duration_s": duration,
            "request_throughput_rps": _num(d, "request_throughput"),
            "output_throughput_tok_s": _num(d, "output_throughput"),
            "total_throughput_tok_s": _num(d, "total_token_throughput", "total_throughput"),
            "peak_output_tok_s_1s": _num(d, "max_output_tokens_per_s"),
        })
        for metric in LATENCY_METRICS:
            for stat in latency_stat_names():
                row[f"{metric}_ms_{stat}"] = _num(d, *_vllm_keys(metric, stat))
        lat = d.get("latencies")
        if lat and duration:
            row["littles_concurrency"] = sum(float(x) for x in lat) / duration
        elif duration:
            row["littles_concurrency"] = row["e2el_ms_mean"] * completed / 1e3 / duration
    row.update({"client_cpu_pct": math.nan, "client_bound": False, "server_running_max": math.nan,
                "server_waiting_max": math.nan, "kv_cache_usage_max": math.nan, "complete": True,
                "source": source})
    row["level"] = (f"c{conc:04d}" if mode == "concurrency" and conc else f"r{req_rate:g}" if req_rate
                    else "unknown")
    return row


IMPORTED_CSV = "imported_vllm_bench.csv"


def import_vllm_results(paths: Iterable[str | Path], base_dir: str | Path = REPO_ROOT,
                        out_dir: str | Path | None = None) -> pd.DataFrame:
    """Levels table (LEVEL_COLUMNS) from `--save-result` files (relative to `base_dir`); with `out_dir` a
    non-empty table is saved there as IMPORTED_CSV."""
    df = _import_table(paths, base_dir)
    if out_dir is not None and len(df):
        from stepscope import schema

        schema.write_table(df, Path(out_dir) / IMPORTED_CSV, schema.LevelRow)
    return df


def _import_table(paths: Iterable[str | Path], base_dir: str | Path) -> pd.DataFrame:
    rows = []
    for p in paths:
        p = Path(p) if Path(p).is_absolute() else Path(base_dir) / p
        if not p.is_file():
            raise ResultImportError("file not found", where=str(p))
        for d in _load_objects(p):
            rows.append(result_row(d, source=f"vllm bench serve: {p.name}"))
    if not rows:
        return pd.DataFrame(columns=LEVEL_COLUMNS)
    df = pd.DataFrame(rows)
    for col in LEVEL_COLUMNS:
        if col not in df:
            df[col] = math.nan
    return df[LEVEL_COLUMNS].sort_values(["mode", "concurrency", "request_rate"]).reset_index(drop=True)
