"""Faults of the offline path (stages 05 and 06 through papermill on real traces): ranks that
cannot be read (bug 7) and secrets planted in params (bug 4)."""

from __future__ import annotations

import gzip
import json
import shutil
import textwrap
from pathlib import Path

import pytest

from stepscope.cli import main
from stepscope.runner import run_pipeline

TP2 = ("vllm-cpu-tinyllama-tp2-rank0.pt.trace.json.gz", "vllm-cpu-tinyllama-tp2-rank1.pt.trace.json.gz")


@pytest.mark.slow
def test_bug7_analyze_names_unreadable_ranks_and_exits_non_zero(real_traces, tmp_path, capsys):
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(real_traces / TP2[0], traces / TP2[0])
    raw = (real_traces / TP2[1]).read_bytes()
    (traces / TP2[1]).write_bytes(raw[: len(raw) // 2])  # rank 1 truncated mid-stream
    out = tmp_path / "an"
    code = main(["analyze", str(traces), "--tp", "2", "--out", str(out), "--no-progress"])
    console = capsys.readouterr().out
    assert code == 3  # EXIT_RANKS_MISSING, docs/faults.md
    assert f"not analysed: {traces / TP2[1]}: the gzip stream is truncated" in console
    assert "analysed 1 rank(s) of the 2 expected (--tp 2); 1 trace file(s) could not be analysed" in console
    assert (out / "06_writeup" / "report.html").is_file()  # the report still renders what was read

    empty = tmp_path / "empty.pt.trace.json.gz"
    empty.write_bytes(b"")
    code = main(["analyze", str(empty), "--out", str(tmp_path / "an2"), "--no-progress"])
    console = capsys.readouterr().out
    assert code == 4  # EXIT_NO_RANK
    assert "no rank was analysed" in console and f"{empty}: empty file (0 bytes)" in console


def _every_file_text(run_dir: Path) -> dict[str, str]:
    """Every file of a run folder as text, gzip files decompressed (traces included)."""
    out = {}
    for f in run_dir.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            if data[:2] == b"\x1f\x8b":
                data = gzip.decompress(data)
            out[str(f.relative_to(run_dir))] = data.decode("utf-8", "replace")
    return out


@pytest.mark.slow
def test_bug4_a_planted_secret_reaches_no_file_of_the_run(real_traces, tmp_path):
    secret = "sk-PLANTED-7c1e5"
    params = tmp_path / "p.yaml"
    params.write_text(textwrap.dedent(f"""\
        run: {{name: leak, outputs_dir: {tmp_path / 'out'}}}
        server:
          tp: 2
          url: "http://user:{secret}@127.0.0.1:9/?token={secret}"
          extra_args: [--block-size, "32", --api-key, {secret}, "--hf-token={secret}"]
          env: {{HF_TOKEN: {secret}}}
        analysis: {{trace_paths: [{real_traces / TP2[0]}, {real_traces / TP2[1]}]}}
        """))
    code, run_dir = run_pipeline(params, stages="05,06", run_id="r", progress=False, echo=lambda s: None)
    assert code == 0
    files = _every_file_text(run_dir)
    assert {"params.yaml", "run.json", "notebooks/06_writeup.ipynb", "06_writeup/report.md",
            "06_writeup/report.html"} <= set(files)
    leaks = sorted(name for name, text in files.items() if secret in text)
    assert leaks == []
    record = json.loads(files["run.json"])
    assert record["params"]["server"]["extra_args"] == ["--block-size", "32", "--api-key", "***redacted***",
                                                        "--hf-token=***redacted***"]
