"""The independent trace pass the GPU trace test relies on, checked here on CPU: against
stepscope on a real vLLM CUDA-graph trace, and on the decoder's own CPU trace."""

from __future__ import annotations

import pandas as pd
import pytest

from tiny_decoder import profile_decode, step_name
from stepscope.trace.analyze import analyze_traces, write_artifacts
from trace_oracle import attribute, read_events


def test_oracle_equals_stepscope_on_a_real_graph_trace(real_traces, tmp_path):
    path = real_traces / "vllm-mi300x-gptoss-decode-fullgraph.json.gz"
    oracle = attribute(read_events(path))
    an = analyze_traces([path], tmp_path, progress=False, perfetto=False)
    write_artifacts(an, tmp_path, perfetto=False)
    steps = pd.read_csv(tmp_path / "steps.csv")
    rank = an.summary.ranks[0]
    assert oracle.unattributed == rank.unattributed_events == 0
    assert oracle.n_device_events == rank.n_device_events == 434
    assert list(steps["n_events"]) == [s.n_events for s in oracle.steps] == [434]
    assert steps["kernel_sum_us"].to_numpy() == pytest.approx([s.dur_sum_us for s in oracle.steps], rel=1e-9)
    # Most of that step's kernels come from one graph launch: the case the GPU test makes.
    assert oracle.steps[0].n_graph_events == 421


def test_decoder_steps_are_read_as_vllm_decode_steps_on_cpu(tmp_path):
    run = profile_decode(tmp_path / "t" / "decoder-rank0.pt.trace.json", device="cpu", eager_steps=5)
    assert run["graph_steps"] == 0
    oracle = attribute(read_events(run["path"]))
    assert [s.name for s in oracle.steps] == [step_name(run["batch"])] * 5
    assert oracle.n_device_events == 0  # CPU: no device events, stepscope counts CPU ops instead
    an = analyze_traces([run["path"]], tmp_path / "an", progress=False, perfetto=False)
    write_artifacts(an, tmp_path / "an", perfetto=False)
    steps = pd.read_csv(tmp_path / "an" / "steps.csv")
    assert list(steps["label"]) == ["decode"] * 5
    assert (steps["decode_requests"] == run["batch"]).all()
    assert steps["annotation_dur_us"].to_numpy() == pytest.approx([s.dur for s in oracle.steps], rel=1e-9)
    # Every step runs the same ops: equal CPU-op piece counts.
    assert steps["n_events"].nunique() == 1 and steps["n_events"].iloc[0] > 0
