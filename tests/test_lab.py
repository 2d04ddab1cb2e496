"""`stepscope lab` and notebooks run by hand: where JupyterLab opens, what it binds to, and
which run a notebook without injected parameters works on."""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pytest
import yaml

from stepscope.cli import build_parser, main
from stepscope.errors import StepscopeError
from stepscope.lab import LOOPBACK, is_loopback, lab_argv, lab_env, lab_root
from stepscope.notebook import NoRunYet, default_run, newest_run, params_file_of
from stepscope.paths import REPO_ROOT
from stepscope.stages import STAGES


def test_lab_opens_the_workbook_or_a_runs_executed_notebooks(tmp_path):
    assert lab_root(None) == (REPO_ROOT, "notebooks")
    run = tmp_path / "cpu-demo-20260101-000000"
    (run / "notebooks").mkdir(parents=True)
    assert lab_root(run) == (run, "notebooks")
    assert lab_root(run.name, outputs_dir=tmp_path) == (run, "notebooks")


def test_lab_names_a_folder_without_notebooks(tmp_path, capsys):
    with pytest.raises(StepscopeError) as e:
        lab_root(tmp_path / "nope")
    assert e.value.where == str(tmp_path / "nope") and "stepscope run" in e.value.hint
    assert main(["lab", str(tmp_path / "nope")]) == 2
    assert "no executed notebooks" in capsys.readouterr().err


def test_lab_binds_loopback_and_keeps_the_token_out_of_argv(tmp_path):
    argv = lab_argv(tmp_path, LOOPBACK, 8888)
    assert "--ServerApp.ip=127.0.0.1" in argv and "--ServerApp.port_retries=0" in argv
    assert not any("token" in a.lower() for a in argv)
    # news neither fetched nor asked about: the override sets the setting's default to "never"
    settings_dir = next(a.split("=", 1)[1] for a in argv if a.startswith("--LabApp.app_settings_dir="))
    overrides = json.loads((Path(settings_dir) / "overrides.json").read_text())
    assert overrides["@jupyterlab/apputils-extension:notification"] == {"fetchNews": "false",
                                                                      "checkForUpdates": False}
    env = lab_env("s3cret")
    assert env["JUPYTER_TOKEN"] == "s3cret"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO_ROOT / "lib")
    args = build_parser().parse_args(["lab"])
    assert args.host == "127.0.0.1" and args.run is None


@pytest.mark.parametrize("host, loop", [("127.0.0.1", True), ("::1", True), ("localhost", True),
                                        ("0.0.0.0", False), ("192.168.1.5", False)])
def test_is_loopback(host, loop):
    assert is_loopback(host) is loop


# --------------------------------------------------------------------------- notebooks by hand


@pytest.fixture()
def demo(tmp_path) -> Path:
    """A params file like the CPU demo's, with outputs in tmp, and two of its runs."""
    data = yaml.safe_load((REPO_ROOT / "params" / "cpu-demo.yaml").read_text())
    data["run"]["outputs_dir"] = str(tmp_path / "outputs")
    params = tmp_path / "demo.yaml"
    params.write_text(yaml.safe_dump(data))
    for stamp in ("20260101-090000", "20260102-080000"):
        run = tmp_path / "outputs" / f"cpu-demo-{stamp}"
        run.mkdir(parents=True)
        (run / "run.json").write_text(json.dumps({"run_id": run.name, "params_file": str(params)}))
    (tmp_path / "outputs" / "cpu-demo-20260103-000000").mkdir()  # no run.json: not a run
    return params


def test_default_run_is_the_newest_demo_runs_scratch_copy_with_its_params_file(demo, capsys):
    newest = demo.parent / "outputs" / "cpu-demo-20260102-080000"
    assert newest_run(demo) == newest
    copy = demo.parent / "outputs" / ".lab" / newest.name  # a notebook opened by hand never writes the run
    assert default_run(None, None, demo_params=demo) == (demo.resolve(), copy)
    assert capsys.readouterr().out == (f"no parameters injected: run {copy} (its scratch copy; the run {newest} "
                                       f"is not written), params {demo.resolve()}\n")
    assert (copy / "run.json").read_bytes() == (newest / "run.json").read_bytes()
    assert newest_run(demo) == newest  # the copy is no run of its own


def test_injected_parameters_pass_through(demo, tmp_path):
    assert default_run("a.yaml", tmp_path, demo_params=demo) == (Path("a.yaml"), tmp_path)


def test_params_file_falls_back_to_the_runs_snapshot(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"run_id": tmp_path.name, "params_file": "/gone/params.yaml"}))
    assert params_file_of(tmp_path) == tmp_path / "params.yaml"
    (tmp_path / "run.json").write_text(json.dumps({"run_id": tmp_path.name, "params_file": "params/cpu-demo.yaml"}))
    assert params_file_of(tmp_path) == REPO_ROOT / "params" / "cpu-demo.yaml"  # relative: from the repo


def test_no_demo_run_says_in_one_line_what_to_run(demo):
    for run in (demo.parent / "outputs").iterdir():
        (run / "run.json").unlink(missing_ok=True)
    with pytest.raises(NoRunYet) as e:
        default_run(None, None, demo_params=demo)
    shown = e.value._render_traceback_()
    assert len(shown) == 1 and "\n" not in shown[0]
    assert "stepscope run params/cpu-demo.yaml" in shown[0]


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.id)
def test_every_notebook_defaults_its_parameters_the_same_way(stage):
    nb = nbformat.read(stage.notebook, as_version=4)
    i = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    ns: dict = {}
    exec(nb.cells[i].source, ns)
    assert ns["params_file"] is None and ns["run_dir"] is None
    nxt = next(c for c in nb.cells[i + 1:] if c.cell_type == "code").source
    assert "params_file, run_dir = default_run(params_file, run_dir)" in nxt
    assert nxt.index("default_run(") < nxt.index("open_stage(")


# --------------------------------------------------------------------------- the lab's scratch copy


def _executed_run(root: Path) -> Path:
    """A run folder with an executed notebook (papermill's injected cell), a params snapshot,
    a small artifact and a trace larger than the copy limit (sparse: no disk used)."""
    from stepscope.scratch import COPY_LIMIT_BYTES

    run = root / "outputs" / "cpu-demo-20260105-000000"
    (run / "notebooks").mkdir(parents=True)
    (run / "params.yaml").write_text("run: {name: cpu-demo}\n")
    (run / "06_writeup").mkdir()
    (run / "06_writeup" / "report.md").write_text("# the run's report\n")
    (run / "04_profiler_capture").mkdir()
    with open(run / "04_profiler_capture" / "rank0.pt.trace.json.gz", "wb") as fh:
        fh.truncate(COPY_LIMIT_BYTES + 1)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("params_file = None\nrun_dir = None", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell(f"# Parameters\nparams_file = {str(run / 'params.yaml')!r}\n"
                                          f"run_dir = {str(run)!r}\n", metadata={"tags": ["injected-parameters"]})]
    nbformat.write(nb, run / "notebooks" / "06_writeup.ipynb")
    (run / "notebooks" / ".ipynb_checkpoints").mkdir()
    (run / "notebooks" / ".ipynb_checkpoints" / "06_writeup-checkpoint.ipynb").write_text("{}")
    return run


def _injected(nb_path: Path) -> dict:
    nb = nbformat.read(nb_path, as_version=4)
    cell = next(c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", []))
    ns: dict = {}
    exec(cell.source, ns)
    return {k: ns[k] for k in ("params_file", "run_dir")}


def test_a_run_opens_in_a_scratch_copy_beside_it(tmp_path):
    from stepscope.lab import checkpoints_dir, lab_folder

    run = _executed_run(tmp_path)
    root, start = lab_folder(run)
    copy = tmp_path / "outputs" / ".lab" / run.name
    assert (root, start) == (copy, "notebooks")
    # the copy's notebook writes into the copy; the run's own notebook still points at the run
    assert _injected(copy / "notebooks" / "06_writeup.ipynb") == {"params_file": str(copy / "params.yaml"),
                                                                   "run_dir": str(copy)}
    assert _injected(run / "notebooks" / "06_writeup.ipynb")["run_dir"] == str(run)
    # small files copied, a large one linked (read, never written through: writes rename over the link)
    trace = copy / "04_profiler_capture" / "rank0.pt.trace.json.gz"
    assert trace.is_symlink() and trace.resolve() == (run / "04_profiler_capture" / "rank0.pt.trace.json.gz")
    report = copy / "06_writeup" / "report.md"
    assert not report.is_symlink() and report.read_text() == "# the run's report\n"
    assert not (copy / "notebooks" / ".ipynb_checkpoints").exists()
    # checkpoints outside the run, whichever folder JupyterLab serves
    assert checkpoints_dir(copy) == copy / ".checkpoints"
    assert checkpoints_dir(run.resolve()) == copy / ".checkpoints"  # --write-run
    argv = lab_argv(copy, LOOPBACK, 8888)
    assert f"--FileCheckpoints.checkpoint_dir={copy / '.checkpoints'}" in argv
    assert lab_folder(run, write_run=True) == (run.resolve(), "notebooks")


def test_the_scratch_copy_keeps_the_users_notebooks_and_follows_the_run(tmp_path):
    from stepscope.lab import lab_folder

    run = _executed_run(tmp_path)
    copy, _ = lab_folder(run)
    nb = copy / "notebooks" / "06_writeup.ipynb"
    nb.write_text(nb.read_text().replace("# Parameters", "# Parameters (my edit)"))
    (run / "06_writeup" / "report.md").write_text("# analysed again\n")
    assert lab_folder(run)[0] == copy
    assert "(my edit)" in nb.read_text()
    assert (copy / "06_writeup" / "report.md").read_text() == "# analysed again\n"


def test_the_scratch_copy_is_never_inside_the_run(tmp_path):
    from stepscope.scratch import make_scratch

    run = _executed_run(tmp_path)
    with pytest.raises(StepscopeError) as e:
        make_scratch(run, run / "scratch")
    assert e.value.where == str(run / "scratch")


def _digests(folder: Path) -> dict[str, str]:
    import hashlib

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_run_all_on_notebook_06_in_the_lab_leaves_the_run_byte_identical(tmp_path, real_traces):
    """Issue 38: "Run All" on an executed notebook 06 in `stepscope lab RUN` rewrote that run's
    report, verdict and figures. Run All here is the scratch copy's notebook executed as it
    stands (its injected parameters), in this process."""
    from stepscope import inprocess
    from stepscope.lab import lab_folder

    run = tmp_path / "outputs" / "analyze-tp2"
    traces = [real_traces / f"vllm-cpu-tinyllama-tp2-rank{r}.pt.trace.json.gz" for r in (0, 1)]
    assert main(["analyze", *map(str, traces), "--tp", "2", "--out", str(run), "--no-progress"]) == 0
    before = _digests(run)
    assert "06_writeup/report.md" in before and "06_writeup/verdict.json" in before
    copy, _ = lab_folder(run)
    nb = copy / "notebooks" / "06_writeup.ipynb"
    report = copy / "06_writeup" / "report.md"
    report.write_text("stale")
    inprocess.execute_notebook(nb, nb, _injected(nb), cwd=REPO_ROOT / "notebooks")
    assert _digests(run) == before
    assert report.read_text().startswith("# ") and "stale" not in report.read_text()  # written in the copy
    # the same Run All on the run itself (`--write-run`) rewrites it: what the copy prevents
    own = run / "notebooks" / "06_writeup.ipynb"
    inprocess.execute_notebook(own, own, _injected(own), cwd=REPO_ROOT / "notebooks")
    assert {k for k, v in _digests(run).items() if before.get(k) != v} >= {"notebooks/06_writeup.ipynb"}
