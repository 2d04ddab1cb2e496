"""`stepscope compare A B --fail-on-regression` on synthetic run folders: one variant within
noise (every device time x1.01), one outside it (x1.3)."""

from __future__ import annotations

import pytest

from stepscope.campaign.gate import regression_message, regressions
from stepscope.cli import main
from stepscope.testing.synthetic import make_synthetic_run, set_level_columns


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("gate")
    return {name: make_synthetic_run(d / name, scale=s) for name, s in (("a", 1.0), ("near", 1.01), ("slow", 1.3))}


def test_within_noise_passes(runs, capsys):
    assert regressions(runs["a"], runs["near"]) == []
    assert main(["compare", str(runs["a"]), str(runs["near"]), "--fail-on-regression"]) == 0
    assert "no regression beyond noise" in capsys.readouterr().out


def test_outside_noise_fails_and_names_metric_values_and_band(runs, capsys):
    found = regressions(runs["a"], runs["slow"])
    metrics = {(d.metric, d.where) for d in found}
    assert ("category_ms_per_step", "all_reduce") in metrics
    assert ("output_throughput_tok_s", "c=1") in metrics and ("tpot_capture_ms", "capture (batch 1)") in metrics
    for d in found:
        assert abs(d.delta) > d.band and d.better is False
    ar = next(d for d in found if d.where == "all_reduce")
    assert ar.baseline == pytest.approx(5.5) and ar.value == pytest.approx(5.5 * 1.3)
    assert main(["compare", str(runs["a"]), str(runs["slow"]), "--fail-on-regression"]) == 1
    err = capsys.readouterr().err
    assert regression_message(ar) in err
    assert "all_reduce time per decode step (ms): A 5.50 → B 7.15" in err and "noise band ±" in err


def test_an_improvement_is_not_a_regression(runs):
    # B faster than A: the reverse comparison of the slow run finds nothing to fail on
    assert regressions(runs["slow"], runs["a"]) == []


def test_a_level_delivered_in_bursts_is_not_a_latency_regression(runs, tmp_path):
    # As the n-gram variant of the CPU campaign of 2026-12-01: at every level 97-100 % of its
    # token chunks arrived bunched, its TTFT read 15-20x the baseline's and its TPOT 0 ms. Those
    # measure delivery; throughput (tokens over the level's time) still compares.
    import shutil

    import pandas as pd

    from stepscope.campaign.analysis import deltas, pair

    b = tmp_path / "bursty"
    shutil.copytree(runs["slow"], b)
    lv = pd.read_csv(b / "01_macro_sweep" / "levels.csv")
    set_level_columns(b, bunched_chunk_share=[0.97, 0.2, 0.2, 0.2],
                      ttft_ms_median=lv["ttft_ms_median"].where(lv["concurrency"] != 1, 294.0).tolist(),
                      tpot_ms_median=lv["tpot_ms_median"].where(lv["concurrency"] != 1, 0.0).tolist())
    found = {(d.metric, d.where) for d in regressions(runs["a"], b)}
    assert ("ttft_ms_median", "c=1") not in found and ("output_throughput_tok_s", "c=1") in found
    assert ("ttft_ms_median", "c=2") in found  # a level that was not bunched is still judged
    ttft = next(d for d in deltas(pair(runs["a"], b)) if (d.metric, d.where) == ("ttft_ms_median", "c=1"))
    assert ttft.not_comparable == "B's chunks at c=1 arrived bunched (97 %): its TPOT and TTFT measure delivery"
    assert not ttft.real and ttft.better is None and ttft.value == 294.0


def test_a_stalled_level_is_not_a_throughput_regression(runs, tmp_path):
    # As the n-gram variant of the CPU campaign of 2026-12-01 (second run): its level c=4 lost
    # 82 % of its time to server-wide stalls and read 350 output tok/s against the baseline's
    # 1,158, which the change table called a "real" 0.302x. Stalls say nothing of the variant.
    import shutil

    from stepscope.campaign.analysis import deltas, pair

    a = set_level_columns(shutil.copytree(runs["a"], tmp_path / "a"), stall_share=[0.0, 0.0, 0.0, 0.0])
    b = tmp_path / "stalled"
    shutil.copytree(runs["slow"], b)
    set_level_columns(b, stall_share=[0.82, 0.0, 0.04, 0.0])
    found = {(d.metric, d.where) for d in regressions(a, b)}
    for metric in ("output_throughput_tok_s", "ttft_ms_median", "tpot_ms_median"):
        assert (metric, "c=1") not in found
    assert ("output_throughput_tok_s", "c=2") in found  # a level without stalls is still judged
    assert ("output_throughput_tok_s", "c=4") in found  # 4 %: within the few-percent scatter, judged
    tput = next(d for d in deltas(pair(a, b)) if (d.metric, d.where) == ("output_throughput_tok_s", "c=1"))
    assert tput.not_comparable == ("B's level c=1 lost 82 % of its time to server-wide stalls: its readings are "
                                   "low or late by up to that share")
    assert not tput.real and tput.better is None
    # ... but the stalls themselves are compared: a server that pauses must not hide its own
    # regression behind "not compared".
    assert ("stall_pct", "c=1") in found and ("stall_pct", "c=4") not in found  # 4 points: within the band
    stall = next(d for d in regressions(a, b) if (d.metric, d.where) == ("stall_pct", "c=1"))
    assert (stall.baseline, stall.value, stall.band) == (0.0, pytest.approx(82.0), 5.0)
    assert regression_message(stall) == ("regression: share of the level lost to server-wide stalls (%) at c=1: "
                                         "A 0 → B 82.0 (Δ 82.0, outside the noise band ±5.00 from fixed 5 points "
                                         "(STALLED_LEVEL_SHARE))")
    assert ("stall_pct", "c=1") not in {(d.metric, d.where) for d in regressions(b, a)}  # fewer stalls: better
