"""`stepscope analyze` against HTA, whole process each, on every real trace in tests/data/traces.

    .venv/bin/python benchmarks/analyze_vs_hta.py [--repeats 3] [--only NAME] [--baseline DIR]
        [--figures-free] [--analysis-only]

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
With `--figures-free` it also times `analyze` with every figure's rendering replaced by writing
a 1-pixel PNG (figures still built, notebooks and report still written): the floor that no
faster figure rendering can go below, beside HTA in the same alternation.
With `--analysis-only` it also times a new process that only imports stepscope and runs stage
05's analysis and writes its result files (no figures, no notebooks, no report): what any
`analyze` built on this engine pays before it draws or writes anything for a reader.
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


FIGURES_FREE_CHILD = r"""
import base64, sys
import stepscope.runfolder as rf
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==")
def one_pixel(figures, run_dir):
    paths = []
    for name in figures:
        p = rf.figures_dir(run_dir) / (name if name.endswith(".png") else name + ".png")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(PNG)
        paths.append(p)
    return paths
rf.save_figures = one_pixel  # before any stage module imports it by name
from stepscope.cli import main
sys.argv = ["stepscope", *sys.argv[1:]]
sys.exit(main())
"""


ANALYSIS_ONLY_CHILD = r"""
import sys
from pathlib import Path
from stepscope.trace.analyze import analyze_traces
analyze_traces([Path(p) for p in sys.argv[2:]], Path(sys.argv[1]), progress=False)  # it writes its files
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


def time_stepscope(files: list[Path], tmp: Path, env: dict, figures_free: bool = False
                   ) -> tuple[tuple[float, float], str | None]:
    out = tmp / f"analyze-out-{abs(hash(env['PYTHONPATH']))}-{int(figures_free)}"
    shutil.rmtree(out, ignore_errors=True)
    head = [sys.executable, "-c", FIGURES_FREE_CHILD] if figures_free else [sys.executable, "-m", "stepscope.cli"]
    wall, err = _timed([*head, "analyze", *map(str, files), "--out", str(out), "--no-progress"], env)
    if err is None and not ((out / "06_writeup" / "report.html").is_file()
                            and (out / "notebooks" / "06_writeup.ipynb").is_file()
                            and (out / "notebooks" / "05_categorize.ipynb").is_file()):
        err = "no report or notebooks written"
    return wall, err


def time_analysis_only(files: list[Path], tmp: Path, env: dict) -> tuple[tuple[float, float], str | None]:
    out = tmp / "analysis-only-out"
    shutil.rmtree(out, ignore_errors=True)
    wall, err = _timed([sys.executable, "-c", ANALYSIS_ONLY_CHILD, str(out), *map(str, files)], env)
    if err is None and not (out / "summary.json").is_file():
        err = "no summary.json written"
    return wall, err


def time_hta(files: list[Path], tmp: Path, env: dict) -> tuple[tuple[float, float], str | None]:
    d = tmp / "hta-in"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    for f in files:
        (d / f.name).symlink_to(f)
    return _timed([sys.executable, "-c", HTA_CHILD, str(d)], env)


def _median(runs: list[tuple[float, float]]) -> tuple[float, float]:
    nan = float("nan")
    return tuple(statistics.median(x[i] for x in runs) for i in (0, 1)) if runs else (nan, nan)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", help="substring of the trace names to run")
    ap.add_argument("--baseline", type=Path, help="another stepscope checkout to time alongside")
    ap.add_argument("--figures-free", action="store_true",
                    help="also time analyze with figure rendering replaced by a 1-pixel PNG (the floor)")
    ap.add_argument("--analysis-only", action="store_true",
                    help="also time stage 05's analysis alone in a new process (no figures, notebooks, report)")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(REPO / "lib"), PYTHONWARNINGS="ignore")
    # (label, how to time it): this checkout first; the others are printed beside it
    variants = [("stepscope", lambda f, t: time_stepscope(f, t, env))]
    if args.baseline:
        base_env = dict(env, PYTHONPATH=str(args.baseline.resolve() / "lib"))
        variants.append(("base", lambda f, t: time_stepscope(f, t, base_env)))
    if args.figures_free:
        variants.append(("no-fig", lambda f, t: time_stepscope(f, t, env, figures_free=True)))
    if args.analysis_only:
        variants.append(("05-only", lambda f, t: time_analysis_only(f, t, env)))
    has_hta = hta_installed()
    if not has_hta:
        print("HTA is not installed (pip install HolisticTraceAnalysis): timing stepscope alone")
    print(f"{'trace':38} {'MB(gz)':>6} {'HTA s':>6} {'HTA cpu':>7}"
          + "".join(f" {label + ' s':>11} {'ratio':>6} {'cpu s':>6} {'ratio':>6}" for label, _ in variants) + "  note")
    worst = {label: [0.0, 0.0] for label, _ in variants}
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        for name, files in trace_sets().items():
            if args.only and args.only not in name:
                continue
            timed: dict[str, list] = {label: [] for label, _ in variants}
            hh, notes = [], []
            for _ in range(args.repeats):  # alternating, so machine noise hits every variant alike
                for label, run in variants:
                    w, err = run(files, tmp)
                    timed[label].append(w)
                    if err:
                        notes.append(f"{label}: {err}")
                if has_hta:
                    w, err = time_hta(files, tmp, env)
                    hh.append(w)
                    if err:
                        notes.append(f"HTA failed: {err}")
            h, hc = _median(hh)
            ok_h = bool(hh) and not any(n.startswith("HTA") for n in notes)
            cols = ""
            for label, _ in variants:
                s_, sc = _median(timed[label])
                r, rc = (s_ / h, sc / hc) if ok_h else (float("nan"), float("nan"))
                if ok_h:
                    worst[label] = [max(worst[label][0], r), max(worst[label][1], rc)]
                cols += f" {s_:11.2f} {r:6.2f} {sc:6.2f} {rc:6.2f}"
            mb = sum(f.stat().st_size for f in files) / 1e6
            print(f"{name:38} {mb:6.2f} {h:6.2f} {hc:7.2f}{cols}  {'; '.join(dict.fromkeys(notes))}")
    if has_hta:
        for label, (w, wc) in worst.items():
            print(f"worst ratio {label} / HTA over the traces HTA analyses (median of {args.repeats}): "
                  f"wall {w:.2f}, CPU {wc:.2f} (target < 1: {'met' if w < 1 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
