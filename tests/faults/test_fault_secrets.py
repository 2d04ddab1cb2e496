"""No secret from a server's reply, the environment or params reaches a file of the run
(issue 39, finding 5): the secret filter (`stepscope.redaction.scrub`) sits at every writer.
The server is the fake of `stepscope.testing.fake_server`; the stage notebooks of the runner
test are stand-ins (`faultkit.stand_in_notebooks`), the report is the real one."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from faultkit import stand_in_notebooks
from stepscope import paths, schema
from stepscope.config import SweepParams
from stepscope.errors import ServerError
from stepscope.redaction import REDACTED, scrub
from stepscope.report import build_report
from stepscope.runner import run_pipeline
from stepscope.sweep.client import ServerInfo
from stepscope.sweep.run import run_sweep
from stepscope.testing.fake_server import FakeBehaviour, FakeServer

PARAMS = SweepParams(concurrency=(1,), input_len=4, output_len=4, min_requests=4, warmup_requests=0)
KEY_ENV = "STEPSCOPE_PROBE_CRED"
"""A name that does not look secret: the key is known to be one because api_key_env names it."""


def files_holding(run_dir: Path, *secrets: str) -> list[str]:
    """The files under `run_dir` (every one, read as bytes) that hold any of `secrets`."""
    return sorted(str(f.relative_to(run_dir)) for f in run_dir.rglob("*")
                  if f.is_file() and any(s.encode() in f.read_bytes() for s in secrets))


def test_a_server_echoing_the_api_key_leaves_it_in_no_file(tmp_path, monkeypatch):
    key = "sk-PROBE-4f9a2c77e1"
    monkeypatch.setenv(KEY_ENV, key)
    run_dir = tmp_path / "run"
    with FakeServer(FakeBehaviour(echo_key_401=True)) as fake:
        server = ServerInfo(base_url=fake.base_url, served_model="fake", tp=2, api_key_env=KEY_ENV)
        res = run_sweep(server, PARAMS, run_dir / "01_macro_sweep")
    assert res.levels["n_failed"].tolist() == [4]
    summary = json.loads((run_dir / "01_macro_sweep" / "summary.json").read_text())
    assert summary["failures"][0]["error"] == (
        f"HTTP 401 Unauthorized: {{\"error\": {{\"message\": \"the key '{REDACTED}' is not valid here\"}}}}")
    with pytest.raises(ServerError) as exc:
        res.raise_if_died()
    assert "the first error: HTTP 401 Unauthorized" in str(exc.value) and key not in str(exc.value)
    build_report(run_dir, draw_figures=False)
    assert "HTTP 401 Unauthorized" in (run_dir / "06_writeup" / "report.md").read_text()  # the reply is shown
    assert files_holding(run_dir, key) == []


def test_environment_tokens_bearer_values_and_url_passwords_in_replies_are_blanked(tmp_path, monkeypatch):
    token, bearer, password = "tok-9d8e7f6a5b4c", "eyJhbGciOi.J9-x1", "hunter2pass"
    monkeypatch.setenv("PROBE_UPSTREAM_TOKEN", token)
    body = f"upstream http://admin:{password}@10.0.0.1/v1 refused token {token} (Authorization: Bearer {bearer})"
    with FakeServer(FakeBehaviour(fail_every=2, error_body=body, error_content_type="text/plain")) as fake:
        res = run_sweep(ServerInfo(base_url=fake.base_url, served_model="fake", tp=2), PARAMS, tmp_path)
    assert res.levels["n_failed"].tolist() == [2]
    assert res.failures["error"].iloc[0] == (
        f"HTTP 500 Internal Server Error: upstream http://{REDACTED}@10.0.0.1/v1 refused token {REDACTED} "
        f"(Authorization: Bearer {REDACTED})")
    assert files_holding(tmp_path, token, bearer, password) == []


class ErrorRow(schema.Row):
    """A table with a text column, as a stage writes one."""

    request_id: int
    error: str


def test_a_table_cell_holding_a_secret_is_blanked_and_the_rest_kept(tmp_path):
    df = pd.DataFrame({"request_id": [0, 1], "error": ["overload, x=1", "GET http://u:pw1234@h/health, 401"]})
    schema.write_table(df, tmp_path / "failures.csv", ErrorRow)
    back = pd.read_csv(tmp_path / "failures.csv")
    assert back["error"].tolist() == ["overload, x=1", f"GET http://{REDACTED}@h/health, 401"]
    assert back["request_id"].tolist() == [0, 1]


def test_the_filter_keeps_ordinary_text():
    text = "level c0004: 2 of 16 requests failed; Bearer tokens, max_tokens=16, --tokenizer-mode auto"
    assert scrub(text) == text


REPORT_NOTEBOOK = textwrap.dedent("""\
    from IPython.display import Markdown, display
    from stepscope.report import build_report
    display(Markdown(build_report(run_dir, draw_figures=False)["markdown"].read_text()))
    """)


def test_an_attach_url_password_and_a_printed_key_reach_no_file(tmp_path, monkeypatch):
    """The probe's attach URL with `user:pass@` put the password in run.json, the report and
    notebook 06 through stage 00's error; a notebook printing the key kept it in its output."""
    password, key = "s3cretpass", "sk-PROBE-aa11bb22cc"
    monkeypatch.setenv(KEY_ENV, key)
    monkeypatch.setattr(paths, "NOTEBOOKS_DIR", stand_in_notebooks(tmp_path / "nbs", {
        "02_gemm_micro": f"import os\nprint('the key:', os.environ['{KEY_ENV}'])",
        "06_writeup": REPORT_NOTEBOOK}))
    params = tmp_path / "p.yaml"
    with FakeServer() as fake:
        params.write_text(textwrap.dedent(f"""\
            run: {{name: t, outputs_dir: {tmp_path / 'out'}}}
            server: {{mode: attach, url: "http://user:{password}@127.0.0.1:{fake.port}", api_key_env: {KEY_ENV}}}
            """))
        lines: list[str] = []
        code, run_dir = run_pipeline(params, stages="00,02,06", run_id="r", progress=False, echo=lines.append)
    assert code == 1
    record = json.loads((run_dir / "run.json").read_text())
    assert {k: v["status"] for k, v in record["stages"].items()} == {
        "00_deploy": "failed", "02_gemm_micro": "ok", "06_writeup": "ok"}
    assert record["stages"]["00_deploy"]["error"].startswith(
        "ServerError: params: server.url: server.url holds a user name or password")
    assert f"the key: {REDACTED}" in (run_dir / "notebooks" / "02_gemm_micro.ipynb").read_text()
    assert "server.url holds a user name or password" in (run_dir / "06_writeup" / "report.md").read_text()
    assert files_holding(run_dir, password, key) == []
    assert not any(password in line or key in line for line in lines)
    assert os.environ[KEY_ENV] == key  # the filter blanks what is written, never the variable
