"""One file-name parser for stage 04 (capture) and stage 05 (trace loading, text tables)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.capture import classify
from stepscope.filenames import parse_name, rank_from_filename
from stepscope.trace.load import load_rank

NAMES = [
    # (file name, kind, rank, stage, rank source)
    ("rank0.1795951127199467815.pt.trace.json.gz", "trace", 0, None, "rank"),
    ("dp0_pp0_tp3_dcp0_ep3_rank3.1795951127199467815.pt.trace.json.gz", "trace", 3, None, "rank"),
    # No explicit rank: with dp and pp at 0 the tp index is the global rank (TP innermost).
    ("dp0_pp0_tp3_x.pt.trace.json.gz", "trace", 3, None, "tp index"),
    # dp 1: the global rank depends on the TP size, which the name does not carry.
    ("dp1_pp0_tp3_x.pt.trace.json.gz", "trace", None, None, None),
    ("host-1234-rank-5.1712.pt.trace.json.gz", "trace", 5, None, "rank"),
    ("graph_capture_rank_2.pt.trace.json.gz", "trace", 2, None, "rank"),
    ("1732000000.123-TP-7-DECODE.trace.json.gz", "trace", 7, "DECODE", "sglang TP"),
    ("1732000000.123-TP-0.trace.json.gz", "trace", 0, None, "sglang TP"),
    ("profiler_out_2.txt", "profiler_table", 2, None, "table index"),
    ("rank1.profiler_out.txt", "profiler_table", 1, None, "rank"),
    ("vm_7208.async_llm.1795951127170854254.pt.trace.json.gz", "frontend_trace", None, None, None),
    ("trace_rank3.json.gz", None, 3, None, "rank"),
    ("foo.json.gz", None, None, None, None),
    ("myrank3.pt.trace.json", "trace", None, None, None),
]


@pytest.mark.parametrize("name, kind, rank, stage, source", NAMES)
def test_parse_name(name, kind, rank, stage, source):
    pf = parse_name(name)
    assert (pf.kind, pf.rank, pf.stage, pf.rank_source) == (kind, rank, stage, source)


@pytest.mark.parametrize("name", [n for n, *_ in NAMES])
def test_capture_and_loader_agree_on_every_rank(name):
    # The bug this module fixes: capture.classify gave None for dp0_pp0_tp3_x while the
    # loader gave 3. Both now read the one parser.
    pf = classify(name)
    assert rank_from_filename(name) == parse_name(name).rank
    if pf is not None:
        assert pf.rank == rank_from_filename(name)


def test_dp0_pp0_tp3_name_is_rank_3_in_capture():
    assert classify("dp0_pp0_tp3_x.pt.trace.json.gz").rank == 3


def test_loader_takes_the_rank_from_the_name_when_the_trace_has_none(real_traces: Path, tmp_path: Path):
    p = tmp_path / "dp0_pp0_tp3_x.pt.trace.json.gz"
    p.write_bytes((real_traces / "hta-no-distributed-info.json.gz").read_bytes())
    rt = load_rank(p)
    assert rt.rank == 3 and rt.meta["rank_source"] == "file name (tp index)"
