"""Importing `vllm bench serve --save-result` files, with hand-made examples of each shape."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from stepscope.sweep.run import LEVEL_COLUMNS
from stepscope.sweep.vllm_import import ResultImportError, import_vllm_results

DETAILED = {  # shape of vLLM 0.32 with --save-detailed, max_concurrency 2
    "date": "20261129-101010", "backend": "vllm", "model_id": "m", "num_prompts": 3,
    "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 2,
    "duration": 2.0, "completed": 2, "failed": 1, "total_input_tokens": 20, "total_output_tokens": 7,
    "request_throughput": 1.0, "output_throughput": 3.5, "total_token_throughput": 13.5,
    "input_lens": [10, 10, 10], "output_lens": [4, 3, 0],
    "ttfts": [0.1, 0.3, 0.0], "itls": [[0.05, 0.05, 0.1], [0.2, 0.2], []],
    "latencies": [0.3, 0.7, 0.0], "start_times": [5.0, 5.0, 5.5],
    "errors": ["", "", "Traceback ... ServerDisconnectedError"],
    "max_output_tokens_per_s": 7.0, "max_concurrent_requests": 2,
    "mean_ttft_ms": 200.0, "median_ttft_ms": 200.0, "p99_ttft_ms": 299.8,
}

SUMMARY_ONLY = {  # --save-result without --save-detailed (latencies are still kept)
    "backend": "vllm", "num_prompts": 64, "request_rate": "inf", "max_concurrency": 16,
    "duration": 8.0, "completed": 63, "failed": 1, "request_throughput": 7.875,
    "output_throughput": 1000.0, "total_token_throughput": 1500.0,
    "mean_ttft_ms": 50.0, "median_ttft_ms": 45.0, "std_ttft_ms": 3.0, "p99_ttft_ms": 90.0,
    "mean_tpot_ms": 12.0, "median_tpot_ms": 11.5, "p99_tpot_ms": 20.0,
    "mean_itl_ms": 12.1, "median_itl_ms": 11.0, "p99_itl_ms": 30.0,
    "mean_e2el_ms": 2000.0, "median_e2el_ms": 1900.0, "p99_e2el_ms": 2500.0,
    "latencies": [2.0] * 63 + [0.0], "max_output_tokens_per_s": 1100.0,
}

OLD = {  # an older release: no max_concurrency, no failed, no total throughput, a finite rate
    "backend": "vllm", "num_prompts": 100, "request_rate": 4.0, "duration": 30.0, "completed": 100,
    "request_throughput": 3.3, "output_throughput": 420.0,
    "mean_ttft_ms": 30.0, "median_ttft_ms": 28.0, "p99_ttft_ms": 60.0, "mean_tpot_ms": 9.0,
    "median_tpot_ms": 8.8, "p99_tpot_ms": 14.0, "mean_itl_ms": 9.0, "median_itl_ms": 8.5,
    "p99_itl_ms": 20.0,
}


def test_detailed_file_goes_through_stepscope_metrics(tmp_path):
    p = tmp_path / "detailed.json"
    p.write_text(json.dumps(DETAILED))
    t = import_vllm_results([p])
    assert list(t.columns) == LEVEL_COLUMNS
    r = t.iloc[0]
    assert (r["mode"], r["concurrency"], r["level"]) == ("concurrency", 2, "c0002")
    assert r["n_completed"] == 2 and r["n_failed"] == 1
    assert r["duration_s"] == 2.0
    assert r["output_throughput_tok_s"] == pytest.approx(7 / 2.0)
    assert r["ttft_ms_median"] == pytest.approx(200.0)
    # TPOT: (0.3-0.1)/3 and (0.7-0.3)/2 s
    assert r["tpot_ms_mean"] == pytest.approx((200 / 3 + 200) / 2)
    assert r["itl_ms_median"] == pytest.approx(np.median([50, 50, 100, 200, 200]))
    assert r["e2el_ms_p99"] == pytest.approx(np.percentile([300, 700], 99))
    assert r["littles_concurrency"] == pytest.approx(1.0 / 2.0)
    assert r["source"] == "vllm bench serve: detailed.json"


def test_summary_only_file_maps_keys(tmp_path):
    p = tmp_path / "s.json"
    p.write_text(json.dumps(SUMMARY_ONLY))
    r = import_vllm_results([p]).iloc[0]
    assert r["level"] == "c0016" and r["n_requests"] == 64
    assert r["tpot_ms_median"] == 11.5 and r["e2el_ms_p99"] == 2500.0
    assert math.isnan(r["ttft_ms_p90"])  # not requested in that run
    assert r["littles_concurrency"] == pytest.approx(2.0 * 63 / 8.0)
    assert r["peak_output_tok_s_1s"] == 1100.0


def test_older_keys_and_appended_lines(tmp_path):
    p = tmp_path / "appended.json"
    p.write_text(json.dumps(OLD) + "\n" + json.dumps(SUMMARY_ONLY) + "\n")
    t = import_vllm_results([p])
    assert len(t) == 2
    old = t[t["mode"] == "rate"].iloc[0]
    assert old["request_rate"] == 4.0 and old["level"] == "r4"
    assert math.isnan(old["total_throughput_tok_s"]) and math.isnan(old["n_failed"])
    assert old["ttft_ms_median"] == 28.0
    # no latencies list: Little's law from mean E2EL is impossible (no e2el keys) -> NaN
    assert math.isnan(old["littles_concurrency"])


def test_not_a_result_file(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(ResultImportError, match="not a `vllm bench serve` result"):
        import_vllm_results([p])
    with pytest.raises(ResultImportError, match="file not found"):
        import_vllm_results([tmp_path / "missing.json"])


def test_relative_paths_and_empty_list(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps(SUMMARY_ONLY))
    assert len(import_vllm_results(["r.json"], base_dir=tmp_path)) == 1
    empty = import_vllm_results([])
    assert empty.empty and list(empty.columns) == LEVEL_COLUMNS


def test_imported_table_is_saved_in_the_stage_folder(tmp_path):
    """The imported `vllm bench` results are a file of stage 01, not only a notebook display."""
    import pandas as pd

    p = tmp_path / "detailed.json"
    p.write_text(json.dumps(DETAILED))
    out = tmp_path / "01_macro_sweep"
    out.mkdir()
    t = import_vllm_results([p], out_dir=out)
    saved = pd.read_csv(out / "imported_vllm_bench.csv")
    assert list(saved.columns) == LEVEL_COLUMNS and len(saved) == 1
    assert saved.loc[0, "output_throughput_tok_s"] == pytest.approx(t.loc[0, "output_throughput_tok_s"])
    assert saved.loc[0, "source"] == "vllm bench serve: detailed.json"
    import_vllm_results([], out_dir=tmp_path / "none")  # nothing listed: no file, no folder
    assert not (tmp_path / "none").exists()
