"""Step period, micro/macro idle, the largest gap and launch delay, on real traces (issue 14)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from stepscope import schema
from stepscope.trace.analyze import analyze_traces

TP2 = [f"vllm-cpu-tinyllama-tp2-rank{i}.pt.trace.json.gz" for i in (0, 1)]


def _analyse(real_traces: Path, names, out: Path):
    return analyze_traces([real_traces / n for n in names], out, progress=False, perfetto=False)


def test_tp2_period_is_longer_than_the_span_and_carries_the_amdahl_ceilings(real_traces, tmp_path):
    an = _analyse(real_traces, TP2, tmp_path)
    d = an.summary.decode
    # 8 decode steps followed by a decode step; the review measured 26.4 ms against 20.0 ms.
    assert d.period_ms.n == 8
    assert d.period_ms.mean == pytest.approx(26.42, abs=0.01)
    assert d.steps.span_ms.mean == pytest.approx(20.03, abs=0.01)
    assert d.steps.period_ms.mean == d.period_ms.mean
    assert d.denominator == "period"
    amd = an.amdahl.set_index("category")
    assert (amd["denominator"] == "period").all()
    assert amd.loc["all_reduce", "step_ms"] == pytest.approx(26.42, abs=0.01)
    exp = amd.loc["all_reduce", "exposed_ms"]
    assert amd.loc["all_reduce", "speedup_ceiling"] == pytest.approx(26.4187 / (26.4187 - exp), rel=1e-4)
    cats = an.decode_categories.query("rank == 0").set_index("category")
    assert cats.loc["all_reduce", "share_of_period"] == pytest.approx(
        cats.loc["all_reduce", "union_ms_mean"] / d.period_ms.mean)
    # CPU traces: idle is the gaps between the worker's ops; no launches to time.
    # (6.38 ms before the all-gathers' unrecorded waits on gloo were counted as theirs)
    assert d.idle_micro_ms == pytest.approx(6.15, abs=0.01)
    assert d.idle_macro_ms == pytest.approx(1.17, abs=0.01)
    assert d.launch_delay_us == {"median": None, "p90": None}


def test_steps_csv_has_period_idle_and_launch_columns(real_traces, tmp_path):
    _analyse(real_traces, TP2, tmp_path)
    st = pd.read_csv(tmp_path / "steps.csv")
    for c in ("kind", "period_us", "compute_us", "comm_exposed_us", "memory_exposed_us",
              "idle_micro_us", "idle_macro_us", "launch_delay_us"):
        assert c in st.columns, c
    r0 = st[st["rank"] == 0].reset_index(drop=True)
    assert r0.loc[1, "period_us"] == pytest.approx(r0.loc[2, "annotation_ts_us"] - r0.loc[1, "annotation_ts_us"])
    assert pd.isna(r0["period_us"].iloc[-1])
    # Idle inside a step never exceeds the step's idle (span - busy).
    assert ((r0["idle_micro_us"] + r0["idle_macro_us"]) <= r0["idle_us"] + 1e-6).all()


def test_sglang_stall_is_one_macro_gap_behind_a_blocking_memcpy(real_traces, tmp_path):
    an = _analyse(real_traces, ["sglang-mi300x-qwen3-8b-decode.json.gz"], tmp_path)
    d = an.summary.decode
    assert d.denominator == "span" and "one step only" in d.denominator_reason
    assert d.period_ms.n == 0
    g = d.largest_gap
    assert g.dur_ms == pytest.approx(463.30, abs=0.01) and g.macro is True
    assert g.host_call == "hipMemcpyWithStream"
    assert d.idle_macro_ms == pytest.approx(g.dur_ms)
    assert d.idle_micro_ms == pytest.approx(0.68, abs=0.01)
    json.dumps(schema.to_builtins(d))  # the summary block encodes as plain JSON


def test_ddp_launch_delay_and_period(real_traces, tmp_path):
    an = _analyse(real_traces, ["hta-a100-ddp-nccl.json.gz"], tmp_path)
    d = an.summary.decode
    assert d.period_ms.n == 2 and d.period_ms.mean == pytest.approx(221.14, abs=0.01)
    assert d.launch_delay_us["median"] == pytest.approx(12.25, abs=0.01)
    assert d.launch_delay_us["p90"] == pytest.approx(80.78, abs=0.01)


@pytest.mark.parametrize("tpot,flagged", [(26.0, False), (20.0, True), (40.0, True)])
def test_period_and_client_tpot_disagreement_is_flagged(real_traces, tmp_path, tpot, flagged):
    an = analyze_traces([real_traces / n for n in TP2], tmp_path, progress=False, perfetto=False,
                        tpot_ms=tpot)
    msgs = [f.message for f in an.flags if f.code == "period_tpot_mismatch"]
    assert bool(msgs) is flagged
    if flagged:
        assert ("bursts" in msgs[0]) is (tpot < 26.42)


def test_overlapping_steps_read_the_device_busy_within_each_period(tmp_path):
    """HTA's pipelined all-to-all rank: each step's own work (124 ms) outlasts its 111 ms period.
    The device's busy time within each period, from the step's first work, counts any step's
    work: checked against a plain union of the trace's device events over the same windows."""
    import gzip
    import json

    from stepscope.trace import analyze_traces

    src = Path(__file__).parent / "data" / "corpus" / "hta-rank1-of-2-alltoall-training.json.gz"
    an = analyze_traces([src], tmp_path, progress=False, perfetto=False)
    st = an.reference.steps_tot
    ev = [e for e in json.loads(gzip.decompress(src.read_bytes()))["traceEvents"]
          if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    iv = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in ev)
    for row in st[st["period_busy_us"].notna()].itertuples():
        a = row.first_start_us + an.reference.info["origin_us"]  # stage 05's times start at the trace's origin
        b = a + row.period_us
        covered, cur_s, cur_e = 0.0, None, None
        for s, e in iv + [(float("inf"), float("inf"))]:  # merge, then clip each interval to [a, b)
            if cur_e is not None and s <= cur_e:
                cur_e = max(cur_e, e)
                continue
            if cur_s is not None:
                covered += max(0.0, min(cur_e, b) - max(cur_s, a))
            cur_s, cur_e = s, e
        assert row.period_busy_us == pytest.approx(covered, abs=1.0), row.step_id
        assert row.period_busy_us <= row.period_us < row.busy_us or row.busy_us <= row.period_us
    assert an.summary.decode.steps.period_busy_ms.median == pytest.approx(107.44, abs=0.01)
