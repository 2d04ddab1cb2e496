"""A categorized Chrome/Perfetto trace of one rank, for looking at a step by eye.

Each work event is named `[category] name` and carries category, class and step in its
args; steps are drawn on their own track. Opens in https://ui.perfetto.dev.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import msgspec


def export_perfetto(r, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = r.work
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
    for row in w.itertuples(index=False):
        events.append({"ph": "X", "cat": row.category, "name": f"[{row.category}] {row.name}",
                       "pid": pid, "tid": tid_of[int(row.stream)], "ts": row.start_us - t0,
                       "dur": row.dur_us,
                       "args": {"category": row.category, "class": row[4],
                                "step_id": int(row.step_id)}})
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
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wb", compresslevel=3) as fh:
        fh.write(data)
    tmp.replace(path)
    return path
