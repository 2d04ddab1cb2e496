"""Categorized Chrome/Perfetto traces, for looking at a step by eye.

Events are named `[category] name`, steps get a track, and `MERGED_NAME` holds every rank clock-aligned as
stage 05 aligns them; docs/trace-analysis.md#opening-the-traces-in-perfetto.
"""

from __future__ import annotations

import gzip
import http.server
import threading
from pathlib import Path

import msgspec
import numpy as np

from stepscope.runfolder import atomic_path

MAX_EVENTS = 200_000
"""Above this, only the representative decode step and two steps either side are written:
the file is for looking at a step by eye, and the UI slows down past a few 100k events."""
MERGED_NAME = "ranks.merged.json.gz"
"""The merged file's name in `05_categorize/perfetto/`."""
UI_URL = "https://ui.perfetto.dev"
UI_PORT = 9001
"""The one local port Perfetto's UI fetches traces from (its `?url=` deep link, as Perfetto's
own `open_trace_in_ui` serves a file)."""


def _kept(r, focus_step: int | None):
    w = r.work
    if len(w) > MAX_EVENTS and focus_step is not None:
        ids = r.steps_tot["step_id"].to_numpy()
        hit = np.flatnonzero(ids == focus_step)
        pos = int(hit[0]) if len(hit) else len(ids) // 2
        keep = ids[max(0, pos - 2):pos + 3]
        w = w[w["step_id"].isin(keep)]
    return w


def rank_events(r, *, t0_us: float, offset_us: float = 0.0, focus_step: int | None = None) -> list[dict]:
    """One rank's events as one process (pid = rank): work per stream or thread, steps on a
    track of their own; times are `start_us + offset_us - t0_us`."""
    w = _kept(r, focus_step)
    pid = int(r.rank)
    streams = sorted(int(x) for x in w["stream"].unique()) if len(w) else []
    tid_of = {s: i + 1 for i, s in enumerate(streams)}
    step_tid = len(streams) + 1
    label = "stream" if r.mode == "gpu" else "thread"
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
         "args": {"name": f"rank {r.rank} ({r.mode}, categorized by stepscope)"}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": step_tid, "args": {"name": "steps (work span)"}},
    ]
    for s_, t in tid_of.items():
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": t, "args": {"name": f"{label} {s_}"}})
    shift = offset_us - t0_us
    cols = zip(w["category"].to_numpy(object).tolist(), w["name"].to_numpy(object).tolist(),
               w["stream"].to_numpy().tolist(), (w["start_us"].to_numpy() + shift).tolist(),
               w["dur_us"].to_numpy().tolist(), w["class"].to_numpy(object).tolist(),
               w["step_id"].to_numpy().tolist())
    for cat, name, stream, ts, dur, klass, step in cols:
        events.append({"ph": "X", "cat": cat, "name": f"[{cat}] {name}", "pid": pid,
                       "tid": tid_of[int(stream)], "ts": ts, "dur": dur,
                       "args": {"category": cat, "class": klass, "step_id": step}})
    kept = set(w["step_id"].unique()) if len(w) else set()
    for row in r.steps_tot.itertuples(index=False):
        if row.n_events == 0 or row.step_id not in kept:
            continue
        events.append({"ph": "X", "cat": "step", "name": f"step {row.step_id} {row.label}",
                       "pid": pid, "tid": step_tid, "ts": row.first_start_us + shift, "dur": row.span_us,
                       "args": {"annotation": row.name, "label": row.label,
                                "busy_us": row.busy_us, "kernel_sum_us": row.kernel_sum_us}})
    return events


def _write(events: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = msgspec.json.encode({"traceEvents": events, "displayTimeUnit": "ms"})
    with atomic_path(path) as tmp, gzip.open(tmp, "wb", compresslevel=3) as fh:  # exclusive temp name
        fh.write(data)
    return path


def _start_us(r, focus_step: int | None) -> float:
    w = _kept(r, focus_step)
    return float(w["start_us"].min()) if len(w) else 0.0


def export_perfetto(r, path: str | Path, *, focus_step: int | None = None) -> Path:
    """One rank's categorized trace, its first kept event at 0."""
    return _write(rank_events(r, t0_us=_start_us(r, focus_step), focus_step=focus_step), Path(path))


def origin_offsets_us(ranks) -> dict[int, float]:
    """{rank: its trace origin minus the reference (first) rank's}, µs: the shift stage 05's
    cross-rank matching applies (`trace.analyze`), 0 where a rank has no origin."""
    origin0 = ranks[0].info.get("origin_us") if ranks else None
    return {r.rank: (float(r.info["origin_us"]) - float(origin0)
                     if r.info.get("origin_us") is not None and origin0 is not None else 0.0) for r in ranks}


def export_merged(ranks, path: str | Path, *, focus_step: int | None = None) -> Path:
    """Every rank in one file, one process each, on the reference rank's clock (its first kept
    event at 0). A rank over `MAX_EVENTS` keeps only the steps around `focus_step`."""
    offsets = origin_offsets_us(ranks)
    t0 = min((_start_us(r, focus_step) + offsets[r.rank] for r in ranks), default=0.0)
    events = [e for r in ranks for e in rank_events(r, t0_us=t0, offset_us=offsets[r.rank], focus_step=focus_step)]
    return _write(events, Path(path))


def readme_text(ranks, focus_step: int | None, step_label: str = "decode step") -> str:
    """How to open the files, and which step to look at: the representative one (the report's
    timeline), with where it starts in the merged file."""
    lines = ["# Categorized traces for Perfetto", "",
             f"Open {UI_URL} and choose *Open trace file* (or drag a file onto the page). `{MERGED_NAME}` holds "
             "every rank, one process each, on one clock (each rank shifted by its trace origin against the "
             "reference rank's, as stage 05 matches collectives): skew between ranks shows as offsets between "
             "the processes. `rank<N>.categorized.json.gz` hold one rank each. Every event is named "
             "`[category] name`; steps are on the track `steps (work span)`.", ""]
    if focus_step is not None and ranks:
        ref = ranks[0]
        st = ref.steps_tot[ref.steps_tot["step_id"] == focus_step]
        offsets = origin_offsets_us(ranks)
        t0 = min(_start_us(r, focus_step) + offsets[r.rank] for r in ranks)
        at = f", starting {(float(st['first_start_us'].iloc[0]) - t0) / 1000:,.3f} ms into the merged file" if len(st) else ""
        lines += [f"Look at step {focus_step} (the representative {step_label} of rank {ref.rank}: the one the "
                  f"report's timeline draws){at}. Type `step {focus_step} ` in the search box to find it.", ""]
    return "\n".join(lines)


def serve_for_ui(path: str | Path, host: str = "127.0.0.1", port: int = UI_PORT,
                 origin: str = UI_URL) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve one file to Perfetto's UI (loopback, only that file, CORS for the UI's origin) in a
    daemon thread; return the server (its caller shuts it down) and the UI's deep link."""
    path = Path(path)

    class OneFile(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path.lstrip("/") != path.name:
                self.send_error(404)
                return
            body = path.read_bytes()
            self.send_response(200)
            self.send_header("Access-Control-Allow-Origin", origin)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # the lab's console is not this server's log
            pass

    server = http.server.ThreadingHTTPServer((host, port), OneFile)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"{origin}/#!/?url=http://{host}:{server.server_address[1]}/{path.name}"


def write_perfetto_files(ranks, reference, focus_step: int | None, out_dir: str | Path, *,
                         big: bool = False, step_label: str = "decode step") -> list[Path]:
    """Stage 05's `perfetto/` folder: a file per rank (only the reference rank's for a big
    capture, around `focus_step`), the merged file of every rank, and its README."""
    out = Path(out_dir)
    written = [export_perfetto(r, out / f"rank{r.rank}.categorized.json.gz",
                               focus_step=focus_step if r is reference else None)
               for r in ([reference] if big else ranks)]
    ordered = [reference] + [r for r in ranks if r is not reference]  # the reference rank's clock
    written.append(export_merged(ordered, out / MERGED_NAME, focus_step=focus_step))
    readme = out / "README.md"
    with atomic_path(readme) as tmp:
        tmp.write_text(readme_text(ordered, focus_step, step_label))
    return written + [readme]
