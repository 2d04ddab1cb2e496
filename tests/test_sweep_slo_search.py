"""The SLO search (params `sweep.slo_search`, stepscope.sweep.slo_search): bisection between the
SLO-boundary level and the first miss, its levels real and on disk, kept by --resume only under
the same identity. The sweeps run against the fake server with TPOT growing with concurrency,
so the boundary is known."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from stepscope import schema
from stepscope.config import params_from_dict
from stepscope.errors import ParamsError
from stepscope.report.build import _slo_paragraph
from stepscope.schema.sweep import SweepPlan
from stepscope.sweep import slo_search as ss
from stepscope.sweep.goodput import per_gpu_points
from stepscope.sweep.plots import plot_per_gpu_vs_per_user
from stepscope.sweep.client import ServerInfo
from stepscope.sweep.run import run_sweep
from stepscope.testing.fake_server import FakeBehaviour, FakeServer

PER_STREAM_S = 0.015
"""The fake's pause between chunks per open stream: TPOT is about C x 15 ms (+1 ms here)."""


def _params(**over):
    sweep = {"concurrency": [1, 2, 4, 8], "input_len": 8, "output_len": 4, "min_requests": 4,
             "warmup_requests": 0, "gpu_telemetry": False,
             # C=5 streams at ~76 ms TPOT, C=6 at ~91 ms: the boundary lies between them; half the
             # requests, so that a loaded machine's few late ones cannot move it
             "slo": {"tpot_ms": 83, "min_share": 0.5}, "slo_search": {"max_extra_levels": 3}}
    sweep.update(over)
    return params_from_dict({"run": {"name": "t"}, "sweep": sweep}).sweep


def _sweep(fake, params, out, **kw):
    return run_sweep(ServerInfo(base_url=fake.base_url, served_model="fake"), params, out, **kw)


def test_bisection_midpoints_and_where_it_stops():
    assert ss.midpoint("concurrency", 4, 8, 0.05) == (6.0, "")
    assert ss.midpoint("concurrency", 5, 6, 0.05)[0] is None
    assert "adjacent" in ss.midpoint("concurrency", 5, 6, 0.05)[1]
    assert ss.midpoint("rate", 2.0, 3.0, 0.05) == (2.5, "")
    assert ss.midpoint("rate", 2.0, 2.09, 0.05)[0] is None  # within 5 % of the boundary
    assert "lowest level missed" in ss.midpoint("concurrency", None, 1, 0.05)[1]
    assert "every level met" in ss.midpoint("concurrency", 8, None, 0.05)[1]


def test_the_search_refines_the_boundary_with_real_levels_on_disk(tmp_path):
    with FakeServer(FakeBehaviour(chunk_delay_per_stream_s=PER_STREAM_S)) as fake:
        res = _sweep(fake, _params(), tmp_path)
    lv = res.levels.set_index("level")
    # planned: C=4 meets (~61 ms), C=8 misses (~121 ms); bisection measures 6 (miss), then 5 (meets)
    assert list(lv.index) == ["c0001", "c0002", "c0004", "c0005", "c0006", "c0008"]
    assert list(lv.index[lv["slo_search"]]) == ["c0005", "c0006"]
    assert lv.loc["c0006", "n_completed"] == 24 and lv.loc["c0005", "slo_met_share"] >= 0.5
    s = res.summary["slo_search"]
    assert s["levels"] == ["c0006", "c0005"] and s["reused"] == []
    c = s["concurrency"]
    assert (c["planned_boundary_load"], c["planned_first_miss_load"]) == (4, 8)
    assert (c["boundary_load"], c["first_miss_load"]) == (5, 6) and "adjacent" in c["stopped"]
    assert res.summary["slo"]["concurrency"]["boundary_level"] == "c0005"
    assert res.messages[-1].startswith("SLO search (concurrency): 2 extra level(s) c0006, c0005; boundary 5, "
                                       "first miss 6; stopped: the boundary C=5")
    assert res.overview()["slo_search"].sum() == 2
    for name in ("c0005", "c0006"):  # real levels: raw records and a finished meta file
        assert (tmp_path / "levels" / f"{name}.jsonl").is_file()
        assert json.loads((tmp_path / "levels" / f"{name}.meta.json").read_text())["slo_search"] is True
    plan = schema.read(tmp_path / "plan.json", SweepPlan)
    assert [(p.name, p.slo_search) for p in plan.levels][-2:] == [("c0006", True), ("c0005", True)]
    saved = schema.read(tmp_path / "summary.json", schema.SweepSummary)
    assert saved.slo_search.concurrency.boundary_load == 5
    assert pd.read_csv(tmp_path / "levels.csv")["slo_search"].sum() == 2
    # the report's SLO sentence and the per-GPU chart say the same, from the saved summary
    text = _slo_paragraph(saved.slo, saved.slo_search)
    assert "the SLO-boundary level is **c0005** (concurrency 5)" in text
    assert "narrowed it from C=4–C=8 to C=5–C=6 with 2 extra levels, c0006, c0005, then stopped" in text
    pts = per_gpu_points(res.levels, tp=1)
    assert pts.loc[pts["slo_search"], "concurrency"].tolist() == [5, 6]
    fig = plot_per_gpu_vs_per_user(pts, 1, res.summary)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert "SLO-search level (2 of 6, by bisection)" in labels and "SLO boundary: C=5" in labels


def test_the_extra_levels_stay_within_their_bound(tmp_path):
    with FakeServer(FakeBehaviour(chunk_delay_per_stream_s=PER_STREAM_S)) as fake:
        res = _sweep(fake, _params(concurrency=[1, 16], slo_search={"max_extra_levels": 2}), tmp_path)
    s = res.summary["slo_search"]
    # 1 meets, 16 misses: 8 (miss), then 4 (meets); the third step (6) is over the budget
    assert s["levels"] == ["c0008", "c0004"]
    assert (s["concurrency"]["boundary_load"], s["concurrency"]["first_miss_load"]) == (4, 8)
    assert "budget of 2" in s["concurrency"]["stopped"]
    assert int(res.levels["slo_search"].sum()) == 2


def test_resume_keeps_the_search_levels_and_a_changed_identity_clears_them(tmp_path):
    with FakeServer(FakeBehaviour(chunk_delay_per_stream_s=PER_STREAM_S)) as fake:
        _sweep(fake, _params(), tmp_path)
        n_first = fake.n_requests
        again = _sweep(fake, _params(), tmp_path, resume=True)
        assert fake.n_requests == n_first  # nothing measured again, the search's levels included
        assert set(again.summary["reused_levels"]) == {"c0001", "c0002", "c0004", "c0005", "c0006", "c0008"}
        assert again.summary["slo_search"]["reused"] == ["c0006", "c0005"]
        assert again.summary["slo_search"]["concurrency"]["boundary_load"] == 5
        # a looser SLO, same identity: the bisection replays 6 (kept, now meeting it), goes on to 7,
        # and the earlier search's 5, which it no longer reaches, leaves the folder and the plan
        looser = _sweep(fake, _params(slo={"tpot_ms": 100, "min_share": 0.5}), tmp_path, resume=True)
        assert looser.summary["slo_search"]["levels"] == ["c0006", "c0007"]
        assert looser.summary["slo_search"]["reused"] == ["c0006"]
        assert not (tmp_path / "levels" / "c0005.meta.json").exists() and "c0005" not in set(looser.levels["level"])
        assert "c0005" not in [p.name for p in schema.read(tmp_path / "plan.json", SweepPlan).levels]
        changed = _sweep(fake, _params(input_len=9), tmp_path, resume=True)  # another identity
    assert changed.summary["reused_levels"] == [] and changed.summary["slo_search"]["reused"] == []
    meta = json.loads((tmp_path / "levels" / "c0006.meta.json").read_text())
    assert meta["settings"]["input_len"] == 9 and meta["slo_search"] is True


def test_without_resume_every_search_level_is_measured_again(tmp_path):
    with FakeServer(FakeBehaviour(chunk_delay_per_stream_s=PER_STREAM_S)) as fake:
        _sweep(fake, _params(concurrency=[4, 8], slo_search={"max_extra_levels": 1}), tmp_path)
        n_first = fake.n_requests
        res = _sweep(fake, _params(concurrency=[4, 8], slo_search={"max_extra_levels": 1}), tmp_path)
    assert fake.n_requests == 2 * n_first and res.summary["slo_search"]["reused"] == []


def test_slo_search_without_an_slo_is_refused_naming_the_key():
    with pytest.raises(ParamsError) as e:
        params_from_dict({"run": {"name": "t"}, "sweep": {"slo_search": {"max_extra_levels": 2}}})
    assert "sweep.slo_search" in str(e.value) and "sweep.slo" in str(e.value)


def test_an_open_loop_sweep_bisects_on_request_rate():
    slo = _params().slo
    search = _params(slo_search={"max_extra_levels": 3, "min_rate_step_share": 0.1}).slo_search
    levels = pd.DataFrame({"level": ["r1", "r2", "r4", "c0001"], "mode": ["rate", "rate", "rate", "concurrency"],
                           "request_rate": [1.0, 2.0, 4.0, None], "concurrency": [None, None, None, 1.0],
                           "slo_met_share": [1.0, 0.8, 0.1, 1.0], "complete": [True] * 4})
    assert ss.next_load(levels, slo, search, "rate") == (3.0, "")  # 2 meets (0.8 >= 0.5), 4 misses
    closer = pd.concat([levels, pd.DataFrame({"level": ["r3", "r2.5"], "mode": ["rate", "rate"],
                                              "request_rate": [3.0, 2.5], "slo_met_share": [0.2, 0.6],
                                              "complete": [True, True]})], ignore_index=True)
    load, why = ss.next_load(closer, slo, search, "rate")  # 2.5 meets, 3 misses: 20 % apart
    assert load == 2.75
    closest = pd.concat([closer, pd.DataFrame({"level": ["r2.75"], "mode": ["rate"], "request_rate": [2.75],
                                               "slo_met_share": [0.9], "complete": [True]})], ignore_index=True)
    load, why = ss.next_load(closest, slo, search, "rate")
    assert load is None and "within 10 %" in why
