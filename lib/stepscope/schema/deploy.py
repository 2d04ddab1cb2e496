"""`00_deploy/server.json`: the run's server, launched or attached (`stepscope.serve`)."""

from __future__ import annotations

from stepscope.schema._base import Record


class ModelCard(Record, kw_only=True):
    """One model of the server's `/v1/models` answer (OpenAI's list format)."""

    id: str
    root: str | None = None
    """vLLM: the model's path or hub name as the server loaded it."""
    max_model_len: int | None = None
    owned_by: str | None = None


class ModelsResponse(Record, kw_only=True):
    object: str | None = None
    data: list[ModelCard] = []

    def root(self) -> str | None:
        """The first model's root (where the server loaded it from), else None."""
        return self.data[0].root if self.data else None


class ServerRecord(Record, kw_only=True):
    mode: str
    """`launch` (this run started it) or `attach` (someone else's)."""
    engine: str
    """`vllm` or `sglang`."""
    base_url: str
    """e.g. `http://127.0.0.1:8000`."""
    served_model: str | None = None
    """The model name requests use."""
    engine_version: str | None = None
    models_response: ModelsResponse | None = None
    """The server's `/v1/models` answer."""
    argv: list[str] = []
    """The server's command line, secrets redacted (launch mode)."""
    env: dict[str, str] = {}
    """Only the variables stepscope set, secrets redacted."""
    profiler_dir: str | None = None
    """Where the server writes its traces."""
    tp: int = 1
    """Tensor-parallel size: one worker and one trace per rank."""
    pid: int | None = None
    pgid: int | None = None
    """Process group the runner stops at the end (launch mode)."""
    create_time: float | None = None
    """The leader's start time (epoch s): a recycled pid is never taken for this server."""
    supervisor: str | None = None
    """`<pid>:<start time>` of the process that launched the server and owns it (the runner,
    or a notebook kernel). A launched server whose supervisor is gone is a leftover: the next
    stage, `--resume` or the next launch on its port stops it and says so, never adopts it."""
    watchdog_pid: int | None = None
    """The lifeline watchdog that stops the server's group when its supervisor dies
    (`stepscope.lifeline`), `kill -9` included."""
    leftover_stopped: str | None = None
    """What was stopped before this launch: a leftover server of a dead supervisor that held
    the port (its run folder, pids and supervisor), as the console said it."""
    log_path: str | None = None
    """The server's log (`00_deploy/server.log` in launch mode)."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key (never the key)."""
    started_at: str | None = None
    """ISO 8601, UTC."""
    startup_s: float | None = None
    """Seconds from launch until /health answered."""
    stopped_at: str | None = None
    """ISO 8601, UTC: when the runner stopped the server it launched."""
    stop_reason: str | None = None
    """Why the runner stopped it, when it was not the end of the run (e.g. it had exited)."""
