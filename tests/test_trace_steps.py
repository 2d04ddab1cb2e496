"""Step sources and their fallbacks, attribution methods, SGLang stage files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepscope.trace.analyze import analyze_rank, analyze_traces
from stepscope.trace.categorize import make_rules
from stepscope.trace.load import load_rank, load_ranks


def _k(ts, corr, name="nvjet_tst_gemm"):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": 5.0,
            "args": {"correlation": corr, "stream": 7}}


def _rt(ts, corr, name="cudaLaunchKernel", tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": 1.0,
            "args": {"correlation": corr}}


def _write(tmp_path: Path, events, name="rank0.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events}))
    return p


def _analyse(p: Path):
    return analyze_rank(load_rank(p), make_rules())


def test_graph_launch_fallback(tmp_path: Path):
    # Two FULL-graph steps: each graph launch's kernels share its correlation.
    ev = [_rt(0.0, 1, "cudaGraphLaunch"), _k(10.0, 1), _k(16.0, 1),
          _rt(100.0, 2, "cudaGraphLaunch"), _k(110.0, 2), _rt(105.0, 3), _k(120.0, 3)]
    r = _analyse(_write(tmp_path, ev))
    assert r.step_source == "graph_launches"
    assert r.steps_tot["n_events"].tolist() == [2, 2]
    assert (r.work["step_id"] >= 0).all()


def test_execute_model_frame_fallback(tmp_path: Path):
    frame = {"ph": "X", "cat": "python_function", "name": "vllm/v1/worker/gpu_worker.py(1): execute_model",
             "pid": 1, "tid": 1, "ts": 0.0, "dur": 50.0}
    noise = {"ph": "X", "cat": "python_function", "name": "threading.py(1): run", "pid": 1, "tid": 1,
             "ts": 0.0, "dur": 500.0}
    ev = [noise, frame, {**frame, "ts": 100.0}, _rt(10.0, 1), _k(20.0, 1), _rt(110.0, 2), _k(120.0, 2)]
    r = _analyse(_write(tmp_path, ev))
    assert r.step_source == "engine_frames"
    assert r.steps_tot["n_events"].tolist() == [1, 1]


def test_whole_trace_fallback(tmp_path: Path):
    r = _analyse(_write(tmp_path, [_rt(0.0, 1), _k(10.0, 1), _k(30.0, 2)]))
    assert r.step_source == "whole_trace" and len(r.steps) == 1
    assert (r.work["attribution"] == "whole_trace").all() and (r.work["step_id"] == 0).all()


def test_attribution_methods(tmp_path: Path):
    ann = {"ph": "X", "cat": "user_annotation", "name": "execute_context_0(0)_generation_2(2)",
           "pid": 1, "tid": 1, "ts": 0.0, "dur": 50.0}
    ev = [ann, {**ann, "ts": 200.0},
          _rt(10.0, 1), _k(60.0, 1),            # launch inside step 0, kernel runs after it ends
          _rt(20.0, 2, tid=9), _k(70.0, 2),     # launched from another thread of the process
          _rt(100.0, 3), _k(110.0, 3),          # launched between the steps
          _k(215.0, 4),                         # launch not in the trace
          _rt(210.0, 5), _k(230.0, 5)]
    r = _analyse(_write(tmp_path, ev))
    w = r.work.sort_values("start_us")
    assert w["attribution"].tolist() == ["launch_thread", "launch_process", "after_step_launch",
                                         "work_time", "launch_thread"]
    assert w["step_id"].tolist() == [0, 0, 0, 1, 1]
    assert r.steps["label"].tolist() == ["decode", "decode"]


def test_sglang_stage_files_keep_decode(tmp_path: Path):
    ann = {"ph": "X", "cat": "user_annotation", "name": "step[DECODE bs=4]", "pid": 1, "tid": 1,
           "ts": 0.0, "dur": 50.0}
    ev = [ann, _rt(10.0, 1), _k(20.0, 1)]
    a = _write(tmp_path, ev, "1700-TP-0-EXTEND.trace.json")
    b = _write(tmp_path, ev, "1700-TP-0-DECODE.trace.json")
    ranks, flags = load_ranks([a, b], workers=1, progress=False)
    assert [r.path.name for r in ranks] == ["1700-TP-0-DECODE.trace.json"]
    assert [f.code for f in flags] == ["sglang_stage_split"]


def test_folder_input_skips_frontend_and_non_traces(real_traces: Path, tmp_path: Path):
    import shutil

    d = tmp_path / "traces"
    d.mkdir()
    shutil.copy(real_traces / "vllm-cpu-tinyllama-tp2-rank0.pt.trace.json.gz", d)
    (d / "vm_1.async_llm.123.pt.trace.json.gz").write_bytes(b"not read")
    (d / "manifest.json").write_text("{}")
    an = analyze_traces(d, tmp_path / "out", progress=False, perfetto=False)
    assert [r.rank for r in an.summary.ranks] == [0]
    assert not [f for f in an.flags if f.severity == "error"]
    assert set(an.summary.ranks[0].attribution) == {"op_thread"}


def test_a_folder_of_frontend_traces_only_says_so(tmp_path: Path):
    """vLLM writes a front-end `*.async_llm.*` trace beside the engine's: a folder holding only
    that one (the engine's traces went elsewhere) is refused with the reason, not a bare
    "no trace files found"."""
    from stepscope.errors import TraceError
    from stepscope.trace.analyze import load_traces

    (tmp_path / "vm_1.async_llm.123.pt.trace.json.gz").write_bytes(b"not read")
    with pytest.raises(TraceError) as err:
        load_traces(tmp_path, tmp_path / "out", progress=False)
    assert "only 1 front-end trace(s), which hold no device work: vm_1.async_llm.123.pt.trace.json.gz" in str(err.value)
    assert "rank0" in err.value.hint


def test_an_unreadable_trace_gives_one_fix(tmp_path: Path):
    """A JSON that is no Kineto trace (rocprof's results file, say): the file's own fix, once.
    The error added a second, "see the messages above for each file", naming nothing above."""
    from stepscope.errors import TraceError
    from stepscope.trace.analyze import load_traces

    (tmp_path / "results.json").write_text('{"rocprof": []}')
    with pytest.raises(TraceError) as err:
        load_traces(tmp_path / "results.json", tmp_path / "out", progress=False)
    text = err.value.render()
    assert "no traceEvents array" in text and text.count("fix:") == 1, text


def test_a_cpu_collective_wait_no_op_records_is_the_collectives():
    """vLLM V0's CPU communicator calls `dist.all_reduce`: `c10d::allreduce_` returns once gloo
    has the work, gloo runs it on its own thread (`gloo:all_reduce`), and the worker's wait is no
    op. That gap is the all-reduce's: 10.9 ms a decode step, not 2.6 ms and 77 % "idle". Where
    the worker records its wait (`_c10d_functional::wait_tensor`, vLLM 0.32) the all-reduces add
    nothing; only 0.32's synchronous all-gathers, with no wait op, do."""
    from stepscope.trace.load import load_rank
    from stepscope.trace.steps import unrecorded_waits

    data = Path(__file__).parent / "data"
    v0 = analyze_rank(load_rank(data / "corpus" / "vllm-cpu085-v0-tinyllama-tp2.json.gz"), make_rules())
    ar = v0.decode.set_index("category").loc["all_reduce"]
    assert 10.5 < ar["union_ms_mean"] < 11.3 and ar["calls_per_step"] == 5
    assert 0.60e6 < v0.info["unrecorded_wait_us"] < 0.68e6
    rt = load_rank(data / "traces" / "vllm-cpu-tinyllama-tp2-rank0.pt.trace.json.gz")
    ev = rt.events
    w = unrecorded_waits(ev, ev[ev["cat"] == "cpu_op"])
    assert set(ev.loc[w["row"], "name"]) == {"c10d::_allgather_base_"} and len(w) == 8
