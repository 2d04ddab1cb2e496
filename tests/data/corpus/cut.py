"""Cut a public Kineto trace into a small corpus excerpt that keeps its structure.

Kept: the metadata (everything outside `traceEvents`), every `cpu_op`, annotation, runtime
call, device event (kernel, memcpy, memset) with its args, and the `python_function` frames
that say what the trace is (`nn.Module: ...` frames, frames of a graph capture, compile or
warm-up, and vLLM's `execute_model`, a step's frame). Dropped: other `python_function` frames
(the bulk of a stack-enabled trace), `ac2g` flows and `cpu_instant_event` markers (in the 2021
format: `async` flows and `[memory]` instants). With `--until-us`, only events that start
before that many microseconds after the trace's first event are kept, so whole steps stay
whole when the cut is placed at a step's end.

Usage: python tests/data/corpus/cut.py SRC.json.gz DST.json.gz [--until-us N]
Plain json/gzip only, so the cut can be rerun without stepscope installed.
"""
from __future__ import annotations

import argparse
import gzip
import json

KEEP_FRAME_WORDS = ("nn.Module:", "capture", "cudagraph", "compile_or_warm_up", "warm_up", "warmup", "checkpoint",
                    "execute_model")  # vLLM's step frame: the step of a trace with no step annotation
DROP_CATS = {"ac2g", "cpu_instant_event",
             "async"}  # the 2021 Kineto format's flow arrows (today's `ac2g`)


def _memory_instant(e: dict) -> bool:
    # the 2021 format's memory instants: `ph: "i"`, name `[memory]`, no category (today's cpu_instant_event)
    return e.get("ph") == "i" and e.get("name") == "[memory]"


def keep(e: dict) -> bool:
    cat = e.get("cat")
    if cat in DROP_CATS or _memory_instant(e):
        return False
    if cat == "python_function":
        name = str(e.get("name", "")).lower()
        return any(w.lower() in name for w in KEEP_FRAME_WORDS)
    return True


def cut(src: str, dst: str, until_us: float | None) -> tuple[int, int]:
    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    t0 = min(float(e["ts"]) for e in events if "ts" in e and e.get("ph") == "X")
    kept = [e for e in events if keep(e)
            and (until_us is None or "ts" not in e or e.get("ph") == "M" or float(e["ts"]) - t0 < until_us)]
    doc["traceEvents"] = kept
    with gzip.open(dst, "wt", compresslevel=9) as f:
        json.dump(doc, f, separators=(",", ":"))
    return len(events), len(kept)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--until-us", type=float, default=None)
    a = ap.parse_args()
    n, k = cut(a.src, a.dst, a.until_us)
    print(f"{a.dst}: kept {k} of {n} events")
