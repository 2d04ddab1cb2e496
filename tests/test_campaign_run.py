"""The campaign runner: order, folders, reused stages and --resume, with a stand-in stage executor.

The executor here replaces papermill only (the stages themselves are tested elsewhere): it
writes a marker into each stage's folder and records the call, so what ran where is exact.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepscope.campaign.run import run_campaign
from stepscope.runfolder import read_json

PARAMS = """run: {{name: camp, outputs_dir: {out}}}
server: {{mode: attach, url: "http://127.0.0.1:9", tp: 2}}
campaign:
  baseline: tp2
  variants:
    - name: spec
      description: n-gram speculative decoding
      overrides: {{server: {{extra_args: [--speculative-config, '{{"method":"ngram"}}']}}}}
    - name: tp1
      overrides: {{server: {{tp: 1}}}}
"""


class Recorder:
    def __init__(self, fail_once: tuple[str, str] | None = None):
        self.calls: list[tuple[str, str]] = []
        self.fail_once = fail_once

    def __call__(self, stage, params_file, run_dir, progress):
        key = (Path(run_dir).name, stage.id)
        if self.fail_once == key:
            self.fail_once = None
            raise RuntimeError("stage broke")
        self.calls.append(key)
        (Path(run_dir) / stage.id).mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / stage.id / "done.txt").write_text(str(params_file))
        nb = Path(run_dir) / "notebooks" / f"{stage.id}.ipynb"
        nb.parent.mkdir(parents=True, exist_ok=True)
        nb.write_text("{}")
        return nb


@pytest.fixture
def params_file(tmp_path):
    f = tmp_path / "camp.yaml"
    f.write_text(PARAMS.format(out=tmp_path / "out"))
    return f


def _run(params_file, rec, **kw):
    # attach mode with no server: the runner's _ensure_server is bypassed by marking server stages' need
    import stepscope.runner as runner

    orig = runner._ensure_server
    runner._ensure_server = lambda *a, **k: False
    try:
        return run_campaign(params_file, campaign_id="c1", executor=rec, scraper=lambda d: None,
                            report=False, progress=False, echo=lambda s: None, **kw)
    finally:
        runner._ensure_server = orig


def test_each_variant_is_a_full_run_and_unchanged_stages_are_reused(params_file):
    rec = Recorder()
    code, cdir = _run(params_file, rec)
    assert code == 0
    ran = {}
    for run_name, stage in rec.calls:
        ran.setdefault(run_name, []).append(stage[:2])
    # the spec variant changes only server flags: GEMM micro and collectives burst are copied
    assert ran["tp2"] == ["00", "01", "02", "03", "04", "05", "06"]
    assert ran["spec"] == ["00", "01", "04", "05", "06"]
    # TP=1 changes the per-rank shapes and the world size: both measured again
    assert ran["tp1"] == ["00", "01", "02", "03", "04", "05", "06"]
    rec_json = read_json(cdir / "campaign.json")
    spec = next(r for r in rec_json["runs"] if r["variant"] == "spec")
    assert spec["reused"] == {"02_gemm_micro": "tp2#1", "03_nccl_burst": "tp2#1"}
    run_json = read_json(cdir / "spec" / "run.json")
    assert run_json["stages"]["02_gemm_micro"]["reused_from"] == "tp2#1"
    from stepscope import schema

    assert schema.read(cdir / "spec" / "02_gemm_micro" / "reused_from.json", schema.ReusedFrom).run == "tp2#1"
    typed = schema.read(cdir / "campaign.json", schema.CampaignRecord)
    assert [(r.key, r.status, r.exit_code) for r in typed.runs] == [("tp2#1", "ok", 0), ("spec#1", "ok", 0),
                                                                    ("tp1#1", "ok", 0)]
    assert set(typed.runs[0].measured) == {"02_gemm_micro", "03_nccl_burst"} and typed.runs[1].measured == {}
    # each run ran its own merged params file
    assert "speculative-config" in (cdir / "spec" / "variant_params.yaml").read_text()
    import yaml

    assert "campaign" not in yaml.safe_load((cdir / "spec" / "variant_params.yaml").read_text())


def test_repeats_interleave_variants(params_file):
    rec = Recorder()
    code, cdir = _run(params_file, rec, repeats=2)
    assert code == 0
    order = [r for r, s in rec.calls if s == "00_deploy"]
    assert order == ["repeat-1"] * 3 + ["repeat-2"] * 3
    runs = read_json(cdir / "campaign.json")["runs"]
    assert [r["key"] for r in runs] == ["tp2#1", "spec#1", "tp1#1", "tp2#2", "spec#2", "tp1#2"]
    assert (cdir / "tp1" / "repeat-2" / "06_writeup" / "done.txt").is_file()
    # repeat 2 of the baseline reuses its own first repeat's micro-benchmarks
    assert next(r for r in runs if r["key"] == "tp2#2")["reused"]["02_gemm_micro"] == "tp2#1"


def test_resume_continues_at_the_first_unfinished_variant_and_stage(params_file):
    rec = Recorder(fail_once=("spec", "04_profiler_capture"))
    code, cdir = _run(params_file, rec)
    assert code == 1
    assert read_json(cdir / "campaign.json")["runs"][1]["status"] == "failed"
    rec2 = Recorder()
    code, _ = _run(params_file, rec2, resume=True)
    assert code == 0
    # the baseline and tp1 finished: not run again; the spec run resumes at its capture, the
    # stage that failed; 05 (skipped: it reads 04's traces) and 06 (its inputs changed) follow
    assert rec2.calls == [("spec", "04_profiler_capture"), ("spec", "05_categorize"), ("spec", "06_writeup")]


def test_resume_without_a_campaign_folder_is_a_clear_error(params_file):
    from stepscope.errors import StepscopeError

    with pytest.raises(StepscopeError, match="nothing to resume"):
        _run(params_file, Recorder(), resume=True)


def test_an_explicit_collective_world_size_makes_stage_03_independent_of_tp(params_file):
    from stepscope.campaign.plan import plan_campaign, stage_fingerprint
    from stepscope.config import load_params
    import yaml

    raw = yaml.safe_load(params_file.read_text())
    plan = plan_campaign(raw, load_params(params_file), Path("/tmp/x"))
    tp2, _, tp1 = plan.runs
    assert stage_fingerprint(tp2.params, "03_nccl_burst") != stage_fingerprint(tp1.params, "03_nccl_burst")
    raw["micro"] = {"collectives": {"world_size": 2}}
    from stepscope.config import params_from_dict

    plan = plan_campaign(raw, params_from_dict(raw), Path("/tmp/x"))
    tp2, _, tp1 = plan.runs
    assert stage_fingerprint(tp2.params, "03_nccl_burst") == stage_fingerprint(tp1.params, "03_nccl_burst")
    assert stage_fingerprint(tp2.params, "02_gemm_micro") != stage_fingerprint(tp1.params, "02_gemm_micro")


@pytest.mark.parametrize("name, variants, reused_by", [
    ("cpu-campaign", ["tp2", "tp2-ngram", "tp1", "tp2-shared-prefix", "tp2-load"],
     {"tp2-ngram": {"02_gemm_micro", "03_nccl_burst"}, "tp1": {"03_nccl_burst"},
      "tp2-shared-prefix": {"02_gemm_micro", "03_nccl_burst"}, "tp2-load": {"02_gemm_micro", "03_nccl_burst"}}),
    ("kimi-k25-int4-tp8-campaign", ["tp8-custom-ar", "tp8-ngram", "tp8-nccl-ar", "tp8-nccl-ll"],
     {v: {"02_gemm_micro", "03_nccl_burst"} for v in ("tp8-ngram", "tp8-nccl-ar", "tp8-nccl-ll")}),
])
def test_shipped_campaigns_plan_as_documented(repo_root, name, variants, reused_by):
    import yaml

    from stepscope.campaign.plan import REUSABLE_STAGES, plan_campaign, reuse_source, stage_fingerprint
    from stepscope.config import load_params

    f = repo_root / "params" / f"{name}.yaml"
    plan = plan_campaign(yaml.safe_load(f.read_text()), load_params(f), Path("/tmp") / name)
    assert list(plan.variants) == variants
    base = plan.runs[0]
    reusable = [s.id for s in REUSABLE_STAGES]
    assert reusable == ["02_gemm_micro", "03_nccl_burst"]
    finished = {base.key: {s: stage_fingerprint(base.params, s) for s in reusable}}
    for run in plan.runs[1:len(variants)]:
        got = {s for s in reusable if reuse_source(run, s, finished)}
        assert got == reused_by[run.variant], run.variant
    spec = plan.runs[1].params
    assert any("ngram" in a for a in spec.server.extra_args)
    assert spec.server.tp == base.params.server.tp


def test_a_campaign_json_off_its_schema_is_named_with_its_key(params_file):
    from stepscope.campaign.analysis import load_campaign
    from stepscope.schema import ArtifactError

    code, cdir = _run(params_file, Recorder())
    assert code == 0
    rec = read_json(cdir / "campaign.json")
    del rec["runs"][1]["run_dir"]  # a hand-edited or truncated record
    (cdir / "campaign.json").write_text(json.dumps(rec))
    with pytest.raises(ArtifactError) as err:
        load_campaign(cdir)
    assert "campaign.json" in str(err.value) and "run_dir" in str(err.value) and "$.runs[1]" in str(err.value)


def test_the_spec_decode_file_holds_exactly_the_schemas_keys(repo_root):
    import msgspec

    from stepscope.server_metrics import spec_decode_delta
    from stepscope.schema import SpecDecodeCounters

    m = repo_root / "tests" / "data" / "metrics" / "vllm-cpu-tinyllama-tp2-ngram"
    stats = spec_decode_delta(m.with_suffix(".before.prom").read_text(), m.with_suffix(".after.prom").read_text())
    assert set(stats.to_json()) == {f.name for f in msgspec.structs.fields(SpecDecodeCounters)}


def test_stages_run_again_in_every_started_run_and_nothing_else(params_file):
    from stepscope import schema

    code, cdir = _run(params_file, Recorder())
    assert code == 0
    before = {v: read_json(cdir / v / "run.json")["stages"] for v in ("tp2", "spec", "tp1")}
    rec = Recorder()
    code, _ = _run(params_file, rec, stages=["05", "06"])
    assert code == 0
    # exactly the two analysis stages, in every run, interleaved as before
    assert rec.calls == [(v, s) for v in ("tp2", "spec", "tp1") for s in ("05_categorize", "06_writeup")]
    for v in ("tp2", "spec", "tp1"):
        after = read_json(cdir / v / "run.json")["stages"]
        assert set(after) == set(before[v]) and after["00_deploy"] == before[v]["00_deploy"]
        assert after["05_categorize"]["finished_at"] >= before[v]["05_categorize"]["finished_at"]
    typed = schema.read(cdir / "campaign.json", schema.CampaignRecord)
    assert [r.status for r in typed.runs] == ["ok"] * 3
    assert typed.runs[1].reused == {"02_gemm_micro": "tp2#1", "03_nccl_burst": "tp2#1"}  # not run again: kept
    # re-measuring a reused stage makes it the run's own
    _run(params_file, Recorder(), stages=["02"])
    assert "02_gemm_micro" not in schema.read(cdir / "campaign.json", schema.CampaignRecord).runs[1].reused


def test_stages_need_an_existing_campaign_and_known_stage_names(params_file):
    from stepscope.errors import StepscopeError

    with pytest.raises(StepscopeError, match="nothing to run again"):
        _run(params_file, Recorder(), stages=["05"])
    with pytest.raises(StepscopeError, match="'09'"):
        _run(params_file, Recorder(), stages=["09"])


def test_stage_04s_own_scrapes_give_the_counters_over_the_profiled_requests(tmp_path, repo_root):
    """Around the whole stage the counters include the warm-up; stage 04's own scrapes, just
    inside /start_profile and /stop_profile, do not, and are preferred when present."""
    from stepscope import schema
    from stepscope.campaign.run import metrics_executor
    from stepscope.server_metrics import METRICS_SCRAPES
    from stepscope.stages import STAGES

    m = repo_root / "tests" / "data" / "metrics" / "vllm-cpu-tinyllama-tp2-ngram"
    before, after = m.with_suffix(".before.prom").read_text(), m.with_suffix(".after.prom").read_text()
    stage = next(s for s in STAGES if s.id == "04_profiler_capture")
    scrapes = iter([before, after, before, after])

    def capture(inside: tuple[str, str] | None):
        def inner(stage, params_file, run_dir, progress):
            (run_dir / stage.id).mkdir(parents=True, exist_ok=True)
            for name, text in zip(METRICS_SCRAPES, inside or ()):
                (run_dir / stage.id / name).write_text(text)
            return run_dir
        return inner

    for name, inside in (("whole", None), ("inside", (before, before))):
        run_dir = tmp_path / name
        metrics_executor(capture(inside), lambda d: next(scrapes))(stage, tmp_path / "p.yaml", run_dir, False)
        w = schema.read(run_dir / "campaign_metrics" / "04_profiler_capture.spec_decode.json", schema.SpecDecodeWindow)
        if inside is None:
            assert w.window == "whole stage" and w.spec_decode.drafts == 72.0
        else:
            # no request between the two inner scrapes here: nothing drafted inside the window
            assert w.window == "profiled requests" and w.spec_decode.drafts == 0.0
        # the scrapes around the stage are kept either way
        assert (run_dir / "campaign_metrics" / "04_profiler_capture.after.prom").read_text() == after


def test_a_secret_in_a_variants_params_reaches_no_file_of_the_campaign(tmp_path, monkeypatch):
    """The server a variant launches gets its literal --api-key; no file under outputs/ holds it."""
    import stepscope.runner as runner

    secret = "sk-campaign-literal-0123456789"
    f = tmp_path / "camp.yaml"
    f.write_text(PARAMS.format(out=tmp_path / "out").replace(
        "tp: 1}}", f"tp: 1, extra_args: [--api-key, {secret}]}}}}"))
    launched_with: list[list[str]] = []
    monkeypatch.setattr(runner, "_ensure_server",
                        lambda params, *a, **k: launched_with.append(list(params.server.extra_args)) or False)
    code, cdir = run_campaign(f, campaign_id="c1", executor=Recorder(), scraper=lambda d: None,
                              report=False, progress=False, echo=lambda s: None)
    assert code == 0
    assert ["--api-key", secret] in launched_with
    leaked = [p for p in cdir.rglob("*") if p.is_file() and secret in p.read_text(errors="replace")]
    assert leaked == []
    assert "--api-key" in (cdir / "tp1" / "variant_params.yaml").read_text()
    private = Path(read_json(cdir / "tp1" / "run.json")["params_file"])
    assert not private.exists()  # the private copy is gone with the run
