"""Issue 26, items 2, 3 and 7: nothing stale, nothing clobbered, a full disk said plainly.

Real processes, real papermill kernels, a real flock and, for the full disk, a real 1 MiB
tmpfs (root only; skipped with its reason elsewhere). The server is faultkit's fake where
the point is the runner's bookkeeping, and the sweep runs against stepscope.testing's fake
SSE server: no model is needed to show which levels were measured and which kept.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from faultkit import stand_in_notebooks, write_fake_server
from stepscope import paths, runfolder, runner
from stepscope.cli import main
from stepscope.config import SweepParams
from stepscope.errors import StepscopeError
from stepscope.notebook import open_stage
from stepscope.runner import run_pipeline
from stepscope.sweep.client import ServerInfo
from stepscope.sweep.run import run_sweep
from stepscope.testing.fake_server import FakeBehaviour, FakeServer

from conftest import free_port


@pytest.fixture
def notebooks(tmp_path, monkeypatch):
    def use(bodies: dict[str, str], name: str = "nbs") -> None:
        folder = stand_in_notebooks(tmp_path / name, bodies)
        monkeypatch.setattr(paths, "NOTEBOOKS_DIR", folder)
    return use


def _params(tmp_path: Path, *, outputs: Path | None = None, extra_args: tuple[str, ...] = (),
            sizes: tuple[int, ...] = (1024,), name: str = "t", env: dict | None = None,
            port: int | None = None) -> Path:
    """A params file whose server is faultkit's fake (launched like vLLM, in its own group)."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    data = {"run": {"name": name, "outputs_dir": str(outputs or tmp_path / "out")},
            "model": {"path": str(model), "served_name": "m"},
            "server": {"port": port or free_port(), "python": str(write_fake_server(tmp_path)), "startup_timeout_s": 60,
                       "extra_args": list(extra_args),
                       "env": {"FAKE_PID_LOG": str(tmp_path / "pids.jsonl"), **(env or {})},
                       "profiler": {"enabled": False}},
            "micro": {"collectives": {"sizes_bytes": list(sizes)}}}
    params = tmp_path / "p.yaml"
    params.write_text(yaml.safe_dump(data))
    return params


# --------------------------------------------------------------------------- item 2: one snapshot

READ_SIZES = ("from stepscope.notebook import open_stage\nfrom pathlib import Path\n"
              "params, out = open_stage(params_file, run_dir, '03_nccl_burst')\n"
              "(out / 'sizes.json').write_text(str(list(params.micro.collectives.sizes_bytes)))\n")


def test_a_stage_reads_the_runs_snapshot_not_the_live_params_file(tmp_path, notebooks):
    """The params file is edited while stage 02 runs: stage 03 still measures the sizes the run
    started with, the ones params.yaml and run.json record."""
    params = _params(tmp_path, sizes=(1024,))
    edit = (f"from pathlib import Path\np = Path({str(params)!r})\n"
            "p.write_text(p.read_text().replace('- 1024', '- 999999'))\n")
    notebooks({"02_gemm_micro": edit, "03_nccl_burst": READ_SIZES})
    code, run_dir = run_pipeline(params, run_id="r", stages="02,03", progress=False, echo=lambda s: None)
    assert code == 0
    assert "999999" in params.read_text()  # the live file was edited mid-run
    assert json.loads((run_dir / "03_nccl_burst" / "sizes.json").read_text()) == [1024]
    assert yaml.safe_load((run_dir / "params.yaml").read_text())["micro"]["collectives"]["sizes_bytes"] == [1024]


def test_the_snapshot_holds_no_secret_and_a_stage_takes_it_from_the_environment(tmp_path, monkeypatch):
    """A secret in server.env never reaches params.yaml; a stage opened on the snapshot drops
    the placeholder, so a server it launched inherits the real value from the environment."""
    params = _params(tmp_path, env={"HF_TOKEN": "hf-sekrit-1234"})
    run_dir = tmp_path / "out" / "r"
    runfolder.write_yaml(runfolder.params_snapshot_path(run_dir),
                         runner.redact(runner.params_to_dict(runner.load_params(params))))
    assert "hf-sekrit-1234" not in (run_dir / "params.yaml").read_text()
    loaded, _ = open_stage(run_dir / "params.yaml", run_dir, "00_deploy")
    assert "HF_TOKEN" not in loaded.server.env  # not '***redacted***': the environment's value wins
    assert loaded.server.env["FAKE_PID_LOG"] == str(tmp_path / "pids.jsonl")


# --------------------------------------------------------------------------- item 2: level identity

def _launched(argv: list[str]) -> dict:
    return {"mode": "launch", "engine": "vllm", "engine_version": "0.32", "base_url": "u", "served_model": "fake",
            "tp": 1, "argv": argv, "env": {}}


def test_a_level_is_kept_only_under_resume_and_only_for_the_same_server_flags(tmp_path):
    p = SweepParams(concurrency=(1, 2), input_len=2, output_len=3, min_requests=2, warmup_requests=0)
    with FakeServer(FakeBehaviour()) as fake:
        def sweep(argv: list[str], resume: bool) -> tuple[int, dict]:
            before = fake.n_requests
            server = ServerInfo(base_url=fake.base_url, served_model="fake", launch=_launched(argv))
            res = run_sweep(server, p, tmp_path, resume=resume)
            return fake.n_requests - before, res.summary

        assert sweep(["vllm", "serve"], resume=False)[0] == 4 + 8
        assert sweep(["vllm", "serve"], resume=False)[0] == 4 + 8  # no --resume: measured again
        n, summary = sweep(["vllm", "serve"], resume=True)
        assert (n, summary["reused_levels"]) == (0, ["c0001", "c0002"])
        n, summary = sweep(["vllm", "serve", "--max-num-seqs", "2"], resume=True)  # other flags: measured
        assert (n, summary["reused_levels"]) == (4 + 8, [])
    short = SweepParams(concurrency=(1,), input_len=2, output_len=3, min_requests=2, warmup_requests=0)
    with FakeServer(FakeBehaviour()) as fake:
        res = run_sweep(ServerInfo(base_url=fake.base_url, served_model="fake"), short, tmp_path, resume=True)
    assert res.levels["level"].tolist() == ["c0001"]  # c0002 is not planned now: not reported as fresh
    assert not (tmp_path / "levels" / "c0002.jsonl").exists()


SWEEP_AGAINST = """
import json
from pathlib import Path
from stepscope.config import SweepParams
from stepscope.notebook import resuming
from stepscope.sweep.client import ServerInfo, load_server
from stepscope.sweep.run import run_sweep
out = Path(run_dir) / '01_macro_sweep'
out.mkdir(exist_ok=True)
server = ServerInfo(base_url={url!r}, served_model='fake', launch=load_server(run_dir).launch)
run_sweep(server, SweepParams(concurrency=(1, 2), input_len=2, output_len=3, min_requests=2,
                              warmup_requests=0), out, resume=resuming(run_dir))
flag = Path({flag!r})
if flag.exists():  # the stage fails after its levels (as a missing sweep.import_results file would)
    flag.unlink()
    raise RuntimeError("failed after measuring")
"""


def test_reuse_is_said_on_the_console_and_new_server_flags_measure_afresh(tmp_path, notebooks):
    """Stages 00,01 with the real sweep in the stage's kernel. Stage 01 fails after measuring;
    --resume runs it again, keeps both levels and the console says which. A changed
    server.extra_args relaunches the server and measures every level again, --resume or not."""
    port = free_port()  # one port: the server's argv then differs only where the test changes it
    flag = tmp_path / "fail-once"
    with FakeServer(FakeBehaviour()) as fake:
        notebooks({"00_deploy": "pass", "01_macro_sweep": SWEEP_AGAINST.format(url=fake.base_url, flag=str(flag))})

        def run(extra_args: tuple[str, ...], resume: bool, want: int = 0) -> tuple[int, str]:
            lines: list[str] = []
            before = fake.n_requests
            code, _ = run_pipeline(_params(tmp_path, extra_args=extra_args, port=port), run_id="r", stages="00,01",
                                   resume=resume, progress=False, echo=lines.append)
            assert code == want, lines
            return fake.n_requests - before, "\n".join(lines)

        flag.write_text("")
        assert run((), resume=False, want=1)[0] == 4 + 8
        n, out = run((), resume=True)
        assert n == 0 and "01_macro_sweep: kept 2 level(s) measured earlier (--resume): c0001, c0002" in out, out
        n, out = run(("--max-num-seqs", "2"), resume=True)
        assert n == 4 + 8 and "kept" not in out, out


# --------------------------------------------------------------------------- item 2: the lock

HOLD = """
import sys, time
from stepscope.runfolder import run_folder_lock
with run_folder_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


def _holder(run_dir: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_on_the_same_run_is_refused_then_a_dead_holders_lock_taken_over(
        tmp_path, notebooks, capsys):
    notebooks({})
    params = _params(tmp_path)
    run_dir = tmp_path / "out" / "r"
    holder = _holder(run_dir)
    try:
        t0 = time.monotonic()
        assert main(["run", str(params), "--run-id", "r", "--stages", "02", "--no-progress"]) == 2
        assert time.monotonic() - t0 < 5  # refused at once, not after waiting
        err = capsys.readouterr().err
        assert f"in use by another stepscope process (pid {holder.pid})" in err and "--run-id" in err
        assert not (run_dir / "params.yaml").exists() and not (run_dir / "run.json").exists()
    finally:
        holder.kill()  # as an OOM killer would: no clean-up runs
        holder.wait()
    assert (run_dir / runfolder.LOCK_NAME).read_text().strip() == str(holder.pid)  # stale
    assert main(["run", str(params), "--run-id", "r", "--stages", "02", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"taking over the lock left by pid {holder.pid}, which no longer holds it (gone)" in out
    assert (run_dir / runfolder.LOCK_NAME).read_text() == ""  # released cleanly: nothing stale next time


# --------------------------------------------------------------------------- item 3: safe paths

@pytest.mark.parametrize("run_id", ["..", "../../x", "a/b", "-rf", ".hidden", "", "a" * 129])
def test_a_run_id_that_is_not_one_safe_segment_is_refused_before_anything_is_written(tmp_path, capsys, run_id):
    params = _params(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["run", str(params), f"--run-id={run_id}"]) == 2
    err = capsys.readouterr().err
    assert "is not a run id: one path segment of letters, digits" in err and "--run-id" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # not even outputs/ was created
    assert main(["validate", str(params), f"--run-id={run_id}"]) == 2


@pytest.mark.parametrize("name", ["", "-x", "../up", ".dot", "a b"])
def test_validate_refuses_a_run_name_that_cannot_start_a_run_id(tmp_path, capsys, name):
    params = _params(tmp_path, name=name)
    assert main(["validate", str(params)]) == 2
    assert "run.name" in capsys.readouterr().err


def test_a_symlinked_run_folder_or_a_link_out_of_it_is_refused(tmp_path, capsys, notebooks):
    notebooks({})
    params = _params(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "link").symlink_to(elsewhere)
    assert main(["validate", str(params), "--run-id", "link"]) == 2
    assert main(["run", str(params), "--run-id", "link", "--stages", "02"]) == 2
    assert "the run folder is a symlink" in capsys.readouterr().err
    assert list(elsewhere.iterdir()) == []
    (tmp_path / "out" / "r").mkdir()
    (tmp_path / "out" / "r" / "02_gemm_micro").symlink_to(elsewhere)
    assert main(["run", str(params), "--run-id", "r", "--stages", "02"]) == 2
    assert "02_gemm_micro is a symlink to" in capsys.readouterr().err
    assert list(elsewhere.iterdir()) == []


def test_a_planted_temp_symlink_is_never_followed(tmp_path, notebooks, capsys):
    """The old fixed temp name (`params.yaml.tmp`) made a planted link overwrite its target:
    the writer now takes an exclusive temp name, and a run refuses the folder, naming the link."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    run_dir = tmp_path / "out" / "r"
    run_dir.mkdir(parents=True)
    (run_dir / "params.yaml.tmp").symlink_to(victim)
    runfolder.write_yaml(run_dir / "params.yaml", {"a": 1})
    assert victim.read_text() == "precious"
    assert yaml.safe_load((run_dir / "params.yaml").read_text()) == {"a": 1}
    notebooks({})
    assert main(["run", str(_params(tmp_path)), "--run-id", "r", "--stages", "02"]) == 2
    assert "params.yaml.tmp is a symlink to" in capsys.readouterr().err
    assert victim.read_text() == "precious"


def test_output_files_share_one_mode_from_the_umask(tmp_path, notebooks):
    """JSON outputs were 0600 (mkstemp's mode) beside 0644 reports: a colleague could read the
    report but not summary.json."""
    notebooks({"02_gemm_micro": "from stepscope.runfolder import write_json\n"
                                "from pathlib import Path\nwrite_json(Path(run_dir) / '02_gemm_micro' / 'x.json', {})\n"
                                "(Path(run_dir) / '02_gemm_micro' / 'y.txt').write_text('')"})
    old = os.umask(0o022)
    try:
        code, run_dir = run_pipeline(_params(tmp_path), run_id="r", stages="02", progress=False, echo=lambda s: None)
    finally:
        os.umask(old)
    assert code == 0
    files = [run_dir / "run.json", run_dir / "params.yaml", run_dir / "02_gemm_micro" / "x.json",
             run_dir / "02_gemm_micro" / "y.txt"]
    assert {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {p.name: "0o644" for p in files}


# --------------------------------------------------------------------------- item 7: disk full

@pytest.fixture
def small_disk(tmp_path):
    """A real 1 MiB filesystem (tmpfs), so that writes fail with ENOSPC as on a full disk."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a 1 MiB tmpfs needs root; test_write_json_on_a_full_disk_* covers the writer")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"tmpfs mount refused here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _leftovers(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.name.endswith(".tmp"))


def test_write_json_on_a_full_disk_names_the_path_and_keeps_the_last_good_file(tmp_path, monkeypatch):
    target = runfolder.write_json(tmp_path / "summary.json", {"good": 1})

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runfolder.json, "dump", full)
    with pytest.raises(runfolder.DiskFull) as caught:
        runfolder.write_json(target, {"good": 2})
    assert str(target) in str(caught.value) and "MiB free on the filesystem holding" in str(caught.value)
    assert json.loads(target.read_text()) == {"good": 1}
    assert _leftovers(tmp_path) == []


def test_a_trace_copy_cut_short_by_a_full_disk_leaves_no_trace_behind(tmp_path, small_disk):
    from stepscope.capture import _sha256_copy

    src = tmp_path / "rank0.pt.trace.json.gz"
    src.write_bytes(os.urandom(2 << 20))  # 2 MiB onto a 1 MiB disk
    traces = small_disk / "traces"
    traces.mkdir()
    with pytest.raises(StepscopeError) as caught:
        _sha256_copy(src, traces / src.name)
    msg = str(caught.value)
    assert str(traces / src.name) in msg and "No space left on device" in msg and "MiB free" in msg
    assert list(traces.iterdir()) == []  # neither the truncated trace nor a temp file


FILL_DISK = """
from pathlib import Path
block = b'x' * 65536
with open(Path(run_dir) / 'filler.bin', 'wb') as fh:
    while True:
        fh.write(block)
        fh.flush()
"""


def test_a_stage_that_fills_the_disk_fails_with_the_free_space_and_the_run_stops(tmp_path, small_disk, notebooks):
    """The disk fills during stage 02 (a plain write, no path in its error): the run says so with
    the free space, stops instead of starting stage 03, exits 1 without a traceback, and
    run.json stays readable, holding the last good record at least."""
    notebooks({"02_gemm_micro": FILL_DISK})
    params = _params(tmp_path, outputs=small_disk)
    lines: list[str] = []
    code, run_dir = run_pipeline(params, run_id="r", stages="02,03", progress=False, echo=lines.append)
    out = "\n".join(lines)
    assert code == 1, out
    assert "02_gemm_micro: FAILED" in out and "No space left on device" in out
    assert "MiB free on the filesystem holding" in out
    assert "the disk is full: the run stops here; not run: 03_nccl_burst" in out
    record = json.loads((run_dir / "run.json").read_text())  # the last good record, never half a file
    stage = record["stages"].get("02_gemm_micro")
    assert stage is None or stage["status"] == "failed"
    assert stage is not None or "run.json keeps its last good record" in out
    assert "03_nccl_burst" not in record["stages"]
    assert _leftovers(small_disk) == []


def test_a_second_capture_leaves_only_its_own_traces_where_stage_05_reads(tmp_path):
    """Stage 04 run again (a --resume after a failed copy, or a re-run): stage 05 reads the
    whole traces/ folder, so what the earlier capture copied there must not stay beside the new
    capture's files, to be analysed as one capture."""
    from stepscope.capture import capture_profile
    from stepscope.config import CaptureParams

    cap = CaptureParams(warmup_requests=0, requests=1, input_len=2, output_len=3, wait_timeout_s=5)
    pdir, out = tmp_path / "prof", tmp_path / "04_profiler_capture"
    pdir.mkdir()
    with FakeServer(FakeBehaviour(profiler_dir=str(pdir), tp=2, chunk_delay_s=0.002)) as fake:
        server = ServerInfo(base_url=fake.base_url, served_model="fake", tp=2, profiler_dir=str(pdir))
        first = capture_profile(server, cap, out)
        stale = out / "traces" / "rank1.999.pt.trace.json.gz"  # e.g. the copy of an interrupted run
        stale.write_bytes(b"\x1f\x8b truncated")
        time.sleep(0.01)  # the fake names traces by time: the second capture's names differ
        second = capture_profile(server, cap, out)
    names = {Path(f["path"]).name for f in second.manifest["files"]}
    assert stale.name not in names and first.manifest["files"]
    assert {p.name for p in (out / "traces").iterdir()} == names
