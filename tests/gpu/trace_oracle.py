"""An independent pass over a Kineto trace: device work per vLLM step, by plain JSON.

It shares no code with `stepscope.trace` (no pandas, no loader, no categories) so that
the two can check each other: a device event (kernel, memcpy, memset) belongs to the
step annotation that encloses its launch (the runtime event with the same correlation
id) on the launching thread. A CUDA-graph launch is one runtime event whose correlation
all the graph's kernels carry.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

DEVICE = {"kernel", "gpu_memcpy", "gpu_memset"}
LAUNCH = {"cuda_runtime", "cuda_driver"}
VLLM_STEP = re.compile(r"^execute_.*context_\d+\(.*\)_generation_\d+\(.*\)$")
GRAPH_LAUNCH = re.compile(r"^(cuda|hip)GraphLaunch")


@dataclass
class OracleStep:
    name: str
    ts: float
    dur: float
    n_events: int = 0
    dur_sum_us: float = 0.0
    n_graph_events: int = 0
    """Device events whose launch was a graph launch inside this step."""
    kernel_names: list[str] = field(default_factory=list)


@dataclass
class OracleResult:
    steps: list[OracleStep]
    n_device_events: int
    dur_sum_us: float
    unattributed: int


def read_events(path: str | Path) -> list[dict]:
    p = Path(path)
    opener = gzip.open if p.name.endswith(".gz") else open
    with opener(p, "rt") as fh:
        data = json.load(fh)
    return data["traceEvents"] if isinstance(data, dict) else data


def attribute(events: list[dict]) -> OracleResult:
    """Count and sum the device events of each vLLM step annotation (ordered by start)."""
    complete = [e for e in events if e.get("ph") == "X"]
    steps_by_thread: dict[tuple, list[OracleStep]] = {}
    for e in complete:
        if e.get("cat") == "user_annotation" and VLLM_STEP.match(str(e.get("name", ""))):
            s = OracleStep(str(e["name"]), float(e["ts"]), float(e["dur"]))
            steps_by_thread.setdefault((e["pid"], e["tid"]), []).append(s)
    for lst in steps_by_thread.values():
        lst.sort(key=lambda s: s.ts)
    launches: dict[int, dict] = {}
    for e in complete:
        corr = (e.get("args") or {}).get("correlation")
        if e.get("cat") in LAUNCH and corr is not None and corr not in launches:
            launches[corr] = e
    n = 0
    total = 0.0
    unattributed = 0
    for e in complete:
        if e.get("cat") not in DEVICE:
            continue
        n += 1
        total += float(e["dur"])
        launch = launches.get((e.get("args") or {}).get("correlation"))
        step = _enclosing(steps_by_thread.get((launch["pid"], launch["tid"]), []), float(launch["ts"])) \
            if launch else None
        if step is None:
            unattributed += 1
            continue
        step.n_events += 1
        step.dur_sum_us += float(e["dur"])
        step.kernel_names.append(str(e.get("name")))
        if GRAPH_LAUNCH.match(str(launch.get("name", ""))):
            step.n_graph_events += 1
    ordered = sorted((s for lst in steps_by_thread.values() for s in lst), key=lambda s: s.ts)
    return OracleResult(ordered, n, total, unattributed)


def _enclosing(steps: list[OracleStep], t: float) -> OracleStep | None:
    i = bisect.bisect_right([s.ts for s in steps], t) - 1
    if i >= 0 and t <= steps[i].ts + steps[i].dur:
        return steps[i]
    return None
