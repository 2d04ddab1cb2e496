"""Fingerprints of the demo params, pinned: `--resume` and a campaign's stage reuse compare
hashes of the params a stage reads, and a sweep level is kept only when its recorded identity
matches. A change to how params are built or flattened (dataclasses to msgspec Structs, issue
24) that moved any of these would make every existing run folder re-measure everything.
Re-pinned twice on purpose: `model.tiny.arch` (issue 34) adds `"arch": "llama"` to every tiny model's
plain form, and `sweep.percentiles` (issue 38) adds the chosen percentiles to every sweep's;
without those keys the old hashes come back exactly."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from stepscope.config import deep_merge, load_params, params_from_dict, params_to_dict
from stepscope.runfolder import short_hash
from stepscope.stages import STAGES

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "params" / "cpu-demo.yaml"


def _json_sha(obj) -> str:
    """Key order counts here (params.yaml and run.json are written in field order)."""
    return hashlib.sha256(json.dumps(obj).encode()).hexdigest()[:16]


@pytest.mark.parametrize("name, sha", [
    ("cpu-demo", "3433168b902cb88b"), ("smoke", "2ab88289adef9143"),
    ("kimi-k25-int4-tp8-pcie", "6775e3d2cd240c28"), ("cpu-campaign", "c89e8d6ce7250019"),
    ("kimi-k25-int4-tp8-campaign", "51b841fe3348b958"),
])
def test_the_plain_form_of_each_shipped_params_file_is_unchanged(name, sha):
    assert _json_sha(params_to_dict(load_params(REPO / "params" / f"{name}.yaml"))) == sha


def test_the_campaigns_stage_fingerprints_of_the_demo_are_unchanged():
    from stepscope.campaign.plan import stage_fingerprint

    p = load_params(DEMO)
    assert {s.id: stage_fingerprint(p, s.id) for s in STAGES if stage_fingerprint(p, s.id)} == {
        "02_gemm_micro": "31573d493b71580e", "03_nccl_burst": "20f113b04b5b0684"}


def test_the_runners_params_fingerprints_of_the_demo_are_unchanged():
    from stepscope.runner import input_fingerprints

    p = load_params(DEMO)
    per_stage = {s.id: {k: v for k, v in input_fingerprints(s, p, REPO / "no-such-run").items()
                        if k.startswith("params:")} for s in STAGES}
    assert short_hash(per_stage) == "2f087800efde9dbd"


def test_a_sweep_levels_load_shape_identity_is_unchanged():
    from stepscope.sweep.workloads import load_shape_identity

    over = {"sweep": {"burstiness": 0.5, "prompt_mode": "shared_prefix",
                      "ramp": {"strategy": "exponential", "end_rps": 8},
                      "workload": {"num_prefixes": 2, "prefix_len": 16}}}
    p = params_from_dict(deep_merge(params_to_dict(load_params(DEMO)), over))
    identity = load_shape_identity(p.sweep)
    assert identity["ramp"] == {"strategy": "exponential", "start_rps": 1.0, "end_rps": 8.0, "n_requests": 32}
    assert identity["workload"]["num_prefixes"] == 2 and identity["workload"]["path"] is None
    assert short_hash(identity) == "0942777fe0c3fcc6"
