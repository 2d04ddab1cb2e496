"""Figures name steps the way the report does: a training or prefill trace's figures never
say "decode step", and one step is "1 ... step", not "1 ... steps"."""

from __future__ import annotations

import pytest

from stepscope.report import build_report
from stepscope.runfolder import save_figures
from stepscope.trace import analyze_traces
from stepscope.trace.plots import stage_figures
from stepscope.wording import plural, step_label, with_article


def _texts(fig) -> str:
    return " ".join(t for ax in fig.axes for t in (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()))


@pytest.mark.parametrize("trace, label, n_steps", [
    ("hta-a100-ddp-nccl.json.gz", "training step", 3),
    ("hf-h100-qwen1.5-0.5b-eager.json.gz", "prefill step", 1),
    ("sglang-mi300x-qwen3-8b-decode.json.gz", "decode step", 1)])
def test_stage_and_report_figures_name_the_traces_steps(tmp_path, monkeypatch, real_traces, trace, label,
                                                        n_steps):
    run = tmp_path / "run"
    an = analyze_traces([real_traces / trace], run / "05_categorize", progress=False, perfetto=False)
    figs = stage_figures(an)
    said = " | ".join(_texts(f) for f in figs.values())
    assert f"each of {n_steps} {plural(label, n_steps)}" in said
    assert f"Timeline of one {label}" in said
    if label != "decode step":
        assert "decode" not in said
    save_figures(figs, run)
    drawn: dict = {}
    import stepscope.report.build as build

    monkeypatch.setattr(build, "save_figures", lambda figures, run_dir: drawn.update(figures) or [])
    build_report(run)
    report_said = {name: _texts(f) for name, f in drawn.items()}
    assert {"step_category_shares.png", "step_amdahl_ceiling_by_category.png"} <= set(report_said)
    assert f"({n_steps} {plural(label, n_steps)}, mean" in report_said["step_category_shares.png"]
    assert f"{label} speed-up" in report_said["step_amdahl_ceiling_by_category.png"]
    if label != "decode step":
        assert not any("decode" in t for t in report_said.values()), report_said
    # File names (and the alt text the report derives from them) are kind-neutral.
    assert not any("decode" in name for name in list(figs) + list(drawn)), list(figs) + list(drawn)


def test_step_label_and_plural():
    assert step_label("training") == "training step" and step_label(None) == "step"
    assert step_label("profiler_step") == "step"  # not a kind: a plain step
    assert plural("decode step", 1) == "decode step" and plural("decode step", 3) == "decode steps"
    assert plural("step", None) == "steps"


def test_with_article():
    # the BERT encoder's caveat read "this is a encoder trace"
    assert [with_article(k) for k in ("encoder", "unknown", "vision", "diffusion")] == \
        ["an encoder", "an unknown", "a vision", "a diffusion"]
