"""Stage 01's sweep: load levels against the live server, persisted level by level.

A level's meta file is written last, so its presence means the level finished; --resume keeps finished levels
whose `level_identity` matches.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd
import psutil
import yaml
from stepscope import progress

from stepscope import schema
from stepscope import server_metrics as sm
from stepscope.config import SweepParams
from stepscope.errors import ServerError, StepscopeError
from stepscope.redaction import dumps as scrubbed_json, scrub_plain
from stepscope.runfolder import atomic_open, read_json, write_json
from stepscope.schema.sweep import SweepPlan
from stepscope.sweep import client as cl
from stepscope.thresholds import BUNCHED_FLAG_SHARE
from stepscope.sweep.metrics import (DEFAULT_PERCENTILES, RequestRecord, failures_table, latency_columns,
                                     level_metrics)
from stepscope.sweep.goodput import GOODPUT_COLUMNS, goodput_metrics, slo_flags, slo_summary
from stepscope.sweep.stalls import stall_metrics
from stepscope.sweep import console as sweep_console, exports, gpu_telemetry
from stepscope.sweep import slo_search as ss
from stepscope.sweep import workloads as wl
from stepscope.thresholds import STALL_GAP_S

CLIENT_BOUND_CPU_PCT = 80.0
"""The client is one asyncio thread: near one full core it may be the bottleneck."""

METRICS_POLL_S = 1.0
"""/metrics polling period during a level, s: a scrape costs the API process tens of ms, about 4 % of it at 1
s on the 2-core demo."""

def level_columns(percentiles: Iterable[float] = DEFAULT_PERCENTILES) -> list[str]:
    """levels.csv's columns, in order; the latency statistics follow `sweep.percentiles`."""
    return [
        "level", "mode", "concurrency", "request_rate", "n_requests", "n_completed", "n_failed",
        "duration_s", "request_throughput_rps", "output_throughput_tok_s", "total_throughput_tok_s",
        "total_input_tokens", "total_output_tokens", "output_tok_s_per_user",
        *GOODPUT_COLUMNS, *latency_columns(percentiles),
        "littles_concurrency", "peak_output_tok_s_1s", "bunched_chunk_share", "merged_token_share",
        "stall_count", "stall_total_s", "stall_max_s", "stall_share",
        "n_timed_out", "silent_s", "silence_health",
        *wl.WORKLOAD_COLUMNS, *gpu_telemetry.LEVEL_COLUMNS,
        "client_cpu_pct", "client_bound",
        "server_running_max", "server_waiting_max", "kv_cache_usage_max", "complete", "source", "slo_search",
    ]


LEVEL_COLUMNS = level_columns()
"""The columns under the default `sweep.percentiles`."""


@dataclass(frozen=True)
class Level:
    mode: str
    """`concurrency` (closed loop) or `rate` (open loop, Poisson)."""
    concurrency: int | None
    request_rate: float | None
    n_requests: int
    label: str | None = None
    """The name of a level that is neither one concurrency nor one rate (a ramp)."""

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        if self.mode == "concurrency":
            return f"c{self.concurrency:04d}"
        return f"r{self.request_rate:g}"


def level_at(mode: str, load: float, params: SweepParams) -> Level:
    """One closed-loop level (`load` = concurrency C: max(4 C, min_requests) requests) or
    open-loop one (`load` = req/s: max(4 x ceil(rate), min_requests, rate x min_level_duration_s))."""
    if mode == "concurrency":
        return Level("concurrency", int(load), None, max(4 * int(load), params.min_requests))
    return Level("rate", None, load, max(4 * math.ceil(load), params.min_requests,
                                         math.ceil(load * params.min_level_duration_s)))


def plan_levels(params: SweepParams) -> list[Level]:
    """The planned levels: every concurrency, every rate (`level_at`), then the ramp."""
    levels = [level_at("concurrency", c, params) for c in params.concurrency]
    levels += [level_at("rate", r, params) for r in params.request_rates]
    if params.ramp is not None:  # vLLM's --ramp-up-strategy, as one more open-loop level
        r = params.ramp
        levels.append(Level("ramp", None, None, r.n_requests,
                            label=f"ramp-{r.strategy[:3]}-{r.start_rps:g}-{r.end_rps:g}"))
    return levels


@dataclass
class SweepResult:
    levels: pd.DataFrame
    """One row per level, columns LEVEL_COLUMNS."""
    summary: dict[str, Any]
    failures: pd.DataFrame
    """level, request_id, http_status, error."""
    out_dir: Path
    messages: list[str] = field(default_factory=list)

    def overview(self) -> pd.DataFrame:
        """The levels table's headline columns, for display."""
        cols = ["level", "n_completed", "n_failed", "output_throughput_tok_s", "request_throughput_rps",
                "ttft_ms_median", "ttft_ms_p99", "tpot_ms_median", "tpot_ms_p99", "itl_ms_p99",
                "littles_concurrency", "peak_output_tok_s_1s", "client_cpu_pct", "server_running_max",
                "server_waiting_max", "kv_cache_usage_max"]
        # goodput beside throughput, and the workload's reading, only where measured
        cols[4:4] = [c for c in ("goodput_tok_s", "slo_met_share", "prefix_cache_hit_rate")
                     if c in self.levels and self.levels[c].notna().any()]
        if "slo_search" in self.levels and self.levels["slo_search"].fillna(False).astype(bool).any():
            cols.insert(1, "slo_search")  # which rows the SLO search added
        return self.levels[cols].set_index("level").round(2)

    def raise_if_died(self) -> None:
        """After the results are shown and saved, fail the stage if the server died or if
        not one request completed (a setting the server refuses, e.g. a prompt too long)."""
        if self.summary.get("timed_out_at_level"):  # the liveness watchdog's finding comes first
            raise ServerError(self.summary["died_message"], where=str(self.out_dir), hint=cl.SILENCE_HINT)
        if len(self.levels) and int(self.levels["n_completed"].sum()) == 0:
            first = self.failures["error"].iloc[0] if len(self.failures) else "no error recorded"
            raise ServerError(f"every request of the sweep failed; the first error: {first}",
                              where=str(self.out_dir / "summary.json"),
                              hint="check sweep.input_len + sweep.output_len against the server's "
                                   "max model length, and the served model name")
        if self.summary.get("died_at_level"):
            raise ServerError(self.summary["died_message"], where=str(self.out_dir),
                              hint="see 00_deploy/server.log for why the server stopped; "
                                   "levels measured before it are kept")


def level_identity(level: Level, params: SweepParams, server: cl.ServerInfo, seed: int) -> dict[str, Any]:
    """Everything that changes what a level measures: its load settings and the server it ran against (engine,
    version, argv, env). --resume keeps a level only when all of it matches."""
    return {"mode": level.mode, "concurrency": level.concurrency, "request_rate": level.request_rate,
            "n_requests": level.n_requests, "served_model": server.served_model,
            "input_len": params.input_len, "output_len": params.output_len,
            "warmup_requests": params.warmup_requests, "prompt_mode": params.prompt_mode,
            "min_level_duration_s": params.min_level_duration_s,
            "request_timeout_s": params.request_timeout_s, "seed": seed, "server": server.launch,
            **wl.load_shape_identity(params)}


LEVEL_FILE_SUFFIXES = (".meta.json", ".warmup.jsonl", ".partial.jsonl", ".jsonl")
"""A level's files; the longer suffixes first, so that `c0004.warmup.jsonl` is c0004's."""
PLAN_FILE = "plan.json"


def write_plan(out_dir: Path, planned: list[Level], search: list[Level]) -> None:
    """plan.json (schema.SweepPlan): the planned levels, then the SLO search's. The search adds
    each of its levels here before measuring it, so a --resume after any point keeps it."""
    rows = [{"name": lv.name, "mode": lv.mode, "concurrency": lv.concurrency, "request_rate": lv.request_rate,
             "n_requests": lv.n_requests, "slo_search": lv in search} for lv in [*planned, *search]]
    schema.write(out_dir / PLAN_FILE, {"levels": rows}, SweepPlan)


def recorded_search_levels(out_dir: Path) -> list[Level]:
    """The SLO search's levels in an earlier run's plan.json, in the order it chose them."""
    path = out_dir / PLAN_FILE
    if not path.is_file():
        return []
    plan = schema.read(path, SweepPlan)
    return [Level(p.mode, p.concurrency, p.request_rate, p.n_requests) for p in plan.levels if p.slo_search]


def _finished_same(d: Path, name: str, identity: dict[str, Any]) -> bool:
    """A finished level on disk whose recorded settings are `identity`."""
    meta = d / f"{name}.meta.json"
    if not meta.is_file():
        return False
    old = read_json(meta)
    return old.get("settings") == identity and bool(old.get("complete")) and (d / f"{name}.jsonl").is_file()


def remove_level(out_dir: Path, name: str) -> None:
    for sfx in LEVEL_FILE_SUFFIXES:
        (levels_dir(out_dir) / f"{name}{sfx}").unlink(missing_ok=True)


def keep_or_clear_levels(out_dir: Path, identities: dict[str, dict[str, Any]], resume: bool) -> list[str]:
    """Levels on disk this sweep keeps (under --resume: finished, planned, same identity), in plan order;
    every other level's files are removed so nothing stale reaches levels.csv."""
    d = levels_dir(out_dir)
    kept = [name for name, identity in identities.items() if resume and _finished_same(d, name, identity)]
    for f in d.iterdir():
        name = next((f.name[: -len(sfx)] for sfx in LEVEL_FILE_SUFFIXES if f.name.endswith(sfx)), None)
        if name is not None and name not in kept:
            f.unlink()
    return kept


def levels_dir(out_dir: str | Path) -> Path:
    d = Path(out_dir) / "levels"
    d.mkdir(parents=True, exist_ok=True)
    return d


def write_level(out_dir: Path, level: Level, records: list[RequestRecord], meta: dict[str, Any]) -> None:
    """The level's measured records, its warm-ups in a file of their own (none: no file), then
    its meta, which marks the level finished."""
    d = levels_dir(out_dir)
    warm = [r for r in records if r.warmup]
    for path, recs in ((d / f"{level.name}.jsonl", [r for r in records if not r.warmup]),
                       (d / f"{level.name}.warmup.jsonl", warm)):
        if path.name.endswith(".warmup.jsonl") and not warm:
            path.unlink(missing_ok=True)
            continue
        with atomic_open(path) as fh:
            for r in recs:
                fh.write(scrubbed_json(r.to_dict()) + "\n")
    write_json(d / f"{level.name}.meta.json", scrub_plain(meta))
    partial_path(out_dir, level).unlink(missing_ok=True)


def read_level_records(path: str | Path) -> list[RequestRecord]:
    with open(path) as fh:
        return [RequestRecord.from_dict(json.loads(line)) for line in fh if line.strip()]


def level_row(meta: dict[str, Any], records: list[RequestRecord], slo: Any = None,
              percentiles: Iterable[float] = DEFAULT_PERCENTILES) -> dict[str, Any]:
    """One levels.csv row: the level's metrics (latency `percentiles`) plus its client and
    server health; goodput and the shares meeting each bound when `slo` (SloParams) sets any."""
    m = level_metrics(records, percentiles)
    m.update(stall_metrics(records, m["duration_s"]))
    m.update(goodput_metrics(records, slo, m["duration_s"]))
    done = [r for r in records if not r.warmup and r.success and r.chunk_times_s]
    m.update(wl.workload_columns(meta, np.array([r.input_tokens for r in done]),
                                 np.array([r.output_tokens or len(r.chunk_times_s) for r in done])))
    m.update(gpu_telemetry.level_columns(meta))
    snaps = meta.get("server_metrics") or []

    def smax(key: str) -> float:
        vals = [s[key] for s in snaps if key in s]
        return float(max(vals)) if vals else math.nan

    row = {"level": meta["level"], "mode": meta["mode"], "concurrency": meta.get("concurrency"),
           "request_rate": meta.get("request_rate"), **m,
           "client_cpu_pct": meta.get("client_cpu_pct", math.nan),
           "client_bound": bool(meta.get("client_cpu_pct", 0) >= CLIENT_BOUND_CPU_PCT),
           "server_running_max": smax("running"), "server_waiting_max": smax("waiting"),
           "kv_cache_usage_max": smax("kv_cache_usage"), "complete": bool(meta.get("complete", True)),
           "source": meta.get("source", "stepscope"), "n_timed_out": int(meta.get("n_timed_out") or 0),
           "silent_s": (meta.get("silence") or {}).get("silent_s"),
           "silence_health": (meta.get("silence") or {}).get("state"),
           "slo_search": bool(meta.get("slo_search", False))}
    return row


def levels_table(out_dir: str | Path, slo: Any = None,
                 percentiles: Iterable[float] = DEFAULT_PERCENTILES) -> pd.DataFrame:
    """Rebuild the per-level table from `levels/*.jsonl` + meta on disk (goodput under `slo`)."""
    rows = [level_row(meta, records, slo, percentiles) for meta, records in finished_levels(out_dir)]
    return _order(pd.DataFrame(rows, columns=level_columns(percentiles)))


def finished_levels(out_dir: str | Path) -> list[tuple[dict[str, Any], list[RequestRecord]]]:
    """(meta, records) of every finished level on disk, in name order: the measured records,
    and in a run folder from before warm-ups had their own file its flagged warm-ups too."""
    out = []
    for meta_path in sorted(levels_dir(out_dir).glob("*.meta.json")):
        meta = read_json(meta_path)
        jsonl = meta_path.with_name(meta["level"] + ".jsonl")
        if jsonl.is_file():
            out.append((meta, read_level_records(jsonl)))
    return out


def level_warmups(out_dir: str | Path) -> dict[str, list[RequestRecord]]:
    """{level: its warm-up records} from `levels/<level>.warmup.jsonl`, for the levels that sent any."""
    d = Path(out_dir) / "levels"
    return {p.name.removesuffix(".warmup.jsonl"): read_level_records(p) for p in sorted(d.glob("*.warmup.jsonl"))}


def _order(df: pd.DataFrame) -> pd.DataFrame:
    if df.empty:
        return df
    df = df.assign(_m=(df["mode"] != "concurrency").astype(int))
    return df.sort_values(["_m", "concurrency", "request_rate"]).drop(columns="_m").reset_index(drop=True)


# --------------------------------------------------------------------------- saturation



MERGED_FLAG_SHARE = 0.05
"""Flag a level when more than this share of its output tokens shared a chunk with another."""


def find_knee(levels: pd.DataFrame, knee_gain: float = 0.10) -> dict[str, Any]:
    """Knee and plateau of the closed-loop levels.

    Gain per doubling is (T2/T1)^(1/log2(C2/C1)) - 1, so uneven steps compare fairly. The knee is the first C
    from which no higher level gains `knee_gain` per doubling (a plateau, not a dip); the plateau is the best
    output tok/s from the knee on.
    """
    c = levels[(levels["mode"] == "concurrency") & levels["complete"]].sort_values("concurrency")
    c = c[c["n_completed"] > 0]
    out = {"knee_concurrency": None, "plateau_output_tok_s": None, "gains_per_doubling": {}}
    if len(c) < 2:
        return out
    conc = c["concurrency"].to_numpy(dtype=float)
    tput = c["output_throughput_tok_s"].to_numpy(dtype=float)

    def gain(i: int, j: int) -> float:
        if tput[i] <= 0:
            return math.inf
        return (tput[j] / tput[i]) ** (1.0 / math.log2(conc[j] / conc[i])) - 1.0

    for i in range(len(c) - 1):
        out["gains_per_doubling"][int(conc[i])] = gain(i, i + 1)
        if out["knee_concurrency"] is None and max(gain(i, j) for j in range(i + 1, len(c))) < knee_gain:
            out["knee_concurrency"] = int(conc[i])
            out["plateau_output_tok_s"] = float(np.max(tput[i:]))
    return out


def summarize(levels: pd.DataFrame, failures: pd.DataFrame, knee_gain: float,
              died: tuple[str, str] | None = None) -> dict[str, Any]:
    """summary.json: knee, plateau, batch-1 latency, failures and data-quality flags."""
    knee = find_knee(levels, knee_gain)
    c1 = levels[(levels["mode"] == "concurrency") & (levels["concurrency"] == 1)]
    flags: list[str] = []
    if not len(levels):
        flags.append("no load level was measured: sweep.concurrency and sweep.request_rates are both empty")
    if knee["knee_concurrency"] is None and len(levels):
        flags.append(f"no knee: output tok/s still grows by >= {knee_gain:.0%} per doubling of concurrency "
                     "beyond every level; the plateau was not reached, extend sweep.concurrency")
    for _, r in levels[levels["client_bound"]].iterrows():
        flags.append(f"level {r['level']}: client used {r['client_cpu_pct']:.0f} % of a core; "
                     "the client may be the bottleneck")
    if "bunched_chunk_share" in levels:
        for _, r in levels[levels["bunched_chunk_share"] > BUNCHED_FLAG_SHARE].iterrows():
            flags.append(f"level {r['level']}: {r['bunched_chunk_share']:.0%} of token chunks arrived together "
                         "with the previous one: the server delivered output in bursts (e.g. its API process "
                         "starved of CPU), so TPOT/ITL here measure delivery, not decode")
    if "merged_token_share" in levels:
        for _, r in levels[levels["merged_token_share"] > MERGED_FLAG_SHARE].iterrows():
            flags.append(f"level {r['level']}: {r['merged_token_share']:.0%} of output tokens arrived merged "
                         "into another token's chunk (vLLM coalesces outputs when its API process falls "
                         "behind), so ITL here is pooled over fewer, longer gaps; TPOT is unaffected")
    if "stall_count" in levels:
        for _, r in levels[levels["stall_count"] > 0].iterrows():
            flags.append(f"level {r['level']}: {int(r['stall_count'])} server-wide stall(s), {r['stall_total_s']:.2f} s "
                         f"in all (longest {r['stall_max_s']:.2f} s, {r['stall_share']:.0%} of the level's "
                         f"{r['duration_s']:.1f} s): every open stream was silent at once for over "
                         f"{STALL_GAP_S:g} s, so throughput here is low by up to that share; "
                         "sweep.min_level_duration_s makes one stall weigh less")
    for _, r in levels[levels["n_failed"] > 0].iterrows():
        flags.append(f"level {r['level']}: {int(r['n_failed'])} of {int(r['n_requests'])} requests failed")
    if died:
        flags.append(died[1])
    return {
        "knee_concurrency": knee["knee_concurrency"],
        "plateau_output_tok_s": knee["plateau_output_tok_s"],
        "knee_gain": knee_gain,
        "gains_per_doubling": knee["gains_per_doubling"],
        "c1_ttft_ms_median": float(c1["ttft_ms_median"].iloc[0]) if len(c1) else None,
        "c1_tpot_ms_median": float(c1["tpot_ms_median"].iloc[0]) if len(c1) else None,
        "n_levels": int(len(levels)),
        "died_at_level": died[0] if died else None,
        "died_message": died[1] if died else None,
        "timed_out_at_level": next(iter(levels.loc[levels["n_timed_out"].fillna(0) > 0, "level"]), None)
        if "n_timed_out" in levels else None,
        "failures": failures.head(50).to_dict(orient="records"),
        "n_failures": int(len(failures)),
        "flags": flags,
    }


# --------------------------------------------------------------------------- the sweep


def partial_path(out_dir: Path, level: Level) -> Path:
    """Measured requests of a level still running, one JSON line each as it finishes."""
    return levels_dir(out_dir) / f"{level.name}.partial.jsonl"


async def _run_level(server: cl.ServerInfo, level: Level, params: SweepParams,
                     pool: list[int], seed: int, partial: Path,
                     tokenizer=None) -> tuple[list[RequestRecord], dict[str, Any]]:
    url = server.url("/v1/completions")
    n_warm = params.warmup_requests
    if n_warm and level.mode == "concurrency":
        # One full wave at least, so every batch size the level runs has been formed once
        # before measuring: an engine that builds kernels, graphs or buffers per batch size
        # on first use (eager mode, lazily compiled shapes) pays for it in the warm-up.
        n_warm = max(n_warm, level.concurrency)
    source = wl.make_source(params, pool, server.served_model, seed=seed, tokenizer=tokenizer)
    payloads = source.payloads(n_warm + level.n_requests)
    limit = level.concurrency if level.mode == "concurrency" else level.n_requests
    proc = psutil.Process()
    snaps: list[dict[str, float]] = []
    silence = cl.Silence(params.silence_timeout_s)  # liveness watchdog over every open stream
    async with cl.make_session(server, limit) as session, \
            cl.make_session(server, 2) as side:  # /metrics polling must not take a load slot
        watchdog = asyncio.create_task(silence.watch(side, server, f"level {level.name}"))
        warm: list[RequestRecord] = []
        if n_warm:
            with silence.warming_up():
                warm = await cl.closed_loop(session, url, payloads[:n_warm], concurrency=limit,
                                            timeout_s=params.request_timeout_s,
                                            input_len=params.input_len, warmup=True, silence=silence)
        rows: list[dict[str, Any]] = []  # server_metrics.csv: every scrape, all its series
        t_level = time.perf_counter()
        await _scrape(side, server, rows, snaps, level.name, t_level)

        stop = asyncio.Event()

        async def poll() -> None:
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), timeout=METRICS_POLL_S)
                except asyncio.TimeoutError:
                    await _scrape(side, server, rows, snaps, level.name, t_level)

        bar = progress.bar(total=level.n_requests, desc=f"level {level.name}", leave=False)
        silence.show = bar.set_postfix_str
        poller = asyncio.create_task(poll())
        gpu = gpu_telemetry.Sampler(level.name, enabled=params.gpu_telemetry)  # NVML, when present
        cpu0, wall0 = proc.cpu_times(), time.perf_counter()
        measured = payloads[n_warm:]
        # An interrupted level (Ctrl-C, a killed kernel) keeps its finished requests here.
        with open(partial, "w") as keep:

            def done(r: RequestRecord) -> None:
                keep.write(scrubbed_json(r.to_dict()) + "\n")
                keep.flush()
                bar.update(1)

            if level.mode == "concurrency":
                more = source.next_payload if params.min_level_duration_s else None
                recs = await cl.closed_loop(session, url, measured, concurrency=level.concurrency,
                                            timeout_s=params.request_timeout_s, input_len=params.input_len,
                                            on_done=done, more=more, silence=silence,
                                            min_duration_s=params.min_level_duration_s)
            else:
                recs = await cl.open_loop(session, url, measured, rate_rps=level.request_rate,
                                          timeout_s=params.request_timeout_s, input_len=params.input_len,
                                          seed=seed, on_done=done, burstiness=params.burstiness, silence=silence,
                                          offsets_s=wl.level_offsets_s(level, params, source, n_warm,
                                                                       len(measured), seed))
        cpu1, wall1, gpu_rows = proc.cpu_times(), time.perf_counter(), gpu.stop()
        stop.set()
        await poller
        watchdog.cancel()
        bar.close()
        await _scrape(side, server, rows, snaps, level.name, t_level)
        alive = not silence.tripped
        if alive and any(not r.success for r in recs):
            alive = await cl.is_alive(side, server)
    cpu_pct = 100.0 * ((cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)) / max(wall1 - wall0, 1e-9)
    meta = {"level": level.name, "mode": level.mode, "concurrency": level.concurrency,
            "request_rate": level.request_rate, "n_requests": len(recs),
            "client_cpu_pct": cpu_pct, "server_metrics": snaps, "server_samples": rows, "complete": alive,
            "gpu_samples": gpu_rows, "silence": silence.verdict, "n_timed_out": silence.timed_out(warm + recs),
            "server_alive_after": alive, "source": "stepscope"}
    return warm + recs, meta


async def _scrape(session, server: cl.ServerInfo, rows: list[dict[str, Any]], snaps: list[dict[str, float]],
                  level: str, t0: float, phase: str = "measure") -> None:
    """One /metrics read into `rows` (server_metrics.csv) and `snaps` (levels.csv's snapshot); neither when
    /metrics cannot be read (missing, never guessed)."""
    t = time.perf_counter()
    text = await cl.metrics_text(session, server)
    if text is None:
        return
    row = sm.scrape_row(text, level=level, phase=phase, t_start=t, t_end=time.perf_counter(), t0=t0,
                        n_bytes=len(text))
    rows.append(row)
    snap = cl.parse_prometheus_gauges(text)
    snap["t_s"] = t
    snaps.append(snap)


def run_sweep(server: cl.ServerInfo, params: SweepParams, out_dir: str | Path, *,
              resume: bool = False, seed: int = 0) -> SweepResult:
    """Measure every level of `params` against `server` and write the stage's artifacts.

    If the server dies the sweep stops at that level and `summary.json` names it (call `raise_if_died`). With
    `resume`, finished levels of the same identity are kept (`reused_levels`); `sweep.slo_search` levels
    follow the planned ones.
    """
    out_dir = Path(out_dir)
    plan = plan_levels(params)
    identities = {lv.name: level_identity(lv, params, server, seed + i) for i, lv in enumerate(plan)}
    recorded = recorded_search_levels(out_dir) if resume and params.slo_search is not None else []
    for k, lv in enumerate(recorded):  # the seeds the search gave them (search_seed)
        identities.setdefault(lv.name, level_identity(lv, params, server, seed + len(plan) + k))
    m = _Measurer(server, params, out_dir, keep_or_clear_levels(out_dir, identities, resume), n_planned=len(plan))
    write_plan(out_dir, plan, [lv for lv in recorded if lv.name in m.reused and lv.name not in
                               {p.name for p in plan}])
    died, search = None, None
    try:
        for i, level in enumerate(progress.bar(plan, desc="sweep levels")):
            died = m.measure(level, identities[level.name], seed + i)
            if died:
                break
        if died is None and params.slo_search is not None:
            search, died = _search(m, plan, recorded, seed)
    except Exception as exc:
        # what was measured reaches levels.csv and summary.json before the error goes on
        finish(out_dir, params.knee_gain, messages=m.messages, slo=params.slo, reused=m.reused,
               percentiles=params.percentiles)
        exc.add_note(f"the sweep stopped there; its {m.n_done} finished level(s) are in {out_dir / 'levels.csv'}")
        raise
    return finish(out_dir, params.knee_gain, died=died, messages=m.messages, slo=params.slo,
                  reused=m.reused, search=search, percentiles=params.percentiles)


@dataclass
class _Measurer:
    """Measures one level at a time for run_sweep, the token pool and tokenizer fetched once."""

    server: cl.ServerInfo
    params: SweepParams
    out_dir: Path
    reused: list[str]
    messages: list[str] = field(default_factory=list)
    n_done: int = 0
    n_planned: int = 0
    pool: list[int] | None = None
    tokenizer: Any = None

    def measure(self, level: Level, settings: dict[str, Any], seed: int,
                search: bool = False) -> tuple[str, str] | None:
        """Measure `level` unless --resume kept it; (level, message) when the server died there."""
        params, out_dir = self.params, self.out_dir
        if level.name in self.reused:
            self.messages.append(f"level {level.name}: already measured with the same settings and server, "
                                 "kept (--resume)")
            self.n_done += 1
            progress.event(f"  level {level.name} [{self.n_done}/{self.n_planned}]: kept from the earlier run (--resume)")
            return None
        if self.pool is None:
            self.pool = cl.run_sync(_tokens(self.server))
            self.tokenizer = (cl.local_tokenizer(self.server)
                              if params.prompt_mode in ("random_text", "sharegpt") else None)
        partial = partial_path(out_dir, level)
        try:
            records, meta = cl.run_sync(_run_level(self.server, level, params, self.pool, seed, partial,
                                                   self.tokenizer))
        except Exception as exc:
            exc.add_note(f"during sweep level {level.name} ({level.mode} "
                         f"{level.concurrency or level.request_rate or level.label})")
            raise
        except (KeyboardInterrupt, asyncio.CancelledError):
            n_kept = len(partial.read_text().splitlines()) if partial.is_file() else 0
            finish(out_dir, params.knee_gain, messages=self.messages, slo=params.slo, reused=self.reused,
                   percentiles=params.percentiles)
            progress.write(f"sweep interrupted during level {level.name}: its {n_kept} finished requests are "
                           f"in {partial}; the {self.n_done} earlier level(s) are complete and in levels.csv. "
                           "Run again with --resume to keep them and measure the rest.", file=sys.stderr)
            raise
        meta["settings"], meta["slo_search"] = settings, search
        write_level(out_dir, level, records, meta)
        i, self.n_done = self.n_done, self.n_done + 1
        tag = "SLO search" if search else f"{self.n_done}/{self.n_planned}"
        progress.event(sweep_console.level_line(level_row(meta, records, params.slo, params.percentiles), tag))
        if meta["complete"]:
            return None
        n_fail = sum(1 for r in records if not r.success and not r.warmup)
        died = (level.name, f"the server stopped answering during level {level.name} "
                            f"({level.mode} {level.concurrency or level.request_rate}); "
                            f"{n_fail} requests failed there; the sweep stopped, "
                            f"{i} earlier level(s) are kept")
        if meta.get("silence"):  # the liveness watchdog ended it: say what it found
            died = (level.name, f"level {level.name}: {meta['silence']['message']}; the sweep stopped, "
                                f"{i} earlier level(s) are kept")
        self.messages.append(died[1])
        return died


def _search(m: _Measurer, plan: list[Level], recorded: list[Level],
            seed: int) -> tuple[dict[str, Any], tuple[str, str] | None]:
    """The SLO search after the planned levels: each step reads only the planned levels and its own earlier
    ones (a kept level not reached yet must not steer it), records its level in plan.json, then measures or
    keeps it. Returns summary.json's `slo_search`."""
    p, out_dir, budget = m.params, m.out_dir, m.params.slo_search.max_extra_levels
    planned = {lv.name for lv in plan}
    chosen: list[Level] = []
    stopped: dict[str, str] = {}
    died = None
    for mode in ss.SEARCH_MODES:
        while died is None:
            table = levels_table(out_dir, p.slo)
            view = table[table["level"].isin(planned | {c.name for c in chosen})]
            if not (view["mode"] == mode).any():
                break
            load, why = ss.next_load(view, p.slo, p.slo_search, mode)
            if load is not None and len(chosen) >= budget:
                load, why = None, f"its budget of {budget} extra level(s) (sweep.slo_search.max_extra_levels) was spent"
            if load is None:
                stopped[mode] = why
                break
            lv, k = level_at(mode, load, p), len(chosen)
            settings = level_identity(lv, p, m.server, seed + len(plan) + k)
            if lv.name in m.reused and not _finished_same(levels_dir(out_dir), lv.name, settings):
                m.reused.remove(lv.name)  # kept for another step of an earlier search: not this one
                remove_level(out_dir, lv.name)
            chosen.append(lv)
            write_plan(out_dir, plan, chosen + [r for r in recorded if r.name in m.reused and r not in chosen])
            died = m.measure(lv, settings, seed + len(plan) + k, search=True)
    names = [c.name for c in chosen]
    for r in recorded:  # an earlier search's level this one did not choose is not part of the plan
        if r.name not in names and r.name not in planned:
            remove_level(out_dir, r.name)
            if r.name in m.reused:
                m.reused.remove(r.name)
    write_plan(out_dir, plan, chosen)
    table = levels_table(out_dir, p.slo)
    out: dict[str, Any] = {"max_extra_levels": budget, "levels": names,
                           "reused": [n for n in names if n in m.reused]}
    for mode, why in stopped.items():
        out[mode] = ss.mode_summary(table[table["level"].isin(planned)], table, p.slo,
                                    [c.name for c in chosen if c.mode == mode], why, mode)
        got, g = out[mode], (lambda x: "none" if x is None else f"{x:g}")
        m.messages.append(f"SLO search ({mode}): {len(got['levels'])} extra level(s) {', '.join(got['levels'])}; "
                          f"boundary {g(got['boundary_load'])}, first miss {g(got['first_miss_load'])}; "
                          f"stopped: {why}")
    return out, died


async def _tokens(server: cl.ServerInfo) -> list[int]:
    async with cl.make_session(server, 1) as s:
        return await cl.token_pool(s, server)


def finish(out_dir: str | Path, knee_gain: float, *, died: tuple[str, str] | None = None,
           messages: list[str] | None = None, slo: Any = None,
           reused: list[str] | None = None, search: dict[str, Any] | None = None,
           percentiles: Iterable[float] = DEFAULT_PERCENTILES) -> SweepResult:
    """Tables from what is on disk: levels.csv, failures, summary.json (goodput and SLO boundary when `slo`
    sets a bound), and the exports."""
    out_dir = Path(out_dir)
    levels = levels_table(out_dir, slo, percentiles)
    done = finished_levels(out_dir)
    fails = [failures_table(records).assign(level=meta["level"]) for meta, records in done]
    failures = (pd.concat(fails, ignore_index=True) if fails
                else pd.DataFrame(columns=["request_id", "http_status", "error", "level"]))
    failures = failures[["level", "request_id", "http_status", "error"]]
    if died is None and len(levels) and not levels["complete"].all():
        bad = levels.loc[~levels["complete"], "level"].iloc[0]
        died = (bad, f"the server stopped answering during level {bad}; later levels were not measured")
    summary = summarize(levels, failures, knee_gain, died)
    summary["slo"] = slo_summary(levels, slo)
    summary["flags"] += slo_flags(summary["slo"]) + gpu_telemetry.level_flags(levels)
    gpu_telemetry.write_artifacts(out_dir, [read_json(p) for p in sorted(levels_dir(out_dir).glob("*.meta.json"))])
    summary["reused_levels"] = list(reused or [])
    summary["slo_search"] = search
    write_server_metrics(out_dir)
    schema.write_table(levels, out_dir / "levels.csv", schema.LevelRow)
    schema.write(out_dir / "summary.json", summary, schema.SweepSummary)
    exports.write_exports(out_dir, levels, done, percentiles, warmups=level_warmups(out_dir))
    return SweepResult(levels=levels, summary=summary, failures=failures, out_dir=out_dir,
                       messages=list(messages or []))


def export_run(run_dir: str | Path, out_dir: str | Path | None = None,
               formats: Iterable[str] = exports.FORMATS) -> dict[str, Path]:
    """Stage 01's exports written again from a run folder's records (for folders older than them), into
    `out_dir` (default its 01_macro_sweep/)."""
    sweep = Path(run_dir) / "01_macro_sweep"
    if not any((sweep / "levels").glob("*.meta.json")):  # not levels_dir: it would create the folder
        raise StepscopeError("no sweep levels to export", where=str(sweep / "levels"),
                             hint="pass a run folder whose stage 01 ran (stepscope run PARAMS --stages 01)")
    pct = _run_percentiles(Path(run_dir))
    out = Path(out_dir) if out_dir is not None else sweep
    out.mkdir(parents=True, exist_ok=True)
    return exports.write_exports(out, levels_table(sweep, None, pct), finished_levels(sweep), pct, formats,
                                 level_warmups(sweep))


def _run_percentiles(run_dir: Path) -> tuple[float, ...]:
    """`sweep.percentiles` of the run's params snapshot; the default where it has none (older runs)."""
    try:
        params = yaml.safe_load((run_dir / "params.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return DEFAULT_PERCENTILES
    got = ((params.get("sweep") or {}) if isinstance(params, dict) else {}).get("percentiles")
    return tuple(float(p) for p in got) if isinstance(got, list) and got else DEFAULT_PERCENTILES


def write_server_metrics(out_dir: Path) -> pd.DataFrame:
    """server_metrics.csv (every /metrics scrape of every level, in level order) and
    server_metrics.json (the interval, a scrape's cost, the series the server lacks)."""
    metas = [read_json(p) for p in sorted(levels_dir(out_dir).glob("*.meta.json"))]
    table = sm.samples_table(metas)
    schema.write_table(table, out_dir / "server_metrics.csv", schema.ServerMetricsRow)
    schema.write(out_dir / "server_metrics.json", sm.samples_info(table, METRICS_POLL_S),
                 schema.ServerMetricsInfo)
    return table
