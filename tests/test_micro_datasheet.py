"""The datasheet-predicted decode step (issue 22, item 5): its parts checked by hand for the
Kimi preset, and docs/methods.md holding exactly what the documented command prints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.micro import datasheet as ds
from stepscope.model import get_preset

REPO = Path(__file__).resolve().parents[1]
KIMI = "params/kimi-k25-int4-tp8-pcie.yaml"


def test_the_parts_of_the_kimi_step_by_hand():
    arch = get_preset("kimi-k2.5")
    (one, big) = ds.datasheet_curve(arch, 8, [1, 128], peak_mem_bw_gbps=1792.0, peak_tflops=503.8,
                                    context_tokens=1152.0, measured_batch1_ms=12.1)
    # 123 all-reduces of [1, 7168] bf16 and one logits all-gather, 55.8 us each + bus bytes at 63 GB/s
    ar = 123 * (55.8e-6 + 7168 * 2 * 2 * 7 / 8 / 63e9) + 55.8e-6 + 163840 * 2 * 7 / 8 / 63e9
    assert one.comm_ms == pytest.approx(1e3 * ar)
    # one request's MLA latent cache: 1152 tokens x 576 x 2 B x 61 layers at 1,792 GB/s
    assert one.attention_kv_ms == pytest.approx(1e3 * 1152 * 576 * 2 * 61 / 1792e9)
    assert big.attention_kv_ms == pytest.approx(128 * one.attention_kv_ms)
    assert one.experts_touched == pytest.approx(8.0) and big.experts_touched == pytest.approx(
        384 * (1 - (1 - 8 / 384) ** 128))
    # at batch 1 every GEMM is bandwidth-bound: its time is the bytes it reads at peak
    assert one.gemm_ms == pytest.approx(1e3 * one.weight_gb * 1e9 / 1792e9, rel=0.01)
    assert one.anchored_step_ms == pytest.approx(12.1) and big.anchored_step_ms > big.bound_step_ms
    assert big.bound_tok_s == pytest.approx(1e3 * 128 / big.bound_step_ms)
    assert big.gemm_ms > big.comm_ms > big.attention_kv_ms  # what the prediction claims grows the step


def test_methods_holds_what_the_command_prints(tmp_path):
    doc = tmp_path / "methods.md"
    text = (REPO / "docs" / "methods.md").read_text()
    head, rest = text.split(ds.BEGIN, 1)
    doc.write_text(head + ds.BEGIN + "\nstale\n" + ds.END + rest.split(ds.END, 1)[1])
    assert ds.main([KIMI, str(doc)]) == 0
    assert doc.read_text() == text, f"docs/methods.md is stale: run `python -m stepscope.micro.datasheet {KIMI} docs/methods.md`"
    assert "| 128 | 358.1 |" in text


def test_no_markers_is_named(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("nothing here\n")
    r = subprocess.run([sys.executable, "-m", "stepscope.micro.datasheet", KIMI, str(doc)], cwd=REPO,
                       capture_output=True, text=True, env={"PYTHONPATH": str(REPO / "lib")})
    assert r.returncode == 1 and "no <!-- datasheet-prediction:begin -->" in r.stderr
