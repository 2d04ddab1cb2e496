"""Params ranges, duplicate keys and argv-style secrets (issue 13, bugs 4 and 6): values that
validate but fail at run time (OverflowError, ZeroDivisionError, KeyError) are refused up
front, naming the file and key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.config import REDACTED, load_params, params_from_dict, redact, redact_argv
from stepscope.errors import ParamsError


def _error(tmp_path: Path, body: str) -> str:
    f = tmp_path / "p.yaml"
    f.write_text("run: {name: x}\n" + body + "\n")
    with pytest.raises(ParamsError) as exc:
        load_params(f)
    return str(exc.value)


@pytest.mark.parametrize("body, key, message", [
    ("server: {port: 70000}", "server.port", "must be between 1 and 65,535, got 70000"),
    ("server: {port: 0}", "server.port", "must be between 1 and 65,535, got 0"),
    ("server: {tp: 0}", "server.tp", "must be between 1 and 100,000, got 0"),
    ("sweep: {concurrency: [0]}", "sweep.concurrency[0]", "must be between 1 and 100,000, got 0"),
    ("sweep: {concurrency: [1, -2]}", "sweep.concurrency[1]", "must be between 1 and 100,000, got -2"),
    ("sweep: {concurrency: []}", "sweep.concurrency", "is empty, and so is sweep.request_rates"),
    ("sweep: {request_rates: [0]}", "sweep.request_rates[0]", "must be greater than 0 and at most 1,000,000, got 0.0"),
    ("sweep: {min_requests: -5}", "sweep.min_requests", "must be between 1 and 1,000,000, got -5"),
    ("capture: {requests: 0}", "capture.requests", "must be between 1 and 1,000,000, got 0"),
    ("analysis: {tp: 0}", "analysis.tp", "must be between 1 and 100,000, got 0"),
])
def test_out_of_range_values_name_the_key(tmp_path, body, key, message):
    msg = _error(tmp_path, body)
    assert f"p.yaml: {key}: {message}" in msg


def test_open_loop_only_sweep_is_valid():
    p = params_from_dict({"run": {"name": "x"}, "sweep": {"concurrency": [], "request_rates": [2.0]}})
    assert p.sweep.request_rates == (2.0,)


def test_duplicate_keys_are_refused_with_their_line(tmp_path):
    msg = _error(tmp_path, "server: {port: 8001}\nsweep: {input_len: 4}\nserver: {tp: 2}")
    assert "p.yaml:4: duplicate key 'server'" in msg
    nested = _error(tmp_path, "server:\n  port: 1\n  port: 2")
    assert "p.yaml:4: duplicate key 'port'" in nested


def test_a_directory_is_not_called_missing(tmp_path):
    with pytest.raises(ParamsError) as exc:
        load_params(tmp_path)
    assert "is a directory" in str(exc.value) and "not found" not in str(exc.value)


def test_argv_style_secrets_are_redacted_in_params():
    data = {"server": {"extra_args": ["--api-key", "sk-planted", "--hf-token=hf_planted", "--block-size", "32",
                                      "--tokenizer-mode", "auto"],
                       "url": "http://bob:pw-planted@127.0.0.1:8000/?token=tok-planted&x=1"}}
    out = redact(data)
    assert out["server"]["extra_args"] == ["--api-key", REDACTED, f"--hf-token={REDACTED}", "--block-size",
                                           "32", "--tokenizer-mode", "auto"]
    assert out["server"]["url"] == f"http://{REDACTED}@127.0.0.1:8000/?token={REDACTED}&x=1"
    assert "planted" not in repr(out)


def test_secrets_in_free_text_are_redacted():
    from stepscope.config import redact_text

    raw = 'extra_args: [--enforce-eager, --api-key, "sk-planted", --tokenizer-mode, auto]'
    assert redact_text(raw) == f'extra_args: [--enforce-eager, --api-key, "{REDACTED}", --tokenizer-mode, auto]'
    assert redact_argv(["--enforce-eager", "--api-key=sk-p"]) == ["--enforce-eager", f"--api-key={REDACTED}"]


def test_unparsable_params_text_is_redacted_before_it_reaches_the_report(tmp_path):
    """report/build.py shows params.yaml verbatim when it does not parse: redacted all the same."""
    from stepscope.report import build_report
    from stepscope.testing.synthetic import make_synthetic_run

    run = make_synthetic_run(tmp_path / "run")
    (run / "params.yaml").write_text(
        "server:\n  api_key: sk-planted1\n  env: {HF_TOKEN: hf-planted2}\n"
        "  extra_args: [--api-key, sk-planted3\n  url: http://u:pw-planted4@h/\n")
    paths = build_report(run, draw_figures=False)
    for key in ("appendix_markdown", "appendix_html"):  # the params file lives in the appendix
        text = paths[key].read_text()
        assert "Params file" in text
        assert "planted" not in text, key
    assert "planted" not in paths["markdown"].read_text() + paths["html"].read_text()
    assert "api_key: " + REDACTED in paths["appendix_markdown"].read_text()


@pytest.mark.parametrize("body, key, message", [
    ("sweep: {request_timeout_s: .nan}", "sweep.request_timeout_s", "must be a finite number, got nan"),
    ("sweep: {request_rates: [2, .inf]}", "sweep.request_rates[1]", "must be a finite number, got inf"),
    ("sweep: {slo: {tpot_ms: -.inf}}", "sweep.slo.tpot_ms", "must be a finite number, got -inf"),
    ("campaign: {variants: [{name: a, overrides: {sweep: {knee_gain: .nan}}}]}",
     "campaign.variants[0:a].overrides.sweep.knee_gain", "must be a finite number, got nan"),
])
def test_nan_and_inf_are_refused_wherever_they_stand(tmp_path, body, key, message):
    assert f"p.yaml: {key}: {message}" in _error(tmp_path, body)


@pytest.mark.parametrize("body, key, message", [
    ("sweep: {concurrency: [100000000]}", "sweep.concurrency[0]", "must be between 1 and 100,000, got 100000000"),
    ("sweep: {min_requests: 1000000000000}", "sweep.min_requests",
     "must be between 1 and 1,000,000, got 1000000000000"),
    ("sweep: {request_timeout_s: 1.0e+9}", "sweep.request_timeout_s",
     "must be greater than 0 and at most 604,800, got 1000000000.0"),
    # The bound that failed is named: 5 is not "greater than 0"'s fault.
    ("sweep: {slo: {tpot_ms: 50, min_share: 5}}", "sweep.slo.min_share", "must be greater than 0 and at most 1, got 5.0"),
])
def test_values_past_their_ceiling_are_refused_with_the_bound(tmp_path, body, key, message):
    assert f"p.yaml: {key}: {message}" in _error(tmp_path, body)


@pytest.mark.parametrize("encoding", ["latin-1", "utf-16"])
def test_a_params_file_that_is_not_utf8_is_refused_with_a_message(tmp_path, encoding):
    f = tmp_path / "p.yaml"
    f.write_bytes("run: {name: café}\n".encode(encoding))
    with pytest.raises(ParamsError) as exc:
        load_params(f)
    assert "p.yaml" in str(exc.value) and "is not UTF-8 text" in str(exc.value)
    assert "save the file as UTF-8" in str(exc.value)


def test_a_utf8_bom_is_accepted(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_bytes("run: {name: bom}\n".encode("utf-8-sig"))
    assert load_params(f).run.name == "bom"


def test_a_huge_params_file_is_refused_before_it_is_parsed(tmp_path):
    from stepscope.config import MAX_PARAMS_BYTES

    f = tmp_path / "p.yaml"
    with open(f, "w") as fh:  # 200 MB in the probe; just past the limit is enough to test the refusal
        fh.write("run: {name: x}\n# " + "x" * MAX_PARAMS_BYTES + "\n")
    with pytest.raises(ParamsError) as exc:
        load_params(f)
    assert "over the 1,048,576-byte limit for a params file" in str(exc.value)
