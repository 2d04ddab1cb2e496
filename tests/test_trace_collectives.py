"""Collectives matched across ranks: skew, waiting, transfer, bandwidth (issue 14, item 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from stepscope.trace.analyze import analyze_traces
from stepscope.trace.collectives import bus_factor, dtype_from_kernel

TP2 = [f"vllm-cpu-tinyllama-tp2-rank{i}.pt.trace.json.gz" for i in (0, 1)]


def test_tp2_cpu_all_reduces_split_into_waiting_and_transfer(real_traces: Path, tmp_path: Path):
    an = analyze_traces([real_traces / n for n in TP2], tmp_path, progress=False, perfetto=False)
    m = an.summary.collectives_matched
    assert (m.world_size, m.ranks_present, m.complete, m.clock_flag) == (2, [0, 1], True, None)
    ar = m.by_category["all_reduce"]
    # The 50 all-reduces of the 10 decode steps, matched in issue order.
    assert ar.n_instances == 50 and ar.n_asymmetric == 0
    assert ar.skew_us.p90 == pytest.approx(4265.5, abs=1.0)      # review: ~4.3 ms
    assert ar.transfer_us.p50 == pytest.approx(701.4, abs=1.0)   # review: ~0.70 ms
    # Rank 0 arrives last most of the time; rank 1 does the waiting.
    assert ar.straggler_rank == 0
    assert ar.wait_ms_per_step_by_rank["0"] == pytest.approx(0.225, abs=0.001)
    assert ar.wait_ms_per_step_by_rank["1"] == pytest.approx(4.315, abs=0.001)
    assert ar.transfer_ms_per_step == pytest.approx(8.016, abs=0.001)
    # vLLM's logits gather: rank 1's `_allgather_base_` returns once gloo has the work and waits in
    # no op; counted until gloo's own annotation ends (`steps.unrecorded_waits`) it overlaps rank 0's
    # arrival in 9 of 10 (6 "left before the other arrived" before), no transfer in the last.
    assert m.by_category["all_gather"].n_asymmetric == 1
    t = pd.read_csv(tmp_path / "collective_instances.csv")
    assert len(t) == m.n_instances == 72
    assert t.loc[t["asymmetric"], "transfer_us"].isna().all()
    row = t[t["category"] == "all_reduce"].iloc[0]
    assert row["skew_us"] == pytest.approx(abs(row["arrival_us_r0"] - row["arrival_us_r1"]))
    assert row["wait_us_r0"] + row["wait_us_r1"] == pytest.approx(row["skew_us"])
    st = an.steps.query("rank == 0 and kind == 'decode'")
    assert st["coll_transfer_us"].notna().all() and set(st["straggler_rank"]) <= {0, 1}


def test_ranks_missing_from_the_world_make_no_cross_rank_claim(real_traces: Path, tmp_path: Path):
    an = analyze_traces([real_traces / f"hta-sampled-rank-{i}.json.gz" for i in (0, 1)], tmp_path,
                        progress=False, perfetto=False)
    m = an.summary.collectives_matched
    assert (m.complete, m.n_instances, m.transfer_ms_per_step, m.straggler_rank) == (
        False, 0, None, None)
    assert m.reason == "2 of 128 ranks present: no cross-rank claim is made"
    assert pd.read_csv(tmp_path / "collective_instances.csv").empty


def _nccl(ts: float, corr: int, dur: float, nelems: int, name: str) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "stream": 7, "Collective name": "allreduce",
                     "In msg nelems": nelems}}


def _gpu_rank(tmp_path: Path, rank: int, arrivals, clock_offset: float = 0.0) -> Path:
    ev = []
    for i, (a, d) in enumerate(arrivals):
        t = a + clock_offset
        ev.append({"ph": "X", "cat": "user_annotation", "name": "execute_context_0(0)_generation_8(8)",
                   "pid": 1, "tid": 1, "ts": t - 50.0, "dur": 40.0})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                   "ts": t - 45.0, "dur": 2.0, "args": {"correlation": i + 1}})
        ev.append(_nccl(t, i + 1, d, 4 * 1024 * 1024, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*)"))
    p = tmp_path / f"rank{rank}.json"
    p.write_text(json.dumps({"distributedInfo": {"rank": rank, "world_size": 2}, "traceEvents": ev}))
    return p


def test_gpu_bandwidth_from_message_size_and_a_clock_flag(tmp_path: Path):
    # Rank 1 arrives 100 µs late each time; the transfer after it takes 200 µs.
    r0 = _gpu_rank(tmp_path, 0, [(1000.0 * k, 300.0) for k in range(1, 7)])
    r1 = _gpu_rank(tmp_path, 1, [(1000.0 * k + 100.0, 200.0) for k in range(1, 7)])
    an = analyze_traces([r0, r1], tmp_path / "out", progress=False, perfetto=False)
    m = an.summary.collectives_matched
    ar = m.by_category["all_reduce"]
    assert ar.n_instances == 6 and ar.straggler_rank == 1
    assert ar.skew_us.p50 == pytest.approx(100.0) and ar.transfer_us.p50 == pytest.approx(200.0)
    assert ar.wait_ms_per_step_by_rank == {"0": pytest.approx(0.1), "1": pytest.approx(0.0)}
    assert ar.bytes_p50 == 8 * 1024 * 1024  # 4 Mi bf16 elements
    # algbw = 8 MiB / 200 µs; busbw = algbw x 2(n-1)/n = algbw at n = 2.
    assert ar.busbw_gbps_p50 == pytest.approx(8 * 1024 * 1024 / 200e-6 / 1e9)
    assert m.clock_flag is None
    # On a GPU an instance is one kernel: nothing inside it but the collective, so the two
    # readings of each rank's communication agree exactly.
    for v in m.reconcile.values():
        assert v.inside_idle_ms == 0.0 and v.inside_other_ms == 0.0 and v.agree is True
        assert v.matched_ms == pytest.approx(v.accounted_ms, rel=1e-12)
    # The same capture with rank 1's clock 1 s ahead: the ranks' clocks disagree.
    r1 = _gpu_rank(tmp_path, 1, [(1000.0 * k + 100.0, 200.0) for k in range(1, 7)], clock_offset=1e6)
    an = analyze_traces([r0, r1], tmp_path / "out2", progress=False, perfetto=False)
    assert an.summary.collectives_matched.clock_flag.ranks == [1]
    assert any(f.code == "clock_disagreement" for f in an.flags)


def test_nccl_factors_and_kernel_dtypes():
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert bus_factor("all_reduce", 1) == 1.0
    assert dtype_from_kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)") == "float"
    assert dtype_from_kernel("ncclDevKernel_AllGather_RING_LL_Sum_int8_t(x)") == "int8_t"
    assert dtype_from_kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "bf16"
    assert dtype_from_kernel("cross_device_reduce_1stage<bf16>") is None


def test_waiting_and_completion_add_up_per_rank_and_are_checked_against_the_accounting(
        real_traces: Path, tmp_path: Path):
    an = analyze_traces([real_traces / n for n in TP2], tmp_path, progress=False, perfetto=False)
    m = an.summary.collectives_matched
    wait, after, matched = (getattr(m, k) for k in ("wait_ms_per_step_by_rank", "after_last_arrival_ms_per_step_by_rank",
                                           "matched_ms_per_step_by_rank"))
    for r in ("0", "1"):
        assert wait[r] + after[r] == pytest.approx(matched[r], rel=1e-12)
    assert matched == {"0": pytest.approx(9.776, abs=0.001), "1": pytest.approx(13.636, abs=0.001)}
    # The pooled figures are a typical rank's: their sum (11.68 ms) is more than rank 0 spent.
    assert m.wait_ms_per_step + m.transfer_ms_per_step == pytest.approx(11.683, abs=0.001)
    assert m.wait_ms_per_step == pytest.approx((wait["0"] + wait["1"]) / 2)
    # Second reading: the collective categories' time. Rank 0's instances hold 0.49 ms per step
    # that the accounting does not call communication; shown side by side and flagged.
    rec = m.reconcile
    assert rec["0"].accounted_ms == pytest.approx(9.289, abs=0.001) and rec["0"].agree is False
    assert rec["1"].accounted_ms == pytest.approx(13.381, abs=0.001) and rec["1"].agree is True
    # Where the 0.49 ms lie: inside the instances, time with no recorded op (the traces carry no
    # Python events) and other categories' ops; the two close the gap exactly on both ranks.
    for r in ("0", "1"):
        v = rec[r]
        assert v.accounted_ms + v.inside_idle_ms + v.inside_other_ms == pytest.approx(v.matched_ms,
                                                                                            rel=1e-9)
    assert rec["0"].inside_idle_ms == pytest.approx(0.410, abs=0.001)
    assert rec["0"].inside_other_ms == pytest.approx(0.078, abs=0.001)
    flag = [f for f in an.flags if f.code == "comm_readings_disagree"]
    assert len(flag) == 1 and "rank 0: 9.776 against 9.289 ms per step (inside its instances 0.410 ms per step " \
        "run no recorded op" in flag[0].message and "0.078 ms other categories' work" in flag[0].message
    # steps.csv: the reference rank's own wait and completion, beside the mean over ranks.
    st = an.steps.query("rank == 0 and kind == 'decode'")
    assert (st["coll_wait_us"] + st["coll_after_us"]).mean() / 1e3 == pytest.approx(matched["0"])
    assert st["coll_wait_mean_us"].mean() / 1e3 == pytest.approx(m.wait_ms_per_step)


def test_a_rank_that_leaves_first_waits_only_until_it_leaves(real_traces: Path, tmp_path: Path):
    # vLLM's logits gather: rank 1 leaves before rank 0 arrives in 1 of 10 decode steps, even with
    # its unrecorded wait on gloo counted (`steps.unrecorded_waits`).
    analyze_traces([real_traces / n for n in TP2], tmp_path, progress=False, perfetto=False)
    t = pd.read_csv(tmp_path / "collective_instances.csv")
    asym = t[t["asymmetric"]]
    assert len(asym) == 1 and (asym["step_kind"] == "decode").sum() == 1
    # Counted to the last arrival, rank 1's wait would exceed its own time in the call.
    assert (asym["last_arrival_us"] - asym["arrival_us_r1"] > asym["end_us_r1"] - asym["arrival_us_r1"]).all()
    for r in (0, 1):
        own = asym[f"end_us_r{r}"] - asym[f"arrival_us_r{r}"]
        assert (asym[f"wait_us_r{r}"] + asym[f"after_us_r{r}"] - own).abs().max() < 1e-6
        assert (asym[f"wait_us_r{r}"] <= own + 1e-6).all()


def test_covered_time_inside_windows_is_exact():
    import numpy as np

    from stepscope.trace.account import covered_length, merged_intervals, union_length

    starts, ends = np.array([5.0, 0.0, 2.0, 10.0, 11.0]), np.array([6.0, 3.0, 4.0, 12.0, 11.5])
    s, e = merged_intervals(starts, ends)
    assert s.tolist() == [0.0, 5.0, 10.0] and e.tolist() == [4.0, 6.0, 12.0]
    assert union_length(starts, ends) == 7.0
    # [1, 5.5] covers 3 + 0.5; [5.5, 11] covers 0.5 + 1; a window before everything covers nothing
    assert covered_length(starts, ends, np.array([1.0, 5.5]), np.array([5.5, 11.0])) == 5.0
    assert covered_length(starts, ends, np.array([-5.0]), np.array([-1.0])) == 0.0
    assert covered_length(starts, ends, np.array([0.0]), np.array([20.0])) == 7.0


def test_cpu_only_nccl_job_counts_each_nccl_annotation_once(real_traces: Path, tmp_path: Path):
    # HTA's CPU-only export of an NCCL job: no kernel and no c10d:: op, but ProcessGroupNCCL's
    # six `nccl:all_to_all` annotations in the step, each inside a `record_param_comms` op: six
    # all-to-alls, counted per step with the collectives other than all-reduce and all-gather.
    an = analyze_traces([real_traces / "hta-cpu-only.json.gz"], tmp_path, progress=False, perfetto=False)
    w = an.ranks[0].work
    calls = w[w["collective_call"]]
    assert len(calls) == 6 and set(calls["name"]) == {"record_param_comms"}
    assert set(calls["category"].astype(str)) == {"all_to_all"}
    assert an.summary.collectives_check.observed.other_collective.median == 6
    # the six shorter record_param_comms ops after the calls (their waits) are no calls
    rpc = w[(w["name"] == "record_param_comms") & w["is_call"]]
    assert len(rpc) == 6



def test_an_nccl_annotation_names_its_call_unless_a_c10d_op_counts_it():
    import numpy as np

    from stepscope.trace.steps import _annotated_cpu_calls

    # thread 1: c10d::allreduce_ > record_param_comms > nccl:all_reduce (the c10d op counts it);
    # thread 2: record_param_comms > nccl:all_reduce, no c10d op (the annotation counts it)
    ev = pd.DataFrame({"cat": ["cpu_op", "cpu_op", "user_annotation", "cpu_op", "user_annotation"],
                       "name": ["c10d::allreduce_", "record_param_comms", "nccl:all_reduce",
                                "record_param_comms", "nccl:all_reduce"],
                       "pid": 1, "tid": [1, 1, 1, 2, 2], "ts": [0.0, 1.0, 2.0, 0.0, 1.0],
                       "dur": [10.0, 8.0, 5.0, 8.0, 5.0]})
    work = pd.DataFrame({"op_row": [0, 1, 3], "class": "communication", "is_call": True,
                         "category": ["all_reduce", "other_collective", "other_collective"]})
    coll = _annotated_cpu_calls(ev, work, np.array([True, False, False]))
    assert coll.tolist() == [True, False, True]
    assert work["category"].tolist() == ["all_reduce", "other_collective", "all_reduce"]
