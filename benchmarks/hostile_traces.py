"""Hostile traces through the whole of `stepscope analyze`: time, peak RSS, exit code and message.

    .venv/bin/python benchmarks/hostile_traces.py [--only NAME ...] [--keep DIR]

Each trace is generated here (nothing is downloaded), written as .json.gz piece by piece so a
large one is never held whole, and analysed by `python -m stepscope.cli analyze` in its own
process. Peak RSS is the largest process's (getrusage of the children), so a trace parsed by
several processes reads as its biggest share. The cases are issue 26's second fault probe:
a base of 2,000 real-looking kernels with one hostile event among them, plus the two large
traces (1 GB of whitespace; 30 M tiny events with an 8 GB budget, as the probe's 8 GB cap).
These machines are shared and noisy: read exit codes, messages and the order of RSS, not the
seconds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAD = ('{"deviceProperties": [{"id": 0, "name": "NVIDIA H100"}], "distributedInfo": {"rank": 0}, '
        '"traceEvents": [')


def event(name: str = "ampere_sgemm_128x64_nn", ts: object = 10.0, dur: object = 2.0,
          args: str = '{"correlation": 1, "stream": 7}', cat: str = "kernel") -> str:
    return ('{"ph": "X", "cat": "%s", "name": "%s", "pid": 0, "tid": 7, "ts": %s, "dur": %s, "args": %s}'
            % (cat, name, ts, dur, args))


BASE = [event(ts=10 + i * 5) for i in range(2000)]


def with_one(one: str) -> list[str]:
    return [HEAD + ",".join(BASE[:10] + [one] + BASE[10:]) + "]}"]


def write_gz(path: Path, parts) -> Path:
    c = zlib.compressobj(1, zlib.DEFLATED, 31)
    with open(path, "wb") as fh:
        for p in parts:
            fh.write(c.compress(p.encode() if isinstance(p, str) else p))
        fh.write(c.flush())
    return path


def huge_names():
    yield HEAD + ",".join(BASE) + ',{"ph": "X", "cat": "kernel", "name": "'
    yield from [b"a" * (1 << 20)] * 100
    yield '", "pid": 0, "tid": 7, "ts": 20.0, "dur": 1.0},{"ph": "X", "cat": "python_function", "name": "x.py(1): '
    yield from [b"b" * (1 << 20)] * 100
    yield '", "pid": 0, "tid": 8, "ts": 20.0, "dur": 1.0}]}'


def whitespace_run():
    yield HEAD + ",".join(BASE[:10]) + ","
    yield from [b" \n" * (1 << 19)] * 1024  # 1 GiB
    yield ",".join(BASE[10:]) + "]}"


def tiny_events(n: int):
    """n one-microsecond CPU ops, written 10,000 at a time (the probe's 30 M: ~3 GB of JSON)."""
    yield HEAD
    block = 10_000
    for b in range(n // block):
        t0 = b * block * 2
        yield ",".join('{"ph":"X","cat":"cpu_op","name":"aten::add","pid":0,"tid":1,"ts":%d,"dur":1}' % (t0 + 2 * i)
                       for i in range(block)) + ("," if b < n // block - 1 else "")
    yield "]}"


CASES = {
    "two 100 MB names": (huge_names, ()),
    "1 GiB whitespace run": (whitespace_run, ()),
    "keys after traceEvents": (lambda: [HEAD + ",".join(BASE) + '], "traceName": "x", "meta": {"y": [1, 2]}}'], ()),
    "NaN dur": (lambda: with_one(event(dur="NaN")), ()),
    "Infinity dur": (lambda: with_one(event(dur="Infinity")), ()),
    "1e400 dur": (lambda: with_one(event(dur="1e400")), ()),
    "1e308 dur": (lambda: with_one(event(dur="1e308")), ()),
    "negative ts": (lambda: with_one(event(ts=-5.0)), ()),
    "200,000-deep args": (lambda: with_one(event(args='{"x": ' + "[" * 200_000 + "]" * 200_000 + "}")), ()),
    "id >= 2^63": (lambda: with_one(event(args='{"correlation": %d}' % 2 ** 63)), ()),
    "30 M tiny events, 8 GB budget": (lambda: tiny_events(30_000_000), ("--memory-budget-gb", "8")),
}


_MEASURE = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(r.returncode)")
"""A fresh parent per case, so the peak RSS read is this case's largest process, not an earlier one's."""


def run_case(name: str, make, extra: tuple[str, ...], work: Path) -> dict:
    gz = write_gz(work / "trace.json.gz", make())
    out = work / f"out-{len(list(work.glob('out-*')))}"
    env = {**os.environ, "PYTHONPATH": str(REPO / "lib")}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _MEASURE, sys.executable, "-m", "stepscope.cli", "analyze", str(gz),
                           "--out", str(out), "--no-progress", *extra], capture_output=True, text=True, env=env)
    took = time.perf_counter() - t0
    *lines, peak_kb = (proc.stdout + proc.stderr).strip().splitlines()
    gz.unlink()
    return {"case": name, "s": took, "peak_mb": int(peak_kb) / 1024, "exit": proc.returncode,
            "said": _what_it_said(lines) if proc.returncode else _flags(out)}


def _flags(out: Path) -> str:
    """Stage 05's flag codes of an analysed trace (its summary.json), or that none was raised."""
    import json

    summary = out / "05_categorize" / "summary.json"
    codes = [f["code"] for f in json.loads(summary.read_text()).get("flags", [])] if summary.is_file() else []
    return "flags: " + ", ".join(f"`{c}`" for c in codes) if codes else "analysed, no flag"


def _what_it_said(lines: list[str]) -> str:
    """The error's line, else the last line: what a person would read first."""
    for mark in ("error", "refus", "budget"):
        hit = next((ln.strip() for ln in lines if mark in ln.lower()), None)
        if hit:
            return hit[:160]
    return lines[-1].strip()[:160] if lines else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="case names (default: all)")
    ap.add_argument("--keep", type=Path, help="work folder to keep (default: a temporary one, removed)")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="hostile-"))
    work.mkdir(parents=True, exist_ok=True)
    print("| trace | time s | peak RSS MB (largest process) | exit | what it said |\n|---|---:|---:|---:|---|")
    for name, (make, extra) in CASES.items():
        if args.only and name not in args.only:
            continue
        r = run_case(name, make, extra, work)
        print(f"| {r['case']} | {r['s']:.1f} | {r['peak_mb']:,.0f} | {r['exit']} | {r['said']} |", flush=True)


if __name__ == "__main__":
    main()
