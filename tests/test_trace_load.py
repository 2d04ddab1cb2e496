"""Streaming loader: exact values against json.loads, ranks, cache, bad input."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stepscope.errors import TraceError
from stepscope.trace.frames import keep_frame
from stepscope.trace.load import load_rank, load_ranks, rank_from_filename, read_trace

TP2 = "vllm-cpu-tinyllama-tp2-rank{}.pt.trace.json.gz"


@pytest.mark.parametrize("name", ["hf-h100-qwen1.5-0.5b-eager.json.gz",
                                  "vllm-mi300x-gptoss-decode-fullgraph.json.gz",
                                  "hta-a100-ddp-nccl.json.gz"])
def test_loader_matches_json_exactly(real_traces: Path, name: str):
    ref = json.load(gzip.open(real_traces / name))["traceEvents"]
    df, meta = read_trace(real_traces / name)
    for cat in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime"):
        want = [e for e in ref if e.get("cat") == cat]
        got = df[df["cat"] == cat]
        assert len(got) == len(want)
        # float64 exactly as written: no rounding anywhere.
        assert got["ts"].tolist() == [e["ts"] for e in want]
        assert got["dur"].tolist() == [e["dur"] for e in want]
    # Stack frames are dropped except module frames, frames naming a purpose and
    # execute_model (context for categories, a step fallback), in file order among them.
    frames = df[df["cat"] == "python_function"]
    want = [e for e in ref if e.get("cat") == "python_function" and keep_frame(e["name"])]
    assert frames["name"].astype(str).tolist() == [e["name"] for e in want]
    assert frames["ts"].tolist() == [e["ts"] for e in want]
    n_py = sum(e.get("cat") == "python_function" for e in ref)
    assert len(frames) <= 0.15 * n_py  # a small fraction of the stack
    assert meta["stats"]["n_events_total"] == len(ref)


def test_cpu_trace_keeps_cpu_ops_and_gpu_trace_drops_them(real_traces: Path):
    cpu, _ = read_trace(real_traces / TP2.format(0))
    assert (cpu["cat"] == "cpu_op").sum() == 3696
    gpu, meta = read_trace(real_traces / "hta-a100-ddp-nccl.json.gz")
    # A GPU trace keeps only the cpu_ops that name a purpose (context for its kernels).
    ref = json.load(gzip.open(real_traces / "hta-a100-ddp-nccl.json.gz"))["traceEvents"]
    ops = [e["name"] for e in ref if e.get("cat") == "cpu_op"]
    kept = gpu.loc[gpu["cat"] == "cpu_op", "name"].astype(str).tolist()
    assert sorted(kept) == sorted(n for n in ops if keep_frame(n))
    assert 0 < len(kept) < 0.15 * len(ops)
    assert "aten::cudnn_convolution" in kept and "aten::copy_" not in kept


def test_chunk_boundaries_do_not_change_the_result(real_traces: Path, monkeypatch):
    import stepscope.trace.parse as parse

    full, _ = read_trace(real_traces / TP2.format(1))
    monkeypatch.setattr(parse, "CHUNK_BYTES", 4096)  # many cuts, some inside nested args
    small, _ = read_trace(real_traces / TP2.format(1))
    assert small["ts"].tolist() == full["ts"].tolist()
    assert small["name"].astype(str).tolist() == full["name"].astype(str).tolist()


def test_step_frames_are_found_in_whichever_chunk_holds_them(real_traces: Path, monkeypatch):
    import stepscope.trace.parse as parse

    name = "vllm-mi300x-gptoss-decode-fullgraph.json.gz"
    ref = json.load(gzip.open(real_traces / name))["traceEvents"]
    want = [e["ts"] for e in ref if e.get("cat") == "python_function" and "execute_model" in e["name"]]
    # Small chunks: most hold no execute_model frame.
    monkeypatch.setattr(parse, "CHUNK_BYTES", 8192)
    df, _ = read_trace(real_traces / name)
    got = df[(df["cat"] == "python_function") & df["name"].astype(str).str.contains("execute_model")]
    assert len(want) >= 1 and got["ts"].tolist() == want
    assert (df["cat"] == "kernel").sum() == sum(e.get("cat") == "kernel" for e in ref)


def test_parsing_needs_no_pandas(real_traces: Path):
    # Loader workers parse only: importing pandas would cost each ~100 MB of RSS.
    code = ("import sys; from stepscope.trace.load import parse_trace; "
            f"p = parse_trace({str(real_traces / TP2.format(0))!r}); "
            "print(len(p.columns['ts']), len(p.names), 'pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    df, _ = read_trace(real_traces / TP2.format(0))
    assert out == [str(len(df)), str(df["name"].nunique()), "False"]
    # Only the names still used are kept (cpu_ops dropped on GPU traces leave theirs behind).
    assert len(df["name"].cat.categories) == df["name"].nunique()


@pytest.mark.parametrize("name,rank", [("trace_rank3.json.gz", 3), ("x-rank-5.pt.trace.json", 5),
                                       ("dp0_pp0_tp0_dcp0_ep0_rank2.123.pt.trace.json.gz", 2),
                                       ("1700000-TP-6-DECODE.trace.json.gz", 6),
                                       ("foo.json.gz", None)])
def test_rank_from_filename(name, rank):
    assert rank_from_filename(name) == rank


def test_rank_from_distributed_info_then_error(real_traces: Path, tmp_path: Path):
    assert load_rank(real_traces / TP2.format(1)).rank == 1
    with pytest.raises(TraceError, match="which rank") as exc:
        load_rank(real_traces / "hta-no-distributed-info.json.gz")
    assert "hta-no-distributed-info.json.gz" in str(exc.value)
    # A single file is unambiguous: rank 0, with an info flag.
    rt = load_rank(real_traces / "hta-no-distributed-info.json.gz", allow_no_rank=True)
    assert rt.rank == 0 and rt.flags[0].code == "rank_assumed"


def test_parquet_cache_hit_is_fast_and_identical(real_traces: Path, tmp_path: Path):
    p = real_traces / TP2.format(0)
    a = load_rank(p, cache_dir=tmp_path)
    t = time.perf_counter()
    b = load_rank(p, cache_dir=tmp_path)
    assert time.perf_counter() - t < 1.0
    assert b.meta["from_cache"] and not a.meta["from_cache"]
    assert b.events["ts"].tolist() == a.events["ts"].tolist()
    assert list(tmp_path.glob("*.parquet"))


def test_parallel_load_of_ranks(real_traces: Path):
    ranks, flags = load_ranks([real_traces / TP2.format(1), real_traces / TP2.format(0)],
                              workers=2, progress=False)
    assert [r.rank for r in ranks] == [0, 1]
    assert not [f for f in flags if f["severity"] == "error"]


def test_cpu_only_trace_from_a_gpu_machine_keeps_its_ops(tmp_path: Path):
    # deviceProperties names a GPU, so cpu_ops are skipped on the first pass; with no device
    # work in the file the loader reads it again keeping them.
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0}]
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps({"deviceProperties": [{"id": 0, "name": "NVIDIA H100"}],
                             "distributedInfo": {"rank": 0}, "traceEvents": ev}))
    rt = load_rank(p)
    assert rt.mode == "cpu" and (rt.events["cat"] == "cpu_op").sum() == 1


def test_chrome_json_array_form(tmp_path: Path):
    ev = [{"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "pid": 0, "tid": 7,
           "ts": 1.5, "dur": 2.25, "args": {"correlation": 1}}]
    p = tmp_path / "trace_rank2.json"
    p.write_text(json.dumps(ev))
    rt = load_rank(p)
    assert rt.rank == 2 and rt.events["dur"].tolist() == [2.25]
