"""Params validation: every bad input stops the run with a message naming file, key and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.config import (
    REDACTED,
    Params,
    iter_leaf_keys,
    params_to_dict,
    load_params,
    params_from_dict,
    redact,
    redact_argv,
)
from stepscope.errors import ParamsError

SHIPPED = ["cpu-demo", "smoke", "kimi-k25-int4-tp8-pcie", "cpu-campaign", "kimi-k25-int4-tp8-campaign"]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_params_validate(repo_root, name):
    params = load_params(repo_root / "params" / f"{name}.yaml")
    assert isinstance(params, Params)
    assert params.run.name == name


def test_kimi_campaign_params_match_the_campaign(repo_root):
    p = load_params(repo_root / "params" / "kimi-k25-int4-tp8-pcie.yaml")
    assert p.server.tp == 8
    assert p.model.arch_preset == "kimi-k2.5"
    assert (p.capture.requests, p.capture.output_len) == (5, 32)
    assert p.server.host == "127.0.0.1"
    assert p.server.profiler.with_stack is False


def _write(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "p.yaml"
    f.write_text(text)
    return f


def _error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ParamsError) as exc:
        load_params(_write(tmp_path, text))
    return str(exc.value)


def test_unknown_key_names_file_path_and_nearest_key(tmp_path):
    msg = _error(tmp_path, "run: {name: x}\nsweep:\n  concurency: [1, 2]\n")
    assert "p.yaml" in msg
    assert "sweep.concurency" in msg
    assert "unknown key" in msg
    assert "did you mean 'concurrency'" in msg


def test_nested_unknown_key_has_full_path(tmp_path):
    msg = _error(tmp_path, "run: {name: x}\nserver:\n  profiler: {with_stacks: false}\n")
    assert "server.profiler.with_stacks" in msg
    assert "'with_stack'" in msg


def test_wrong_type_says_what_was_expected(tmp_path):
    msg = _error(tmp_path, "run: {name: x}\nserver: {tp: two}\n")
    assert "server.tp" in msg and "expected an integer" in msg and "'two'" in msg


def test_bool_is_not_an_integer(tmp_path):
    msg = _error(tmp_path, "run: {name: x}\nserver: {port: true}\n")
    assert "server.port" in msg and "expected an integer" in msg


def test_missing_required_value(tmp_path):
    msg = _error(tmp_path, "server: {tp: 2}\n")
    assert "run" in msg and "missing required value" in msg


def test_yaml_scientific_notation_trap_is_caught(tmp_path):
    # PyYAML reads 1e-3 as the string "1e-3"; a float field must refuse it, and say how to write it.
    msg = _error(tmp_path, "run: {name: x}\nsweep: {knee_gain: 1e-3}\n")
    assert "sweep.knee_gain" in msg
    assert "the string '1e-3'" in msg
    assert "1.0e-3" in msg


def test_literal_choice_suggests_nearest(tmp_path):
    msg = _error(tmp_path, "run: {name: x}\nserver: {mode: lanuch}\n")
    assert "server.mode" in msg and "'launch'" in msg


def test_list_expected_not_scalar(tmp_path):
    msg = _error(tmp_path, "run: {name: x}\nsweep: {concurrency: 4}\n")
    assert "sweep.concurrency" in msg and "a list of an integer" in msg


def test_list_item_error_has_index(tmp_path):
    msg = _error(tmp_path, "run: {name: x}\nsweep: {concurrency: [1, x]}\n")
    assert "sweep.concurrency[1]" in msg


def test_invalid_yaml_names_line(tmp_path):
    msg = _error(tmp_path, "run: {name: x\nsweep: [\n")
    assert "p.yaml:" in msg and "not valid YAML" in msg


def test_missing_file(tmp_path):
    with pytest.raises(ParamsError, match="params file not found"):
        load_params(tmp_path / "nope.yaml")


def test_env_values_must_be_quoted_strings(tmp_path):
    msg = _error(tmp_path, "run: {name: x}\nserver: {env: {FOO: [1]}}\n")
    assert "server.env.FOO" in msg


def test_params_are_frozen_and_lists_become_tuples():
    p = params_from_dict({"run": {"name": "x"}, "sweep": {"concurrency": [1, 2]}})
    assert p.sweep.concurrency == (1, 2)
    with pytest.raises(Exception):
        p.sweep.concurrency = (3,)  # type: ignore[misc]


def test_int_accepted_for_float():
    p = params_from_dict({"run": {"name": "x"}, "sweep": {"knee_gain": 1}})
    assert p.sweep.knee_gain == 1.0 and isinstance(p.sweep.knee_gain, float)


def test_redaction_by_key_name():
    out = redact({"server": {"env": {"HF_TOKEN": "hf_abc", "VLLM_HOST_IP": "127.0.0.1"}},
                  "api_key": "sk-1"})
    assert out["server"]["env"]["HF_TOKEN"] == REDACTED
    assert out["server"]["env"]["VLLM_HOST_IP"] == "127.0.0.1"
    assert out["api_key"] == REDACTED


def test_redaction_spares_counts_paths_and_variable_names():
    params = {"writeup": {"verify_extra_tokens": 1}, "sweep": {"max_tokens": 32},
              "server": {"api_key_env": "VLLM_API_KEY",
                         "env": {"HF_TOKEN": "hf_x", "ACCESS_TOKEN": "a", "OPENAI_KEY": "k",
                                 "MY_SECRET_VALUE": "s", "TOKENIZERS_PARALLELISM": "false"}}}
    out = redact(params)
    assert out["writeup"]["verify_extra_tokens"] == 1
    assert out["sweep"]["max_tokens"] == 32
    assert out["server"]["api_key_env"] == "VLLM_API_KEY"
    env = out["server"]["env"]
    assert env["TOKENIZERS_PARALLELISM"] == "false"
    assert {env[k] for k in ("HF_TOKEN", "ACCESS_TOKEN", "OPENAI_KEY", "MY_SECRET_VALUE")} == {REDACTED}


def test_snapshot_of_every_shipped_params_file_still_validates(repo_root):
    # The redacted snapshot is what a re-run of a stage reads: it must stay valid params.
    for name in SHIPPED:
        p = load_params(repo_root / "params" / f"{name}.yaml")
        params_from_dict(redact(params_to_dict(p)))


def test_argv_redaction():
    argv = ["vllm", "--api-key", "sk-secret", "--hf-token=hf_x", "--port", "8000"]
    assert redact_argv(argv) == ["vllm", "--api-key", REDACTED, f"--hf-token={REDACTED}", "--port", "8000"]


def test_leaf_keys_cover_nested_sections():
    keys = iter_leaf_keys()
    assert "server.profiler.with_stack" in keys
    assert "micro.gemm.m_values" in keys
    assert "analysis.extra_rules" in keys


def test_the_params_table_matches_the_schema(repo_root):
    from stepscope.config import schema_reference_markdown

    page = (repo_root / "docs" / "params.md").read_text()
    table = page.split("<!-- PARAMS-TABLE:BEGIN -->\n", 1)[1].split("<!-- PARAMS-TABLE:END -->", 1)[0]
    assert table.strip() == schema_reference_markdown().strip(), \
        "docs/params.md is stale: regenerate it with `python -m stepscope.config`"


def test_the_documented_command_rewrites_the_table_with_its_docs(repo_root, tmp_path):
    """Run as `python -m`, the module is __main__: the docs must still be found (they once were not)."""
    import subprocess
    import sys

    page = tmp_path / "params.md"
    page.write_text((repo_root / "docs" / "params.md").read_text())
    subprocess.run([sys.executable, "-m", "stepscope.config", str(page)], check=True, timeout=120)
    assert page.read_text() == (repo_root / "docs" / "params.md").read_text()
    assert "| `run.name` | a string | `required` | Run-id prefix;" in page.read_text()


# --------------------------------------------------------------------------- campaign variants

_CAMPAIGN = """run: {name: c}
server: {tp: 2, extra_args: [--block-size, "32"], env: {A: "1"}}
campaign:
  baseline: tp2
  variants:
    - name: tp1
      overrides: {server: {tp: 1}}
"""


def test_campaign_variants_validate_and_merge(tmp_path):
    from stepscope.config import variant_params_dict

    text = _CAMPAIGN + "    - name: spec\n      overrides: {server: {env: {B: \"2\"}}, capture: {output_len: 96}}\n"
    p = load_params(_write(tmp_path, text))
    assert p.campaign.baseline == "tp2"
    assert [v.name for v in p.campaign.variants] == ["tp1", "spec"]
    import yaml

    merged = params_from_dict(variant_params_dict(yaml.safe_load(text), p.campaign.variants[1]))
    # mappings merge key by key (env gains B, keeps A); untouched sections stay the baseline's
    assert merged.server.env == {"A": "1", "B": "2"}
    assert merged.capture.output_len == 96 and merged.server.tp == 2
    assert merged.server.extra_args == ("--block-size", "32") and merged.campaign is None


@pytest.mark.parametrize("override, path, words", [
    ("{server: {tpp: 1}}", "campaign.variants[1:bad].overrides.server.tpp", "did you mean 'tp'"),
    ("{server: {profiler: {with_stacks: true}}}", "campaign.variants[1:bad].overrides.server.profiler.with_stacks",
     "unknown key"),
    ("{server: {tp: one}}", "campaign.variants[1:bad].overrides.server.tp", "expected an integer"),
    ("{run: {name: y}}", "campaign.variants[1:bad].overrides.run", "cannot override 'run'"),
    ("[1]", "campaign.variants[1:bad].overrides", "expected a mapping"),
])
def test_bad_variant_override_names_variant_and_key_path(tmp_path, override, path, words):
    msg = _error(tmp_path, _CAMPAIGN + f"    - name: bad\n      overrides: {override}\n")
    assert path in msg and words in msg and "p.yaml" in msg


def test_variant_names_must_be_unique_and_folder_safe(tmp_path):
    assert "used twice" in _error(tmp_path, _CAMPAIGN + "    - name: tp2\n")
    assert "cannot name a folder" in _error(tmp_path, _CAMPAIGN + "    - name: a/b\n")


# --------------------------------------------------------------------------- msgspec decoding


def test_what_the_hand_written_coercer_accepted_msgspec_accepts_too():
    """msgspec is strict; the two leniencies params files rely on are kept: an integer
    written as a float, and numbers in server.env (a variable's value is text)."""
    p = params_from_dict({"run": {"name": "x"}, "server": {"port": 8001.0, "env": {"SPACE": 4, "R": 2.5, 3: "x"}},
                          "sweep": {"concurrency": [1.0, 2]}})
    assert p.server.port == 8001 and isinstance(p.server.port, int)
    assert p.server.env == {"SPACE": "4", "R": "2.5", "3": "x"}
    assert p.sweep.concurrency == (1, 2) and all(isinstance(c, int) for c in p.sweep.concurrency)


def test_a_fractional_integer_and_a_yaml_set_are_still_refused(tmp_path):
    assert "server.port: expected an integer, got 8001.5" in _error(tmp_path, "run: {name: x}\nserver: {port: 8001.5}\n")
    msg = _error(tmp_path, "run: {name: x}\nsweep: {concurrency: !!set {1: null}}\n")
    assert "sweep.concurrency: expected a list of an integer, got {1}" in msg


def test_errors_inside_list_items_and_sections_keep_their_key_paths(tmp_path):
    msg = _error(tmp_path, "run: {name: x}\nanalysis: {extra_rules: [{category: a}]}\n")
    assert "analysis.extra_rules[0].pattern: missing required value (a string)" in msg
    assert "add 'pattern:' under 'analysis.extra_rules[0]'" in msg
    msg = _error(tmp_path, "run: {name: x}\nmodel: {tiny: 5}\n")
    assert "model.tiny: expected a mapping (section), got int 5" in msg
    msg = _error(tmp_path, _CAMPAIGN + "    - name: bad\n      description: 5\n")
    assert "campaign.variants[1:bad].description: expected a string, got 5" in msg
