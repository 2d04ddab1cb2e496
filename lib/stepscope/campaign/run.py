"""`stepscope campaign`: run the baseline and every variant, each a full run with its own server
(the folder's layout: docs/artifacts.md)."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

import yaml

from stepscope import schema
from stepscope.server_metrics import save_scrape, scrape, spec_decode_delta, stage_scrapes
from stepscope.campaign.plan import REUSABLE_STAGES, CampaignPlan, PlannedRun, plan_campaign, reuse_source, \
    stage_fingerprint
from stepscope.config import load_params, redact
from stepscope.errors import ParamsError, StepscopeError
from stepscope.runfolder import write_yaml
from stepscope.runner import execute_notebook, headline_text, resolve_outputs_dir, run_pipeline, select_stages
from stepscope.stages import STAGE_BY_ID, STAGES, Stage

log = logging.getLogger(__name__)

Executor = Callable[[Stage, Path, Path, bool], Path]
Scraper = Callable[[Path], "str | None"]

# Stages around which /metrics is read: the sweep and the capture (both decode on the server).
METRICS_STAGES = ("01_macro_sweep", "04_profiler_capture")
METRICS_DIR = "campaign_metrics"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def scrape_run_server(run_dir: Path) -> str | None:
    """The /metrics text of the run's live server, or None when there is none to ask."""
    from stepscope.serve import running_server

    record = running_server(run_dir)
    if record is None or not record.base_url:
        return None
    return scrape(record.base_url)


def metrics_executor(inner: Executor, scraper: Scraper) -> Executor:
    """Wrap a stage executor: read /metrics before and after the decode stages (stage 04's own scrapes
    when it made them, so acceptance covers the trace's requests). A failed scrape is logged, never guessed."""
    def run(stage: Stage, params_file: Path, run_dir: Path, progress: bool) -> Path:
        watch = stage.id in METRICS_STAGES
        before = _safe_scrape(scraper, run_dir) if watch else None
        nb = inner(stage, params_file, run_dir, progress)
        if watch:
            after = _safe_scrape(scraper, run_dir)
            d = run_dir / METRICS_DIR
            if before is not None:
                save_scrape(d / f"{stage.id}.before.prom", before)
            if after is not None:
                save_scrape(d / f"{stage.id}.after.prom", after)
            window = "whole stage"
            inside = stage_scrapes(run_dir / stage.id)
            if inside is not None:
                (before, after), window = inside, "profiled requests"
            stats = spec_decode_delta(before, after) if before is not None and after is not None else None
            schema.write(d / f"{stage.id}.spec_decode.json",
                         {"stage": stage.id, "spec_decode": stats.to_json() if stats else None,
                          "note": None if stats else ("no speculative-decoding counters on this server"
                                                      if before is not None and after is not None
                                                      else "metrics could not be read"),
                          "window": window},
                         schema.SpecDecodeWindow)
        return nb
    return run


def _safe_scrape(scraper: Scraper, run_dir: Path) -> str | None:
    try:
        return scraper(run_dir)
    except StepscopeError as exc:
        log.warning("metrics not read: %s", exc)
        return None


class CampaignState:
    """campaign.json (`schema.CampaignRecord`), checked against its schema and rewritten after
    every change."""

    def __init__(self, plan: CampaignPlan, params_file: Path, resume: bool):
        self.path = plan.campaign_dir / "campaign.json"
        prev = (schema.to_builtins(schema.read(self.path, schema.CampaignRecord))
                if resume and self.path.is_file() else {})
        prev_runs = {r["key"]: r for r in prev.get("runs", [])}
        self.data = {
            "campaign_id": plan.campaign_dir.name, "created_at": prev.get("created_at") or _now(),
            "params_file": str(params_file), "baseline": plan.baseline, "variants": list(plan.variants),
            "repeats": plan.repeats, "wall_s": prev.get("wall_s", 0.0),
            "runs": [prev_runs.get(r.key) or {
                "key": r.key, "variant": r.variant, "repeat": r.repeat,
                "run_dir": str(r.run_dir.relative_to(plan.campaign_dir)), "description": r.description,
                "status": "pending", "wall_s": None, "reused": {}, "measured": {}} for r in plan.runs],
        }
        self.save()

    def run(self, key: str) -> dict:
        return next(r for r in self.data["runs"] if r["key"] == key)

    def measured(self) -> dict[str, dict[str, str]]:
        return {r["key"]: r.get("measured", {}) for r in self.data["runs"]}

    def save(self) -> None:
        self.data["updated_at"] = _now()
        schema.write(self.path, self.data, schema.CampaignRecord)


def copy_stage(src_run: Path, dst_run: Path, stage_id: str, source_key: str) -> None:
    """Copy a finished stage's artifacts, notebook and figures, and record where they came from."""
    src, dst = src_run / stage_id, dst_run / stage_id
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    nb = src_run / "notebooks" / f"{stage_id}.ipynb"
    if nb.is_file():
        (dst_run / "notebooks").mkdir(parents=True, exist_ok=True)
        shutil.copy2(nb, dst_run / "notebooks" / nb.name)
    for prefix in STAGE_BY_ID[stage_id].figures:
        for fig in (src_run / "figures").glob(f"{prefix}*.png"):
            (dst_run / "figures").mkdir(parents=True, exist_ok=True)
            shutil.copy2(fig, dst_run / "figures" / fig.name)
    schema.write(dst / "reused_from.json", {"run": source_key, "path": str(src_run)}, schema.ReusedFrom)
    run_json = dst_run / "run.json"
    status = schema.StageStatus(status="ok", duration_s=0.0, finished_at=_now(), reused_from=source_key,
                                notebook=str(dst_run / "notebooks" / f"{stage_id}.ipynb"))
    stages = schema.to_builtins({**_stage_status(dst_run), stage_id: status})
    if run_json.is_file():
        schema.update(run_json, schema.RunRecord, stages=stages)
    else:
        schema.write(run_json, {"run_id": dst_run.name, "schema_version": schema.SCHEMA_VERSION, "stages": stages},
                     schema.RunRecord)


def _reuse_stages(run: PlannedRun, plan: CampaignPlan, record: CampaignState, echo: Callable[[str], None]) -> None:
    """Copy each not-yet-finished stage whose inputs an earlier run measured already."""
    entry, done = record.run(run.key), _stage_status(run.run_dir)
    for stage_id in (s.id for s in REUSABLE_STAGES):
        if stage_id in done and done[stage_id].status == "ok":
            continue
        src = reuse_source(run, stage_id, record.measured())
        if src is not None:
            src_dir = plan.campaign_dir / record.run(src)["run_dir"]
            copy_stage(src_dir, run.run_dir, stage_id, src)
            entry["reused"][stage_id] = src
            echo(f"  {stage_id}: same inputs as {src}, reused")


def _stage_status(run_dir: Path) -> dict[str, schema.StageStatus]:
    record = schema.read_if_present(run_dir / "run.json", schema.RunRecord)
    return record.stages if record is not None else {}


@contextlib.contextmanager
def _variant_params_file(run: PlannedRun):
    """The params file a variant runs from: `variant_params.yaml` is redacted, so params with a secret
    go through a private temporary file (0600, outside outputs/), removed when the run ends."""
    shown = write_yaml(run.run_dir / "variant_params.yaml", redact(run.params_dict))
    if redact(run.params_dict) == run.params_dict:
        yield shown
        return
    fd, private = tempfile.mkstemp(prefix="stepscope-params-", suffix=".yaml")
    try:
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(run.params_dict, f, sort_keys=False)
        yield Path(private)
    finally:
        Path(private).unlink(missing_ok=True)


def _run_one(run: PlannedRun, plan: CampaignPlan, record: CampaignState, *, executor: Executor,
             progress: bool, echo: Callable[[str], None], stages: Sequence[str] | None = None) -> int:
    """One run of the campaign: its stages with unchanged inputs copied from an earlier run,
    the rest run (resumed where it stopped); with `stages`, exactly those run again."""
    entry = record.run(run.key)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    if stages is None:
        _reuse_stages(run, plan, record, echo)
    record.save()
    t0 = time.monotonic()
    with _variant_params_file(run) as params_file:
        code, _ = run_pipeline(params_file, run_dir=run.run_dir, stages=stages, progress=progress,
                               resume=stages is None and (run.run_dir / "run.json").is_file(),
                               notebook_executor=executor, echo=echo)
    if stages is not None:
        for stage in select_stages(list(stages)):
            entry["reused"].pop(stage.id, None)  # measured again, by this run
    stages = _stage_status(run.run_dir)
    for stage_id in (s.id for s in REUSABLE_STAGES):
        st = stages.get(stage_id)
        if st is not None and st.status == "ok" and not st.reused_from:
            entry["measured"][stage_id] = stage_fingerprint(run.params, stage_id)
    entry["status"] = "ok" if code == 0 else "failed"
    entry["exit_code"] = code
    entry["wall_s"] = round((entry.get("wall_s") or 0.0) + time.monotonic() - t0, 1)
    record.save()
    return code


def _finished(run: PlannedRun) -> bool:
    stages = _stage_status(run.run_dir)
    return all(s.id in stages and stages[s.id].status == "ok" for s in STAGES)


def run_campaign(params_file: str | Path, *, campaign_id: str | None = None, resume: bool = False,
                 repeats: int | None = None, progress: bool = True, executor: Executor | None = None,
                 scraper: Scraper = scrape_run_server, report: bool = True, stages: Sequence[str] | None = None,
                 echo: Callable[[str], None] = print) -> tuple[int, Path]:
    """Run every variant (interleaved by repeat), then write the campaign report. With `stages`, run
    exactly those again in every started run (e.g. 05 and 06 after an upgrade)."""
    params_file = Path(params_file).resolve()
    params = load_params(params_file)  # every variant's overrides are checked here
    raw = yaml.safe_load(params_file.read_text()) or {}
    again = "--stages" if stages else "--resume" if resume else None
    if again and not campaign_id:
        raise StepscopeError(f"{again} needs --campaign-id", hint="name the campaign folder to continue")
    if stages:
        select_stages(list(stages))  # an unknown stage is named before anything runs
    cid = campaign_id or f"{params.run.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    campaign_dir = (resolve_outputs_dir(params) / cid).resolve()
    if again and not (campaign_dir / "campaign.json").is_file():
        raise StepscopeError(f"nothing to {'resume' if resume else 'run again'}: no campaign.json",
                             where=str(campaign_dir),
                             hint=f"drop {again} to start this campaign")
    resume = resume or bool(stages)  # the record of every run is kept
    if resume and repeats is None:
        repeats = schema.read(campaign_dir / "campaign.json", schema.CampaignRecord).repeats
    plan = plan_campaign(raw, params, campaign_dir, repeats, source=str(params_file))
    campaign_dir.mkdir(parents=True, exist_ok=True)
    write_yaml(campaign_dir / "params.yaml", redact(raw))
    record = CampaignState(plan, params_file, resume)
    wrapped = metrics_executor(executor or execute_notebook, scraper)
    echo(f"stepscope campaign: {campaign_dir} ({len(plan.runs)} runs: {', '.join(plan.variants)}"
         + (f" x {plan.repeats}" if plan.repeats > 1 else "") + ")")
    t0 = time.monotonic()
    failed: list[str] = []
    try:
        for i, run in enumerate(plan.runs, 1):
            if stages and not (run.run_dir / "run.json").is_file():
                echo(f"[{i}/{len(plan.runs)}] {run.key}: never started, skipped (run it with --resume)")
                continue
            if not stages and resume and record.run(run.key)["status"] == "ok" and _finished(run):
                echo(f"[{i}/{len(plan.runs)}] {run.key}: finished earlier, skipped (--resume)")
                continue
            echo(f"[{i}/{len(plan.runs)}] {run.key}: {run.description or ''}".rstrip(": "))
            code = _run_one(run, plan, record, executor=wrapped, progress=progress, echo=echo, stages=stages)
            if code == 130:
                echo("interrupted: finished runs are kept; continue with --resume")
                return 130, campaign_dir
            if code != 0:
                failed.append(run.key)
    finally:
        record.data["wall_s"] = round(record.data.get("wall_s", 0.0) + time.monotonic() - t0, 1)
        record.save()
    if report:
        from stepscope.campaign.report import build_campaign_report

        try:
            paths = build_campaign_report(campaign_dir)
            echo(f"campaign report: {paths['html']}")
            headline = headline_text(paths["headline"])
            if headline:
                echo(headline)
        except (StepscopeError, ParamsError) as exc:
            echo(f"campaign report not written: {exc}")
            failed.append("report")
    if failed:
        echo("failed: " + ", ".join(failed))
        return 1, campaign_dir
    return 0, campaign_dir
