"""The SGLang command line stepscope builds, checked against SGLang's own flag set.

SGLang does not install here, so its flags are data: read from
`python/sglang/srt/server_args.py` of sgl-project/sglang at commit
001067fffe33427bee0ed2f007fb7551a1d76b44 (main, 2026; the file carries no version
string). There every `ServerArgs` field becomes `--field-name` (plus its `aliases`),
booleans are store-true switches, and deprecated flags are registered by hand at the
end of `add_cli_args`. The parser below is rebuilt from that data; it allows
abbreviations as SGLang's `argparse.ArgumentParser` does, which is why stepscope's
flags must also be spelled out in full.
"""

from __future__ import annotations

import argparse

import pytest

from stepscope.config import deep_merge, load_params, params_from_dict, params_to_dict
from stepscope.paths import REPO_ROOT
from stepscope.serve.launch import build_server_command

SGLANG_REPO = "sgl-project/sglang"
SGLANG_COMMIT = "001067fffe33427bee0ed2f007fb7551a1d76b44"
SGLANG_FILE = "python/sglang/srt/server_args.py"

# flag -> (dest, takes a value, choices or None). Aliases share their field's dest.
SGLANG_FLAGS: dict[str, tuple[str, bool, tuple[str, ...] | None]] = {
    "--model-path": ("model_path", True, None),
    "--model": ("model_path", True, None),
    "--host": ("host", True, None),
    "--port": ("port", True, None),
    "--tp-size": ("tp_size", True, None),
    "--tensor-parallel-size": ("tp_size", True, None),
    "--dtype": ("dtype", True, ("auto", "half", "float16", "bfloat16", "float", "float32")),
    "--served-model-name": ("served_model_name", True, None),
    "--context-length": ("context_length", True, None),
    "--trust-remote-code": ("trust_remote_code", False, None),
    "--mem-fraction-static": ("mem_fraction_static", True, None),
    "--disable-custom-all-reduce": ("disable_custom_all_reduce", False, None),
    "--speculative-algorithm": ("speculative_algorithm", True, None),
    "--speculative-draft-model-path": ("speculative_draft_model_path", True, None),
    "--speculative-num-steps": ("speculative_num_steps", True, None),
    "--speculative-eagle-topk": ("speculative_eagle_topk", True, None),
    "--speculative-num-draft-tokens": ("speculative_num_draft_tokens", True, None),
    "--cuda-graph-backend-decode": ("cuda_graph_backend_decode", True, ("full", "breakable", "tc_piecewise",
                                                                         "disabled")),
    "--cuda-graph-backend-prefill": ("cuda_graph_backend_prefill", True, ("full", "breakable", "tc_piecewise",
                                                                           "disabled")),
    # Registered by hand as deprecated (DeprecatedStoreTrueAction: warns, still works).
    "--disable-cuda-graph": ("disable_cuda_graph", False, None),
}
SGLANG_DEPRECATED = {"--disable-cuda-graph": "--cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled"}
# Deprecated flags stepscope still emits on purpose, and why.
KNOWN_DEPRECATED_USES = {"--disable-cuda-graph": "server.enforce_eager; the replacement is unknown to SGLang < 2026"}
# SGLang reads the profiler's output folder from the environment (sglang.srt.environ).
SGLANG_ENV = {"SGLANG_TORCH_PROFILER_DIR"}

KIMI = REPO_ROOT / "params" / "kimi-k25-int4-tp8-pcie.yaml"
# server.extra_args are engine-specific: the Kimi params carry vLLM's; SGLang's equivalents.
SGLANG_EXTRA = ["--trust-remote-code", "--mem-fraction-static", "0.92"]
SPEC_EAGLE3 = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/models/Kimi-K2.5-eagle3",
               "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def sglang_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sglang serve")
    for dest in dict.fromkeys(d for d, _, _ in SGLANG_FLAGS.values()):
        flags = [f for f, (d, _, _) in SGLANG_FLAGS.items() if d == dest]
        _, value, choices = SGLANG_FLAGS[flags[0]]
        if value:
            p.add_argument(*flags, dest=dest, choices=choices)
        else:
            p.add_argument(*flags, dest=dest, action="store_true")
    return p


def sglang_command(tmp_path, **server_over):
    over = {"engine": "sglang", "extra_args": SGLANG_EXTRA, **server_over}
    params = params_from_dict(deep_merge(params_to_dict(load_params(KIMI)), {"server": over}))
    return build_server_command(params, tmp_path)


def check(argv: list[str]):
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    args = argv[3:]
    flags = {a.split("=", 1)[0] for a in args if a.startswith("--")}
    unknown = flags - set(SGLANG_FLAGS)
    assert not unknown, f"not SGLang flags at {SGLANG_COMMIT[:8]} (or abbreviated): {sorted(unknown)}"
    deprecated = (flags & set(SGLANG_DEPRECATED)) - set(KNOWN_DEPRECATED_USES)
    assert not deprecated, {f: SGLANG_DEPRECATED[f] for f in deprecated}
    return sglang_parser().parse_args(args), flags


def test_kimi_sglang_argv(tmp_path):
    cmd = sglang_command(tmp_path)
    ns, flags = check(cmd.argv)
    assert ns.model_path == "/models/Kimi-K2.5-INT4"
    assert ns.tp_size == "8" and ns.dtype == "bfloat16" and ns.context_length == "32768"
    assert ns.served_model_name == "kimi-k2.5"
    assert (ns.host, ns.port) == ("127.0.0.1", "8000")
    assert ns.trust_remote_code is True and ns.mem_fraction_static == "0.92"
    assert ns.disable_cuda_graph is False and "--disable-cuda-graph" not in flags
    assert set(cmd.env) & SGLANG_ENV == {"SGLANG_TORCH_PROFILER_DIR"}
    assert cmd.env["SGLANG_TORCH_PROFILER_DIR"] == str(cmd.profiler_dir)


def test_eager_uses_the_known_deprecated_switch(tmp_path):
    ns, flags = check(sglang_command(tmp_path, enforce_eager=True).argv)
    assert ns.disable_cuda_graph is True
    assert flags & set(SGLANG_DEPRECATED) == set(KNOWN_DEPRECATED_USES)


def test_speculative_and_custom_all_reduce_variant(tmp_path):
    cmd = sglang_command(tmp_path, extra_args=SGLANG_EXTRA + SPEC_EAGLE3 + ["--disable-custom-all-reduce"])
    ns, _ = check(cmd.argv)
    assert (ns.speculative_algorithm, ns.speculative_num_steps, ns.speculative_eagle_topk,
            ns.speculative_num_draft_tokens) == ("EAGLE3", "3", "1", "4")
    assert ns.disable_custom_all_reduce is True


@pytest.mark.parametrize("bad", [["--tp", "8"], ["--gpu-memory-utilization", "0.9"], ["--dtype", "bf16"]])
def test_the_check_refuses_abbreviations_vllm_flags_and_bad_values(tmp_path, bad):
    argv = sglang_command(tmp_path, extra_args=bad).argv
    with pytest.raises((AssertionError, SystemExit)):
        check(argv)
