"""A categorized Chrome/Perfetto trace of one rank, for looking at a step by eye.

Each work event is named `[category] name` and carries category, class and step in its
args; steps are drawn on their own track. Opens in https://ui.perfetto.dev.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import msgspec
import numpy as np

from stepscope.runfolder import atomic_path

MAX_EVENTS = 200_000
"""Above this, only the representative decode step and two steps either side are written:
the file is for looking at a step by eye, and the UI slows down past a few 100k events."""


def export_perfetto(r, path: str | Path, *, focus_step: int | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = r.work
    if len(w) > MAX_EVENTS and focus_step is not None:
        ids = r.steps_tot["step_id"].to_numpy()
        pos = int(np.flatnonzero(ids == focus_step)[0])
        keep = ids[max(0, pos - 2):pos + 3]
        w = w[w["step_id"].isin(keep)]
    t0 = float(w["start_us"].min()) if len(w) else 0.0
    # Integer pid/tid with name metadata: the form every Chrome-trace importer accepts.
    pid = int(r.rank)
    streams = sorted(int(x) for x in w["stream"].unique()) if len(w) else []
    tid_of = {s: i + 1 for i, s in enumerate(streams)}
    step_tid = len(streams) + 1
    label = "stream" if r.mode == "gpu" else "thread"
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
         "args": {"name": f"rank {r.rank} ({r.mode}, categorized by stepscope)"}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": step_tid,
         "args": {"name": "steps (work span)"}},
    ]
    for s_, t in tid_of.items():
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": t,
                       "args": {"name": f"{label} {s_}"}})
    cols = zip(w["category"].to_numpy(object).tolist(), w["name"].to_numpy(object).tolist(),
               w["stream"].to_numpy().tolist(), (w["start_us"].to_numpy() - t0).tolist(),
               w["dur_us"].to_numpy().tolist(), w["class"].to_numpy(object).tolist(),
               w["step_id"].to_numpy().tolist())
    for cat, name, stream, ts, dur, klass, step in cols:
        events.append({"ph": "X", "cat": cat, "name": f"[{cat}] {name}", "pid": pid,
                       "tid": tid_of[int(stream)], "ts": ts, "dur": dur,
                       "args": {"category": cat, "class": klass, "step_id": step}})
    st = r.steps_tot
    for row in st.itertuples(index=False):
        if row.n_events == 0:
            continue
        events.append({"ph": "X", "cat": "step", "name": f"step {row.step_id} {row.label}",
                       "pid": pid, "tid": step_tid, "ts": row.first_start_us - t0,
                       "dur": row.span_us,
                       "args": {"annotation": row.name, "label": row.label,
                                "busy_us": row.busy_us, "kernel_sum_us": row.kernel_sum_us}})
    data = msgspec.json.encode({"traceEvents": events, "displayTimeUnit": "ms"})
    with atomic_path(path) as tmp, gzip.open(tmp, "wb", compresslevel=3) as fh:  # exclusive temp name
        fh.write(data)
    return path
