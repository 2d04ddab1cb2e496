"""`stepscope analyze`: stages 05 and 06 through papermill on traces captured elsewhere."""

from __future__ import annotations

import json

import pytest

from stepscope.cli import main


@pytest.mark.slow
def test_analyze_real_cpu_tp2_traces(real_traces, tmp_path, capsys):
    files = [str(real_traces / f"vllm-cpu-tinyllama-tp2-rank{r}.pt.trace.json.gz") for r in (0, 1)]
    out = tmp_path / "an"
    assert main(["analyze", *files, "--tp", "2", "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "05_categorize" / "summary.json").read_text())
    assert sorted(r["rank"] for r in summary["ranks"]) == [0, 1]
    for rank in summary["ranks"]:
        assert rank["unattributed_events"] == 0
        assert rank["collectives_per_decode_step"] == {"all_reduce": 5.0, "all_gather": 1.0}
        assert rank["busy_us"] + rank["idle_us"] == pytest.approx(rank["span_us"], rel=1e-9)
    record = json.loads((out / "run.json").read_text())
    assert set(record["stages"]) == {"05_categorize", "06_writeup"}
    assert (out / "06_writeup" / "report.html").is_file()
    assert f"report: {out / '06_writeup' / 'report.html'}" in capsys.readouterr().out


def test_analyze_missing_path_is_named(tmp_path, capsys):
    assert main(["analyze", str(tmp_path / "nope.json.gz")]) == 2
    err = capsys.readouterr().err
    assert "trace path not found" in err and "nope.json.gz" in err


def test_analyze_folder_without_traces_fails_stage_05_with_a_message(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "an"
    assert main(["analyze", str(empty), "--out", str(out), "--no-progress"]) == 4  # EXIT_NO_RANK
    assert capsys.readouterr().out.splitlines()[0] == f"stepscope analyze: {out.resolve()}"  # its own header
    record = json.loads((out / "run.json").read_text())
    assert record["stages"]["05_categorize"]["status"] == "failed"
    assert "empty" in record["stages"]["05_categorize"]["error"]
    assert record["stages"]["06_writeup"]["status"] == "ok"  # the report still renders, with gaps marked


def test_analyze_prints_the_reports_headline(real_traces, tmp_path, capsys):
    # The conclusion on the terminal, as the report wrote it: no browser needed to read it.
    out = tmp_path / "an"
    assert main(["analyze", str(real_traces / "vllm-mi300x-gptoss-decode-fullgraph.json.gz"), "--out", str(out),
                 "--no-progress"]) == 0
    printed = capsys.readouterr().out
    said = next(ln for ln in (out / "06_writeup" / "report.md").read_text().splitlines()
                if ln.startswith("> **In short:** "))
    # the dominant cost first, the caveat that matters most (one step judged) last
    assert "in short: fused_moe takes the most time" in printed and "Caveat: only 1 decode step judged" in printed
    assert " ".join(printed[printed.index("in short: "):].split()) == " ".join(
        ("in short: " + said.removeprefix("> **In short:** ").replace("**", "")).split())


def test_analyze_finishes_when_its_reader_goes_away(real_traces, tmp_path):
    # `stepscope run ... | head`: head exits after its lines; the run must go on and keep its
    # results, not die of BrokenPipeError at the next line it prints (before: run.json with
    # no stage, exit 1 and a traceback).
    import os
    import subprocess
    import sys

    out = tmp_path / "an"
    read_end, write_end = os.pipe()
    os.close(read_end)  # a reader that is already gone: every write to the pipe fails
    try:
        done = subprocess.run([sys.executable, "-m", "stepscope.cli", "analyze",
                               str(real_traces / "vllm-mi300x-gptoss-decode-fullgraph.json.gz"),
                               "--out", str(out), "--no-progress"],
                              stdout=write_end, stderr=write_end, timeout=120)
    finally:
        os.close(write_end)
    assert done.returncode == 0
    record = json.loads((out / "run.json").read_text())
    assert {k: v["status"] for k, v in record["stages"].items()} == {"05_categorize": "ok", "06_writeup": "ok"}
    assert (out / "06_writeup" / "report.html").is_file()
