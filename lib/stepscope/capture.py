"""Stage 04: a torch.profiler capture of the live server at batch 1.

Warm-up, `POST /start_profile`, K sequential batch-1 requests timed client-side, `POST /stop_profile`, then
wait until every rank's new trace is complete (docs/methods.md#profiler-capture). Only files that appeared or
changed after the capture started count. Artifacts: docs/artifacts.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import shutil
import time
import zlib
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import aiohttp
import pandas as pd
from stepscope import progress

from stepscope import schema
from stepscope.config import CaptureParams
from stepscope.errors import ServerError, StepscopeError
from stepscope.filenames import ProfilerFile, parse_name
from stepscope.runfolder import atomic_open, atomic_path
from stepscope.sweep import client as cl
from stepscope.sweep import gpu_telemetry
from stepscope.sweep.metrics import RequestRecord, level_metrics, request_table
from stepscope.server_metrics import METRICS_SCRAPES, save_scrape
from stepscope.thresholds import STALL_GAP_S
from stepscope.sweep.stalls import stall_metrics
from stepscope.wording import capture_delivery


log = logging.getLogger(__name__)

class CaptureError(StepscopeError):
    """A profiler capture that cannot start or finish."""


# --------------------------------------------------------------------------- file names


def classify(name: str, engine: str = "vllm") -> ProfilerFile | None:
    """What a file in the profiler directory is, from its name alone (None: not ours), through the one parser
    stage 05 uses too (`stepscope.filenames.parse_name`), so both agree on its rank."""
    del engine
    pf = parse_name(name)
    return pf if pf.kind is not None else None


def start_profile_body(engine: str, capture: CaptureParams, profiler_dir: str | None) -> dict[str, Any] | None:
    """The JSON body of `POST /start_profile`: none for vLLM (`--profiler-config`); SGLang's output folder and
    `num_steps`, one per output token of each captured request."""
    if engine != "sglang":
        return None
    body: dict[str, Any] = {
        "num_steps": capture.requests * capture.output_len,
        "activities": ["CPU", "GPU"],
        "with_stack": False,
        "record_shapes": False,
    }
    if profiler_dir:
        body["output_dir"] = profiler_dir
    return body


def enable_hint(engine: str, profiler_dir: str | None) -> str:
    d = profiler_dir or "/abs/path/to/traces"
    if engine == "sglang":
        return (f"start SGLang with the environment variable SGLANG_TORCH_PROFILER_DIR={d} "
                "(stepscope's launch mode sets it when server.profiler.enabled is true)")
    cfg = json.dumps({"profiler": "torch", "torch_profiler_dir": d, "torch_profiler_with_stack": False})
    return (f"start vLLM with --profiler-config '{cfg}' (stepscope's launch mode adds it when "
            "server.profiler.enabled is true; VLLM_TORCH_PROFILER_DIR no longer works in vLLM >= 0.16)")


# --------------------------------------------------------------------------- the directory


def _listing(d: Path) -> dict[str, tuple[int, int]]:
    """name -> (size, mtime_ns) of the regular files directly in d."""
    out = {}
    try:
        for e in os.scandir(d):
            if e.is_file():
                st = e.stat()
                out[e.name] = (st.st_size, st.st_mtime_ns)
    except FileNotFoundError:
        pass
    return out


def describe_dir(d: Path, since_ns: int | None = None) -> str:
    """A listing for error messages: each file with its size and whether it is new."""
    if not d.exists():
        return f"{d} does not exist"
    files = sorted(_listing(d).items())
    if not files:
        return f"{d} is empty"
    lines = [f"{d} holds {len(files)} file(s):"]
    for name, (size, mtime) in files[:40]:
        age = "" if since_ns is None else (" (new)" if mtime >= since_ns else " (older than this capture)")
        lines.append(f"  {name}  {size:,} B{age}")
    if len(files) > 40:
        lines.append(f"  ... and {len(files) - 40} more")
    return "\n".join(lines)


def check_writable(d: Path) -> None:
    """Create the folder and a probe file in it, or say plainly that it is not writable."""
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / f".stepscope_probe_{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise CaptureError(f"the profiler directory is not writable: {exc.strerror or exc}", where=str(d),
                           hint="point server.profiler.dir (launch) or capture.profiler_dir (attach) at a "
                                "folder the server can write") from None


_HEAD_RANK = re.compile(rb'"distributedInfo"\s*:\s*\{[^}]*"rank"\s*:\s*(\d+)')


def gzip_complete(path: Path) -> tuple[bool, int | None]:
    """(the gzip stream ends and decompresses cleanly, distributedInfo.rank if seen near the top)."""
    try:
        import isal.isal_zlib as z  # about 2x faster when installed
    except ImportError:
        z = zlib
    d = z.decompressobj(16 + z.MAX_WBITS)
    head = b""
    rank = None
    try:
        with open(path, "rb") as fh:
            while True:
                block = fh.read(1 << 22)
                if not block:
                    break
                out = d.decompress(block)
                if len(head) < (1 << 20):
                    head += out[: (1 << 20) - len(head)]
                if d.eof:
                    break
    except (z.error, OSError):
        return False, None
    m = _HEAD_RANK.search(head)
    if m:
        rank = int(m.group(1))
    return bool(d.eof), rank


def json_complete(path: Path) -> bool:
    with open(path, "rb") as fh:
        fh.seek(max(0, path.stat().st_size - 64))
        return fh.read().rstrip().endswith(b"}")


@dataclass
class _Seen:
    size: int
    stable_polls: int = 0
    complete: bool = False
    checked: bool = False
    content_rank: int | None = None


def wait_for_traces(profiler_dir: Path, before: dict[str, tuple[int, int]], *, engine: str, tp: int,
                    timeout_s: float, poll_s: float = 0.5, stable_polls: int = 2
                    ) -> tuple[dict[str, ProfilerFile], dict[str, int | None], list[str]]:
    """Wait until every rank 0..tp-1 has a complete new trace, or the timeout: (new files by name, rank from
    each trace's distributedInfo, notes). Files unchanged since before the capture are ignored."""
    deadline = time.monotonic() + timeout_s
    seen: dict[str, _Seen] = {}
    notes: list[str] = []
    bar = progress.bar(total=tp, desc="rank traces complete", leave=False)
    try:
        while True:
            now_list = _listing(profiler_dir)
            new = {n: v for n, v in now_list.items() if before.get(n) != v}
            for name, (size, _) in new.items():
                pf = classify(name, engine)
                if pf is None or pf.kind != "trace":
                    continue
                s = seen.get(name)
                if s is None or s.size != size or size == 0:
                    seen[name] = _Seen(size=size)
                    continue
                if s.complete or s.checked:
                    continue  # a stable file that failed the check is re-read only if it grows
                s.stable_polls += 1
                if s.stable_polls >= stable_polls:
                    s.checked = True
                    path = profiler_dir / name
                    if name.endswith(".gz"):
                        s.complete, s.content_rank = gzip_complete(path)
                    else:
                        s.complete = json_complete(path)
            complete = {n: classify(n, engine) for n, s in seen.items() if s.complete}
            ranks = {pf.rank for pf in complete.values()}
            bar.n = len([r for r in range(tp) if r in ranks])
            bar.refresh()
            if all(r in ranks for r in range(tp)):
                break
            if time.monotonic() > deadline:
                for n, s in seen.items():
                    if not s.complete:
                        notes.append(f"{n}: incomplete after {timeout_s:g} s "
                                     f"({'gzip stream does not end' if s.stable_polls >= stable_polls else 'still growing'})")
                break
            time.sleep(poll_s)
    finally:
        bar.close()
    content_ranks = {n: seen[n].content_rank for n in complete}
    return complete, content_ranks, notes


# --------------------------------------------------------------------------- the capture


async def _profile_call(session: aiohttp.ClientSession, server: cl.ServerInfo, path: str,
                        body: dict[str, Any] | None, profiler_dir: str | None) -> tuple[int, str]:
    url = server.url(path)
    status, text = await cl.post_text(session, url, body)
    if status == 404:
        raise CaptureError(f"{path} answered 404: the server was started without a profiler", where=url,
                           hint=enable_hint(server.engine, profiler_dir))
    return status, text


async def _capture_async(server: cl.ServerInfo, capture: CaptureParams, profiler_dir: str | None,
                         body: dict[str, Any] | None) -> dict[str, Any]:
    url = server.url("/v1/completions")
    silence = cl.Silence(capture.silence_timeout_s)  # liveness watchdog: a silent server fails the capture
    async with cl.make_session(server, 1) as session, silence.watching(server, "the capture"):
        pool = await cl.token_pool(session, server)
        prompts = cl.make_prompts(pool, capture.input_len, capture.warmup_requests + capture.requests, seed=4)
        payloads = [cl.completion_payload(server.served_model, p, capture.output_len) for p in prompts]
        warm = []
        with silence.warming_up():
            for i, p in enumerate(progress.bar(payloads[: capture.warmup_requests], desc="warm-up", leave=False)):
                warm.append(await cl.stream_request(session, url, p, timeout_s=600, request_id=i, warmup=True,
                                                    input_len=capture.input_len, silence=silence))
        silence.raise_if_tripped(url)
        if warm and not any(r.success for r in warm):
            raise ServerError(f"every warm-up request failed: {warm[0].error}", where=url,
                              hint="check 00_deploy/server.log")
        before_ns = time.time_ns()
        before = _listing(Path(profiler_dir)) if profiler_dir else {}
        # the server's counters over exactly the profiled requests (the warm-up left out), so
        # that counted rates (speculative acceptance) describe the same steps as the trace
        metrics_before = await cl.metrics_text(session, server)
        started_at = datetime.now(timezone.utc).isoformat()
        status, text = await _profile_call(session, server, "/start_profile", body, profiler_dir)
        if status != 200:
            raise CaptureError(f"/start_profile answered HTTP {status}: {text[:300]}", where=server.url("/start_profile"),
                               hint="see the server log; a capture may already be running (POST /stop_profile)")
        recs: list[RequestRecord] = []
        gpu = gpu_telemetry.Sampler("capture")  # NVML through the profiled window, when present
        try:
            for i, p in enumerate(progress.bar(payloads[capture.warmup_requests:], desc="captured requests", leave=False)):
                recs.append(await cl.stream_request(session, url, p, timeout_s=600, request_id=i,
                                                    input_len=capture.input_len, silence=silence))
        finally:
            t_stop = time.perf_counter()
            if silence.tripped:  # a silent server would hold /stop_profile too: ask briefly
                stop_status, stop_text = await cl.post_briefly(session, server.url("/stop_profile"), 10.0)
            else:
                stop_status, stop_text = await _profile_call(session, server, "/stop_profile", None, profiler_dir)
            stop_s = time.perf_counter() - t_stop
            gpu_samples = gpu.stop()
        silence.raise_if_tripped(url)
        metrics_after = await cl.metrics_text(session, server)
    return {"warm": warm, "records": recs, "before": before, "before_ns": before_ns,
            "metrics": (metrics_before, metrics_after),
            "started_at": started_at, "stopped_at": datetime.now(timezone.utc).isoformat(),
            "stop_status": stop_status, "stop_text": stop_text[:300], "stop_profile_s": stop_s,
            "gpu_samples": gpu_samples}


def _write_metrics(scrapes: tuple[str | None, str | None], out_dir: Path) -> None:
    if None in scrapes:
        log.info("capture: the server's /metrics could not be read around the profiled requests")
        return
    for name, text in zip(METRICS_SCRAPES, scrapes):
        save_scrape(out_dir / name, text)


def _sha256_copy(src: Path, dst: Path) -> str:
    """Copy `src` to `dst` with its SHA-256 through a temp file renamed into place: stage 05 trusts traces/,
    so a copy cut short must leave nothing under a trace's name."""
    h = hashlib.sha256()
    with atomic_path(dst) as tmp:
        with open(src, "rb") as fi, open(tmp, "wb") as fo:
            while True:
                block = fi.read(1 << 22)
                if not block:
                    break
                h.update(block)
                fo.write(block)
        shutil.copystat(src, tmp)
    return h.hexdigest()


@dataclass
class CaptureResult:
    manifest: dict[str, Any]
    latency: dict[str, Any]
    files: pd.DataFrame
    """rank, path, bytes, sha256, kind: the manifest's file list as a table."""
    out_dir: Path
    requests: pd.DataFrame
    """The captured requests, one row each (stepscope.sweep.metrics.request_table)."""

    def overview(self) -> pd.DataFrame:
        """Batch-1 latency during the capture and the capture's completeness, as one table."""
        m, lat = self.manifest, self.latency
        typed = schema.CaptureLatency(**lat)
        rows = [("requests completed / sent", f"{lat['n_completed']} / {lat['n_requests']}"),
                ("output tokens per request", lat["output_len"]),
                ("TTFT median (ms)", round(lat["ttft_ms_median"], 3)),
                ("TPOT median (ms)", round(lat["tpot_ms_median"], 3)),
                ("TPOT mean (ms)", round(lat["tpot_ms_mean"], 3)),
                ("token chunks bunched with the previous (share)", lat.get("bunched_chunk_share")),
                (f"stream silences over {STALL_GAP_S:g} s (s, share)",
                 f"{lat.get('stall_total_s'):.2f}, {lat.get('stall_share'):.1%}"
                 if lat.get("stall_share") is not None else None),
                ("TPOT measures", f"delivery, not decode ({capture_delivery(typed)})"
                 if typed.tpot_is_delivery() else "decode"),
                ("ranks found / expected", f"{len(m['ranks_found'])} / {len(m['ranks_expected'])}"),
                ("partial capture", m["partial"]),
                ("/stop_profile took (s)", round(m["stop_profile_s"], 2)),
                ("engine", f"{m['engine']} {m['engine_version'] or ''}".strip()),
                ("profiler dir", m["profiler_dir"])]
        return pd.DataFrame(rows, columns=["quantity", "value"]).set_index("quantity")


def profiler_settings(run_dir: str | Path, params=None) -> dict[str, Any]:
    """The profiler settings the server really runs with: its `--profiler-config` from server.json, else
    SGLANG_TORCH_PROFILER_DIR, else what params asked (attach mode, which the result says)."""
    d = schema.read_if_present(Path(run_dir) / "00_deploy" / "server.json", schema.ServerRecord)
    argv = d.argv if d is not None else []
    for i, arg in enumerate(argv):
        value = None
        if arg == "--profiler-config" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--profiler-config="):
            value = arg.split("=", 1)[1]
        if value is not None:
            try:
                return {"source": "server argv --profiler-config", **json.loads(value)}
            except json.JSONDecodeError:
                return {"source": "server argv --profiler-config", "raw": value}
    env = d.env if d is not None else {}
    if env.get("SGLANG_TORCH_PROFILER_DIR"):
        return {"source": "server env", "SGLANG_TORCH_PROFILER_DIR": env["SGLANG_TORCH_PROFILER_DIR"]}
    from stepscope.config import params_to_dict

    asked = params_to_dict(params.server.profiler) if params is not None else {}
    return {"source": "params server.profiler (the server's own flags are not known here)", **asked}


def resolve_profiler_dir(server: cl.ServerInfo, capture: CaptureParams) -> tuple[str, bool]:
    """(the folder to read traces from, whether it is the user's attach-mode path)."""
    if capture.profiler_dir:
        return capture.profiler_dir, True
    if server.profiler_dir:
        return server.profiler_dir, False
    raise CaptureError("no profiler directory is known for this server",
                       where="00_deploy/server.json: profiler_dir",
                       hint="in attach mode set capture.profiler_dir to where the server's traces can be "
                            "read from here (a shared filesystem, or a folder copied by hand)")


def _write_requests_and_latency(run: dict, capture: CaptureParams, out_dir: Path) -> dict:
    """The capture's raw request records (capture_requests.jsonl) and their client-side latency
    (capture_latency.json); the latency dict."""
    with atomic_open(out_dir / "capture_requests.jsonl") as fh:  # a full disk names the file
        for r in run["warm"] + run["records"]:
            fh.write(json.dumps(r.to_dict()) + "\n")
    m = level_metrics(run["records"])
    stalls = stall_metrics(run["records"], m["duration_s"])  # as the sweep counts a level's
    latency = {
        "n_requests": m["n_requests"], "n_completed": m["n_completed"], "n_failed": m["n_failed"],
        "input_len": capture.input_len, "output_len": capture.output_len,
        **{k: m[k] for k in ("ttft_ms_mean", "ttft_ms_median", "tpot_ms_mean", "tpot_ms_median",
                             "e2el_ms_mean", "e2el_ms_median")},
        # NaN (no request with two chunks, or no usage-reported token count) is written as null.
        **{k: None if math.isnan(m[k]) else m[k] for k in ("bunched_chunk_share", "merged_token_share")},
        "stall_total_s": stalls["stall_total_s"],
        "stall_share": None if math.isnan(stalls["stall_share"]) else stalls["stall_share"],
        "definitions": "stepscope.sweep.metrics (vllm bench serve's, docs/methods.md#serving-metrics); sequential batch-1 "
                       "requests measured client-side while the profiler ran, so profiler overhead is included",
    }
    schema.write(out_dir / "capture_latency.json", latency, schema.CaptureLatency)
    return latency


def _await_extra_files(pdir: Path, before: dict, complete: dict, engine: str, grace_s: float = 10.0) -> list[str]:
    """The new files beside the traces (profiler_out tables, the front end's trace). vLLM writes
    its text tables right after the traces: wait up to `grace_s` for one per traced rank."""
    deadline = time.monotonic() + grace_s
    while True:
        new_names = [n for n, v in _listing(pdir).items() if before.get(n) != v]
        tables = [n for n in new_names if (pf := classify(n, engine)) and pf.kind == "profiler_table"]
        if engine == "sglang" or len(tables) >= len({pf.rank for pf in complete.values()}) \
                or time.monotonic() > deadline:
            return [n for n in new_names if (pf := classify(n, engine)) and pf.kind != "trace"]
        time.sleep(0.5)


def _copy_captured(pdir: Path, names: list[str], content_ranks: dict, engine: str, out_dir: Path,
                   traces_dir: Path, notes: list[str]) -> list[dict]:
    """Copy each captured file into traces/ with its SHA-256; the manifest's file entries. An earlier
    capture's traces are removed first: stage 05 reads the whole folder and would mix them. A rank
    contradicting its name keeps the trace's own, with a note."""
    for old in traces_dir.iterdir():
        if old.is_file() or old.is_symlink():
            old.unlink()
    files = []
    for name in names:
        pf = classify(name, engine)
        rank = pf.rank
        if content_ranks.get(name) is not None and content_ranks[name] != rank:
            notes.append(f"{name}: the name says rank {rank}, distributedInfo.rank says {content_ranks[name]}; "
                         "using the file's own")
            rank = content_ranks[name]
        dst = traces_dir / name
        sha = _sha256_copy(pdir / name, dst)
        files.append({"rank": rank, "path": str(dst.relative_to(out_dir)), "bytes": dst.stat().st_size,
                      "sha256": sha, "kind": pf.kind, **({"stage": pf.stage} if pf.stage else {})})
    return files


def prepare_dirs(server: cl.ServerInfo, capture: CaptureParams, out_dir: Path) -> tuple[str, Path, bool, Path]:
    """(profiler dir as the server names it, as a Path, attach, out_dir/traces), checked writable: a server
    fails silently on an unwritable profiler folder. An attached server's folder is its own."""
    pdir_s, attach = resolve_profiler_dir(server, capture)
    if not attach:
        check_writable(Path(pdir_s))
    check_writable(out_dir / "traces")
    return pdir_s, Path(pdir_s), attach, out_dir / "traces"


def capture_profile(server: cl.ServerInfo, capture: CaptureParams, out_dir: str | Path, *,
                    profiler_settings: dict[str, Any] | None = None) -> CaptureResult:
    """Run the capture sequence against `server` and write the stage's artifacts into out_dir."""
    out_dir = Path(out_dir)
    pdir_s, pdir, attach, traces_dir = prepare_dirs(server, capture, out_dir)
    body = start_profile_body(server.engine, capture, pdir_s if server.engine == "sglang" else None)

    run = cl.run_sync(_capture_async(server, capture, pdir_s, body))
    latency = _write_requests_and_latency(run, capture, out_dir)  # measured results hit disk before the wait
    _write_metrics(run["metrics"], out_dir)
    gpu_telemetry.write_artifacts(out_dir, [{"gpu_samples": run["gpu_samples"]}])

    notes: list[str] = []
    if run["stop_status"] != 200:
        notes.append(f"/stop_profile answered HTTP {run['stop_status']}: {run['stop_text']}"
                     + (" (SGLang stops by itself after num_steps)" if server.engine == "sglang" else ""))
    complete, content_ranks, wait_notes = wait_for_traces(
        pdir, run["before"], engine=server.engine, tp=server.tp, timeout_s=capture.wait_timeout_s)
    notes += wait_notes
    if not complete:
        raise CaptureError(
            f"no complete trace appeared within {capture.wait_timeout_s:g} s after /stop_profile\n"
            + describe_dir(pdir, run["before_ns"]),
            where=str(pdir),
            hint="if the server runs elsewhere, set capture.profiler_dir to where its traces are visible "
                 "from here; otherwise raise capture.wait_timeout_s or check the server log")

    extra = _await_extra_files(pdir, run["before"], complete, server.engine)
    files = _copy_captured(pdir, sorted(complete) + sorted(extra), content_ranks, server.engine, out_dir,
                           traces_dir, notes)
    ranks_found = sorted({f["rank"] for f in files if f["kind"] == "trace" and f["rank"] is not None})
    missing = [r for r in range(server.tp) if r not in ranks_found]
    if missing:
        notes.append(f"partial capture: no complete trace for rank(s) {missing} of {server.tp}")
    manifest = {
        "engine": server.engine, "engine_version": server.engine_version, "base_url": server.base_url,
        "profiler_dir": pdir_s, "profiler_dir_source": "capture.profiler_dir" if attach else "server.json",
        "profiler_settings": profiler_settings or {}, "start_profile_body": body,
        "tp": server.tp, "ranks_expected": list(range(server.tp)), "ranks_found": ranks_found,
        "missing_ranks": missing, "partial": bool(missing),
        "requests": capture.requests, "output_len": capture.output_len, "input_len": capture.input_len,
        "warmup_requests": capture.warmup_requests, "stop_profile_s": run["stop_profile_s"],
        "started_at": run["started_at"], "stopped_at": run["stopped_at"], "notes": notes, "files": files,
    }
    for note in notes:
        log.warning("capture: %s", note)
    schema.write(out_dir / "manifest.json", manifest, schema.CaptureManifest)
    return CaptureResult(manifest=manifest, latency=latency,
                         files=pd.DataFrame(files, columns=["rank", "kind", "path", "bytes", "sha256"]).astype({"rank": "Int64"}),
                         out_dir=out_dir, requests=request_table(run["records"]))
