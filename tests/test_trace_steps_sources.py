"""The step from the strongest evidence a trace holds (issue 35, item 1), and degenerate
traces refused (item 6): each source of `trace.step_sources.STEP_SOURCES`, the refusal of a
source whose steps are pieces of a coarser one's, and the fake vLLM V1 serving trace."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from stepscope.errors import TraceError
from stepscope.trace import analyze_traces
from stepscope.trace.analyze import analyze_rank
from stepscope.trace.categorize import make_rules
from stepscope.trace.load import load_rank

GEMM = "nvjet_tst_128x64_64x8_1x1_v_bz_coopA_NTT"


def _k(ts, corr, name=GEMM, dur=5.0, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "stream": 7}}


def _rt(ts, corr, name="cudaLaunchKernel", tid=1, cat="cuda_runtime"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": 1.0,
            "args": {"correlation": corr}}


def _mark(name, ts, dur, cat="user_annotation", tid=1):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def _analyse(tmp_path: Path, events, **top):
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps({"distributedInfo": {"rank": 0}, **top, "traceEvents": events}))
    return analyze_rank(load_rank(p), make_rules())


def _record(r) -> dict[str, tuple[str, str | None]]:
    return {c["source"]: (c["status"], c["reason"]) for c in r.steps.attrs["step_sources"]}


def test_profiler_step_recorded_as_a_2021_operator(tmp_path: Path):
    """The 2021 Kineto format names categories `Kernel`, `Runtime`, `Operator`, and records
    `ProfilerStep#N` as an Operator; the device events come first, so the loader has already
    seen device work when it meets the step markers. Read as "no step marker" before."""
    ev = [_k(10.0 + 100 * i, i + 1, cat="Kernel") for i in range(3)]
    ev += [_rt(5.0 + 100 * i, i + 1, cat="Runtime") for i in range(3)]
    ev += [_mark(f"ProfilerStep#{5 + i}", 100.0 * i, 90.0, cat="Operator") for i in range(3)]
    r = _analyse(tmp_path, ev)
    assert r.step_source == "annotation:profiler_step"
    assert r.steps["name"].tolist() == ["ProfilerStep#5", "ProfilerStep#6", "ProfilerStep#7"]
    assert r.steps_tot["n_events"].tolist() == [1, 1, 1]


def test_one_training_step_per_optimizer_step(tmp_path: Path):
    """No ProfilerStep, one `Optimizer.step#SGD.step` per iteration: each iteration is a step,
    ending where its optimizer step ends. Read as one window before."""
    ev = []
    for i in range(3):
        t = 1000.0 * i
        ev += [_rt(t + 10, 10 * i + 1), _k(t + 20, 10 * i + 1),                    # forward
               _rt(t + 400, 10 * i + 2, tid=2), _k(t + 410, 10 * i + 2, "wgrad_kernel"),  # backward thread
               _mark("Optimizer.step#SGD.step", t + 800, 100.0), _rt(t + 810, 10 * i + 3),
               _k(t + 820, 10 * i + 3, "multi_tensor_apply_kernel")]
    r = _analyse(tmp_path, ev)
    assert r.step_source == "iteration_markers"
    assert r.steps["kind"].tolist() == ["training"] * 3
    assert r.steps_tot["n_events"].tolist() == [3, 3, 3]
    assert (r.work["step_id"] >= 0).all()


def test_a_benchmarks_warmup_is_never_judged(tmp_path: Path):
    """A benchmark's `[param|...|warmup|forward]` and `[param|...|measure|forward]` passes: the
    warm-up (here a large copy in) is kind `warmup` and left out of the judged steps, so the
    copy is not what the steps are judged on. Read as one window led by memcpy before."""
    bench = "[param|pytorch.model.alex_net|0|0|0|{}|forward]"
    ev = [_mark(bench.format("warmup"), 0.0, 500.0), _rt(10.0, 1, "cudaMemcpyAsync"),
          _k(20.0, 1, "Memcpy HtoD (Pageable -> Device)", dur=400.0, cat="gpu_memcpy")]
    for i in range(2):
        t = 1000.0 + 1000.0 * i
        ev += [_mark(bench.format("measure"), t, 500.0), _rt(t + 10, 2 + i), _k(t + 20, 2 + i, dur=100.0)]
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": ev}))
    an = analyze_traces(p, tmp_path / "out", progress=False, perfetto=False)
    ref = an.reference
    assert ref.step_source == "benchmark_annotations"
    assert ref.steps["kind"].tolist() == ["warmup", "measure", "measure"]
    info = an.summary.trace_info
    assert info.step_kinds == {"measure": 2}
    assert an.summary.decode.steps.n_steps == 2
    assert set(ref.decode["category"]) == {"dense_gemm"}


def test_graph_launches_inside_frames_are_refused(tmp_path: Path):
    """Two `execute_model` steps, each replaying four graph pieces: the 8 graph launches are
    pieces of the 2 frame steps, refused with the reason; before, each launch was a step."""
    frame = "vllm/v1/worker/gpu_model_runner.py(1862): execute_model"
    ev = []
    for i in range(2):
        t = 1000.0 * i
        ev.append({"ph": "X", "cat": "python_function", "name": frame, "pid": 1, "tid": 1, "ts": t, "dur": 500.0})
        for j in range(4):
            c = 10 * i + j + 1
            ev += [_rt(t + 10 + 50 * j, c, "cudaGraphLaunch"), _k(t + 20 + 50 * j, c), _k(t + 30 + 50 * j, c)]
    r = _analyse(tmp_path, ev)
    assert r.step_source == "engine_frames"
    assert r.steps["kind"].tolist() == ["decode", "decode"]  # graph replay, and no eager step beside
    assert r.steps_tot["n_events"].tolist() == [8, 8]
    status, reason = _record(r)["graph_launches"]
    assert status == "refused" and reason.startswith("8 steps, 4.0x the 2 of engine_frames, which enclose 88% of them"), reason


def test_outermost_frame_per_thread_and_idle_calls_dropped(tmp_path: Path):
    """The worker's `execute_model` around the runner's is one step, not two; a call with
    nothing scheduled launches nothing and is no step; a step run eagerly beside ones that
    replay graphs is a prefill."""
    worker, runner = "vllm/v1/worker/gpu_worker.py(328): execute_model", "gpu_model_runner.py(9): execute_model"

    def frames(t):
        return [{"ph": "X", "cat": "python_function", "name": worker, "pid": 1, "tid": 1, "ts": t, "dur": 400.0},
                {"ph": "X", "cat": "python_function", "name": runner, "pid": 1, "tid": 1, "ts": t + 5, "dur": 390.0}]

    ev = frames(0.0) + frames(1000.0) + frames(2000.0)
    ev += [_rt(1010.0, 1), _k(1020.0, 1), _rt(2010.0, 2, "cudaGraphLaunch"), _k(2020.0, 2)]
    r = _analyse(tmp_path, ev)
    assert r.step_source == "engine_frames"
    assert r.steps["ts"].tolist() == [1000.0, 2000.0] and r.steps["name"].tolist() == [worker, worker]
    assert r.steps["kind"].tolist() == ["prefill", "decode"]


def test_sglang_forward_frames_name_the_kind(tmp_path: Path):
    """SGLang's scheduler runs one `run_batch` per step; its model runner's `forward_extend` or
    `forward_decode` inside says the kind."""
    ev = []
    for i, kind in enumerate(("extend", "decode", "decode")):
        t = 1000.0 * i
        ev += [{"ph": "X", "cat": "python_function", "name": "sglang/srt/managers/scheduler.py(1500): run_batch",
                "pid": 1, "tid": 1, "ts": t, "dur": 500.0},
               {"ph": "X", "cat": "python_function", "pid": 1, "tid": 1, "ts": t + 10, "dur": 400.0,
                "name": f"sglang/srt/model_executor/model_runner.py(1700): forward_{kind}"},
               _rt(t + 20, i + 1), _k(t + 30, i + 1)]
    r = _analyse(tmp_path, ev)
    assert r.step_source == "engine_frames"
    assert r.steps["kind"].tolist() == ["prefill", "decode", "decode"]


def _cpu_op(name, ts, dur=5.0):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}


def test_vllm_v0_cpu_steps_by_their_attention_ops(tmp_path: Path):
    """vLLM 0.8.5's V0 engine on CPU (the corpus's `vllm-cpu085-v0-tinyllama-tp2`): no annotation
    and nothing launched. The driver's `execute_model` with nothing scheduled (it stops the
    workers' loop) runs no op and is no step; SDPA makes a prefill, `paged_attention_v1` a
    decode, both a mixed step. Before: every frame a step (67 of 65) and every kind unknown."""
    worker, runner = "vllm/worker/worker_base.py(386): execute_model", "cpu_model_runner.py(607): execute_model"
    attn = {"prefill": ["aten::scaled_dot_product_attention"], "decode": ["_C::paged_attention_v1"],
            "mixed": ["aten::scaled_dot_product_attention", "_C::paged_attention_v1"], "stop": []}
    ev = []
    for i, kind in enumerate(("prefill", "decode", "decode", "stop", "mixed", "decode")):
        t = 1000.0 * i
        ev += [{"ph": "X", "cat": "python_function", "name": worker, "pid": 1, "tid": 1, "ts": t, "dur": 500.0}]
        if kind != "stop":
            ev += [{"ph": "X", "cat": "python_function", "name": runner, "pid": 1, "tid": 1, "ts": t + 5, "dur": 490.0},
                   _cpu_op("aten::linear", t + 10)] + [_cpu_op(n, t + 20 + 10 * j) for j, n in enumerate(attn[kind])]
    r = _analyse(tmp_path, ev)
    assert r.step_source == "engine_frames" and r.steps["ts"].tolist() == [0.0, 1000.0, 2000.0, 4000.0, 5000.0]
    assert r.steps["kind"].tolist() == ["prefill", "decode", "decode", "mixed", "decode"]
    assert "paged_attention" in {c["source"]: c for c in r.steps.attrs["step_sources"]}["engine_frames"]["kind_from"]


def test_the_engines_annotation_is_never_refused_for_a_wrapper(tmp_path: Path):
    """A `ProfilerStep` around a window of engine steps is coarser, but the engine's word on its
    own step wins: its steps are steps, not pieces."""
    ann = "execute_context_0(0)_generation_4(4)"
    ev = [_mark("ProfilerStep#1", 0.0, 5000.0)]
    for i in range(4):
        t = 10.0 + 1000.0 * i
        ev += [_mark(ann, t, 500.0), _rt(t + 10, i + 1), _k(t + 20, i + 1)]
    r = _analyse(tmp_path, ev)
    assert r.step_source == "annotation:vllm" and len(r.steps) == 4
    assert _record(r)["annotation:profiler_step"] == ("outranked", "annotation:vllm ranks above it")


@pytest.mark.parametrize("events,said", [
    ([_rt(0.0, 1), _k(5.0, 1, dur=0.02)], "1 work event(s)"),      # a libkineto unit test's output
    ([_rt(0.0, 1), _k(5.0, 1, dur=0.2), _k(6.0, 1, dur=0.3)], "summing to 0.5 µs"),
])
def test_degenerate_traces_are_refused(tmp_path: Path, events, said):
    """Too few events or too little device time to say anything: refused with the reason, not
    read as "device busy 100 %, bound by the work itself"."""
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events}))
    with pytest.raises(TraceError) as err:
        analyze_traces(p, tmp_path / "out", progress=False, perfetto=False)
    assert "too little to analyse" in str(err.value) and said in str(err.value), str(err.value)


# --------------------------------------------------------------- the fake vLLM V1 serving trace


@cache
def _fake_v1_run(root: str) -> tuple:
    from stepscope.report.artifacts import load_run_artifacts
    from stepscope.report.build import build_report, report_context, writeup_params_from
    from stepscope.testing.vllm_v1_trace import write_fake_vllm_v1_trace

    run = Path(root) / "run"
    trace = write_fake_vllm_v1_trace(Path(root) / "traces" / "rank0.pt.trace.json.gz")
    an = analyze_traces([trace], run / "05_categorize", progress=False, perfetto=False)
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    a = load_run_artifacts(run)
    return an, md, report_context(a, writeup_params_from(a)).verdict


@pytest.fixture(scope="module")
def fake_v1(tmp_path_factory):
    return _fake_v1_run(str(tmp_path_factory.mktemp("v1")))


def test_vllm_v1_piecewise_trace_reads_as_1_prefill_and_9_decode_steps(fake_v1):
    """Issue 35's first "done when": no step annotation, `execute_model` frames, 81 graph pieces
    per decode step. Before: 729 "steps" of one graph piece each, 2 all-reduces per step, kind
    unknown and no decode verdict."""
    an, _, _ = fake_v1
    info = an.summary.trace_info
    assert info.step_source == "engine_frames" and info.n_steps == 10
    assert info.step_kinds == {"prefill": 1, "decode": 9}
    assert info.kind == "decode" and info.judged_kind == "decode" and info.graph_replay is True
    assert an.reference.steps["kind"].tolist() == ["prefill"] + ["decode"] * 9
    obs = an.summary.collectives_check.observed
    assert obs.steps_used == "decode" and obs.n_steps == 9
    assert (obs.all_reduce.min, obs.all_reduce.max) == (161, 161)  # 2L+1, L=80
    assert (obs.all_gather.min, obs.all_gather.max) == (1, 1)


def test_vllm_v1_trace_says_which_source_was_refused_and_why(fake_v1):
    an, _, _ = fake_v1
    choices = {c.source: c for c in an.summary.ranks[0].step_sources}
    assert choices["engine_frames"].status == "chosen" and choices["engine_frames"].n_steps == 10
    assert "graph replay" in choices["engine_frames"].kind_from
    g = choices["graph_launches"]
    assert (g.status, g.n_steps) == ("refused", 729)
    assert g.reason == "729 steps, 72.9x the 10 of engine_frames, which enclose 99% of them: pieces of a step, not steps"


def test_vllm_v1_trace_gets_a_decode_verdict(fake_v1):
    _, md, verdict = fake_v1
    assert verdict.dominant is not None and verdict.dominant.step_label == "decode step"
    assert verdict.dominant.n_steps == 9 and verdict.dominant.category == "dense_gemm"
    assert "Verdict withheld" not in md and "decode steps: 9" in md


def _llama(n_layers: int):
    from stepscope.model.arch import Architecture

    return Architecture(name=f"llama-{n_layers}", family="llama", n_layers=n_layers, n_dense_layers=n_layers,
                        hidden=8192, vocab=128256, heads=64, kv_heads=8, head_dim=128, intermediate=28672)


@pytest.mark.parametrize("n_layers,failing", [(80, []), (79, list(range(1, 10)))])
def test_decode_steps_checked_against_the_architecture(tmp_path: Path, n_layers, failing):
    """Each decode step must hold the architecture's 2L+1 all-reduces: at L=80 all nine do; told
    the model has 79 layers (159 expected), every one is flagged by id."""
    from stepscope.testing.vllm_v1_trace import write_fake_vllm_v1_trace

    trace = write_fake_vllm_v1_trace(tmp_path / "rank0.pt.trace.json.gz")
    an = analyze_traces([trace], tmp_path / "out", arch=_llama(n_layers), tp=4, progress=False, perfetto=False)
    check = an.summary.collectives_check
    assert check.expected.all_reduce == 2 * n_layers + 1 and check.steps_failing == failing
    flags = [f for f in an.flags if f.code == "steps_off_architecture"]
    assert len(flags) == (1 if failing else 0)
    if failing:
        assert flags[0].message.startswith("9 of 9 decode steps (ids [1, 2, 3, 4, 5] ...) do not hold the 159")


def _guarded_verdict(run: Path):
    from stepscope.report.artifacts import load_run_artifacts
    from stepscope.report.build import report_context, writeup_params_from

    a = load_run_artifacts(run)
    return report_context(a, writeup_params_from(a)).verdict


def test_every_step_off_the_architecture_withdraws_the_claims_on_the_step(tmp_path: Path):
    """Told L=79, none of the nine decode steps holds 159 all-reduces: none is a forward pass as
    the architecture runs it, so the guard withdraws what would be said of "the step"."""
    from stepscope.testing.vllm_v1_trace import write_fake_vllm_v1_trace

    trace = write_fake_vllm_v1_trace(tmp_path / "rank0.pt.trace.json.gz")
    an = analyze_traces([trace], tmp_path / "run" / "05_categorize", arch=_llama(79), tp=4, progress=False,
                        perfetto=False)
    assert an.summary.decode.steps.n_steps == 9  # nothing else to judge: nothing set apart
    v = _guarded_verdict(tmp_path / "run")
    g = next(g for g in v.guards if g.invariant == "steps_match_architecture")
    assert not g.holds and dict(g.values)["n_failing"] == 9 and dict(g.values)["all_reduce"] == 159
    assert v.dominant is None and v.levers == () and v.biggest is None and v.communication is None


def test_a_cut_step_is_set_apart_and_the_others_judged(tmp_path: Path):
    """The real vLLM V1 trace (H100, Llama 80 layers, TP=4) with its last decode step cut halfway,
    as a profiler window that ends mid-step cuts it: that step holds too few of the 161
    all-reduces, so it is set apart (kind `off_architecture`) and the other eight are judged."""
    import gzip

    src = Path(__file__).parent / "data" / "corpus" / "tracemap-h100-vllm-v1-llama80l-tp4-c32.json.gz"
    doc = json.loads(gzip.decompress(src.read_bytes()))
    frames = [e for e in doc["traceEvents"] if e.get("cat") == "python_function"
              and e.get("name", "").endswith("gpu_worker.py(263): execute_model")]
    last = sorted(frames, key=lambda e: e["ts"])[-2]  # the last with work (the final call runs nothing)
    cut_us = last["ts"] + last["dur"] / 2
    doc["traceEvents"] = [e for e in doc["traceEvents"]
                          if e.get("cat") == "python_function" or float(e.get("ts", 0)) < cut_us]
    trace = tmp_path / "rank0.pt.trace.json.gz"
    trace.write_bytes(gzip.compress(json.dumps(doc).encode()))
    an = analyze_traces([trace], tmp_path / "run" / "05_categorize", arch=_llama(80), tp=4, progress=False,
                        perfetto=False)
    failing = an.summary.collectives_check.steps_failing
    assert len(failing) == 1
    st = an.reference.steps_tot.set_index("step_id")
    assert st.loc[failing[0], "kind"] == "off_architecture" and st.loc[failing[0], "all_reduce_calls"] < 161
    assert an.summary.decode.steps.n_steps == 8
    flag = next(f for f in an.flags if f.code == "steps_off_architecture")
    assert flag.message.endswith("set apart (kind `off_architecture`) and the decode tables hold the other 8")
    v = _guarded_verdict(tmp_path / "run")
    assert all(g.holds for g in v.guards if g.invariant == "steps_match_architecture")
    assert v.dominant is not None and v.dominant.n_steps == 8
