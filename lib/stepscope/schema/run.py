"""`run.json`: provenance and per-stage status, written by the runner (and `analyze`)."""

from __future__ import annotations

from msgspec import field

from stepscope.schema._base import Record


class StageStatus(Record, kw_only=True):
    status: str
    """`ok`, `failed` (see `error`) or `skipped` (a stage it needs did not finish)."""
    duration_s: float | None = None
    """Wall time of the stage's notebook, seconds."""
    error: str | None = None
    """The stage's error message, without a traceback."""
    notebook: str | None = None
    """The executed (or partial) notebook."""
    finished_at: str | None = None
    """ISO 8601, UTC."""
    reused_from: str | None = None
    """A campaign copied this stage from the run it names (its inputs were the same), not run."""
    inputs_fingerprint: dict[str, str] | None = None
    """{input: short hash} of what the stage read when it last finished ok: `params:<path>` per
    params path it reads and each run-folder file or folder it reads, as its entry in
    `stepscope.stages.STAGES` declares them. `--resume` runs the stage again when one differs."""


class HostHardware(Record, kw_only=True):
    """The machine the run ran on (`runner.hardware_summary`)."""

    machine: str | None = None
    """`platform.machine()`, e.g. `x86_64`."""
    cpu_count: int | None = None
    cpu: str | None = None
    """/proc/cpuinfo's model name."""
    memory_gib: float | None = None
    gpus: list[str] = []
    """nvidia-smi's `name, memory.total, driver_version` line per GPU; empty without nvidia-smi."""


class RunEvent(Record, kw_only=True):
    """Something that happened outside a stage's notebook (`serve.launch.reap_dead_server`)."""

    event: str
    """`server_relaunch`."""
    cause: str | None = None
    """`server_died`, or `server_orphaned` when it still ran but its supervisor was gone."""
    at: str | None = None
    """ISO 8601, UTC."""
    pid: int | None = None
    pgid: int | None = None
    reason: str | None = None
    orphans_stopped: int | None = None
    """Processes of its group still running, then stopped."""
    log_path: str | None = None
    before_stage: str | None = None


class RunRecord(Record, kw_only=True):
    run_id: str
    """The run folder's name."""
    schema_version: int = 1
    """Version of this schema the run was written with (`stepscope.schema.SCHEMA_VERSION`);
    runs written before it existed read as 1."""
    created_at: str | None = None
    """ISO 8601, UTC."""
    updated_at: str | None = None
    params_file: str | None = None
    """The params YAML the run was started from."""
    argv: list[str] = []
    """The command line, secrets redacted."""
    git_commit: str | None = None
    git_dirty: bool | None = None
    """Uncommitted changes to tracked files when the run started."""
    packages: dict[str, str] = {}
    """{distribution: version} of the packages that shape the numbers."""
    hardware: HostHardware = field(default_factory=HostHardware)
    python: str | None = None
    params: dict[str, dict[str, object] | None] | None = None
    """The validated params with every default filled in, secrets redacted, by section; their
    keys and types are `stepscope.config.Params`'s, which `config.params_from_dict` checks."""
    stages: dict[str, StageStatus] = {}
    """{stage id: status}, in the order the stages ran."""
    resume: bool = False
    """The latest `stepscope run` on this folder was given --resume: only then may a stage keep
    data measured earlier (stage 01's finished levels) instead of measuring it again."""
    events: list[RunEvent] = []
    """What happened outside a stage's notebook, in order. `server_relaunch`: the server this
    run launched was gone (`reason`, `pid`, `pgid`, `orphans_stopped`: processes of its group
    still running, then stopped) and a new one was launched before `before_stage`; `cause` is
    `server_died`, or `server_orphaned` when it still ran but its supervisor was gone (a killed
    `stepscope run` before a `--resume`): stopped, never adopted."""
