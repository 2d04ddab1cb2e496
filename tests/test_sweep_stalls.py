"""Server-wide stalls, the minimum level duration and the vLLM-random-dataset prompt mode."""

from __future__ import annotations

import pytest

from stepscope.config import TinyModelParams
from stepscope.sweep.client import PromptSource
from stepscope.sweep.metrics import RequestRecord
from stepscope.sweep.run import summarize, levels_table, level_row
from stepscope.sweep.stalls import find_stalls, stall_metrics


def _rec(start: float, chunks: list[float], rid: int = 0) -> RequestRecord:
    return RequestRecord(start_s=start, chunk_times_s=chunks, end_s=chunks[-1], output_tokens=len(chunks),
                         success=True, request_id=rid)


def _steady(start: float, end: float, step: float = 0.02) -> list[float]:
    n = int(round((end - start) / step))
    return [start + step * (k + 1) for k in range(n)]


def test_one_silence_across_every_open_stream_is_one_stall():
    # Two streams decode every 20 ms; both are silent from their last chunk at 1.01 s to 2.12 s.
    a = _rec(0.0, _steady(0.0, 1.0) + _steady(2.1, 3.0), 0)
    b = _rec(0.05, _steady(0.05, 1.0) + _steady(2.1, 3.0), 1)
    stalls = find_stalls([a, b], threshold_s=0.5)
    assert len(stalls) == 1
    assert stalls[0].dur_s == pytest.approx(1.11, abs=0.001) and stalls[0].n_open == 2
    m = stall_metrics([a, b], duration_s=3.0, threshold_s=0.5)
    assert m["stall_count"] == 1 and m["stall_total_s"] == pytest.approx(1.11, abs=0.001)
    assert m["stall_share"] == pytest.approx(1.11 / 3.0, abs=0.001)


def test_one_silent_stream_while_another_delivers_is_no_stall():
    a = _rec(0.0, [0.02, 2.0], 0)                   # long pause on one stream only
    b = _rec(0.0, _steady(0.0, 2.0), 1)             # the other keeps delivering
    assert find_stalls([a, b], threshold_s=0.5) == []


def test_a_gap_with_nothing_in_flight_is_no_stall():
    # Open loop: the first request ends at 0.2 s and the next starts at 1.5 s.
    a = _rec(0.0, _steady(0.0, 0.2), 0)
    b = _rec(1.5, _steady(1.5, 1.7), 1)
    assert find_stalls([a, b], threshold_s=0.5) == []


def test_a_stalled_level_is_flagged_with_its_count_and_share(tmp_path):
    import pandas as pd

    recs = [_rec(0.0, _steady(0.0, 1.0) + _steady(2.0, 2.5), 0)]
    row = level_row({"level": "c0001", "mode": "concurrency", "concurrency": 1}, recs)
    assert row["stall_count"] == 1 and row["stall_max_s"] == pytest.approx(1.02, abs=0.001)
    summary = summarize(pd.DataFrame([row]).assign(complete=True, client_bound=False),
                        pd.DataFrame(columns=["level", "request_id", "http_status", "error"]), 0.1)
    flag = [f for f in summary["flags"] if "server-wide stall" in f]
    assert flag == ["level c0001: 1 server-wide stall(s), 1.02 s in all (longest 1.02 s, 41% of the level's "
                    "2.5 s): every open stream was silent at once for over 0.5 s, so throughput here is low "
                    "by up to that share; sweep.min_level_duration_s makes one stall weigh less"]


def test_random_text_prompts_encode_to_the_exact_length(tmp_path):
    """Text prompts like vLLM's random dataset: the server's tokenizer (BOS included) counts
    exactly input_len tokens, and consecutive prompts differ from the first token on."""
    from transformers import AutoTokenizer

    from stepscope.serve import create_tiny_model

    model = create_tiny_model(tmp_path / "m", TinyModelParams())
    tok = AutoTokenizer.from_pretrained(model)
    src = PromptSource("random_text", [1, 2, 3], input_len=32, seed=7, tokenizer=tok)
    prompts = src.take(20)
    assert all(isinstance(p, str) for p in prompts)
    lengths = {len(tok(p)["input_ids"]) for p in prompts}  # as the server counts: special tokens added
    assert lengths == {32}
    assert len({tok(p)["input_ids"][1] for p in prompts}) > 15
    assert src.length_mismatches == 0


def test_token_id_prompts_are_unchanged_by_the_prompt_source():
    from stepscope.sweep.client import make_prompts

    pool = list(range(100, 140))
    assert PromptSource("token_ids", pool, 16, seed=3).take(5) == make_prompts(pool, 16, 5, seed=3)


def test_levels_table_reads_back_the_stall_columns(tmp_path):
    from stepscope.sweep.run import LEVEL_COLUMNS

    assert {"stall_count", "stall_total_s", "stall_max_s", "stall_share"} <= set(LEVEL_COLUMNS)
    assert levels_table(tmp_path).empty
