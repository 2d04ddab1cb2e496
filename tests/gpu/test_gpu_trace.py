"""A real CUDA trace through `stepscope analyze`: a small torch decoder stepped eagerly and
by CUDA-graph replay, one vLLM-style annotation per decode step, profiled with
torch.profiler. Every count and sum is checked against an independent pass over the
same events (`trace_oracle`)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tiny_decoder import profile_decode
from stepscope.cli import main
from trace_oracle import attribute, read_events

pytestmark = pytest.mark.gpu

EAGER, GRAPHED = 6, 6


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory):
    root = tmp_path_factory.mktemp("cuda-trace")
    run = profile_decode(root / "traces" / "decoder-rank0.pt.trace.json", device="cuda",
                         eager_steps=EAGER, graph_steps=GRAPHED)
    out = root / "analyze"
    assert main(["analyze", str(root / "traces"), "--out", str(out), "--no-progress"]) == 0
    steps = pd.read_csv(out / "05_categorize" / "steps.csv")
    summary = json.loads((out / "05_categorize" / "summary.json").read_text())
    return run, attribute(read_events(run["path"])), steps, summary


def test_the_oracle_sees_every_step_and_attributes_every_device_event(analyzed):
    run, oracle, _, _ = analyzed
    assert len(oracle.steps) == EAGER + GRAPHED
    assert oracle.unattributed == 0
    eager, graphed = oracle.steps[:EAGER], oracle.steps[EAGER:]
    assert all(s.n_graph_events == 0 for s in eager)
    # A replay holds the step's whole forward; only the host copy of the tokens is
    # launched outside the graph.
    for s in graphed:
        assert s.n_graph_events == s.n_events - 1, s.kernel_names
    assert {s.n_events for s in oracle.steps} == {eager[0].n_events}, [s.n_events for s in oracle.steps]
    assert eager[0].n_events > 2 * 6  # at least the six GEMMs per layer, two layers


def test_stepscope_counts_and_sums_equal_the_oracle(analyzed):
    run, oracle, steps, summary = analyzed
    rank = summary["ranks"][0]
    assert rank["mode"] == "gpu"
    assert rank["unattributed_events"] == 0
    assert rank["n_device_events"] == oracle.n_device_events
    assert rank["kernel_sum_us"] == pytest.approx(oracle.dur_sum_us, rel=1e-9)
    assert rank["n_steps"] == rank["n_decode_steps"] == EAGER + GRAPHED
    assert list(steps["label"]) == ["decode"] * (EAGER + GRAPHED)
    assert (steps["decode_requests"] == run["batch"]).all()
    assert list(steps["n_events"]) == [s.n_events for s in oracle.steps]
    assert steps["kernel_sum_us"].to_numpy() == pytest.approx([s.dur_sum_us for s in oracle.steps], rel=1e-9)
    assert steps["annotation_dur_us"].to_numpy() == pytest.approx([s.dur for s in oracle.steps], rel=1e-9)


def test_graph_launched_kernels_land_in_their_steps(analyzed):
    _, oracle, steps, _ = analyzed
    graphed = steps.iloc[EAGER:]
    # Same work per replay, none spilled into a neighbour: equal counts in every step.
    assert (graphed["n_events"] == oracle.steps[EAGER].n_events).all()
    assert graphed["kernel_sum_us"].gt(0).all()
