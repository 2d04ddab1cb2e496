"""Issue 13's bugs, each reproduced without a GPU in seconds: real processes, real papermill
and real process groups; the server is a fake (faultkit.FAKE_SERVER) only where the point is
the runner's bookkeeping, not vLLM. The live versions are in test_fault_matrix.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from faultkit import descendants, fake_pids, leftover_processes, running, stage_status, stand_in_notebooks, write_fake_server
from stepscope import paths, runner
from stepscope.cli import main
from stepscope.runner import run_pipeline
from stepscope.stages import STAGE_BY_ID

from conftest import free_port, wait_for


@pytest.fixture
def notebooks(tmp_path, monkeypatch):
    def use(bodies: dict[str, str], name: str = "nbs") -> None:
        folder = stand_in_notebooks(tmp_path / name, bodies)
        monkeypatch.setattr(paths, "NOTEBOOKS_DIR", folder)
    return use


def _fake_params(tmp_path: Path, port: int | None = None) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    params = tmp_path / "p.yaml"
    params.write_text(textwrap.dedent(f"""\
        run: {{name: t, outputs_dir: {tmp_path / 'out'}}}
        model: {{path: {model}, served_name: m}}
        server:
          port: {port or free_port()}
          python: {write_fake_server(tmp_path)}
          startup_timeout_s: 60
          env: {{FAKE_PID_LOG: {tmp_path / 'pids.jsonl'}}}
          profiler: {{enabled: false}}
        """))
    return params


KILL_SERVER = ("import json, os, signal\nfrom pathlib import Path\n"
               "rec = json.loads((Path(run_dir) / '00_deploy' / 'server.json').read_text())\n"
               "os.kill(rec['pid'], signal.SIGKILL)\n")


def test_bug1_a_dead_server_is_reaped_and_the_relaunch_is_said(tmp_path, notebooks):
    """The API server dies during stage 01: its engine (same process group, reparented to
    PID 1) must be stopped before stage 04 launches a second server, and the relaunch said."""
    notebooks({"01_macro_sweep": KILL_SERVER})
    params = _fake_params(tmp_path)
    lines: list[str] = []
    before = descendants()
    code, run_dir = run_pipeline(params, run_id="r", stages="00,01,04", progress=False, echo=lines.append)
    out = "\n".join(lines)
    first, second = fake_pids(tmp_path / "pids.jsonl")
    assert code == 0, out
    assert not running(first["engine"]), "the dead server's engine outlived it"
    assert "the server launched earlier in this run is gone: its API server" in out
    assert f"(pid {first['api']}) has exited" in out and "stopped 1 process(es)" in out
    events = json.loads((run_dir / "run.json").read_text())["events"]
    assert [(e["event"], e["pid"], e["before_stage"], e["orphans_stopped"]) for e in events] == [
        ("server_relaunch", first["api"], "04_profiler_capture", 1)]
    assert json.loads((run_dir / "00_deploy" / "server.json").read_text())["pid"] == second["api"]
    assert leftover_processes(pgids=(first["api"], second["api"]), before=before) == []


def test_bug2_a_second_interrupt_kills_the_group_at_once(tmp_path):
    """Ctrl-C, then Ctrl-C again inside stop_process_group's grace period: the group is
    killed at once (not abandoned), feedback comes at once, the interrupt still propagates."""
    script = tmp_path / "stopper.py"
    script.write_text(textwrap.dedent(f"""\
        import subprocess, sys, time
        sys.path.insert(0, {str(Path(runner.__file__).parents[1])!r})
        from stepscope.serve.launch import ServerCommand, ServerProcess
        # A server that survives SIGTERM, with a child that ignores it: the grace period runs to
        # its end. The leader notes each SIGTERM in a file, so the test knows the stop has begun.
        cmd = ServerCommand(["sh", "-c", "trap 'echo term >> {tmp_path}/termed' TERM; "
                             "(trap '' TERM; exec sleep 600) & echo $! > {tmp_path}/child; "
                             "while :; do wait; done"],
                            {{}}, None, "http://127.0.0.1:1")
        proc = ServerProcess(cmd, __import__("pathlib").Path({str(tmp_path / 'log')!r}))
        proc.start()
        child = __import__("pathlib").Path({str(tmp_path / 'child')!r})
        while not (child.is_file() and child.read_text().strip()):  # the trap is set by then
            time.sleep(0.05)
        print(proc.proc.pid, flush=True)
        try:
            proc.stop(grace_s=300)
        except KeyboardInterrupt:
            print("KeyboardInterrupt", flush=True)
        """))
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        leader = int(p.stdout.readline())
        child = int((tmp_path / "child").read_text())
        said = [p.stderr.readline()]  # the stop says so just before its SIGTERM
        while said[-1] and not said[-1].startswith("stopping the server"):
            said.append(p.stderr.readline())
        assert said[-1].startswith(f"stopping the server (process group {leader}"), said
        # The leader got the SIGTERM: the stop is inside its 300 s grace period now.
        wait_for(lambda: (tmp_path / "termed").is_file(), "the server to receive SIGTERM", timeout_s=120)
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
    # At once means well inside the grace period, however loaded the machine.
    assert time.monotonic() - t0 < 120, "the second interrupt waited out the grace period"
    assert "KeyboardInterrupt" in out
    assert f"interrupted again: killing the server's process group {leader} now" in err
    wait_for(lambda: not running(leader) and not running(child), "the server's group to be gone", timeout_s=30)


def test_bug3_resume_reruns_a_stage_whose_inputs_changed(tmp_path, notebooks):
    """Stage 02 fails, 06 renders without it; on --resume 02 succeeds, so 06 must run again
    (its recorded input fingerprint no longer matches), not be kept as 'done earlier'."""
    report = ("from pathlib import Path\nd = Path(run_dir)\n(d / '06_writeup').mkdir(exist_ok=True)\n"
              "src = d / '02_gemm_micro' / 'done.txt'\n"
              "(d / '06_writeup' / 'report.md').write_text(src.read_text() if src.exists() else 'no gemm data')")
    notebooks({"02_gemm_micro": "raise RuntimeError('gemm crashed')", "06_writeup": report})
    params = _fake_params(tmp_path)
    code, run_dir = run_pipeline(params, run_id="r", stages="02,06", progress=False, echo=lambda s: None)
    assert code == 1 and (run_dir / "06_writeup" / "report.md").read_text() == "no gemm data"
    fp = json.loads((run_dir / "run.json").read_text())["stages"]["06_writeup"]["inputs_fingerprint"]
    assert set(fp) == {"params:*", *STAGE_BY_ID["06_writeup"].reads}
    notebooks({"06_writeup": report}, name="nbs2")
    lines: list[str] = []
    code, _ = run_pipeline(params, run_id="r", stages="02,06", resume=True, progress=False, echo=lines.append)
    assert code == 0
    assert (run_dir / "06_writeup" / "report.md").read_text() == "ok"
    assert "06_writeup: done earlier, but 02_gemm_micro changed since: running it again" in "\n".join(lines)
    # Nothing changed now: a second resume keeps everything.
    lines.clear()
    run_pipeline(params, run_id="r", stages="02,06", resume=True, progress=False, echo=lines.append)
    assert "06_writeup: done earlier, skipped (--resume)" in "\n".join(lines)


def test_bug5_compare_refuses_what_is_not_a_run_folder(tmp_path, real_traces, capsys):
    from stepscope.testing.synthetic import make_synthetic_run

    run = make_synthetic_run(tmp_path / "run")
    assert main(["compare", str(real_traces), str(run)]) == 2
    err = capsys.readouterr().err
    assert "this holds traces, not a run (no run.json)" in err and "stepscope analyze" in err
    assert main(["compare", str(run), str(run / "01_macro_sweep")]) == 2
    err = capsys.readouterr().err
    assert "this is a stage folder, not a run folder" in err and f"pass the run folder above it: {run}" in err
    assert main(["compare", str(run), str(tmp_path / "nope")]) == 2
    assert "run folder not found" in capsys.readouterr().err


def test_bug5_a_missing_stage_names_the_run_that_lacks_it(tmp_path):
    from stepscope.report import compare_runs
    from stepscope.testing.synthetic import make_synthetic_run

    a = make_synthetic_run(tmp_path / "a")
    b = make_synthetic_run(tmp_path / "b", stages=("05_categorize",))
    md = compare_runs(a, b)["markdown"].read_text()
    assert "`01_macro_sweep/levels.csv` (missing in B `" in md
    # A holds every stage but 06 (the synthetic run has no verdict.json): only that is missing in A.
    assert "levels.csv` (missing in A" not in md and "summary.json` (missing in A" not in md


def test_bug8_a_stage_whose_input_stage_was_skipped_is_skipped(tmp_path, notebooks):
    """The port is taken: 00 fails, 01 and 04 are skipped, and so is 05 (it reads 04's
    traces), instead of failing with StageInputMissing."""
    import socket

    notebooks({})
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        params = _fake_params(tmp_path, port=sock.getsockname()[1])
        code, run_dir = run_pipeline(params, run_id="r", progress=False, echo=lambda s: None)
    assert code == 1
    record = json.loads((run_dir / "run.json").read_text())
    assert stage_status(run_dir) == {"00_deploy": "failed", "01_macro_sweep": "skipped", "02_gemm_micro": "ok",
                                     "03_nccl_burst": "ok", "04_profiler_capture": "skipped",
                                     "05_categorize": "skipped", "06_writeup": "ok"}
    assert "already in use" in record["stages"]["00_deploy"]["error"]
    assert record["stages"]["05_categorize"]["error"] == "needs 04_profiler_capture, which did not finish"


def test_bug4_a_server_echoing_its_secret_arguments_leaves_none_in_its_log(tmp_path):
    """vLLM logs its non-default arguments, `api_key` included: the log is filtered."""
    from stepscope.serve.launch import ServerCommand, ServerProcess

    cmd = ServerCommand(["sh", "-c", 'echo "non-default args: $*"; echo "key from env: $VLLM_API_KEY"', "sh",
                         "--api-key", "sk-PLANTED-1", "--hf-token=hf-PLANTED-2", "--port", "8000"],
                        {"VLLM_API_KEY": "sk-PLANTED-3"}, None, "http://127.0.0.1:1")
    proc = ServerProcess(cmd, tmp_path / "server.log")
    proc.start()
    proc.proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while (tmp_path / "server.log").read_text().count("\n") < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    log = (tmp_path / "server.log").read_text()
    assert "non-default args: --api-key ***redacted*** --hf-token=***redacted*** --port 8000" in log
    assert "key from env: ***redacted***" in log and "PLANTED" not in log
