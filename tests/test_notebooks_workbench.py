"""Notebooks a person can work in (issue 24, item 7): stage 05 as three steps (load, analyse,
write), and stage 06's findings as tables before the report, on real CPU traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepscope import schema, thresholds
from stepscope.errors import StepscopeError
from stepscope.report import prose
from stepscope.report import verdict as vd
from stepscope.report.findings import verdict
from stepscope.trace.analyze import analyse, analyze_traces, load_traces

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


@pytest.fixture(scope="module")
def run(real_traces, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("run")
    analyze_traces(sorted(real_traces.glob("vllm-cpu-tinyllama-tp2-rank*.pt.trace.json.gz")), run / "05_categorize",
                   progress=False, perfetto=False)
    return run


def test_load_and_analyse_write_nothing_and_agree_with_the_one_call(run, real_traces, tmp_path):
    out = tmp_path / "05"
    loaded = load_traces(sorted(real_traces.glob("vllm-cpu-tinyllama-tp2-rank*.pt.trace.json.gz")), out,
                         progress=False)
    assert list(loaded.table()["rank"]) == [0, 1] and (loaded.table()["events"] > 0).all()
    an = analyse(loaded, progress=False)
    assert not (out / "summary.json").exists()  # the write step is its own
    one = json.loads((run / "05_categorize" / "summary.json").read_text())
    assert schema.to_builtins(an.summary.decode.period_ms) == pytest.approx(one["decode"]["period_ms"])
    assert [c.category for c in an.summary.decode.categories] == \
        [c["category"] for c in one["decode"]["categories"]]


def test_the_findings_table_is_the_verdicts_sentences(run):
    v = verdict(run)
    df = v.get_findings()
    assert list(df["sentence"]) == [s for _, s in prose.sentences(v.verdict)]
    assert df.loc[df["finding"] == "Dominant", "subject"].tolist() == [v.verdict.dominant.category]
    head = {type(f).__name__ for src, _ in prose.headline_sentences(v.verdict) for f in src}
    assert set(df.loc[df["in_headline"], "finding"]) == head
    lv = v.get_levers()
    assert lv.loc[lv["biggest"], "name"].tolist() == [v.verdict.biggest.name]
    assert lv.loc[lv["kind"] == "category", "coherent"].all()
    g = v.get_guards()
    assert len(g) == len(v.verdict.guards) and g["holds"].all()
    assert v.get_finding("biggest") is v.verdict.biggest
    assert "Findings of" in repr(v) and "<table" in v._repr_html_()


def test_another_threshold_changes_the_judgement_and_only_inside(run):
    v = verdict(run)
    b = v.verdict.between_steps
    assert b is not None and 10 < b.gap_pct < 50  # named at the default 10 %, not at 50 %
    w = v.with_thresholds(BETWEEN_STEPS_SHARE=0.5)
    assert w.verdict.between_steps is None and w.overrides == (("BETWEEN_STEPS_SHARE", 0.5),)
    changed = w.changed(v)
    assert list(changed["in"]) == ["other"] and changed["sentence"].iloc[0].startswith("Between steps,")
    assert thresholds.BETWEEN_STEPS_SHARE == 0.1 and vd.BETWEEN_STEPS_SHARE == 0.1  # restored
    assert verdict(run).verdict.between_steps == b


def test_a_wrong_name_is_named_with_the_nearest(run):
    v = verdict(run)
    with pytest.raises(StepscopeError) as e:
        v.with_thresholds(BETWEEN_STEP_SHARE=0.5)
    assert "BETWEEN_STEPS_SHARE" in e.value.render()
    with pytest.raises(StepscopeError) as e:
        v.get_finding("domnant")
    assert "'dominant'" in e.value.render()


def _code(name: str) -> str:
    nb = json.loads((NOTEBOOKS / name).read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")


def test_notebook_05_runs_its_three_steps_as_cells_and_06_shows_the_findings_first():
    nb = json.loads((NOTEBOOKS / "05_categorize.ipynb").read_text())
    cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    at = [next(i for i, c in enumerate(cells) if step in c) for step in ("load_traces(", "analyse_stage(", "write_stage(")]
    assert at == sorted(at) and len(set(at)) == 3 and "run_stage(" not in _code("05_categorize.ipynb")
    six = _code("06_writeup.ipynb")
    assert six.index("verdict(run_dir") < six.index("build_report(run_dir")
    assert "with_thresholds(" in six and "get_levers()" in six and "get_guards()" in six
