"""Stage 04 under load: a bounded profile of the server while C requests are in flight.

For each `capture.concurrency` level C > 1, keep C of the sweep's requests in flight, wait until all are past
their first token, and profile a bounded window the engine stops by itself (else `/stop_profile` ends a timed
one; `load_window.json` says which). Method: docs/methods.md#the-step-under-load; `c<C>/`'s files:
docs/artifacts.md.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from stepscope import schema
from stepscope import server_metrics as sm
from stepscope.capture import (CaptureError, _await_extra_files, _copy_captured, _listing, _profile_call,
                               classify, prepare_dirs, wait_for_traces)
from stepscope.config import CaptureParams, SweepParams
from stepscope.sweep import client as cl
from stepscope.sweep import gpu_telemetry
from stepscope.redaction import dumps as scrubbed_json

METRICS_INTERVAL_S = 1.0
"""/metrics scrapes during a load level: a window of a few steps lasts seconds here."""


def level_dir_name(concurrency: int) -> str:
    return f"c{concurrency}"


def load_levels(capture: CaptureParams) -> list[int]:
    """The load levels stage 04 profiles beyond batch 1, in order, each once."""
    return sorted({int(c) for c in capture.concurrency if int(c) > 1})


def load_body(engine: str, capture: CaptureParams, profiler_dir: str | None) -> tuple[dict[str, Any], str]:
    """(the `/start_profile` body of a bounded window, how the engine is asked to bound it)."""
    if engine == "sglang":
        body: dict[str, Any] = {"num_steps": capture.load_steps, "activities": ["CPU", "GPU"],
                                "with_stack": False, "record_shapes": False}
        if profiler_dir:
            body["output_dir"] = profiler_dir
        return body, "num_steps"
    return {"delay_iterations": capture.load_delay_steps, "max_iterations": capture.load_steps}, "max_iterations"


class _Load:
    """C closed-loop workers of the sweep's client, and who is past the first token."""

    def __init__(self, server: cl.ServerInfo, sweep: SweepParams, concurrency: int, source, session):
        self.server, self.sweep, self.c, self.source, self.session = server, sweep, concurrency, source, session
        self.url = server.url("/v1/completions")
        self.stop = asyncio.Event()
        self.records: list = []
        self.in_flight: set[int] = set()
        self.first: set[int] = set()
        self.ids = itertools.count()

    async def worker(self, k: int) -> None:
        # Worker k's first request asks for (k+1)/C of the output length: requests then end at
        # staggered steps, as on a server under steady load, not all together in waves (which
        # would leave the window all decode steps, or all prefills).
        n_out = max(1, round(self.sweep.output_len * (k + 1) / self.c))
        while not self.stop.is_set():
            i = next(self.ids)
            self.in_flight.add(i)
            payload = cl.completion_payload(self.server.served_model, self.source.next(), n_out)
            n_out = self.sweep.output_len
            rec = await cl.stream_request(self.session, self.url, payload, timeout_s=self.sweep.request_timeout_s,
                                          request_id=i, input_len=self.sweep.input_len,
                                          on_first_chunk=self.first.add)
            self.in_flight.discard(i)
            self.records.append(rec)

    def steady(self) -> bool:
        """Past the first wave (C requests done: the engine has run this batch size before) and
        every request in flight past its first token."""
        return (len(self.records) >= self.c and len(self.in_flight) == self.c
                and self.in_flight <= self.first)


async def _poll_metrics(side, server, rows: list, level: str, t0: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        text = await cl.metrics_text(side, server)
        if text is not None:
            rows.append(sm.scrape_row(text, level=level, phase="capture", t_start=t,
                                      t_end=time.perf_counter(), t0=t0, n_bytes=len(text)))
        try:
            await asyncio.wait_for(stop.wait(), timeout=METRICS_INTERVAL_S)
        except asyncio.TimeoutError:
            pass


def _new_traces(pdir: Path, before: dict, engine: str) -> bool:
    return any((pf := classify(n, engine)) is not None and pf.kind == "trace"
               for n, v in _listing(pdir).items() if before.get(n) != v)


async def _window(load: _Load, side, server, pdir: Path, body: dict, capture: CaptureParams) -> dict:
    """Start the bounded profile once the load is steady; end it by the engine or by time."""
    deadline = time.monotonic() + capture.wait_timeout_s
    while not load.steady():
        if time.monotonic() > deadline:
            raise CaptureError(f"the {load.c} requests were not all past their first token after a first "
                               f"wave within "
                               f"{capture.wait_timeout_s:g} s", where=server.url("/v1/completions"),
                               hint="raise capture.wait_timeout_s, or lower capture.concurrency")
        await asyncio.sleep(0.005)  # a new prefill arrives every few steps: look often
    before = _listing(pdir)
    started_at = datetime.now(timezone.utc).isoformat()
    t_start = time.perf_counter()
    status, text = await _profile_call(side, server, "/start_profile", body, str(pdir))
    if status != 200:
        raise CaptureError(f"/start_profile answered HTTP {status}: {text[:300]}", where=server.url("/start_profile"),
                           hint="see the server log; a capture may already be running (POST /stop_profile)")
    t_open = time.perf_counter()
    self_stopped = False
    gpu = gpu_telemetry.Sampler(f"capture-c{load.c:04d}", enabled=load.sweep.gpu_telemetry)
    try:
        while time.perf_counter() - t_open < capture.load_window_s:
            if _new_traces(pdir, before, server.engine):
                self_stopped = True
                break
            await asyncio.sleep(0.1)
        t_stop = time.perf_counter()
        stop_status, stop_text = await _profile_call(side, server, "/stop_profile", None, str(pdir))
    finally:
        gpu_samples = gpu.stop()
    return {"before": before, "started_at": started_at, "t_start": t_start, "t_open": t_open, "t_stop": t_stop,
            "self_stopped": self_stopped, "stop_status": stop_status, "stop_text": stop_text[:300],
            "gpu_samples": gpu_samples}


async def _level_async(server: cl.ServerInfo, capture: CaptureParams, sweep: SweepParams, c: int,
                       pdir: Path, body: dict) -> dict:
    async with cl.make_session(server, c) as session, cl.make_session(server, 2) as side:
        pool = await cl.token_pool(side, server)
        tok = cl.local_tokenizer(server) if sweep.prompt_mode == "random_text" else None
        source = cl.PromptSource(sweep.prompt_mode, pool, sweep.input_len, seed=1000 + c, tokenizer=tok)
        load = _Load(server, sweep, c, source, session)
        rows: list[dict] = []
        stop_poll = asyncio.Event()
        poller = asyncio.create_task(_poll_metrics(side, server, rows, f"capture-c{c:04d}",
                                                   time.perf_counter(), stop_poll))
        workers = [asyncio.create_task(load.worker(k)) for k in range(c)]
        try:
            win = await _window(load, side, server, pdir, body, capture)
        finally:
            load.stop.set()
            done, pending = await asyncio.wait(workers, timeout=sweep.request_timeout_s)
            for t in pending:
                t.cancel()
            stop_poll.set()
            await poller
    return {**win, "records": load.records, "metrics_rows": rows}


def window_client_metrics(records: list, t0: float, t1: float, concurrency: int) -> dict:
    """The client's view of exactly [t0, t1] (perf_counter s): chunks in it, requests overlapping it, chunks
    per second (a floor: a chunk can carry several tokens)."""
    chunks = sum(1 for r in records for t in r.chunk_times_s if t0 <= t <= t1)
    overlapping = [r for r in records if r.start_s <= t1 and (r.end_s or t1) >= t0]
    span = t1 - t0
    return {"concurrency": concurrency, "window_s": span, "token_chunks": chunks,
            "capture_output_tok_s": chunks / span if span > 0 else None,
            "requests_overlapping": len(overlapping),
            "requests_failed": sum(1 for r in overlapping if not r.success)}


def capture_load_level(server: cl.ServerInfo, capture: CaptureParams, sweep: SweepParams, c: int,
                       stage_dir: str | Path, *, profiler_settings: dict[str, Any] | None = None) -> dict:
    """Profile one load level into `<stage_dir>/c<C>/`; its load_window.json as a dict."""
    out_dir = Path(stage_dir) / level_dir_name(c)
    pdir_s, pdir, attach, traces_dir = prepare_dirs(server, capture, out_dir)
    body, method = load_body(server.engine, capture, pdir_s if server.engine == "sglang" else None)
    run = cl.run_sync(_level_async(server, capture, sweep, c, pdir, body))
    with open(out_dir / "capture_requests.jsonl", "w") as fh:  # measured results on disk first
        for r in run["records"]:
            fh.write(scrubbed_json(r.to_dict()) + "\n")
    schema.write_table(pd.DataFrame(run["metrics_rows"], columns=[*schema.columns(schema.ServerMetricsRow),
                                                                   "scrape_bytes"]),
                       out_dir / "server_metrics.csv", schema.ServerMetricsRow)
    gpu_telemetry.write_artifacts(out_dir, [{"gpu_samples": run["gpu_samples"]}])
    notes: list[str] = []
    if not run["self_stopped"]:
        notes.append(f"no trace appeared within capture.load_window_s = {capture.load_window_s:g} s of "
                     f"/start_profile: the engine did not stop after {method} by itself, so /stop_profile "
                     "ended a timed window")
    # From the /start_profile request, not its answer: a starved API process can answer after
    # the engine has already run (and written) the whole bounded window.
    window = {**window_client_metrics(run["records"], run["t_start"], run["t_stop"], c),
              "window_method": method if run["self_stopped"] else "timed", "start_profile_body": body,
              "load_steps": capture.load_steps, "started_at": run["started_at"],
              "stop_status": run["stop_status"], "notes": notes}
    complete, content_ranks, wait_notes = wait_for_traces(pdir, run["before"], engine=server.engine, tp=server.tp,
                                                          timeout_s=capture.wait_timeout_s)
    notes += wait_notes
    if not complete:
        raise CaptureError(f"no complete trace of load level c={c} appeared within {capture.wait_timeout_s:g} s",
                           where=str(pdir), hint="raise capture.wait_timeout_s or check the server log")
    extra = _await_extra_files(pdir, run["before"], complete, server.engine)
    files = _copy_captured(pdir, sorted(complete) + sorted(extra), content_ranks, server.engine, out_dir,
                           traces_dir, notes)
    ranks_found = sorted({f["rank"] for f in files if f["kind"] == "trace" and f["rank"] is not None})
    missing = [r for r in range(server.tp) if r not in ranks_found]
    manifest = {"engine": server.engine, "engine_version": server.engine_version, "base_url": server.base_url,
                "profiler_dir": pdir_s, "profiler_dir_source": "capture.profiler_dir" if attach else "server.json",
                "profiler_settings": profiler_settings or {}, "start_profile_body": body, "tp": server.tp,
                "ranks_expected": list(range(server.tp)), "ranks_found": ranks_found, "missing_ranks": missing,
                "partial": bool(missing), "input_len": sweep.input_len, "output_len": sweep.output_len,
                "started_at": run["started_at"], "stopped_at": datetime.now(timezone.utc).isoformat(),
                "notes": notes, "files": files}
    schema.write(out_dir / "manifest.json", manifest, schema.CaptureManifest)
    schema.write(out_dir / "load_window.json", window, schema.LoadWindow)
    from stepscope import progress

    progress.event(capture_level_line(window, ranks_found, server.tp))
    return window


def capture_level_line(window: dict[str, Any], ranks_found: list[int], tp: int) -> str:
    """One profiled load level in a line, as the sweep prints each level: its window and how it
    was bounded, the client's token chunks over it, failures, the ranks' traces and notes."""
    from stepscope.wording import fmt_num

    missing = [r for r in range(tp) if r not in ranks_found]
    rate = window.get("capture_output_tok_s")
    notes = window.get("notes") or []
    return (f"  capture c={window['concurrency']}: {fmt_num(1e3 * window['window_s'])} ms window "
            f"({window['window_method']}), {window['token_chunks']} token chunks"
            + (f" ({fmt_num(rate)} /s under the profiler)" if rate is not None else "")
            + f", {window['requests_overlapping']} requests in flight, {window['requests_failed']} failed; "
            f"traces of {len(ranks_found)} of {tp} rank(s)" + (f", missing {missing}" if missing else "")
            + (f"; {len(notes)} note(s) in load_window.json" if notes else ""))


def capture_load_levels(server: cl.ServerInfo, capture: CaptureParams, sweep: SweepParams,
                        stage_dir: str | Path, *, profiler_settings: dict[str, Any] | None = None) -> pd.DataFrame:
    """Every load level of `capture.concurrency` (beyond 1), one row each: how its window was
    bounded and the client's throughput over it. Empty when the list holds only 1."""
    rows = [capture_load_level(server, capture, sweep, c, stage_dir, profiler_settings=profiler_settings)
            for c in load_levels(capture)]
    cols = ["concurrency", "window_method", "window_s", "token_chunks", "capture_output_tok_s",
            "requests_overlapping", "requests_failed"]
    return pd.DataFrame(rows, columns=cols).set_index("concurrency") if rows else pd.DataFrame(columns=cols)
