"""Runner: stage selection, failure policy, run.json, resume. Real papermill, real kernels;
the stage notebooks here are small stand-ins written into tmp_path."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest

from stepscope import paths
from stepscope.errors import StepscopeError
from stepscope.runner import run_pipeline, select_stages
from stepscope.stages import STAGES


def test_select_stages_by_number_id_and_name():
    assert [s.id for s in select_stages("03,2")] == ["02_gemm_micro", "03_nccl_burst"]
    assert [s.id for s in select_stages(["05_categorize", "writeup"])] == ["05_categorize", "06_writeup"]
    assert len(select_stages(None)) == 7


def test_unknown_stage_is_named():
    with pytest.raises(StepscopeError) as exc:
        select_stages("02,09")
    assert "'09'" in str(exc.value) and "00_deploy" in str(exc.value)


def _stand_in_notebooks(folder: Path, failing: dict[str, str]) -> None:
    """One notebook per stage: writes <stage>/done.txt, or raises the given error."""
    folder.mkdir()
    for stage in STAGES:
        params = nbformat.v4.new_code_cell('params_file = ""\nrun_dir = ""')
        params.metadata["tags"] = ["parameters"]
        if stage.id in failing:
            body = ("from stepscope.errors import StepscopeError\n"
                    f"raise StepscopeError({failing[stage.id]!r}, where='x.yaml', hint='do y')")
        else:
            body = ("from pathlib import Path\n"
                    f"d = Path(run_dir) / '{stage.id}'\nd.mkdir(exist_ok=True)\n"
                    "(d / 'done.txt').write_text('ok')")
        nb = nbformat.v4.new_notebook(cells=[params, nbformat.v4.new_code_cell(body)])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, folder / f"{stage.id}.ipynb")


@pytest.fixture
def stand_ins(tmp_path, monkeypatch):
    def make(failing: dict[str, str]) -> Path:
        nbdir = tmp_path / "nbs"
        _stand_in_notebooks(nbdir, failing)
        monkeypatch.setattr(paths, "NOTEBOOKS_DIR", nbdir)
        params = tmp_path / "p.yaml"
        # No model on disk: the deploy stage fails before any server starts.
        params.write_text(f"run: {{name: t, outputs_dir: {tmp_path / 'out'}}}\n"
                          f"model: {{path: {tmp_path / 'no-model'}}}\nserver: {{port: 18601}}\n")
        return params
    return make


def test_failing_stage_is_recorded_and_independent_stages_still_run(stand_ins, tmp_path):
    params = stand_ins({"03_nccl_burst": "rank 1 hung"})
    lines: list[str] = []
    code, run_dir = run_pipeline(params, run_id="r1", progress=False, echo=lines.append)
    out = "\n".join(lines)
    assert code == 1
    record = json.loads((run_dir / "run.json").read_text())
    status = {k: v["status"] for k, v in record["stages"].items()}
    assert status == {"00_deploy": "failed", "01_macro_sweep": "skipped", "02_gemm_micro": "ok",
                      "03_nccl_burst": "failed", "04_profiler_capture": "skipped",
                      "05_categorize": "skipped", "06_writeup": "ok"}
    # The deploy failure says why, and names the key to fix.
    assert "model path does not exist" in record["stages"]["00_deploy"]["error"]
    # A notebook failure names the stage, the error without traceback, and the partial notebook.
    err3 = record["stages"]["03_nccl_burst"]["error"]
    assert err3.startswith("StepscopeError: x.yaml: rank 1 hung")
    assert "03_nccl_burst: FAILED" in out
    assert f"partial notebook: {run_dir / 'notebooks' / '03_nccl_burst.ipynb'}" in out
    assert (run_dir / "notebooks" / "03_nccl_burst.ipynb").is_file()
    assert "01_macro_sweep: skipped (needs 00_deploy)" in out
    assert (run_dir / "02_gemm_micro" / "done.txt").read_text() == "ok"
    # Provenance.
    assert record["packages"]["stepscope"]
    assert record["params"]["server"]["port"] == 18601
    assert (run_dir / "params.yaml").is_file()


def test_resume_skips_finished_stages(stand_ins, tmp_path):
    params = stand_ins({"03_nccl_burst": "boom"})
    run_pipeline(params, run_id="r2", stages="02,03", progress=False, echo=lambda s: None)
    done = tmp_path / "out" / "r2" / "02_gemm_micro" / "done.txt"
    done.write_text("from the first run")
    _stand_in_notebooks(tmp_path / "nbs2", {})
    paths.NOTEBOOKS_DIR = tmp_path / "nbs2"  # restored by monkeypatch
    lines: list[str] = []
    code, run_dir = run_pipeline(params, run_id="r2", stages="02,03", resume=True, progress=False,
                                 echo=lines.append)
    assert code == 0
    assert done.read_text() == "from the first run"  # 02 was not re-run
    assert "02_gemm_micro: done earlier, skipped (--resume)" in "\n".join(lines)
    status = json.loads((run_dir / "run.json").read_text())["stages"]
    assert status["03_nccl_burst"]["status"] == "ok"


def test_resume_without_run_id_is_refused(stand_ins):
    params = stand_ins({})
    with pytest.raises(StepscopeError, match="--resume needs --run-id"):
        run_pipeline(params, resume=True, progress=False)


def test_bad_params_stop_before_anything_runs(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"run: {{name: t, outputs_dir: {tmp_path / 'out'}}}\nsweep: {{concurency: [1]}}\n")
    with pytest.raises(StepscopeError, match="did you mean 'concurrency'"):
        run_pipeline(bad, progress=False)
    assert not (tmp_path / "out").exists()


def test_cli_prints_message_without_traceback(tmp_path, capsys):
    from stepscope.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("run: {name: t}\nserver: {tp: 1e-3}\n")
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "server.tp" in err and "Traceback" not in err


def test_analysis_stages_give_each_cell_a_time_limit_and_server_stages_none(tmp_path, monkeypatch):
    import papermill

    from stepscope.stages import ANALYSIS_CELL_TIMEOUT_S, STAGE_BY_ID
    from stepscope.runner import execute_notebook

    seen: dict[str, object] = {}

    def fake_execute(nb, out, **kw):
        seen[Path(nb).stem] = kw["execution_timeout"]

    monkeypatch.setattr(papermill, "execute_notebook", fake_execute)
    for sid in ("01_macro_sweep", "05_categorize", "06_writeup"):
        execute_notebook(STAGE_BY_ID[sid], tmp_path / "params.yaml", tmp_path, progress=False)
    assert seen == {"01_macro_sweep": None, "05_categorize": ANALYSIS_CELL_TIMEOUT_S,
                    "06_writeup": ANALYSIS_CELL_TIMEOUT_S}
    assert ANALYSIS_CELL_TIMEOUT_S == 3600.0


def test_children_of_the_suite_receive_ctrl_c_even_when_it_was_started_ignoring_it():
    import subprocess
    import sys

    probe = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_running_one_stage_again_keeps_the_record_of_the_others(stand_ins, tmp_path):
    # The hint a missing input gives: `stepscope run <params> --run-id <id> --stages NN`. Without
    # --resume the named stage runs again; the others' status, and when the run began, stay.
    params = stand_ins({})
    code, run_dir = run_pipeline(params, run_id="r3", stages="02,03", progress=False, echo=lambda s: None)
    assert code == 0
    first = json.loads((run_dir / "run.json").read_text())
    for stage in ("02_gemm_micro", "03_nccl_burst"):
        (run_dir / stage / "done.txt").write_text("from the first run")
    code, _ = run_pipeline(params, run_id="r3", stages="03", progress=False, echo=lambda s: None)
    assert code == 0
    assert (run_dir / "03_nccl_burst" / "done.txt").read_text() == "ok"  # ran again
    assert (run_dir / "02_gemm_micro" / "done.txt").read_text() == "from the first run"
    again = json.loads((run_dir / "run.json").read_text())
    assert set(again["stages"]) == {"02_gemm_micro", "03_nccl_burst"}
    assert again["stages"]["02_gemm_micro"] == first["stages"]["02_gemm_micro"]
    assert again["stages"]["03_nccl_burst"]["finished_at"] >= first["stages"]["03_nccl_burst"]["finished_at"]
    assert again["created_at"] == first["created_at"]


def test_an_unreadable_run_json_is_kept_aside_or_named(stand_ins, tmp_path):
    params = stand_ins({})
    run_dir = tmp_path / "out" / "r4"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text('{"stages": {"02_gemm')  # cut off mid-write by something else
    with pytest.raises(StepscopeError) as exc:
        run_pipeline(params, run_id="r4", stages="02", resume=True, progress=False, echo=lambda s: None)
    assert exc.value.where == str(run_dir / "run.json") and "drop --resume" in exc.value.hint
    code, _ = run_pipeline(params, run_id="r4", stages="02", progress=False, echo=lambda s: None)
    assert code == 0
    assert (run_dir / "run.json.unreadable").read_text() == '{"stages": {"02_gemm'
    assert json.loads((run_dir / "run.json").read_text())["stages"]["02_gemm_micro"]["status"] == "ok"


def test_a_secret_on_the_command_line_stays_out_of_run_json(stand_ins, monkeypatch):
    params = stand_ins({})
    monkeypatch.setattr(sys, "argv", ["stepscope", "run", str(params), "--api-key", "sk-argv-0123456789"])
    _, run_dir = run_pipeline(params, run_id="r-argv", stages="02", progress=False, echo=lambda s: None)
    text = (run_dir / "run.json").read_text()
    assert "sk-argv-0123456789" not in text
    assert json.loads(text)["argv"][-2:] == ["--api-key", "***redacted***"]


SWEEP_STAND_IN = """from pathlib import Path
from stepscope.config import load_params
from stepscope.sweep import load_server, run_sweep
out = Path(run_dir) / '01_macro_sweep'
out.mkdir(exist_ok=True)
run_sweep(load_server(run_dir), load_params(params_file).sweep, out)"""


def test_the_console_says_each_sweep_level_as_it_ends_then_the_level_table(tmp_path, monkeypatch, capfd):
    """The real sweep in a real papermill kernel against the fake server: one line per level
    reaches the runner's console while stage 01 runs, the run ends with the level table, and
    nothing on stderr is redrawn with carriage returns (stderr is no terminal here)."""
    import pandas as pd

    from stepscope.sweep.console import level_line
    from stepscope.testing.fake_server import FakeBehaviour, FakeServer

    nbdir = tmp_path / "nbs"
    _stand_in_notebooks(nbdir, {})
    nb = nbformat.read(nbdir / "01_macro_sweep.ipynb", as_version=4)
    nb.cells[1].source = SWEEP_STAND_IN
    nbformat.write(nb, nbdir / "01_macro_sweep.ipynb")
    monkeypatch.setattr(paths, "NOTEBOOKS_DIR", nbdir)
    params = tmp_path / "p.yaml"
    params.write_text(f"run: {{name: t, outputs_dir: {tmp_path / 'out'}}}\n"
                      "sweep: {concurrency: [1, 2], input_len: 4, output_len: 3, min_requests: 4, "
                      "warmup_requests: 0, gpu_telemetry: false}\n")
    lines: list[str] = []
    with FakeServer(FakeBehaviour(chunk_delay_s=0.005)) as fake:
        deploy = tmp_path / "out" / "r5" / "00_deploy"
        deploy.mkdir(parents=True)
        (deploy / "server.json").write_text(json.dumps({"mode": "attach", "engine": "vllm",
                                                        "base_url": fake.base_url, "served_model": "fake"}))
        code, run_dir = run_pipeline(params, run_id="r5", stages="01", progress=True, echo=lines.append)
    assert code == 0, lines
    levels = pd.read_csv(run_dir / "01_macro_sweep" / "levels.csv")
    running, ok = lines.index("  01_macro_sweep: running"), next(i for i, ln in enumerate(lines) if "01_macro_sweep: ok" in ln)
    assert lines[running + 1:ok] == [level_line(levels.iloc[0], "1/2"), level_line(levels.iloc[1], "2/2")]
    assert lines[running + 1].startswith("  level c0001 [1/2] (c=1): 4 ok, 0 failed; ")
    table = lines[ok + 1:]
    assert "Serving Benchmark Result" in table[0] and table[1].split()[:4] == ["level", "load", "ok", "failed"]
    assert table[2].split()[:4] == ["c0001", "c=1", "4", "0"] and table[3].split()[:4] == ["c0002", "c=2", "8", "0"]
    from stepscope.wording import fmt_num

    assert table[3].split()[5] == fmt_num(levels.iloc[1]["output_throughput_tok_s"])
    assert lines[0] == f"stepscope run: {run_dir}"
    assert "\r" not in capfd.readouterr().err


def test_papermill_draws_its_cell_bar_only_on_a_terminal(tmp_path, monkeypatch):
    import io

    import papermill

    from stepscope.progress import notebook_bar
    from stepscope.runner import execute_notebook
    from stepscope.stages import STAGE_BY_ID

    seen: list[object] = []
    monkeypatch.setattr(papermill, "execute_notebook", lambda nb, out, **kw: seen.append(kw["progress_bar"]))
    execute_notebook(STAGE_BY_ID["01_macro_sweep"], tmp_path / "params.yaml", tmp_path, progress=True)
    assert seen == [False]  # pytest's stderr is no terminal: no bar, no carriage returns

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    bar = notebook_bar(True, "01_macro_sweep", stream=Tty())
    assert bar["desc"] == "01_macro_sweep" and "remaining" not in bar["bar_format"]  # no ETA from cell counts
    assert notebook_bar(False, "01_macro_sweep", stream=Tty()) is False
