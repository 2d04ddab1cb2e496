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


def test_default_run_is_the_newest_demo_run_with_its_params_file(demo, capsys):
    newest = demo.parent / "outputs" / "cpu-demo-20260102-080000"
    assert newest_run(demo) == newest
    assert default_run(None, None, demo_params=demo) == (demo.resolve(), newest)
    assert capsys.readouterr().out == f"no parameters injected: run {newest}, params {demo.resolve()}\n"


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
