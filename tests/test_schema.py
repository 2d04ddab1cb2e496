"""The artifact schema: every stage's real output validates, and bad files are named."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from stepscope import schema
from stepscope.trace.analyze import analyze_traces

TP2 = ["vllm-cpu-tinyllama-tp2-rank0.pt.trace.json.gz", "vllm-cpu-tinyllama-tp2-rank1.pt.trace.json.gz"]


@pytest.fixture(scope="module")
def stage05_outputs(real_traces: Path, tmp_path_factory) -> dict[str, dict[str, object]]:
    """Stage 05's real artifacts for a CPU TP=2 pair, a GPU DDP trace and an SGLang trace."""
    out = {}
    for name, files in {"cpu-tp2": TP2, "a100-ddp": ["hta-a100-ddp-nccl.json.gz"],
                        "sglang": ["sglang-mi300x-qwen3-8b-decode.json.gz"]}.items():
        d = tmp_path_factory.mktemp(name)
        analyze_traces([real_traces / f for f in files], d / "05_categorize", tp=2 if name == "cpu-tp2" else None,
                       progress=False, perfetto=False)
        out[name] = schema.check_run_folder(d)
    return out


def test_stage05_real_output_validates_with_the_values_it_wrote(stage05_outputs):
    for name, arts in stage05_outputs.items():
        assert {"05_categorize/summary.json", "05_categorize/steps.csv", "05_categorize/decode_categories.csv",
                "05_categorize/rank_categories.csv", "05_categorize/amdahl.csv"} <= set(arts), name
        s = arts["05_categorize/summary.json"]
        assert isinstance(s, schema.TraceSummary)
        for r in s.ranks:
            assert r.busy_us + r.idle_us == pytest.approx(r.span_us, rel=1e-9)
        steps = arts["05_categorize/steps.csv"]
        ref = steps[steps["rank"] == s.decode.rank]
        if s.decode.steps.steps_used == "decode":
            assert s.decode.steps.n_steps == int(((ref["label"] == "decode") & (ref["n_events"] > 0)).sum())
        # The summary's category rows are the reference rank's rows of the CSV.
        dec = arts["05_categorize/decode_categories.csv"]
        dec_ref = dec[dec["rank"] == s.decode.rank]
        assert [c.category for c in s.decode.categories] == dec_ref["category"].tolist()
        assert [c.class_ for c in s.decode.categories] == dec_ref["class"].tolist()


def test_stage05_cpu_tp2_values_through_the_schema(stage05_outputs):
    s = stage05_outputs["cpu-tp2"]["05_categorize/summary.json"]
    assert [r.rank for r in s.ranks] == [0, 1]
    assert all(r.mode == "cpu" for r in s.ranks)
    assert s.ranks[0].collectives_per_decode_step == {"all_reduce": 5.0, "all_gather": 1.0}
    assert s.collectives_check.observed.all_reduce.median == 5.0
    assert s.collectives_check.observed.per_step() == {"all_reduce": 5.0, "all_gather": 1.0, "other_collective": 0.0}
    assert s.collectives_check.tp == 2
    m = s.collectives_matched
    assert m.ranks_present == [0, 1] and m.world_size == 2
    assert m.by_category and all(isinstance(c, schema.CollectiveCategoryStats) for c in m.by_category.values())
    assert set(m.reconcile) == {"0", "1"} and all(isinstance(r, schema.RankReconcile) for r in m.reconcile.values())
    assert s.decode.steps.n_steps == 10
    assert s.decode.steps.union_ms.mean <= s.decode.steps.kernel_sum_ms.mean + 1e-12


def test_synthetic_run_follows_the_schema(tmp_path):
    from stepscope.testing.synthetic import make_synthetic_run

    arts = schema.check_run_folder(make_synthetic_run(tmp_path / "run"))
    typed = {a.path for a in schema.ARTIFACTS if a.type is not None and not a.optional}
    assert typed <= set(arts), typed - set(arts)
    run = arts["run.json"]
    assert run.schema_version == schema.SCHEMA_VERSION
    assert run.stages["05_categorize"].status == "ok"
    assert arts["03_nccl_burst/prediction.json"].comm_us_per_decode_step == 4300.0


def test_missing_key_names_the_file_and_the_key(tmp_path):
    p = tmp_path / "summary.json"
    p.write_text(json.dumps({"ranks": [{"rank": 0, "file": "x", "mode": "gpu"}]}))
    with pytest.raises(schema.ArtifactError) as e:
        schema.read(p, schema.TraceSummary)
    msg = e.value.render()
    assert str(p) in msg and "$.ranks[0]" in msg and "n_device_events" in msg


def test_wrong_type_is_refused_and_unknown_keys_are_ignored(tmp_path):
    p = tmp_path / "summary.json"
    p.write_text(json.dumps({"knee_concurrency": "four", "a_newer_key": 1}))
    with pytest.raises(schema.ArtifactError, match=r"knee_concurrency"):
        schema.read(p, schema.SweepSummary)
    p.write_text(json.dumps({"knee_concurrency": 4, "plateau_output_tok_s": 300, "a_newer_key": 1}))
    s = schema.read(p, schema.SweepSummary)
    assert (s.knee_concurrency, s.plateau_output_tok_s, s.flags) == (4, 300.0, [])


def test_tables_need_their_required_columns_and_numbers(tmp_path):
    df = pd.DataFrame({"rank": [0], "category": ["all_reduce"], "class": ["communication"],
                       "union_ms_mean": [1.5]})
    assert schema.check_frame(df, schema.DecodeCategoryRow, "x.csv") is df
    with pytest.raises(schema.ArtifactError, match="missing column.*union_ms_mean"):
        schema.check_frame(df.drop(columns="union_ms_mean"), schema.DecodeCategoryRow, "x.csv")
    with pytest.raises(schema.ArtifactError, match="union_ms_mean.*'fast'"):
        schema.check_frame(df.assign(union_ms_mean=["fast"]), schema.DecodeCategoryRow, "x.csv")
    assert schema.required_columns(schema.AmdahlRow) == ("category", "step_ms", "exposed_ms", "speedup_ceiling")
    assert "class" in schema.columns(schema.AmdahlRow)


def test_writers_refuse_what_the_schema_does_not_allow(tmp_path):
    with pytest.raises(schema.ArtifactError, match="SweepSummary"):
        schema.write(tmp_path / "summary.json", {"knee_concurrency": "x"}, schema.SweepSummary)
    assert not (tmp_path / "summary.json").exists()
    schema.write(tmp_path / "summary.json", {"knee_concurrency": 4}, schema.SweepSummary)
    assert json.loads((tmp_path / "summary.json").read_text()) == {"knee_concurrency": 4}


def test_schema_import_is_light():
    import subprocess
    import sys

    code = ("import sys, stepscope.schema; "
            "print(sorted(m for m in ('pandas', 'numpy', 'yaml', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_artifact_docs_equal_the_schema(repo_root):
    from stepscope.schema import docs

    page = (repo_root / "docs" / "artifacts.md").read_text()
    assert page == docs.artifacts_markdown() + "\n", (
        "docs/artifacts.md is stale: run `python -m stepscope.schema`")
    # Every typed artifact, and the exposed-time caveat, reach the reference.
    for a in schema.ARTIFACTS:
        assert a.path.rsplit("/", 1)[-1] in page or a.path in page, a.path
    assert "can add up to more than `busy_us`" in page


def test_generated_docs_carry_each_field_its_type_and_meaning():
    from stepscope.schema import docs

    md = docs.artifacts_markdown()
    assert "| `tpot_ms_mean` | float or null | Per request (E2EL - TTFT) / (tokens - 1)" in md
    assert "- `knee_concurrency` (int | null, optional): The first level beyond which" in md
    assert "## `05_categorize/steps.csv`" in md and "| `class` | str | `compute`, `communication` or `memory`. |" in md


def test_report_loader_reads_typed_values_and_names_an_off_schema_file(tmp_path, caplog):
    import logging

    from stepscope.report.artifacts import load_run_artifacts
    from stepscope.testing.synthetic import make_synthetic_run

    run = make_synthetic_run(tmp_path / "run")
    a = load_run_artifacts(run)
    assert isinstance(a.sweep_summary, schema.SweepSummary) and a.sweep_summary.knee_concurrency == 4
    assert a.comm_prediction.comm_us_per_decode_step == 4300.0 and a.decode.rank == 0
    assert list(a.decode_categories["rank"].unique()) == [0]  # the reference rank's rows only
    assert a.problems == []
    (run / "02_gemm_micro" / "prediction.json").write_text(json.dumps({"gemm_us_per_decode_step": "fast"}))
    with caplog.at_level(logging.WARNING, logger="stepscope.report.artifacts"):
        a = load_run_artifacts(run)
    assert a.gemm_prediction is None
    assert a.problems == ["02_gemm_micro/prediction.json: does not match the schema GemmPrediction: "
                          "Expected `object`, got `str` - at `$.gemm_us_per_decode_step`"]
    assert "prediction.json" in caplog.text and "GemmPrediction" in caplog.text


def test_no_schema_class_declares_a_field_twice(repo_root):
    """A field declared twice in one class body silently keeps the last declaration (two
    helpers once both added `DecodeSummary.spec_decode`, each with its own class)."""
    import ast

    twice = []
    for f in sorted((repo_root / "lib/stepscope/schema").glob("*.py")):
        for cls in ast.walk(ast.parse(f.read_text())):
            if isinstance(cls, ast.ClassDef):
                names = [s.target.id for s in cls.body if isinstance(s, ast.AnnAssign)
                         and isinstance(s.target, ast.Name)]
                twice += [f"{f.name}:{cls.name}.{n}" for n in sorted(set(names)) if names.count(n) > 1]
    assert twice == []
    assert schema.DecodeSummary.__annotations__["spec_decode"] == "SpecDecodeSteps | None"
