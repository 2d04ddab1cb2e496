"""Stage 01's exports: levels.csv's spread and percentiles, the vLLM-shaped JSON per level
(checked against vLLM's own calculate_metrics), the per-request table, and warm-ups apart."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from stepscope.sweep.metrics import RequestRecord, level_metrics
from stepscope.sweep.run import Level, finish, write_level


def _records(n: int = 40, seed: int = 0) -> list[RequestRecord]:
    """`n` requests at random times, every ninth a failure, one token per chunk."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        start = 100.0 + rng.uniform(0, 3)
        n_out = int(rng.integers(1, 30))
        gaps = rng.exponential(0.02, size=n_out)
        gaps[0] += rng.uniform(0.05, 0.5)  # the prefill
        chunks = list(start + np.cumsum(gaps))
        fail = i % 9 == 4
        out.append(RequestRecord(start_s=start, chunk_times_s=[] if fail else chunks,
                                 end_s=(start + 0.1) if fail else chunks[-1] + 0.001,
                                 input_tokens=int(rng.integers(10, 100)), output_tokens=None if fail else n_out,
                                 success=not fail, error="reset" if fail else None,
                                 http_status=None if fail else 200, request_id=i))
    return out


def _warmups() -> list[RequestRecord]:
    return [RequestRecord(start_s=1.0, chunk_times_s=[1.5, 1.6], end_s=1.6, input_tokens=3, output_tokens=2,
                          success=True, warmup=True, request_id=-1)]


def _write(out_dir, records, name="c0004", mode="concurrency", conc=4, rate=None):
    level = Level(mode, conc, rate, len(records))
    meta = {"level": name, "mode": mode, "concurrency": conc, "request_rate": rate, "n_requests": len(records),
            "complete": True, "settings": {"served_model": "tiny-llama"}}
    write_level(out_dir, level, records, meta)


def _vllm_outputs(records):
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

    outs = []
    for r in records:
        o = RequestFuncOutput(success=r.success, prompt_len=r.input_tokens, start_time=r.start_s)
        if r.success:
            o.ttft = r.chunk_times_s[0] - r.start_s
            o.itl = list(np.diff(r.chunk_times_s))
            o.latency = r.chunk_times_s[-1] - r.start_s
            o.output_tokens = r.output_tokens
        outs.append(o)
    return outs


def test_the_vllm_json_is_what_vllm_computes_from_the_same_requests(tmp_path):
    serve = pytest.importorskip("vllm.benchmarks.serve")
    records = _records()
    _write(tmp_path, records)
    pct = (25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9)
    res = finish(tmp_path, 0.1, percentiles=pct)
    got = json.loads((tmp_path / "vllm_bench" / "c0004.vllm.json").read_text())
    dur = res.levels.iloc[0]["duration_s"]
    theirs, _ = serve.calculate_metrics(input_requests=[], outputs=_vllm_outputs(records), dur_s=dur,
                                        tokenizer=None, selected_percentiles=list(pct), goodput_config_dict={})
    assert (got["completed"], got["failed"]) == (theirs.completed, theirs.failed) == (36, 4)
    assert (got["total_input_tokens"], got["total_output_tokens"]) == (theirs.total_input, theirs.total_output)
    for key, value in [("request_throughput", theirs.request_throughput), ("output_throughput", theirs.output_throughput),
                       ("total_token_throughput", theirs.total_token_throughput),
                       ("max_output_tokens_per_s", theirs.max_output_tokens_per_s)]:
        assert got[key] == pytest.approx(value, rel=1e-9), key
    for name in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std"):
            assert got[f"{stat}_{name}_ms"] == pytest.approx(getattr(theirs, f"{stat}_{name}_ms"), rel=1e-9)
        for p, value in getattr(theirs, f"percentiles_{name}_ms"):
            word = str(int(p)) if int(p) == p else str(p)  # vLLM's own key spelling: p99, p99.9
            assert got[f"p{word}_{name}_ms"] == pytest.approx(value, rel=1e-9), (name, word)
    assert (got["max_concurrency"], got["request_rate"], got["num_prompts"], got["duration"]) == (4, "inf", 40, dur)
    assert got["model_id"] == "tiny-llama" and got["request_goodput"] is None
    # vLLM's loader of its own files (stepscope's importer) reads back the same level
    from stepscope.sweep.vllm_import import result_row

    back = result_row(got)
    row = res.levels.iloc[0]
    for col in ("output_throughput_tok_s", "ttft_ms_median", "tpot_ms_p99", "itl_ms_std", "e2el_ms_p25"):
        assert back[col] == pytest.approx(row[col], rel=1e-9), col
    assert back["concurrency"] == 4 and back["mode"] == "concurrency"


def test_levels_csv_has_spread_percentiles_tokens_and_per_user_rate(tmp_path):
    records = _records()
    _write(tmp_path, records)
    finish(tmp_path, 0.1, percentiles=(50.0, 99.9))
    row = pd.read_csv(tmp_path / "levels.csv").iloc[0]
    done = [r for r in records if r.success]
    ttft = np.array([(r.chunk_times_s[0] - r.start_s) * 1e3 for r in done])
    assert row["ttft_ms_std"] == pytest.approx(np.std(ttft))  # population std, as vLLM's
    assert (row["ttft_ms_min"], row["ttft_ms_max"]) == pytest.approx((ttft.min(), ttft.max()))
    assert row["ttft_ms_p99.9"] == pytest.approx(np.percentile(ttft, 99.9))
    assert row["ttft_ms_p90"] == pytest.approx(np.percentile(ttft, 90))  # always there, chosen or not
    assert "ttft_ms_p25" not in row and "ttft_ms_p50" not in row  # not chosen; p50 is the median
    assert row["total_input_tokens"] == sum(r.input_tokens for r in done)
    assert row["total_output_tokens"] == sum(r.output_tokens for r in done)
    per_user = [r.output_tokens / (r.chunk_times_s[-1] - r.start_s) for r in done]
    assert row["output_tok_s_per_user"] == pytest.approx(np.mean(per_user))


def test_default_percentiles_add_p25_p75_p95():
    m = level_metrics(_records())
    assert {"ttft_ms_p25", "tpot_ms_p75", "itl_ms_p95", "e2el_ms_max"} <= set(m)
    assert "ttft_ms_p50" not in m  # the median is there under its own name


def test_requests_csv_holds_every_measured_request_and_no_warm_up(tmp_path):
    records = _records(12)
    _write(tmp_path, _warmups() + records)
    _write(tmp_path, _records(5, seed=1), name="r2.5", mode="rate", conc=None, rate=2.5)
    finish(tmp_path, 0.1)
    req = pd.read_csv(tmp_path / "requests.csv")
    assert req.groupby("level").size().to_dict() == {"c0004": 12, "r2.5": 5}
    assert -1 not in set(req["request_id"])  # the warm-up is in levels/c0004.warmup.jsonl
    r0 = req[(req["level"] == "c0004") & (req["request_id"] == 0)].iloc[0]
    rec = records[0]
    assert r0["ttft_ms"] == pytest.approx((rec.chunk_times_s[0] - rec.start_s) * 1e3)
    assert r0["e2el_ms"] == pytest.approx((rec.chunk_times_s[-1] - rec.start_s) * 1e3)
    assert r0["output_tok_s"] == pytest.approx(rec.output_tokens / (rec.chunk_times_s[-1] - rec.start_s))
    assert (r0["input_tokens"], r0["http_status"], r0["concurrency"]) == (rec.input_tokens, 200, 4)
    failed = req[(req["level"] == "c0004") & (req["request_id"] == 4)].iloc[0]
    assert (bool(failed["success"]), failed["error"], math.isnan(failed["ttft_ms"])) == (False, "reset", True)
    rate = req[req["level"] == "r2.5"]
    assert rate["request_rate"].eq(2.5).all() and rate["concurrency"].isna().all()


def test_warm_ups_have_their_own_file_and_an_older_mixed_file_reads_the_same(tmp_path):
    records = _records(20)
    new, old = tmp_path / "new", tmp_path / "old"
    _write(new, _warmups() + records)
    assert [json.loads(x)["warmup"] for x in (new / "levels" / "c0004.warmup.jsonl").read_text().splitlines()] == [True]
    assert not any(json.loads(x)["warmup"] for x in (new / "levels" / "c0004.jsonl").read_text().splitlines())
    # as stage 01 wrote a level before: warm-ups flagged, in the same file
    _write(old, records)
    mixed = [json.dumps(r.to_dict()) for r in _warmups() + records]
    (old / "levels" / "c0004.jsonl").write_text("\n".join(mixed) + "\n")
    a, b = finish(new, 0.1), finish(old, 0.1)
    pd.testing.assert_frame_equal(a.levels, b.levels)
    pd.testing.assert_frame_equal(pd.read_csv(new / "requests.csv"), pd.read_csv(old / "requests.csv"))
    assert a.levels.iloc[0]["n_requests"] == 20


def test_resume_keeps_a_kept_levels_warm_up_file(tmp_path):
    from stepscope.sweep.run import keep_or_clear_levels

    _write(tmp_path, _warmups() + _records(5))
    _write(tmp_path, _records(5), name="c0008", conc=8)
    identity = {"served_model": "tiny-llama"}
    kept = keep_or_clear_levels(tmp_path, {"c0004": identity}, resume=True)
    assert kept == ["c0004"]
    left = sorted(p.name for p in (tmp_path / "levels").iterdir())
    assert left == ["c0004.jsonl", "c0004.meta.json", "c0004.warmup.jsonl"]


def test_a_level_no_longer_on_disk_loses_its_vllm_json(tmp_path):
    _write(tmp_path, _records(5))
    _write(tmp_path, _records(5), name="c0008", conc=8)
    finish(tmp_path, 0.1)
    assert sorted(p.name for p in (tmp_path / "vllm_bench").iterdir()) == ["c0004.vllm.json", "c0008.vllm.json"]
    for p in (tmp_path / "levels").glob("c0008.*"):
        p.unlink()
    finish(tmp_path, 0.1)
    assert [p.name for p in (tmp_path / "vllm_bench").iterdir()] == ["c0004.vllm.json"]


@pytest.mark.parametrize("bad", [0, -5, 100.5])
def test_percentiles_outside_0_to_100_are_refused(bad):
    from stepscope.config import params_from_dict
    from stepscope.errors import StepscopeError

    with pytest.raises(StepscopeError, match=r"sweep\.percentiles\[1\]"):
        params_from_dict({"run": {"name": "t"}, "sweep": {"percentiles": [50, bad]}}, source="t.yaml")


def test_export_writes_the_exports_for_a_run_folder_made_before_them(tmp_path, capsys):
    """A run folder whose stage 01 predates the exports (warm-ups flagged in the level's own file,
    no vllm_bench/, no requests.csv): `stepscope export` writes them from its request records, the
    same as a sweep that wrote them itself."""
    from stepscope.cli import main

    records = _records(20)
    new = tmp_path / "new" / "01_macro_sweep"
    _write(new, _warmups() + records)
    finish(new, 0.1)
    old_run = tmp_path / "old"
    old = old_run / "01_macro_sweep"
    _write(old, records)
    (old / "levels" / "c0004.jsonl").write_text(
        "\n".join(json.dumps(r.to_dict()) for r in _warmups() + records) + "\n")
    (old_run / "run.json").write_text(json.dumps({"run_id": "old", "stages": {}}))
    assert not (old / "vllm_bench").exists() and not (old / "requests.csv").exists()
    assert main(["export", str(old_run)]) == 0
    assert "3 file(s) written" in capsys.readouterr().out
    want = json.loads((new / "vllm_bench" / "c0004.vllm.json").read_text())
    got = json.loads((old / "vllm_bench" / "c0004.vllm.json").read_text())
    assert got == want and got["completed"] == sum(r.success for r in records)
    pd.testing.assert_frame_equal(pd.read_csv(old / "requests.csv"), pd.read_csv(new / "requests.csv"))
    assert main(["export", str(old_run), "--format", "csv", "--out", str(tmp_path / "csv-only")]) == 0
    assert [p.name for p in (tmp_path / "csv-only").iterdir()] == ["requests.csv"]


def test_export_of_a_run_without_a_sweep_says_so(tmp_path, capsys):
    from stepscope.cli import main

    (tmp_path / "run.json").write_text(json.dumps({"run_id": "x", "stages": {}}))
    assert main(["export", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no sweep levels to export" in err and "stepscope run PARAMS --stages 01" in err


def test_aiperf_export_holds_each_metrics_distribution_and_the_warmups_apart(tmp_path):
    """aiperf/<level>/profile_export_aiperf.json in AIPerf's schema 1.4: per-request metrics over
    the successful measured requests (checked against numpy on the records themselves), run-level
    metrics with `unit` and `avg` only, the failures counted by error, the warm-up apart."""
    from stepscope import schema

    records = _records(40)
    out = tmp_path / "run" / "01_macro_sweep"
    _write(out, _warmups() + records)
    finish(out, 0.1)
    path = out / "aiperf" / "c0004" / "profile_export_aiperf.json"
    doc = json.loads(path.read_text())
    schema.read(path, schema.AiperfExport)
    ok = [r for r in records if r.success]
    e2el_ms = np.array([(r.chunk_times_s[-1] - r.start_s) * 1e3 for r in ok])
    lat = doc["request_latency"]
    assert lat["unit"] == "ms" and lat["count"] == len(ok) == 36
    assert lat["avg"] == pytest.approx(e2el_ms.mean()) and lat["p99"] == pytest.approx(np.percentile(e2el_ms, 99))
    assert lat["std"] == pytest.approx(e2el_ms.std(ddof=1)) and lat["sum"] == pytest.approx(e2el_ms.sum())
    osl = doc["output_sequence_length"]
    assert osl["unit"] == "tokens" and osl["sum"] == sum(r.output_tokens for r in ok)
    assert doc["request_count"] == {"unit": "requests", "avg": 36.0}
    assert doc["error_request_count"] == {"unit": "requests", "avg": 4.0}
    assert doc["error_summary"] == [{"error": "reset", "count": 4}]
    assert set(doc["output_token_throughput"]) == {"unit", "avg"}
    assert doc["schema_version"] == "1.4" and doc["aiperf_version"] is None
    assert doc["input_config"]["concurrency"] == 4 and doc["input_config"]["model"] == "tiny-llama"
    warm = doc["warmup_metrics"]["request_latency"]
    assert warm["count"] == 1 and warm["avg"] == pytest.approx(600.0)
