"""Perfetto, ready to open (issue 38, item 6): stage 05's merged file, one process per rank on
the reference rank's clock (each rank shifted by its trace origin, as stage 05 matches
collectives), a README naming the step to look at, and `stepscope lab` serving the file to
Perfetto's UI when the UI answers (here a loopback server stands in for it: no network)."""

from __future__ import annotations

import gzip
import json
import socket
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

from stepscope.lab import perfetto_link
from stepscope.trace import perfetto


@pytest.fixture(scope="module")
def stage05(real_traces, tmp_path_factory):
    from stepscope.trace import analyze_traces

    run = tmp_path_factory.mktemp("pf")
    an = analyze_traces([real_traces / f"vllm-cpu-tinyllama-tp2-rank{r}.pt.trace.json.gz" for r in (0, 1)],
                        run / "05_categorize", progress=False)
    return run, an


def _events(path: Path) -> list[dict]:
    return json.loads(gzip.open(path).read())["traceEvents"]


def test_the_merged_file_holds_every_rank_on_one_clock(stage05):
    run, an = stage05
    folder = run / "05_categorize" / "perfetto"
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "rank0.categorized.json.gz",
                                                        "rank1.categorized.json.gz", perfetto.MERGED_NAME]
    events = _events(folder / perfetto.MERGED_NAME)
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {0: "rank 0 (cpu, categorized by stepscope)", 1: "rank 1 (cpu, categorized by stepscope)"}
    summary = json.loads((run / "05_categorize" / "summary.json").read_text())
    origins = {r["rank"]: r["origin_us"] for r in summary["ranks"]}
    offset = origins[1] - origins[0]
    assert offset == pytest.approx(551.068, abs=0.01)  # the two ranks' traces began 0.55 ms apart
    t0 = min(float(r.work["start_us"].min()) + (origins[r.rank] - origins[0]) for r in an.ranks)
    for r in an.ranks:
        got = sorted(e["ts"] for e in events if e["pid"] == r.rank and e["ph"] == "X" and e.get("cat") != "step")
        want = sorted(r.work["start_us"].astype(float) + (origins[r.rank] - origins[0]) - t0)
        assert got == pytest.approx(want, abs=1e-3)
    # the per-rank file starts its own rank at 0, unshifted
    own = [e["ts"] for e in _events(folder / "rank1.categorized.json.gz") if e["ph"] == "X" and e.get("cat") != "step"]
    assert min(own) == 0.0


def test_the_readme_says_how_to_open_them_and_which_step(stage05):
    run, _ = stage05
    step = int(pd.read_csv(run / "05_categorize" / "timeline_rank0_step.csv")["step_id"].iloc[0])
    readme = (run / "05_categorize" / "perfetto" / "README.md").read_text()
    assert "https://ui.perfetto.dev" in readme and "Open trace file" in readme
    assert f"Look at step {step} (the representative decode step of rank 0" in readme
    merged = _events(run / "05_categorize" / "perfetto" / perfetto.MERGED_NAME)
    start = next(e["ts"] for e in merged if e["pid"] == 0 and e.get("cat") == "step" and e["name"].startswith(f"step {step} "))
    assert f"starting {start / 1000:,.3f} ms into the merged file" in readme


def test_lab_serves_the_merged_file_on_loopback_and_says_where_it_is(stage05):
    """No probe of the UI (the user's browser reaches it, not stepscope): the link and the file."""
    run, _ = stage05
    said: list[str] = []
    origin = "http://127.0.0.1:1"  # a stand-in origin: nothing is ever sent to it
    files = perfetto_link(run, said.append, ui_url=origin, port=0)
    try:
        assert str(run / "05_categorize" / "perfetto" / perfetto.MERGED_NAME) in said[1]
        link = said[0].split(": ", 1)[1].strip()
        url = link.split("?url=", 1)[1]
        assert link.startswith(f"{origin}/#!/?url=http://127.0.0.1:") and url.endswith("/" + perfetto.MERGED_NAME)
        with urllib.request.urlopen(url, timeout=5) as resp:
            assert resp.headers["Access-Control-Allow-Origin"] == origin
            assert resp.read() == (run / "05_categorize" / "perfetto" / perfetto.MERGED_NAME).read_bytes()
        with pytest.raises(urllib.error.HTTPError):  # that one file only
            urllib.request.urlopen(url.rsplit("/", 1)[0] + "/README.md", timeout=5)
    finally:
        files.shutdown()


def test_a_taken_port_says_where_the_file_is(stage05):
    run, _ = stage05
    said: list[str] = []
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert perfetto_link(run, said.append, port=taken.getsockname()[1]) is None
    assert str(run / "05_categorize" / "perfetto" / perfetto.MERGED_NAME) in said[0]
    assert "not served on loopback" in said[0]
