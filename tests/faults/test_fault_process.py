"""Issue 26, items 1, 6 and 8: nothing outlives its supervisor, a leftover is stopped (never
adopted), a silent server is named as such, attach mode names each HTTP failure, and
progress on a pipe is a line now and then.

The fast cases use real processes and process groups, and a stand-in server where the point
is the bookkeeping (`faultkit.FAKE_SERVER`, `stepscope.testing.fake_server`); the slow ones
the real vLLM CPU server (run them under `flock /tmp/stepscope-live.lock`).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from faultkit import command_line, fake_pids, running, write_fake_server
from stepscope import lifeline
from stepscope.errors import ServerError
from stepscope.paths import REPO_ROOT

from conftest import free_port, wait_for

LIB = str(REPO_ROOT / "lib")


def _group(pgid: int) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.pid) == pgid:
                out.append(p.pid)
        except (ProcessLookupError, psutil.NoSuchProcess, OSError):
            continue
    return out


def _supervisor(tmp_path: Path, body: str) -> tuple[subprocess.Popen, dict]:
    """A Python process that runs `body` (which starts something and prints a JSON line of
    pids), then sleeps: the supervisor a test kills with SIGKILL."""
    script = tmp_path / "supervisor.py"
    script.write_text(f"import sys, json, time\nsys.path.insert(0, {LIB!r})\n" + textwrap.dedent(body)
                      + "\nprint(json.dumps(pids), flush=True)\ntime.sleep(600)\n")
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line:
        p.kill()
        raise AssertionError("the supervisor printed no pids: " + p.stderr.read()[-2000:])
    return p, json.loads(line)


def _gone_within(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [p for p in pids if running(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if running(p)]


# ----------------------------------------------------------------- item 1: the mechanism


def test_a_kill_9_of_the_supervisor_stops_the_group_and_a_grandchild_in_its_own_session(tmp_path):
    """The lifeline alone, on a plain child tree: a group leader with two children in its group
    and one that moved to a session of its own (as Jupyter's kernels do). The leader ignores
    SIGTERM, so the SIGKILL after the grace period is what ends it."""
    sup, pids = _supervisor(tmp_path, f"""\
        import os, subprocess
        from stepscope import lifeline
        own = "{tmp_path}/own"
        leader = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 600 & sleep 600 & "
                                   "setsid sleep 600 & echo $! > " + own + "; wait"], start_new_session=True)
        while not (os.path.exists(own) and open(own).read().strip()):
            time.sleep(0.02)
        line = lifeline.guard(leader.pid, grace_s=1.0, log_path="{tmp_path}/log")
        pids = {{"leader": leader.pid, "watchdog": line.watchdog.pid}}
        """)
    own = int((tmp_path / "own").read_text())
    tree = _group(pids["leader"]) + [own]
    assert len(tree) >= 4 and all(running(p) for p in tree)
    sup.kill()
    sup.wait()
    assert _gone_within(tree + [pids["watchdog"]], 6.0) == []
    assert "its supervisor (pid %d) is gone" % sup.pid in (tmp_path / "log").read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_spawned_leader_dies_with_its_parent_before_any_watchdog_is_up(tmp_path):
    """The gap before the watchdog: a supervisor killed right after `lifeline.spawn`, with no
    watchdog started at all. The kernel's parent-death signal ends the spawned leader; a
    plain child in a session of its own, started beside it, outlives the supervisor (what
    the server did in that gap before)."""
    sup, pids = _supervisor(tmp_path, """\
        import subprocess
        from stepscope import lifeline
        spawned = lifeline.spawn(["sleep", "600"])
        plain = subprocess.Popen(["sleep", "600"], start_new_session=True)
        pids = {"spawned": spawned.pid, "plain": plain.pid}
        """)
    try:
        assert running(pids["spawned"]) and os.getsid(pids["spawned"]) == pids["spawned"]
        sup.kill()
        sup.wait()
        assert _gone_within([pids["spawned"]], 5.0) == []
        assert running(pids["plain"])
    finally:
        sup.kill()
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_no_parent_death_signal_from_a_thread_that_may_end_before_the_process():
    """The signal fires when the forking thread ends: from any thread but the main one the
    server would die with it, so only the watchdog guards what such a thread starts."""
    seen = []
    t = threading.Thread(target=lambda: seen.append(lifeline.parent_death_signal()))
    t.start()
    t.join()
    assert seen == [None]
    assert callable(lifeline.parent_death_signal()) is sys.platform.startswith("linux")


def test_a_stop_on_purpose_lets_the_watchdog_go_quietly(tmp_path):
    leader = subprocess.Popen(["sleep", "600"], start_new_session=True)
    line = lifeline.guard(leader.pid, grace_s=1.0, log_path=tmp_path / "log")
    assert lifeline.held(leader.pid) is line and running(line.watchdog.pid)
    os.killpg(leader.pid, signal.SIGKILL)
    leader.wait()
    line.release()
    assert line.watchdog.returncode == 0 and lifeline.held(leader.pid) is None
    assert not (tmp_path / "log").exists()  # nothing to say: the group was stopped before


def test_a_release_that_left_part_of_the_group_running_stops_that_part_and_says_so(tmp_path):
    """Release says "stopped on purpose" on the pipe; the watchdog still stops what that stop
    missed, and its note says it was a release, not a dead supervisor."""
    leader = subprocess.Popen(["sleep", "600"], start_new_session=True)
    line = lifeline.guard(leader.pid, grace_s=1.0, log_path=tmp_path / "log")
    line.release()  # the group was not stopped first
    assert leader.wait(timeout=5) == -signal.SIGTERM and line.watchdog.returncode == 0
    log = (tmp_path / "log").read_text()
    assert f"its supervisor (pid {os.getpid()}) stopped it on purpose, but some of it still ran: " \
           f"stopped the server's process group {leader.pid} (1 process(es))" in log


def _fake_command_body(tmp_path: Path, port: int) -> str:
    fake = write_fake_server(tmp_path)
    return f"""\
        import os
        from pathlib import Path
        from stepscope.serve.launch import ServerCommand, ServerProcess
        os.environ["FAKE_PID_LOG"] = "{tmp_path}/pids.jsonl"
        cmd = ServerCommand(["{fake}", "--port", "{port}"], {{}}, None, "http://127.0.0.1:{port}")
        proc = ServerProcess(cmd, Path("{tmp_path}/run/00_deploy/server.log"))
        proc.start()
        proc.wait_ready(30, progress=False)
        pids = {{"pgid": proc.proc.pid, "watchdog": proc.lifeline.watchdog.pid}}
        """


def test_a_launched_server_dies_with_its_supervisor(tmp_path):
    """ServerProcess.start, then kill -9 of the process that called it: the API server and its
    engine (same group) are gone within the deadline, the port is free, the log says why."""
    port = free_port()
    sup, pids = _supervisor(tmp_path, _fake_command_body(tmp_path, port))
    (fake,) = fake_pids(tmp_path / "pids.jsonl")
    assert pids["pgid"] == fake["api"] and set(_group(fake["api"])) >= {fake["api"], fake["engine"]}
    sup.kill()
    sup.wait()
    assert _gone_within([fake["api"], fake["engine"], pids["watchdog"]], 15.0) == []
    wait_for(lambda: not _listening(port), "the port freed", timeout_s=5)
    log = (tmp_path / "run" / "00_deploy" / "server.log").read_text()
    # the watchdog stopped the group, or (the leader gone first on its parent-death signal) says it had ended
    assert f"its supervisor (pid {sup.pid}) is gone" in log and f"the server's process group {pids['pgid']}" in log


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


# ----------------------------------------------------------------- item 1: leftovers


def _dead_stamp() -> str:
    p = subprocess.Popen(["true"])
    p.wait()
    return f"{p.pid}:{time.time() - 5:.2f}"


def _leftover(tmp_path: Path, port: int, run_dir: Path) -> tuple[subprocess.Popen, dict]:
    """A stand-in server left running by a supervisor that is gone, with its server.json."""
    from stepscope import schema
    from stepscope.serve.launch import server_json_path

    fake = write_fake_server(tmp_path)
    env = {**os.environ, "FAKE_PID_LOG": str(tmp_path / "pids.jsonl"),
           lifeline.SUPERVISOR_ENV: _dead_stamp(), lifeline.RUN_DIR_ENV: str(run_dir)}
    proc = subprocess.Popen([str(fake), "--port", str(port)], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: _listening(port), "the stand-in server listening", timeout_s=20)
    record = {"mode": "launch", "engine": "vllm", "base_url": f"http://127.0.0.1:{port}", "served_model": "m",
              "pid": proc.pid, "pgid": proc.pid, "create_time": psutil.Process(proc.pid).create_time(),
              "supervisor": env[lifeline.SUPERVISOR_ENV]}
    schema.write(server_json_path(run_dir), record, schema.ServerRecord)
    return proc, fake_pids(tmp_path / "pids.jsonl")[-1]


def test_resume_stops_a_leftover_of_a_dead_supervisor_and_never_adopts_it(tmp_path):
    from stepscope.serve.launch import reap_dead_server, running_server

    run_dir = tmp_path / "out" / "r"
    port = free_port()
    proc, fake = _leftover(tmp_path, port, run_dir)
    try:
        assert running_server(run_dir) is None  # it answers /health, but nobody owns it
        event = reap_dead_server(run_dir)
        assert event["event"] == "server_orphaned" and event["orphans_stopped"] == 2
        assert "is gone and left it running, owned by nobody; it is stopped, not adopted" in event["reason"]
        assert _gone_within([fake["api"], fake["engine"]], 10.0) == []
        record = json.loads((run_dir / "00_deploy" / "server.json").read_text())
        assert record["stopped_at"] and record["stop_reason"] == event["reason"]
    finally:
        proc.kill()


def test_the_next_launch_on_the_port_stops_a_leftover_and_says_so(tmp_path, capsys):
    from stepscope.config import params_from_dict
    from stepscope.serve.launch import check_launch_preconditions

    old_run = tmp_path / "out" / "old"
    port = free_port()
    proc, fake = _leftover(tmp_path, port, old_run)
    try:
        params = params_from_dict({"run": {"name": "t"}, "server": {"port": port}}, source="t")
        said = check_launch_preconditions(params, tmp_path / "out" / "new")
        assert said is not None and f"port {port} was held by a server left behind" in said
        assert f"run folder {old_run}" in said and f"stopped its process group {fake['api']} (2 process(es))" in said
        assert said in capsys.readouterr().err
        assert _gone_within([fake["api"], fake["engine"]], 10.0) == []
        old = json.loads((old_run / "00_deploy" / "server.json").read_text())
        assert old["stopped_at"] and "left behind by a dead supervisor" in old["stop_reason"]
    finally:
        proc.kill()


def test_a_port_held_by_someone_else_is_refused_naming_the_holder(tmp_path):
    from stepscope.config import params_from_dict
    from stepscope.serve.launch import check_launch_preconditions

    port = free_port()
    other = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _listening(port), "http.server listening", timeout_s=20)
        params = params_from_dict({"run": {"name": "t"}, "server": {"port": port}}, source="t")
        with pytest.raises(ServerError) as e:
            check_launch_preconditions(params, tmp_path)
        assert f"port {port} on 127.0.0.1 is already in use (held by pid {other.pid}: " in str(e.value)
        assert "http.server" in str(e.value) and running(other.pid)  # named, and left alone
    finally:
        other.kill()
        other.wait()


# ----------------------------------------------------------------- item 8: attach mode


def _attach(tmp_path: Path, url: str, key_env: str | None = None):
    from stepscope.config import params_from_dict
    from stepscope.serve.launch import attach

    server = {"mode": "attach", "url": url, **({"api_key_env": key_env} if key_env else {})}
    return attach(params_from_dict({"run": {"name": "t"}, "server": server}, source="t"), tmp_path)


@pytest.mark.parametrize("behaviour, key, suffix, says, fix", [
    ({"api_key": "right"}, None, "", "wants an API key on /v1/models (HTTP 401 Unauthorized)",
     "set server.api_key_env"),
    ({"api_key": "right"}, "wrong", "", "refused the API key in $STEPSCOPE_T_KEY on /v1/models (HTTP 401",
     "STEPSCOPE_T_KEY is set, but not to a key this server accepts"),
    ({"status_for": {"/v1/models": 403}}, "any", "", "refused the API key in $STEPSCOPE_T_KEY on /v1/models "
     "(HTTP 403 Forbidden)", "check it against the server's --api-key"),
    ({}, None, "/v1", "/health answered HTTP 404", "drop the /v1: server.url is the server's root"),
    ({}, None, "/nope", "/health answered HTTP 404: no inference server's API", "the server's root"),
    ({"status_for": {"/v1/models": 500}}, None, "", '/v1/models answered HTTP 500: {"error": {"message": "fake HTTP 500"}}',
     "the server is up but failing"),
    ({"status_for": {"/health": 500, "/v1/models": 500}}, None, "", "/health answered HTTP 500", "failing"),
    ({"hang_paths": ("/health",)}, None, "", "did not answer within 5 s (timeout)", "SIGCONT"),
])
def test_attach_names_the_http_status_and_the_fix(tmp_path, monkeypatch, behaviour, key, suffix, says, fix):
    from stepscope.testing.fake_server import FakeBehaviour, FakeServer

    if key is not None:
        monkeypatch.setenv("STEPSCOPE_T_KEY", key)
    with FakeServer(FakeBehaviour(**behaviour)) as fake:
        with pytest.raises(ServerError) as e:
            _attach(tmp_path, fake.base_url + suffix, "STEPSCOPE_T_KEY" if key is not None else None)
    text = str(e.value)
    assert says in text and fix in text, text
    assert not (tmp_path / "00_deploy" / "server.json").exists()  # refused: nothing recorded


def test_attach_with_the_right_key_records_the_server(tmp_path, monkeypatch):
    from stepscope.testing.fake_server import FakeBehaviour, FakeServer

    monkeypatch.setenv("STEPSCOPE_T_KEY", "right")
    with FakeServer(FakeBehaviour(api_key="right")) as fake:
        handle = _attach(tmp_path, fake.base_url + "/", "STEPSCOPE_T_KEY")
    assert handle.served_model == "fake-model" and handle.engine_version == "fake"
    record = json.loads((tmp_path / "00_deploy" / "server.json").read_text())
    assert record["mode"] == "attach" and "right" not in json.dumps(record)


# ----------------------------------------------------------------- progress on a pipe


def test_server_start_up_on_a_pipe_prints_a_line_now_and_then(tmp_path):
    """A 3 s start-up whose log changes every 0.3 s, the console a file: whole short lines
    (no carriage returns), the first and the last state, not one line per log change."""
    port = free_port()
    fake = write_fake_server(tmp_path)
    script = tmp_path / "startup.py"
    script.write_text(textwrap.dedent(f"""\
        import os, sys
        sys.path.insert(0, {LIB!r})
        from pathlib import Path
        from stepscope.serve.launch import ServerCommand, ServerProcess
        os.environ["FAKE_PID_LOG"] = "{tmp_path}/pids.jsonl"
        cmd = ServerCommand(["sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do echo loading weights $i; "
                             "sleep 0.3; done; exec {fake} --port {port}"], {{}}, None, "http://127.0.0.1:{port}")
        proc = ServerProcess(cmd, Path("{tmp_path}/server.log"))
        proc.start()
        try:
            proc.wait_ready(60, progress=True)
        finally:
            proc.stop()
        """))
    with open(tmp_path / "console", "w") as console:
        subprocess.run([sys.executable, str(script)], stderr=console, stdout=console, timeout=120, check=True)
    out = (tmp_path / "console").read_bytes().decode()  # bytes: read_text would turn \r into \n
    lines = [ln for ln in out.split("\n") if ln.startswith("server start-up")]
    assert "\r" not in out, out
    assert 1 <= len(lines) <= 3, out  # one at the start, the last state at the end (30 s apart at most)
    assert max(len(ln) for ln in lines) < 200


def test_a_bar_on_a_pipe_is_whole_lines_at_the_stated_interval(monkeypatch):
    from stepscope import progress

    monkeypatch.setattr(progress, "LINE_INTERVAL_S", 3600.0)
    sink = io.StringIO()
    b = progress.bar(total=100, desc="level c0004", file=sink)
    assert isinstance(b, progress.LineBar)
    for _ in range(100):
        b.update(1)
        b.set_postfix_str("silent 5 s", refresh=True)
    b.close()
    lines = sink.getvalue().splitlines()
    assert "\r" not in sink.getvalue() and len(lines) == 2, lines  # the start and the end
    assert lines[0].startswith("level c0004:   0%") and "100/100" in lines[1] and "silent 5 s" in lines[1]


# ----------------------------------------------------------------- item 6: a silent server


@pytest.mark.parametrize("stall_health, state, says", [
    (False, "alive_not_answering", "server alive but not answering: no token on any of the 2 open stream(s)"),
    (True, "not_answering", "server not answering /health either: no token on any of the 2 open stream(s)"),
])
def test_a_silent_server_ends_the_level_with_its_timeouts_said(tmp_path, stall_health, state, says):
    """Every stream falls silent after 2 tokens (the fake's stall mode, like a SIGSTOPped or
    deadlocked server): the watchdog ends the level after sweep.silence_timeout_s, not after
    request_timeout_s, records the open requests as timeouts and says what /health did."""
    from stepscope.config import SweepParams
    from stepscope.sweep.client import SILENCE_ERROR, ServerInfo
    from stepscope.sweep.run import run_sweep
    from stepscope.testing.fake_server import FakeBehaviour, FakeServer

    p = SweepParams(concurrency=(2, 4), input_len=4, output_len=6, min_requests=4, warmup_requests=0,
                    silence_timeout_s=2.0, request_timeout_s=300)
    t0 = time.monotonic()
    with FakeServer(FakeBehaviour(stall_after_tokens=2, stall_health=stall_health)) as fake:
        res = run_sweep(ServerInfo(base_url=fake.base_url, served_model="fake"), p, tmp_path)
    took_s = time.monotonic() - t0
    assert took_s < 2.0 + 5.0 + 8.0, took_s  # the timeout, the /health probe, slack on 2 cores
    row = res.levels.set_index("level").loc["c0002"]
    assert (row["n_timed_out"], row["silence_health"], row["complete"]) == (2, state, False)
    assert 2.0 <= row["silent_s"] < 6.0
    assert list(res.levels["level"]) == ["c0002"]  # the sweep stopped there
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["timed_out_at_level"] == "c0002" and says in summary["died_message"]
    assert "(timeout 2 s)" in summary["died_message"] and "ended as timeouts" in summary["died_message"]
    recs = [json.loads(ln) for ln in (tmp_path / "levels" / "c0002.jsonl").read_text().splitlines()]
    assert sum((r["error"] or "").startswith(SILENCE_ERROR) for r in recs) == 2
    assert all(len(r["chunk_times_s"]) == 2 for r in recs)  # what came before the silence is kept
    with pytest.raises(ServerError) as e:
        res.raise_if_died()
    assert "kill -CONT" in str(e.value)


def test_the_bar_shows_the_silence_while_it_lasts():
    """The watchdog's running silence reaches the bar, and is cleared when tokens come again."""
    import asyncio

    from stepscope.sweep.client import Silence

    shown: list[str] = []

    async def go() -> None:
        s = Silence(timeout_s=3600.0, show=shown.append)
        s.opened()
        s.last_heard -= 7.0  # seven seconds without a token
        s._show(time.perf_counter() - s.last_heard)
        s.heard(time.perf_counter())
        s._show(0.0)

    asyncio.run(go())
    assert shown == ["no token for 7 s (timeout at 3600 s)", ""]


def test_a_silent_server_fails_the_capture_saying_so(tmp_path):
    """The capture's streams fall silent after 2 tokens: stage 04 fails after
    capture.silence_timeout_s, naming the state, instead of waiting out its 600 s per request."""
    from stepscope.capture import capture_profile
    from stepscope.config import CaptureParams
    from stepscope.sweep.client import ServerInfo
    from stepscope.testing.fake_server import FakeBehaviour, FakeServer

    pdir = tmp_path / "prof"
    cap = CaptureParams(warmup_requests=0, requests=2, input_len=4, output_len=6, wait_timeout_s=5,
                        silence_timeout_s=2.0)
    t0 = time.monotonic()
    with FakeServer(FakeBehaviour(stall_after_tokens=2, profiler_dir=str(pdir), tp=1)) as fake:
        server = ServerInfo(base_url=fake.base_url, served_model="fake", tp=1, profiler_dir=str(pdir))
        with pytest.raises(ServerError) as e:
            capture_profile(server, cap, tmp_path / "stage")
    assert time.monotonic() - t0 < 15.0
    text = str(e.value)
    assert "server alive but not answering: no token on any of the 1 open stream(s)" in text, text
    assert "during the capture (timeout 2 s)" in text and "kill -CONT" in text


# ----------------------------------------------------------------- item 1: stepscope lab


def test_jupyterlab_and_its_kernel_die_with_stepscope_lab(tmp_path):
    """The real JupyterLab, with a kernel running (Jupyter starts it in a session of its own),
    then kill -9 of the process that started it: the server and the kernel are gone, the port
    free. Before, both kept running code for anyone holding the token."""
    import urllib.request

    port = free_port()
    sup, pids = _supervisor(tmp_path, f"""\
        from stepscope.lab import start_lab
        lab = start_lab(port={port}, log_path="{tmp_path}/lab.log", timeout_s=120)
        pids = {{"lab": lab.proc.pid, "token": lab.token}}
        """)
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/api/kernels", data=b"{}", method="POST",
                                     headers={"Authorization": f"token {pids['token']}"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert resp.status == 201
        lab_tree = wait_for(lambda: [p.pid for p in psutil.Process(pids["lab"]).children(recursive=True)
                                     if "ipykernel" in command_line(p)] or None, "the kernel started",
                            timeout_s=60)
        assert os.getsid(lab_tree[0]) != os.getsid(pids["lab"])  # out of the group's reach
    finally:
        sup.kill()
        sup.wait()
    assert _gone_within([pids["lab"], *lab_tree], 20.0) == []
    wait_for(lambda: not _listening(port), "the lab's port freed", timeout_s=5)


# ----------------------------------------------------------------- item 1, live: the real vLLM CPU server


@pytest.mark.slow
def test_kill_9_of_stepscope_run_leaves_no_vllm_process(tmp_path):
    """`stepscope run` on the real vLLM CPU server (TP=2: API server, engine core, 2 workers),
    `kill -9` of the runner once the server is up, as an OOM killer would: within the
    deadline no process of the server's group, nor any process the run ever had, remains,
    and the port is free. Before, all four were reparented to PID 1 and kept the port."""
    from test_fault_matrix import Run, _params

    port = free_port()
    run = Run(tmp_path, _params(tmp_path, port), "k9", "--stages", "00,01")
    server_json = run.run_dir / "00_deploy" / "server.json"
    run.wait_for(server_json.is_file, timeout_s=600)
    record = run.server()
    pgid = record["pgid"]
    wait_for(lambda: len(_group(pgid)) >= 4, "the engine core and both TP workers in the server's group",
             timeout_s=60)
    members = _group(pgid)
    assert record["supervisor"].startswith(f"{run.proc.pid}:") and running(record["watchdog_pid"])
    run.proc.kill()
    run.proc.wait()
    t0 = time.monotonic()
    assert _gone_within(members + [record["watchdog_pid"]], 40.0) == [], run.text()[-2000:]
    gone_s = time.monotonic() - t0
    assert _group(pgid) == [] and run.survivors() == []
    wait_for(lambda: not _listening(port), "the server's port freed", timeout_s=10)
    log = (run.run_dir / "00_deploy" / "server.log").read_text(errors="replace")
    assert f"its supervisor (pid {run.proc.pid}) is gone" in log
    print(f"kill -9 of the runner: {len(members)} server processes gone {gone_s:.1f} s later")


def test_resume_after_a_killed_runner_stops_the_orphan_says_so_and_launches_anew(tmp_path):
    """The runner's own path: a leftover server of a dead supervisor in this run's server.json
    (the lifeline's watchdog killed too, say by the same OOM kill) is stopped, the console and
    run.json's events say so, and a fresh server is launched, not the leftover adopted."""
    from stepscope import runner
    from test_fault_bugs import _fake_params

    port = free_port()
    params_file = _fake_params(tmp_path, port)
    run_dir = tmp_path / "out" / "r"
    proc, fake = _leftover(tmp_path, port, run_dir)
    lines: list[str] = []

    class Events:
        items: list[dict] = []

        def add_event(self, e: dict) -> None:
            self.items.append(e)

    events = Events()
    try:
        started = runner._ensure_server(runner.load_params(params_file), run_dir, False, lines.append,
                                        events, "01_macro_sweep")
        new = json.loads((run_dir / "00_deploy" / "server.json").read_text())
        assert started and new["pid"] != fake["api"] and new["supervisor"].startswith(f"{os.getpid()}:")
        assert _gone_within([fake["api"], fake["engine"]], 10.0) == []
        out = "\n".join(lines)
        assert "the server an earlier process of this run launched was left running: its supervisor" in out
        assert "it is stopped, not adopted; stopped 2 process(es)" in out
        assert [(e["event"], e["cause"], e["pid"]) for e in events.items] == [
            ("server_relaunch", "server_orphaned", fake["api"])]
    finally:
        proc.kill()
        from stepscope.serve import stop_server
        stop_server(run_dir)


@pytest.mark.slow
def test_a_sigstopped_vllm_server_is_named_within_the_silence_timeout(tmp_path):
    """SIGSTOP the real API server mid-sweep: stage 01 ends the level after
    sweep.silence_timeout_s (5 s here) with "server not answering /health either", records the
    timeouts, and the run still stops the (stopped) server's group on the way out."""
    from test_fault_matrix import Run, _params

    sweep = ("{concurrency: [2, 4], input_len: 16, output_len: 64, min_requests: 40, warmup_requests: 1, "
             "silence_timeout_s: 5}")
    run = Run(tmp_path, _params(tmp_path, free_port(), sweep=sweep), "stop", "--stages", "00,01")
    level = run.run_dir / "01_macro_sweep" / "levels" / "c0002.partial.jsonl"
    run.wait_for(lambda: level.is_file() and level.stat().st_size > 0, timeout_s=600)
    record = run.server()
    os.kill(record["pid"], signal.SIGSTOP)
    t0 = time.monotonic()
    code = run.finish(timeout_s=300)
    out = run.text()
    assert code == 1, out[-3000:]
    summary = json.loads((run.run_dir / "01_macro_sweep" / "summary.json").read_text())
    assert summary["timed_out_at_level"] == "c0002", summary
    assert "server not answering /health either" in summary["died_message"]
    assert "server not answering /health either" in out and "kill -CONT" in out
    levels = (run.run_dir / "01_macro_sweep" / "levels.csv").read_text()
    assert "not_answering" in levels
    assert _group(record["pgid"]) == [] and run.survivors() == []
    print(f"SIGSTOP to exit: {time.monotonic() - t0:.1f} s")


def test_a_cold_servers_slow_warm_up_is_not_a_silence(tmp_path, monkeypatch):
    """The first requests on a cold server pay its one-off costs before any token (over 5 s on
    the 2-core CPU demo): a silence_timeout_s meant for the measured requests must not end the
    level in its warm-up. The warm-up gets WARMUP_SILENCE_MIN_S; the measured requests keep
    the configured limit."""
    from stepscope.config import SweepParams
    from stepscope.sweep import client as cl
    from stepscope.sweep.run import run_sweep
    from stepscope.testing.fake_server import FakeBehaviour, FakeServer

    monkeypatch.setattr(cl, "WARMUP_SILENCE_MIN_S", 5.0)  # seconds, not a minute, in a test
    p = SweepParams(concurrency=(2,), input_len=4, output_len=4, min_requests=4, warmup_requests=2,
                    silence_timeout_s=1.0, request_timeout_s=60)
    with FakeServer(FakeBehaviour(cold_requests=2, cold_delay_s=2.5)) as fake:
        res = run_sweep(cl.ServerInfo(base_url=fake.base_url, served_model="fake"), p, tmp_path)
    row = res.levels.set_index("level").loc["c0002"]
    assert row["n_requests"] >= 4 and row["n_completed"] == row["n_requests"]
    assert (row["n_timed_out"], bool(row["complete"])) == (0, True)
    assert res.summary.get("died_message") is None


def test_a_level_ended_in_its_warm_up_is_a_row_not_a_keyerror(tmp_path, monkeypatch):
    """A silent server during the warm-up ends the level before any measured request: the
    sweep still finishes its tables (a row with no requests, the silence said), instead of a
    KeyError from an empty request table (CI, stage 01 of the SIGSTOP fault test)."""
    from stepscope.config import SweepParams
    from stepscope.sweep import client as cl
    from stepscope.sweep.run import run_sweep
    from stepscope.testing.fake_server import FakeBehaviour, FakeServer

    p = SweepParams(concurrency=(2, 4), input_len=4, output_len=6, min_requests=4, warmup_requests=2,
                    silence_timeout_s=1.0, request_timeout_s=60)
    monkeypatch.setattr(cl, "WARMUP_SILENCE_MIN_S", 1.0)
    with FakeServer(FakeBehaviour(stall_after_tokens=2)) as fake:
        res = run_sweep(cl.ServerInfo(base_url=fake.base_url, served_model="fake"), p, tmp_path)
    row = res.levels.set_index("level").loc["c0002"]
    assert (row["n_requests"], row["n_completed"], row["n_timed_out"]) == (0, 0, 2)
    assert row["silence_health"] == "alive_not_answering"
    assert "server alive but not answering" in res.summary["died_message"]
