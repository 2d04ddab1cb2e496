"""Architecture reading and decode-step arithmetic, checked against docs/methods.md#architectures."""

from __future__ import annotations

import json

import pytest

from stepscope.errors import StepscopeError
from stepscope.model import (
    calls_per_step,
    decode_weight_bytes,
    distinct_experts,
    expected_collectives,
    explain_collectives,
    gemm_bytes,
    gemm_flops,
    gemm_shapes,
    hidden_vector_bytes,
    load_architecture,
)

KIMI_TEXT = {
    "model_type": "kimi_k2", "num_hidden_layers": 61, "first_k_dense_replace": 1, "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 384,
    "num_experts_per_tok": 8, "n_shared_experts": 1, "num_attention_heads": 64, "num_key_value_heads": 64,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "vocab_size": 163840, "moe_layer_freq": 1, "tie_word_embeddings": False,
}


def write(tmp_path, cfg, name="config.json"):
    p = tmp_path / name
    p.write_text(json.dumps(cfg))
    return p


def row(df, gemm):
    r = df[df.gemm == gemm]
    assert len(r) == 1, gemm
    return r.iloc[0]


def test_kimi_routed_expert_shapes_at_tp8_match_published_figures():
    shapes = gemm_shapes(load_architecture(preset="kimi-k2.5"), 8)
    gu, down = row(shapes, "expert_gate_up"), row(shapes, "expert_down")
    assert (gu.k, gu.n) == (7168, 512)
    assert (down.k, down.n) == (256, 7168)
    per_expert_mb = (gu.weight_bytes_4p5bit + down.weight_bytes_4p5bit) / 1e6
    assert per_expert_mb == pytest.approx(3.1, abs=0.01)
    assert gu.layers == 60 and gu.count_per_layer == 8


def test_kimi_mla_and_replicated_projections():
    shapes = gemm_shapes(load_architecture(preset="kimi-k2.5"), 8)
    assert row(shapes, "q_a_proj").replicated and row(shapes, "kv_a_proj_with_mqa").replicated
    assert (row(shapes, "q_a_proj").k, row(shapes, "q_a_proj").n) == (7168, 1536)
    assert row(shapes, "kv_a_proj_with_mqa").n == 512 + 64
    assert row(shapes, "q_b_proj").n == 64 // 8 * 192
    assert (row(shapes, "o_proj").k, row(shapes, "o_proj").n) == (8 * 128, 7168)
    assert row(shapes, "mla_w_uk").batch == 8
    assert (row(shapes, "gate_up_proj").n, row(shapes, "gate_up_proj").layers) == (2 * 18432 // 8, 1)
    assert row(shapes, "shared_down_proj").k == 256
    assert row(shapes, "lm_head").n == 163840 // 8
    assert not row(shapes, "o_proj").replicated


def test_kimi_k25_config_under_text_config_reads_like_the_preset(tmp_path):
    p = write(tmp_path, {"model_type": "kimi_k25", "text_config": KIMI_TEXT, "vision_config": {}})
    a = load_architecture(p)
    b = load_architecture(preset="kimi-k2.5")
    for f in ("n_layers", "n_dense_layers", "hidden", "vocab", "heads", "intermediate", "n_routed_experts",
              "top_k", "shared_intermediate", "moe_intermediate", "q_lora_rank", "kv_lora_rank", "v_head_dim"):
        assert getattr(a, f) == getattr(b, f), f
    assert a.family == "deepseek_v3" and a.model_type == "kimi_k25"
    # a model folder works as well as the file
    assert load_architecture(tmp_path).n_layers == 61


def test_deepseek_v3_preset_facts():
    a = load_architecture(preset="deepseek-v3")
    assert (a.n_layers, a.n_dense_layers, a.n_routed_experts, a.heads, a.vocab) == (61, 3, 256, 128, 129280)
    assert row(gemm_shapes(a, 8), "q_b_proj").n == 128 // 8 * 192


def test_collectives_2l_plus_1():
    a = load_architecture(preset="kimi-k2.5")
    assert expected_collectives(a, 8) == {"all_reduce": 123, "all_gather": 1}
    assert expected_collectives(a, 1) == {"all_reduce": 0, "all_gather": 0}
    text = explain_collectives(a, 8)
    assert "123" in text and "VocabParallelEmbedding" in text and "RMSNorm" in text
    assert hidden_vector_bytes(a, 1, 2) == 14336


def test_distinct_experts_formula():
    assert float(distinct_experts(384, 8, 1)) == pytest.approx(8.0)
    assert float(distinct_experts(384, 8, 8)) == pytest.approx(60, abs=1)
    assert float(distinct_experts(384, 8, 64)) == pytest.approx(284, abs=1)


def test_calls_per_step_and_weight_bytes():
    a = load_architecture(preset="kimi-k2.5")
    c = calls_per_step(gemm_shapes(a, 8), 8, a)
    gu = row(c, "expert_gate_up")
    assert gu.calls_per_step == pytest.approx(59.52 * 60, rel=1e-3)
    assert gu.m_rows == pytest.approx(8 * 8 / 59.52, rel=1e-3)
    assert row(c, "o_proj").calls_per_step == 61 and row(c, "o_proj").m_rows == 8
    wb = decode_weight_bytes(a, 8, [1, 64], quant_scope="routed_experts")
    routed = wb[wb.layer_kind == "routed_expert"].set_index("m").weight_bytes
    per_expert = 2064384 + 1032192
    assert routed[1] == pytest.approx(8 * 60 * per_expert)
    assert routed[64] == pytest.approx(float(distinct_experts(384, 8, 64)) * 60 * per_expert)


def test_gemm_formulas():
    assert gemm_flops(2, 3, 5) == 60
    # W4A16 g=32 at M=1: N·K/2 + 2·N·K/32 + 2·K + 2·N
    n, k = 512, 7168
    assert gemm_bytes(1, n, k, weight_bits=4, group_size=32) == n * k / 2 + 2 * n * k / 32 + 2 * k + 2 * n
    assert gemm_bytes(4, n, k, weight_bits=16) == 2 * n * k + 2 * 4 * k + 2 * 4 * n
    assert gemm_bytes(1, n, k, weight_bits=32, act_bytes=4) == 4 * n * k + 4 * k + 4 * n


@pytest.mark.parametrize("cfg,family,checks", [
    ({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
      "num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": 2048, "tie_word_embeddings": False},
     "llama", {"qkv_proj": (128, (2 + 2 * 1) * 32), "down_proj": (128, 128)}),
    ({"model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
      "num_key_value_heads": 4, "head_dim": 64, "intermediate_size": 256, "vocab_size": 1000},
     "qwen3", {"qkv_proj": (128, (2 + 2 * 2) * 64), "o_proj": (128, 128)}),
    ({"model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
      "num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": 1000, "num_local_experts": 8,
      "num_experts_per_tok": 2},
     "mixtral", {"expert_gate_up": (128, 256), "gate": (128, 8)}),
    ({"model_type": "qwen2_moe", "num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
      "num_key_value_heads": 4, "intermediate_size": 512, "moe_intermediate_size": 64, "num_experts": 16,
      "num_experts_per_tok": 4, "shared_expert_intermediate_size": 256, "vocab_size": 1000},
     "qwen2_moe", {"shared_gate_up_proj": (128, 256), "expert_down": (32, 128)}),
    ({"model_type": "gpt_oss", "num_hidden_layers": 2, "hidden_size": 2880, "num_attention_heads": 64,
      "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880, "num_local_experts": 32,
      "num_experts_per_tok": 4, "vocab_size": 201088},
     "gpt_oss", {"expert_gate_up": (2880, 2880), "qkv_proj": (2880, (32 + 2 * 4) * 64)}),
    ({"model_type": "deepseek_v2", "num_hidden_layers": 27, "first_k_dense_replace": 1, "hidden_size": 2048,
      "intermediate_size": 10944, "moe_intermediate_size": 1408, "n_routed_experts": 64, "n_shared_experts": 2,
      "num_experts_per_tok": 6, "num_attention_heads": 16, "q_lora_rank": None, "kv_lora_rank": 512,
      "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 102400},
     "deepseek_v2", {"q_proj": (2048, 8 * 192), "shared_gate_up_proj": (2048, 2 * 2816 // 2)}),
])
def test_families_at_tp2(tmp_path, cfg, family, checks):
    a = load_architecture(write(tmp_path, cfg))
    assert a.family == family
    shapes = gemm_shapes(a, 2)
    for gemm, (k, n) in checks.items():
        r = row(shapes, gemm)
        assert (r.k, r.n) == (k, n), gemm
    assert expected_collectives(a, 2)["all_reduce"] == 2 * cfg["num_hidden_layers"] + 1


def test_errors_name_the_file_and_the_options(tmp_path):
    with pytest.raises(StepscopeError) as e:
        load_architecture(tmp_path / "nope.json")
    assert "nope.json" in str(e.value) and "kimi-k2.5" in str(e.value)
    with pytest.raises(StepscopeError) as e:
        load_architecture(preset="kimi-k3")
    assert "kimi-k2.5" in str(e.value) and "deepseek-v3" in str(e.value)
    p = write(tmp_path, {"model_type": "bert", "num_hidden_layers": 2})
    with pytest.raises(StepscopeError) as e:
        load_architecture(p)
    assert "bert" in str(e.value) and str(p) in str(e.value) and "deepseek_v3" in str(e.value)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(StepscopeError, match="not valid JSON"):
        load_architecture(bad)
    with pytest.raises(StepscopeError, match="divisible"):
        gemm_shapes(load_architecture(preset="kimi-k2.5"), 3)
    with pytest.raises(StepscopeError, match="no architecture"):
        load_architecture()
