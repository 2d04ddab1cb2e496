"""Goodput under per-request SLOs (stepscope.sweep.goodput): vLLM's definition, checked
against vLLM's own calculate_metrics, and the SLO-boundary level of a sweep."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from stepscope.config import SloParams, params_from_dict
from stepscope.errors import ParamsError
from stepscope.sweep.goodput import goodput_metrics, slo_boundary, slo_flags, slo_summary
from stepscope.sweep.metrics import RequestRecord, level_metrics


def _records_and_vllm_outputs(n: int = 60, seed: int = 1):
    """Records with one-token requests, failures and a spread of latencies around the bounds."""
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

    rng = np.random.default_rng(seed)
    records, outputs = [], []
    for i in range(n):
        start = 100.0 + rng.uniform(0, 3)
        n_out = 1 if i % 11 == 3 else int(rng.integers(2, 30))
        gaps = rng.exponential(0.02, size=n_out)
        gaps[0] += rng.uniform(0.05, 0.5)
        chunks = list(start + np.cumsum(gaps))
        fail = i % 9 == 4
        rec = RequestRecord(start_s=start, chunk_times_s=[] if fail else chunks,
                            end_s=(start + 0.1) if fail else chunks[-1] + 0.001, input_tokens=20,
                            output_tokens=None if fail else n_out, success=not fail,
                            error="reset" if fail else None, request_id=i)
        records.append(rec)
        o = RequestFuncOutput(success=not fail, prompt_len=20, start_time=start)
        if not fail:
            o.ttft, o.itl, o.latency, o.output_tokens = chunks[0] - start, list(np.diff(chunks)), chunks[-1] - start, n_out
        outputs.append(o)
    return records, outputs


@pytest.mark.parametrize("bounds", [{"ttft": 250.0}, {"tpot": 20.0}, {"e2el": 600.0},
                                    {"ttft": 300.0, "tpot": 25.0, "e2el": 700.0}])
def test_goodput_agrees_with_vllm_calculate_metrics(bounds):
    serve = pytest.importorskip("vllm.benchmarks.serve")
    records, outputs = _records_and_vllm_outputs()
    dur = level_metrics(records)["duration_s"]
    theirs, _ = serve.calculate_metrics(input_requests=[], outputs=outputs, dur_s=dur, tokenizer=None,
                                        selected_percentiles=[50.0], goodput_config_dict=bounds)
    ours = goodput_metrics(records, {f"{k}_ms": v for k, v in bounds.items()}, dur)
    assert 0 < theirs.request_goodput < theirs.request_throughput  # the bounds cut some requests
    assert ours["goodput_rps"] == pytest.approx(theirs.request_goodput, rel=1e-12)


def test_bounds_are_inclusive_failures_miss_and_one_token_tpot_is_zero():
    ok = RequestRecord(start_s=0.0, chunk_times_s=[0.1, 0.12, 0.14], end_s=0.14, output_tokens=3, success=True)
    one = RequestRecord(start_s=0.0, chunk_times_s=[0.1], end_s=0.1, output_tokens=1, success=True, request_id=1)
    failed = RequestRecord(start_s=0.0, end_s=0.2, success=False, error="reset", request_id=2)
    # TPOT of `ok` is (0.14 - 0.1)/2 = 20 ms exactly at the bound: it meets it.
    g = goodput_metrics([ok, one, failed], SloParams(tpot_ms=20.0 + 1e-9), duration_s=2.0)
    assert g["slo_tpot_share"] == pytest.approx(2 / 3)
    assert g["goodput_rps"] == pytest.approx(1.0)  # 2 good requests / 2 s
    assert g["goodput_tok_s"] == pytest.approx(2.0)  # (3 + 1) tokens / 2 s
    assert math.isnan(g["slo_ttft_share"])  # not set


def test_itl_bound_reads_the_longest_gap_not_the_mean():
    # TPOT 20 ms, but one 50 ms pause: it meets tpot_ms 25 and misses itl_ms 40.
    paused = RequestRecord(start_s=0.0, chunk_times_s=[0.1, 0.11, 0.16, 0.17, 0.18], end_s=0.18,
                           output_tokens=5, success=True)
    g = goodput_metrics([paused], SloParams(tpot_ms=25.0, itl_ms=40.0), duration_s=1.0)
    assert g["slo_tpot_share"] == 1.0 and g["slo_itl_share"] == 0.0 and g["slo_met_share"] == 0.0


def test_no_slo_leaves_every_goodput_column_empty():
    r = RequestRecord(start_s=0.0, chunk_times_s=[0.1, 0.2], end_s=0.2, output_tokens=2, success=True)
    assert all(math.isnan(v) for v in goodput_metrics([r], None, 1.0).values())


def _levels(shares: dict[int, float]) -> pd.DataFrame:
    return pd.DataFrame([{"level": f"c{c:04d}", "mode": "concurrency", "concurrency": c, "request_rate": None,
                          "complete": True, "n_requests": 32, "slo_met_share": s,
                          "output_throughput_tok_s": 10.0 * c, "goodput_tok_s": 10.0 * c * s, "goodput_rps": c * s}
                         for c, s in shares.items()])


def test_boundary_is_the_last_passing_level_below_the_first_miss():
    lv = _levels({1: 1.0, 2: 0.95, 4: 0.85, 8: 0.92, 16: 0.2})
    b = slo_boundary(lv, 0.9)
    assert (b["boundary_level"], b["boundary_load"], b["first_miss_level"]) == ("c0002", 2.0, "c0004")
    assert b["passes_above_miss"] == ["c0008"]
    summary = slo_summary(lv, SloParams(tpot_ms=50.0, min_share=0.9))
    assert summary["concurrency"]["goodput_tok_s"] == pytest.approx(19.0)
    assert "rate" not in summary
    assert any("c0008 met the SLO again" in f for f in slo_flags(summary))


def test_boundary_when_none_or_all_levels_pass():
    assert slo_boundary(_levels({1: 0.5, 2: 0.1}), 0.9)["boundary_level"] is None
    assert slo_boundary(_levels({1: 1.0, 2: 1.0}), 0.9)["first_miss_level"] is None
    flags = slo_flags(slo_summary(_levels({1: 0.5}), SloParams(ttft_ms=1.0)))
    assert flags and "not even the lowest (c0001)" in flags[0]


def test_params_refuse_an_empty_slo_and_a_search_without_one():
    base = {"run": {"name": "t"}}
    with pytest.raises(ParamsError, match="sets no bound"):
        params_from_dict({**base, "sweep": {"slo": {"min_share": 0.9}}})
    p = params_from_dict({**base, "sweep": {"slo": {"tpot_ms": 50}}})
    assert p.sweep.slo.tpot_ms == 50.0 and p.sweep.slo.min_share == 0.9


def test_finish_writes_goodput_columns_and_the_boundary(tmp_path):
    from stepscope import schema
    from stepscope.sweep.run import Level, finish, write_level

    for c, tpot_s in ((1, 0.01), (2, 0.02), (4, 0.08)):
        recs = [RequestRecord(start_s=0.1 * i, chunk_times_s=[0.1 * i + 0.05 + tpot_s * k for k in range(5)],
                              end_s=0.1 * i + 0.05 + tpot_s * 4, output_tokens=5, success=True, request_id=i)
                for i in range(8)]
        write_level(tmp_path, Level("concurrency", c, None, 8), recs,
                    {"level": f"c{c:04d}", "mode": "concurrency", "concurrency": c, "complete": True})
    res = finish(tmp_path, 0.1, slo=SloParams(tpot_ms=50.0))
    assert list(res.levels["slo_met_share"]) == [1.0, 1.0, 0.0]
    assert res.levels["goodput_tok_s"].iloc[2] == 0.0
    s = schema.read(tmp_path / "summary.json", schema.SweepSummary)
    assert s.slo.concurrency.boundary_level == "c0002" and s.slo.concurrency.first_miss_level == "c0004"
    assert s.slo.bounds_ms == {"tpot_ms": 50.0}


def test_per_gpu_chart_divides_by_tp_and_marks_the_slo_and_the_knee():
    from stepscope.sweep.goodput import per_gpu_points
    from stepscope.sweep.plots import plot_per_gpu_vs_per_user

    lv = _levels({1: 1.0, 2: 1.0, 4: 0.5}).assign(n_completed=32, tpot_ms_median=[10.0, 20.0, 50.0])
    pts = per_gpu_points(lv, tp=2)
    assert pts["tok_s_per_gpu"].tolist() == [5.0, 10.0, 20.0]  # 10 C tok/s over 2 GPUs
    assert pts["tok_s_per_user"].tolist() == [100.0, 50.0, 20.0]
    assert pts["goodput_tok_s_per_gpu"].tolist() == [5.0, 10.0, 10.0]
    summary = {"knee_concurrency": 4, "slo": slo_summary(lv, SloParams(tpot_ms=25.0))}
    ax = plot_per_gpu_vs_per_user(pts, 2, summary).axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "SLO TPOT <= 25 ms: 40.0 tok/s per user" in labels
    assert "SLO boundary: C=2" in labels and "knee: C=4" in labels
    assert "TP=2" in ax.get_ylabel() and "3 levels, 32-32 completed requests each" in ax.get_title().replace("\n", " ")


def _run_with_slo(path, share_of_level):
    """A synthetic run whose levels met `sweep.slo` (TPOT 50 ms) for share_of_level(i, n) of requests."""
    import json

    from stepscope.testing.synthetic import make_synthetic_run, set_level_columns

    run = make_synthetic_run(path)
    lv = pd.read_csv(run / "01_macro_sweep" / "levels.csv")
    shares = np.array([share_of_level(i, len(lv)) for i in range(len(lv))])
    set_level_columns(run, slo_met_share=list(shares), goodput_tok_s=list(lv["output_throughput_tok_s"] * shares),
                      goodput_rps=[1.0] * len(lv))
    lv = pd.read_csv(run / "01_macro_sweep" / "levels.csv")
    summary_path = run / "01_macro_sweep" / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["slo"] = slo_summary(lv, SloParams(tpot_ms=50.0))
    summary_path.write_text(json.dumps(summary))
    return run, lv


def test_the_report_names_the_slo_boundary_and_shows_goodput_beside_throughput(tmp_path):
    from stepscope.report import build_report

    run, lv = _run_with_slo(tmp_path / "run", lambda i, n: 1.0 if i < n - 2 else 0.5)
    md = build_report(run, draw_figures=False)["markdown"].read_text()
    n = len(lv)
    assert f"the SLO-boundary level is **{lv.iloc[n - 3]['level']}**" in md
    assert "TPOT ≤ 50 ms per request" in md and f"the next level, {lv.iloc[n - 2]['level']} (concurrency" in md
    header = next(line for line in md.splitlines() if line.startswith("| concurrency") and "goodput tok/s" in line)
    assert header.index("output tok/s") < header.index("goodput tok/s")


def test_compare_shows_goodput_and_refuses_it_under_different_slos(tmp_path):
    import json

    from stepscope.report.artifacts import load_run_artifacts
    from stepscope.report.compare import compare_macro

    run_a, lv = _run_with_slo(tmp_path / "a", lambda i, n: 1.0)
    run_b, _ = _run_with_slo(tmp_path / "b", lambda i, n: 0.5)
    rows = compare_macro(load_run_artifacts(run_a), load_run_artifacts(run_b))
    g = rows[rows["metric"] == "goodput_tok_s"]
    assert len(g) == len(lv) and g["beyond_noise"].all() and g["not_comparable"].isna().all()
    s = json.loads((run_b / "01_macro_sweep" / "summary.json").read_text())
    s["slo"]["bounds_ms"] = {"tpot_ms": 80.0}
    (run_b / "01_macro_sweep" / "summary.json").write_text(json.dumps(s))
    g = compare_macro(load_run_artifacts(run_a), load_run_artifacts(run_b)).query("metric == 'goodput_tok_s'")
    assert g["not_comparable"].str.contains("SLOs differ").all() and not g["beyond_noise"].any()


def test_compare_names_a_ramp_level_by_its_name():
    from stepscope.report.deltas import level_label

    r = pd.Series({"mode": "ramp", "concurrency": float("nan"), "request_rate": float("nan"), "level": "ramp-lin-1-8"})
    assert level_label(r) == "ramp-lin-1-8"
