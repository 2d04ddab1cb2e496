"""`stepscope analyze` against HTA, whole process each, on every real trace in tests/data/traces.

    .venv/bin/python benchmarks/analyze_vs_hta.py [--repeats 3] [--only NAME] [--baseline DIR]

For each trace (the two ranks of a TP=2 capture count as one run) it times, in one run and
alternating so machine noise hits both alike:
- stepscope: `stepscope analyze TRACE --out TMP --no-progress` as a new process: stage 05 and
  stage 06, both executed notebooks and the report written;
- HTA (when `HolisticTraceAnalysis` is installed; not a stepscope dependency): a new Python
  process that loads the trace with `TraceAnalysis` and runs four analyses (temporal
  breakdown, kernel breakdown, idle-time breakdown, communication/computation overlap).
With `--baseline DIR` (another checkout of stepscope, e.g. `git worktree add DIR main`) it
also times that checkout's `stepscope analyze` in the same alternation, and prints its
ratios to HTA beside this checkout's: a before/after measured side by side.
It prints the median wall time and CPU time (user + system, the process and its children)
of each over `--repeats`, and the ratios stepscope / HTA (target, issue 10: wall below 1 on
every trace). On a shared, loaded machine read the CPU ratio: wall times there measure the
queue for a core. A trace HTA cannot analyse is reported with HTA's
error, not dropped.
"""

from __future__ import annotations

import argparse
import os
import resource
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "tests" / "data" / "traces"

HTA_CHILD = r"""
import sys, warnings
warnings.filterwarnings("ignore")
import logging
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_dir=sys.argv[1])
ta.get_temporal_breakdown(visualize=False)
ta.get_gpu_kernel_breakdown(visualize=False)
ta.get_idle_time_breakdown(visualize=False)
ta.get_comm_comp_overlap(visualize=False)
"""


def trace_sets() -> dict[str, list[Path]]:
    """{name: files}: one entry per capture; the ranks of one capture go together."""
    sets: dict[str, list[Path]] = {}
    for p in sorted(TRACES.glob("*.json.gz")):
        name = re.sub(r"-rank-?\d+$", "", p.name.removesuffix(".json.gz").removesuffix(".pt.trace"))
        sets.setdefault(name, []).append(p)
    return sets


def hta_installed() -> bool:
    return subprocess.run([sys.executable, "-c", "import hta"], capture_output=True).returncode == 0


def _cpu_children() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _timed(argv: list[str], env: dict) -> tuple[tuple[float, float], str | None]:
    """((wall s, CPU s of the process and its children), error or None)."""
    c, t = _cpu_children(), time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall, cpu = time.perf_counter() - t, _cpu_children() - c
    err = None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1][:160]
    return (wall, cpu), err


def time_stepscope(files: list[Path], tmp: Path, env: dict) -> tuple[tuple[float, float], str | None]:
    out = tmp / f"analyze-out-{abs(hash(env['PYTHONPATH']))}"
    shutil.rmtree(out, ignore_errors=True)
    wall, err = _timed([sys.executable, "-m", "stepscope.cli", "analyze", *map(str, files), "--out", str(out),
                        "--no-progress"], env)
    if err is None and not ((out / "06_writeup" / "report.html").is_file()
                            and (out / "notebooks" / "06_writeup.ipynb").is_file()
                            and (out / "notebooks" / "05_categorize.ipynb").is_file()):
        err = "no report or notebooks written"
    return wall, err


def time_hta(files: list[Path], tmp: Path, env: dict) -> tuple[tuple[float, float], str | None]:
    d = tmp / "hta-in"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    for f in files:
        (d / f.name).symlink_to(f)
    return _timed([sys.executable, "-c", HTA_CHILD, str(d)], env)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", help="substring of the trace names to run")
    ap.add_argument("--baseline", type=Path, help="another stepscope checkout to time alongside")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(REPO / "lib"), PYTHONWARNINGS="ignore")
    base_env = dict(env, PYTHONPATH=str(args.baseline.resolve() / "lib")) if args.baseline else None
    has_hta = hta_installed()
    if not has_hta:
        print("HTA is not installed (pip install HolisticTraceAnalysis): timing stepscope alone")
    print(f"{'trace':38} {'MB(gz)':>6} {'stepscope s':>11} {'HTA s':>6} {'ratio':>6} "
          f"{'cpu s':>6} {'HTA cpu':>7} {'ratio':>6}"
          + (f" {'base s':>6} {'ratio':>6} {'b cpu':>6} {'ratio':>6}" if base_env else "") + "  note")
    worst = worst_cpu = 0.0
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        for name, files in trace_sets().items():
            if args.only and args.only not in name:
                continue
            ss, hh, bb, notes = [], [], [], []
            for _ in range(args.repeats):
                if base_env:
                    w, err = time_stepscope(files, tmp, base_env)
                    bb.append(w)
                    if err:
                        notes.append(f"baseline: {err}")
                w, err = time_stepscope(files, tmp, env)
                ss.append(w)
                if err:
                    notes.append(f"stepscope: {err}")
                if has_hta:
                    w, err = time_hta(files, tmp, env)
                    hh.append(w)
                    if err:
                        notes.append(f"HTA failed: {err}")
            nan = float("nan")
            s, sc = (statistics.median(x[i] for x in ss) for i in (0, 1))
            h, hc = (statistics.median(x[i] for x in hh) for i in (0, 1)) if hh else (nan, nan)
            ok_h = bool(hh) and not any(n.startswith("HTA") for n in notes)
            ratio, ratio_cpu = (s / h, sc / hc) if ok_h else (nan, nan)
            if ok_h:
                worst, worst_cpu = max(worst, ratio), max(worst_cpu, ratio_cpu)
            base = ""
            if bb:
                b, bc = (statistics.median(x[i] for x in bb) for i in (0, 1))
                br, brc = (b / h, bc / hc) if ok_h else (nan, nan)
                base = f" {b:6.2f} {br:6.2f} {bc:6.2f} {brc:6.2f}"
            mb = sum(f.stat().st_size for f in files) / 1e6
            print(f"{name:38} {mb:6.2f} {s:11.2f} {h:6.2f} {ratio:6.2f} {sc:6.2f} {hc:7.2f} {ratio_cpu:6.2f}{base}  "
                  f"{'; '.join(dict.fromkeys(notes))}")
    if has_hta:
        print(f"worst ratio stepscope / HTA over the traces HTA analyses (median of {args.repeats}): "
              f"wall {worst:.2f}, CPU {worst_cpu:.2f} (target < 1: {'met' if worst < 1 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
