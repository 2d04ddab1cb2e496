"""compare_runs: side by side, differences, ratios, and the noise criterion."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from stepscope.report import compare_runs
from stepscope.testing.synthetic import make_synthetic_run
from stepscope.report.compare import NOISE_REL


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmp")
    a = make_synthetic_run(root / "baseline")
    b = make_synthetic_run(root / "variant", scale=0.8)
    return compare_runs(a, b, root / "out")


def test_category_ratios_and_flags(compared):
    cats = pd.read_csv(compared["csv_decode_categories"]).set_index("category")
    # every device time in the variant is 0.8x the baseline's
    assert cats["ratio_b_over_a"].to_numpy() == pytest.approx(0.8)
    assert cats.loc["all_reduce", "a"] == pytest.approx(5.5)
    assert cats.loc["all_reduce", "diff"] == pytest.approx(-1.1)
    assert cats["beyond_noise"].all()


def test_collective_counts_unchanged_are_not_flagged(compared):
    coll = pd.read_csv(compared["csv_collectives"]).set_index("collective")
    assert coll.loc["all_reduce", "a"] == coll.loc["all_reduce", "b"] == 123
    assert coll.loc["all_reduce", "ratio_b_over_a"] == pytest.approx(1.0)
    assert not coll["beyond_noise"].any()


def test_macro_and_headlines(compared):
    macro = pd.read_csv(compared["csv_macro"])
    tput = macro[macro["metric"] == "output_throughput_tok_s"].set_index("level")
    assert tput.loc["c=4", "ratio_b_over_a"] == pytest.approx(1.25)
    head = pd.read_csv(compared["csv_headlines"]).set_index("metric")
    assert head.loc["knee_concurrency", "ratio_b_over_a"] == pytest.approx(1.0)
    assert not head.loc["knee_concurrency", "beyond_noise"]
    assert head.loc["decode span_ms", "ratio_b_over_a"] == pytest.approx(0.8)


def test_markdown_and_html(compared):
    md = compared["markdown"].read_text()
    assert f"|B/A − 1| > {100 * NOISE_REL:g} %" in md
    assert "| all_reduce | 5.50 | 4.40 | -1.10 | 0.800× | **changed** |" in md
    assert "| all_reduce | 123 | 123 | 0 | 1.000× | no |" in md
    html = compared["html"].read_text()
    assert "<script" not in html and not re.search(r"""(src|href)=["']?(https?:)?//""", html)
    assert re.search(r'<img[^>]*src="data:image/png;base64,', html)


def test_small_change_is_within_noise(tmp_path):
    a = make_synthetic_run(tmp_path / "a")
    b = make_synthetic_run(tmp_path / "b", scale=1.03)
    out = compare_runs(a, b, tmp_path / "out")
    cats = pd.read_csv(out["csv_decode_categories"])
    assert cats["ratio_b_over_a"].to_numpy() == pytest.approx(1.03)
    assert not cats["beyond_noise"].any()
    assert "None: every compared quantity is within noise." in out["markdown"].read_text()


def test_compare_with_a_missing_stage(tmp_path):
    a = make_synthetic_run(tmp_path / "a")
    b = make_synthetic_run(tmp_path / "b", stages=("05_categorize",))
    out = compare_runs(a, b)
    md = out["markdown"].read_text()
    assert "Not measured" in md and "Sweep comparison" in md
    assert out["markdown"].parent == b / "06_writeup" / "compare_vs_a"


def test_compare_names_the_traces_steps_and_warns_across_kinds(tmp_path, real_traces):
    from stepscope.trace import analyze_traces

    def run(name: str, trace: str) -> Path:
        d = tmp_path / name
        analyze_traces([real_traces / trace], d / "05_categorize", progress=False, perfetto=False)
        return d

    a, b = run("a", "hta-a100-ddp-nccl.json.gz"), run("b", "hta-a100-ddp-nccl.json.gz")
    md = compare_runs(a, b)["markdown"].read_text()
    assert "## Per-category time per training step (ms)" in md and "## Collectives per training step" in md
    assert "per decode step" not in md and "Different kinds of trace" not in md
    c = run("c", "sglang-mi300x-qwen3-8b-decode.json.gz")
    md = compare_runs(a, c)["markdown"].read_text()
    assert "A is a training trace and B a decode trace" in md
