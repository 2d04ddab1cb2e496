"""Kinds never averaged together, boundness from the step's own numbers, and the host's wait
between steps named (issue 35, items 2 and 4, findings 2, 5 and 8), on real corpus traces.

Every expected value is read from the trace's JSON here with plain json and gzip (kernel names,
launch correlations, host op intervals), not through stepscope.
"""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from stepscope.report.artifacts import load_run_artifacts
from stepscope.report.build import build_report, report_context, writeup_params_from
from stepscope.trace import analyze_traces

CORPUS = Path(__file__).parent / "data" / "corpus"
H100, MI300X = "tracemap-h100-vllm-v1-llama80l-tp4-c32", "tracemap-mi300x-vllm-v1-llama80l-tp4-c32"
DATALOADER_W0 = "kineto-v100-resnet50-dataloader-w0"
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset")
STEP_FRAME = "gpu_worker.py(258): execute_model"  # vLLM V1's worker step frame in the MI300X capture


@cache
def _events(name: str) -> list[dict]:
    with gzip.open(CORPUS / f"{name}.json.gz", "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


@cache
def _run(name: str, root: str) -> tuple[Path, str]:
    run = Path(root) / name
    analyze_traces([CORPUS / f"{name}.json.gz"], run / "05_categorize", progress=False, perfetto=False)
    return run, build_report(run, draw_figures=False)["markdown"].read_text()


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("kinds"))


def _launched_inside(name: str, op_name: str) -> set[int]:
    """Correlation ids of the runtime launches that lie inside a host op named `op_name`."""
    ev = _events(name)
    ops = np.array(sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in ev
                          if e.get("cat") == "cpu_op" and e["name"] == op_name))
    out = set()
    for e in ev:
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {}):
            t = float(e["ts"])
            k = np.searchsorted(ops[:, 0], t, side="right") - 1
            if k >= 0 and t < ops[k, 1]:
                out.add(e["args"]["correlation"])
    return out


def _kernel_ms(name: str, keep) -> float:
    return sum(float(e["dur"]) for e in _events(name) if e.get("cat") == "kernel" and keep(e)) / 1e3


def _all_reduce_ms(name: str) -> tuple[float, float]:
    """(the prefill step's all-reduce ms, the decode steps' per step): vLLM ran the prefill's 161
    all-reduces through NCCL (inside `vllm::all_reduce`) and each of the 9 decode steps' 161
    through its custom all-reduce (`cross_device_reduce_1stage`, in the replayed graphs)."""
    inside = _launched_inside(name, "vllm::all_reduce")
    prefill = _kernel_ms(name, lambda e: e["name"].startswith("ncclDevKernel")
                         and e["args"].get("correlation") in inside)
    decode = _kernel_ms(name, lambda e: "cross_device_reduce_1stage" in e["name"]) / 9
    return prefill, decode


@pytest.mark.parametrize("name, prefill_ms", [(H100, 16.5), (MI300X, 42.4)])
def test_the_prefill_step_is_a_column_of_its_own_and_no_decode_figure_pools_it(root, name, prefill_ms):
    run, md = _run(name, root)
    prefill, decode = _all_reduce_ms(name)
    assert prefill == pytest.approx(prefill_ms, abs=0.05)  # the figures, read here from the JSON
    kinds = pd.read_csv(run / "05_categorize" / "kind_categories.csv").set_index(["kind", "category"])
    assert kinds.loc[("prefill", "all_reduce"), "n_steps"] == 1 and kinds.loc[("decode", "all_reduce"), "n_steps"] == 9
    # one stream of collectives: their busy time is their summed time
    assert kinds.loc[("prefill", "all_reduce"), "union_ms_mean"] == pytest.approx(prefill, rel=1e-9)
    assert kinds.loc[("decode", "all_reduce"), "union_ms_mean"] == pytest.approx(decode, rel=1e-9)
    # the decode table holds decode steps only: a mean pooling the prefill would be (prefill + 9 x decode) / 10
    dec = pd.read_csv(run / "05_categorize" / "decode_categories.csv").set_index("category")
    assert dec.loc["all_reduce", "n_steps"] == 9
    assert dec.loc["all_reduce", "union_ms_mean"] == pytest.approx(decode, rel=1e-9)
    assert abs(dec.loc["all_reduce", "union_ms_mean"] - (prefill + 9 * decode) / 10) > 1.0
    # the appendix shows the kinds side by side (the report links it, issue 37), and the verdict reads the
    # prefill step apart
    appendix = (run / "06_writeup" / "appendix.md").read_text()
    assert "| category | decode ms/step (9 steps) | prefill ms/step (1 step) |" in appendix
    assert f"| all_reduce | {_fmt(decode)} | {_fmt(prefill)} |" in appendix
    assert "](appendix.md#step-kinds-side-by-side-stage-05)" in md
    assert "The 1 prefill step is read apart, never averaged into the decode steps" in md


def _fmt(x: float) -> str:
    from stepscope.wording import fmt_num

    return fmt_num(x)


def _device_intervals_by_step(name: str, frame: str) -> list[np.ndarray]:
    """Per step frame (in time order), the [start, end) of the device events its launches made."""
    ev = _events(name)
    frames = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in ev
                    if e.get("cat") in ("python_function", "cpu_op", "Operator") and e["name"].endswith(frame))
    launch = {e["args"]["correlation"]: float(e["ts"]) for e in ev
              if e.get("cat") in ("cuda_runtime", "Runtime") and "correlation" in e.get("args", {})}
    out: list[list[tuple[float, float]]] = [[] for _ in frames]
    starts = np.array([a for a, _ in frames])
    for e in ev:
        t = launch.get(e.get("args", {}).get("correlation")) if e.get("cat") in DEVICE_CATS else None
        if t is None:
            continue
        k = int(np.searchsorted(starts, t, side="right")) - 1
        if k >= 0 and t < frames[k][1]:
            out[k].append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    return [np.array(sorted(x)) for x in out if x]


def _largest_gap_us(iv: np.ndarray) -> float:
    run_end = np.maximum.accumulate(iv[:, 1])
    return float(max(0.0, (iv[1:, 0] - run_end[:-1]).max()))


def test_a_mostly_idle_step_with_one_host_gap_is_host_bound_and_names_the_host_frame(root):
    # MI300X decode: 45.6 ms steps with 15-23 ms of device work; one 22-28 ms gap per step while the
    # host runs the model's Python forward, before the compiled graph runs
    run, md = _run(MI300X, root)
    steps = _device_intervals_by_step(MI300X, STEP_FRAME)
    assert len(steps) == 10  # 1 prefill, then 9 decode steps
    gaps_ms = [_largest_gap_us(iv) / 1e3 for iv in steps[1:]]
    assert min(gaps_ms) > 22 and max(gaps_ms) < 28.5
    a = load_run_artifacts(run)
    v = report_context(a, writeup_params_from(a)).verdict
    b = v.boundness
    assert b.status == "host gap" and b.idle_pct > 50
    assert b.host_gap_ms == pytest.approx(float(np.mean(gaps_ms)), rel=1e-6)
    assert b.host_gap_pct_of_idle > 90 and b.host_frame == "nn.Module: LlamaForCausalLM_0"
    head = md.split("\n> **In short:** ", 1)[1].split("\n", 1)[0]
    assert "The decode step is host-bound" in head and "`nn.Module: LlamaForCausalLM_0`" in head
    assert "Python-stack tracing may inflate it" in head
    assert "biggest lever" not in head and "the work itself dominates" not in md
    assert "Among the categories, the biggest lever is dense_gemm" in md


def test_the_wait_between_steps_is_named_by_the_host_op_running_then(root):
    # ResNet-50 on a V100 with a single-process DataLoader: between each step's last kernel and the
    # next step's first, the host is in the DataLoader's __next__ (2021 format: an Operator)
    run, _ = _run(DATALOADER_W0, root)
    ev = _events(DATALOADER_W0)
    marks = sorted(float(e["ts"]) for e in ev if e["name"].startswith("ProfilerStep#"))
    waits = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in ev
                   if e["name"] == "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__")
    steps = _by_marks(ev, marks)
    gaps = [(steps[k][:, 1].max(), steps[k + 1][0, 0]) for k in range(len(steps) - 1)]
    # each gap lies inside the next step's DataLoader wait, which is the one that precedes its first kernel
    for (a, b), (w0, w1) in zip(gaps, waits[1:]):
        assert w0 <= a and (min(b, w1) - a) / (b - a) > 0.99
    # the verdict's figure: the mean period (step start to next) less the mean span (first to last device work)
    period_us = float(np.mean(np.diff(marks)))
    span_us = float(np.mean([iv[:, 1].max() - iv[0, 0] for iv in steps]))
    a = load_run_artifacts(run)
    v = report_context(a, writeup_params_from(a)).verdict
    assert v.between_steps.host_frame == "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    assert v.between_steps.gap_ms == pytest.approx((period_us - span_us) / 1e3, rel=1e-6)
    assert v.between_steps.gap_ms > 55 and v.between_steps.host_frame_intervals in (None, 5)
    assert v.between_steps.ceiling_x == pytest.approx(v.between_steps.period_ms / v.between_steps.span_ms)
    said = [s.text for s in schema_verdict(run).sentences if s.finding == "between_steps"]
    assert said and "while the host was in `enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__`" in said[0]


def _by_marks(ev: list[dict], marks: list[float]) -> list[np.ndarray]:
    """Per ProfilerStep (in order), the device events launched inside it (by launch correlation)."""
    launch = {e["args"]["correlation"]: float(e["ts"]) for e in ev
              if e.get("cat") in ("cuda_runtime", "Runtime") and "correlation" in e.get("args", {})}
    ends = sorted(float(e["ts"]) + float(e["dur"]) for e in ev if e["name"].startswith("ProfilerStep#"))
    out: list[list[tuple[float, float]]] = [[] for _ in marks]
    for e in ev:
        t = launch.get(e.get("args", {}).get("correlation")) if e.get("cat") in DEVICE_CATS else None
        k = int(np.searchsorted(marks, t, side="right")) - 1 if t is not None else -1
        if k >= 0 and t < ends[k]:
            out[k].append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    return [np.array(sorted(x)) for x in out]


def schema_verdict(run: Path):
    from stepscope import schema

    return schema.read(run / "06_writeup" / "verdict.json", schema.VerdictFile)
