"""End to end: params/smoke.yaml through papermill against a real vLLM CPU server (TP=2, gloo)."""

from __future__ import annotations

import json

import pytest

from stepscope import schema
from stepscope.stages import STAGES
from stepscope.runner import run_pipeline


@pytest.mark.slow
def test_smoke_run_end_to_end(repo_root, tmp_path):
    lines: list[str] = []
    code, run_dir = run_pipeline(repo_root / "params" / "smoke.yaml", run_dir=tmp_path / "smoke-run",
                                 progress=False, echo=lines.append)
    record = json.loads((run_dir / "run.json").read_text())
    statuses = {k: (v["status"], v["error"]) for k, v in record["stages"].items()}
    assert code == 0, "\n".join(lines) + f"\n{statuses}"
    assert all(s == "ok" for s, _ in statuses.values()) and len(statuses) == 7
    for stage in STAGES:
        assert (run_dir / "notebooks" / f"{stage.id}.ipynb").is_file()

    server = json.loads((run_dir / "00_deploy" / "server.json").read_text())
    assert server["engine_version"] == "0.32.0" and server["tp"] == 2
    assert server.get("stopped_at"), "the runner stops the server it started"

    # A real TP=2 capture: one trace per rank, read back by stage 05 with real gloo collectives.
    manifest = json.loads((run_dir / "04_profiler_capture" / "manifest.json").read_text())
    assert sorted(f["rank"] for f in manifest["files"] if f["kind"] == "trace") == [0, 1]
    summary = json.loads((run_dir / "05_categorize" / "summary.json").read_text())
    assert sorted(r["rank"] for r in summary["ranks"]) == [0, 1]
    for rank in summary["ranks"]:
        assert rank["n_decode_steps"] > 0
        assert rank["unattributed_events"] == 0
        # tiny Llama, 2 layers: 2L+1 = 5 all-reduces per decode step over gloo.
        assert rank["collectives_per_decode_step"]["all_reduce"] == pytest.approx(5, abs=0.5)

    assert (run_dir / "06_writeup" / "report.md").is_file()
    html = (run_dir / "06_writeup" / "report.html").read_text()
    assert "<img" in html and "http://" not in html.split("<body", 1)[-1].replace("http://127.0.0.1", "")
    assert (run_dir / "01_macro_sweep" / "levels.csv").is_file()
    # Every stage's real output reads through the artifact schema.
    arts = schema.check_run_folder(run_dir)
    typed = {a.path for a in schema.ARTIFACTS if a.type is not None and not a.optional}
    assert typed <= set(arts), typed - set(arts)
    assert arts["run.json"].schema_version == schema.SCHEMA_VERSION
    assert arts["00_deploy/server.json"].tp == 2
    assert sorted(f.rank for f in arts["04_profiler_capture/manifest.json"].files if f.kind == "trace") == [0, 1]
