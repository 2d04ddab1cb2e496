"""The one versioned reader (`stepscope.schema.versions`): an older run folder reads through
the schema with its missing keys null, and no schema field is left untyped."""

from __future__ import annotations

import json
import shutil
import typing
from pathlib import Path

import msgspec
import pytest

from stepscope import schema

V1 = Path(__file__).parent / "data" / "runfolder-v1"


def test_a_version_1_run_folder_reads_with_the_new_keys_null():
    s = schema.read(V1 / "05_categorize" / "summary.json", schema.TraceSummary)
    assert (s.trace_info, s.collectives_matched, s.roofline) == (None, None, None)
    assert (s.decode.period_ms, s.decode.denominator, s.decode.idle_micro_ms) == (None, None, None)
    assert [r.class_totals_us for r in s.ranks] == [None]
    assert s.decode.steps.n_steps == 1 and s.ranks[0].rank == 0
    run = schema.read(V1 / "run.json", schema.RunRecord)
    assert run.schema_version == 1
    assert run.hardware.gpus == ["NVIDIA H100 80GB HBM3, 81559 MiB, 550.54.15"]


def test_the_same_summary_alone_is_current_and_refused(tmp_path):
    """Without its run.json the file is taken as current: the keys version 2 always writes are
    required, so the reader names the first one missing instead of guessing."""
    shutil.copy(V1 / "05_categorize" / "summary.json", tmp_path / "summary.json")
    with pytest.raises(schema.ArtifactError, match="missing required field `class_totals_us`"):
        schema.read(tmp_path / "summary.json", schema.TraceSummary)


def test_a_version_2_folder_gets_no_fallback(tmp_path):
    shutil.copytree(V1, tmp_path / "run")
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    (tmp_path / "run" / "run.json").write_text(json.dumps({**record, "schema_version": 2}))
    with pytest.raises(schema.ArtifactError, match="missing required field"):
        schema.read(tmp_path / "run" / "05_categorize" / "summary.json", schema.TraceSummary)
    with pytest.raises(schema.ArtifactError, match=r"hardware\.gpus"):
        schema.read(tmp_path / "run" / "run.json", schema.RunRecord)


def test_the_report_reads_a_version_1_folder():
    from stepscope.report.artifacts import load_run_artifacts

    a = load_run_artifacts(V1)
    assert a.trace_summary is not None and a.run is not None, a.problems
    assert not [p for p in a.problems if "summary.json" in p or "run.json" in p]


def test_update_keeps_keys_this_version_does_not_know(tmp_path):
    p = tmp_path / "server.json"
    p.write_text(json.dumps({"mode": "launch", "engine": "vllm", "base_url": "http://127.0.0.1:1", "newer": 7}))
    schema.update(p, schema.ServerRecord, stopped_at="2026-12-01T00:00:00+00:00")
    assert json.loads(p.read_text()) == {"mode": "launch", "engine": "vllm", "base_url": "http://127.0.0.1:1",
                                         "newer": 7, "stopped_at": "2026-12-01T00:00:00+00:00"}
    with pytest.raises(schema.ArtifactError, match="tp"):
        schema.update(p, schema.ServerRecord, tp="two")


UNTYPED_ALLOWED = {
    ("RunRecord", "params"): "a copy of the params, typed by stepscope.config.Params where it is used "
                             "(params_from_dict checks it); kept as plain data here because Params refuses "
                             "keys it does not know, and run.json from an older or newer stepscope must "
                             "still read",
}


def _untyped(tp) -> bool:
    """Any, object, or a bare dict/list whose items say nothing."""
    if tp is typing.Any or tp is object or tp in (dict, list):
        return True
    return any(_untyped(a) for a in typing.get_args(tp))


def _structs() -> list[type[msgspec.Struct]]:
    seen: dict[str, type] = {}
    todo = [getattr(schema, n) for n in schema.__all__]
    todo += [t for m in ("categorize", "run", "deploy", "capture", "micro", "sweep", "load", "campaign",
                         "verdict", "writeup") for t in vars(getattr(schema, m)).values()]
    for t in todo:
        if isinstance(t, type) and issubclass(t, msgspec.Struct) and t.__module__.startswith("stepscope.schema"):
            seen[t.__qualname__] = t
    return list(seen.values())


def test_no_schema_field_is_any():
    bad = []
    structs = _structs()
    assert len(structs) > 60  # every module's Structs, not only the exported ones
    for t in structs:
        for name, tp in typing.get_type_hints(t).items():
            if _untyped(tp) and (t.__name__, name) not in UNTYPED_ALLOWED:
                bad.append(f"{t.__name__}.{name}: {tp}")
    assert not bad, "untyped schema fields (give each a Struct): " + "; ".join(bad)


def test_the_any_finder_finds_one():
    class Loose(schema.Record, kw_only=True):
        x: dict[str, typing.Any] = {}
        y: dict = {}
        z: list[int] = []

    hints = typing.get_type_hints(Loose)
    assert (_untyped(hints["x"]), _untyped(hints["y"]), _untyped(hints["z"])) == (True, True, False)
