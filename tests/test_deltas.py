"""One comparison engine (`report.deltas`): compare's tables, the regression gate and the
campaign's deltas judge the same pair of run folders alike, quantity by quantity."""

from __future__ import annotations

import pandas as pd
import pytest

from stepscope.campaign import analysis as ca
from stepscope.campaign.gate import GATED, regressions
from stepscope.report import compare_runs
from stepscope.report.artifacts import load_run_artifacts
from stepscope.report.deltas import run_deltas, same_setup
from stepscope.testing.synthetic import make_synthetic_run, set_level_columns
from stepscope.wording import not_compared_words


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
    # B: every device time 1.3x A's (a regression), c=1 bunched (97 %), c=8 stalled (82 %): each rule fires once.
    root = tmp_path_factory.mktemp("deltas")
    a = set_level_columns(make_synthetic_run(root / "a"), stall_share=[0.0] * 4, bunched_chunk_share=[0.1] * 4)
    b = set_level_columns(make_synthetic_run(root / "b", scale=1.3), stall_share=[0.0, 0.0, 0.0, 0.82],
                          bunched_chunk_share=[0.97, 0.1, 0.1, 0.1])
    return a, b


def _compare_rows(out: dict) -> dict[tuple[str, str], pd.Series]:
    rows = {}
    for _, r in pd.read_csv(out["csv_macro"]).iterrows():
        rows[(r["metric"], r["level"])] = r
    for _, r in pd.read_csv(out["csv_decode_categories"]).iterrows():
        rows[("category_ms_per_step", r["category"])] = r
    return rows


def test_compare_gate_and_campaign_give_one_judgement(pair_dirs, tmp_path):
    a, b = pair_dirs
    campaign = {(d.metric, d.where): d for d in ca.deltas(ca.pair(a, b))}
    table = _compare_rows(compare_runs(a, b, tmp_path / "out"))
    gate = {(d.metric, d.where) for d in regressions(a, b)}
    shared = set(campaign) & set(table)
    # Every level metric the campaign tabulates, the stall shares and every category are in both.
    assert {m for m, _ in shared} == {"output_throughput_tok_s", "tpot_ms_median", "ttft_ms_median", "stall_pct",
                                      "category_ms_per_step"}
    assert len(shared) == 4 * 4 + 8  # 4 levels x (3 metrics + stall share), 8 categories
    for key in shared:
        d, r = campaign[key], table[key]
        assert (bool(r["beyond_noise"]), r["judgement"]) == (d.real, d.judgement), key
        why = r.get("not_comparable")
        assert (None if pd.isna(why) else why) == d.not_comparable, key
    assert gate == {k for k, d in campaign.items() if d.judgement == "worse" and d.metric in GATED}
    # The rules fired as built: c=1's latencies bunched, all of c=8 stalled, its stall share a regression.
    assert campaign[("tpot_ms_median", "c=1")].reason == "bunched"
    assert campaign[("output_throughput_tok_s", "c=8")].not_comparable == not_compared_words(
        "stalled", [("B", 0.82)], "c=8")
    assert ("stall_pct", "c=8") in gate and ("output_throughput_tok_s", "c=8") not in gate
    assert ("category_ms_per_step", "all_reduce") in gate and ("decode_step_ms", "step") in gate


def test_deltas_carry_unit_ratio_and_codes(pair_dirs):
    a, b = (load_run_artifacts(x) for x in pair_dirs)
    ds = {(d.metric, d.where): d for d in run_deltas("B", [a], [b])}
    ar = ds[("category_ms_per_step", "all_reduce")]
    assert (ar.unit, ar.ratio, ar.judgement, ar.reason) == ("ms per decode step", pytest.approx(1.3), "worse", None)
    tput = ds[("output_throughput_tok_s", "c=2")]
    # scale=1.3 slows the whole synthetic run, its sweep too: throughput down is worse, not better
    assert (tput.unit, tput.higher_is_better, tput.judgement) == ("tok/s", True, "worse")
    assert {d.reason for d in ds.values()} <= {None, "stalled", "bunched", "capture_delivery", "other_slo"}


def test_an_a_a_pair_is_named_once(pair_dirs):
    a, b = (load_run_artifacts(x) for x in pair_dirs)
    assert same_setup(a, a) is not None
    # Same params on the same engine in the synthetic pair too; a params change breaks it.
    b.params = {**(b.params or {}), "model": {"name": "other"}}
    assert same_setup(a, b) is None


def test_compare_sets_the_verdicts_side_by_side_from_verdict_json(tmp_path):
    import json

    from stepscope.report import build_report
    from stepscope.report.deltas import verdict_changes

    a, b = make_synthetic_run(tmp_path / "a"), make_synthetic_run(tmp_path / "b", scale=0.8)
    md = compare_runs(a, b, tmp_path / "out0")["markdown"].read_text()
    assert "`06_writeup/verdict.json` (missing in A `" in md  # before stage 06, the file it needs is named
    for run in (a, b):
        build_report(run, draw_figures=False)
    va, vb = load_run_artifacts(a).verdict, load_run_artifacts(b).verdict
    assert va is not None and va.dominant.category == vb.dominant.category and verdict_changes(va, vb) == []
    p = b / "06_writeup" / "verdict.json"
    rec = json.loads(p.read_text())
    rec["dominant"]["category"] = "attention"  # as if B's step were dominated by another category
    p.write_text(json.dumps(rec))
    vb = load_run_artifacts(b).verdict
    assert verdict_changes(va, vb) == [("dominant", va.dominant.category, "attention")]
    md = compare_runs(a, b, tmp_path / "out1")["markdown"].read_text()
    assert f"Changed: dominant: {va.dominant.category} → attention." in md
    assert f"| dominant | {va.dominant.category} | attention |" in md
