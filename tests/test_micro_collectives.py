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
    plan = coll.plan_collectives(demo_params())
    results = coll.run_collectives(plan, tmp_path, progress=False)
    assert sorted(r["rank"] for r in results) == [0, 1]
    table = coll.collective_table(results)
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
    text = coll.describe_prediction(pred)
    assert "K 5" in text and "eager" in text


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
    assert (tmp_path / "collectives.csv").read_text().startswith("source,op,")
