"""Time by module and levers that say what they are (issue 23, items 4 and 6), on real traces:
the module tree from `nn.Module:` frames, each category's top kernels and module, grab-bags."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from stepscope import schema
from stepscope.thresholds import LEVER_DOMINANT_SHARE, LEVER_GRAB_BAG_MIN_NAMES
from stepscope.trace.analyze import analyze_traces
from stepscope.trace.modules import module_paths
from stepscope.trace.plots import stage_figures

HF = "hf-h100-qwen1.5-0.5b-eager.json.gz"
MLP = "Qwen2Model/Qwen2DecoderLayer/Qwen2MLP"


@pytest.fixture(scope="module")
def hf(real_traces: Path, tmp_path_factory) -> tuple:
    out = tmp_path_factory.mktemp("hf")
    return analyze_traces([real_traces / HF], out, progress=False, perfetto=False), out


def test_module_paths_tell_gate_up_down_apart_and_add_up_the_layers(hf):
    an, out = hf
    m = pd.read_csv(out / "modules.csv")
    schema.check_frame(m, schema.ModuleRow, "modules.csv")
    rows = m.set_index("path")
    # 24 decoder layers in one row; the MLP's three Linear children by call order
    # (gate_proj, up_proj, down_proj in transformers' Qwen2MLP.forward).
    assert rows.loc["Qwen2Model/Qwen2DecoderLayer", "n_instances"] == 24
    for k, ms in ((0, 2.0473), (1, 2.0080), (2, 1.8353)):
        r = rows.loc[f"{MLP}/Linear#{k}"]
        assert r["self_ms_per_step"] == pytest.approx(ms, abs=1e-4)
        assert r["calls_per_step"] == 48 and r["top_category"] == "dense_gemm"
    # q, k, v and o projections: four Linear children of the attention module
    assert {p for p in rows.index if p.startswith("Qwen2Model/Qwen2DecoderLayer/Qwen2Attention/Linear#")} == {
        f"Qwen2Model/Qwen2DecoderLayer/Qwen2Attention/Linear#{k}" for k in range(4)}
    # inclusive time adds up: the MLP holds its own work and its children's
    kids = rows.loc[[p for p in rows.index if p.startswith(MLP + "/")], "sum_ms_per_step"].sum()
    assert rows.loc[MLP, "sum_ms_per_step"] == pytest.approx(kids + rows.loc[MLP, "self_ms_per_step"], abs=1e-9)
    # the root holds every kernel launched inside a module frame: here all of the pass
    assert rows.loc["Qwen2Model", "share_of_device"] == pytest.approx(1.0, abs=1e-6)


def test_a_trace_without_module_frames_has_an_empty_module_table(real_traces: Path, tmp_path: Path):
    an = analyze_traces([real_traces / "vllm-cpu-tinyllama-tp1-nostack-rank0.pt.trace.json.gz"], tmp_path,
                        progress=False, perfetto=False)
    assert an.modules.empty and list(pd.read_csv(tmp_path / "modules.csv").columns)[:2] == ["rank", "path"]
    assert "05_module_time_rank0" not in stage_figures(an)


def test_vllm_module_classes_name_the_layers(real_traces: Path):
    """vLLM's linear classes say their role (QKVParallelLinear, RowParallelLinear); gpt-oss's
    experts run under FusedMoE: 7.67 ms of the 888-token step's summed device work."""
    from stepscope.trace.load import load_rank

    rt = load_rank(real_traces / "tracelens-b200-gptoss-tp8-rank0.json.gz", allow_no_rank=True)
    paths = set(module_paths(rt.events).values())
    assert "GptOssForCausalLM/TransformerBlock/OAIAttention/QKVParallelLinear" in paths
    assert "GptOssForCausalLM/TransformerBlock/MLPBlock/FusedMoE" in paths


def test_each_lever_names_its_kernels_and_module(hf):
    an, out = hf
    lv = pd.read_csv(out / "category_levers.csv")
    schema.check_frame(lv, schema.CategoryLeverRow, "category_levers.csv")
    rot = lv.set_index("category").loc["rotary"]
    assert rot["module"] == "Qwen2Model/Qwen2DecoderLayer/Qwen2Attention"
    assert rot["n_names"] == 11 and rot["coherent"]
    assert rot["top_kernels"].count(" | ") == 2 and "%)" in rot["top_kernels"]
    k = pd.read_csv(out / "category_kernels.csv")
    assert set(k.loc[k["category"] == "activation", "module"]) == {f"{MLP}/SiLU"}
    ref = an.summary.ranks[0].levers
    assert [r.category for r in ref] == lv["category"].tolist()


def test_a_grab_bag_is_marked_as_no_lever(real_traces: Path, tmp_path: Path):
    """The sampled HTA training rank 0: elementwise is 88 distinct kernels, its largest three
    holding 36.8 % of its time; no one fix reaches that, so it is not one lever."""
    an = analyze_traces([real_traces / "hta-sampled-rank-0.json.gz"], tmp_path, progress=False, perfetto=False)
    lv = an.category_levers.set_index("category")
    el = lv.loc["elementwise"]
    assert el["n_names"] == 88 and el["top_share"] == pytest.approx(0.368, abs=5e-4)
    assert el["n_names"] >= LEVER_GRAB_BAG_MIN_NAMES and el["top_share"] < LEVER_DOMINANT_SHARE
    assert not el["coherent"] and "grab-bag" in el["why"]
    assert lv.loc["all_to_all", "coherent"]  # its kernels run inside nccl:all_to_all


def test_module_figure_states_unit_count_and_method(hf):
    an, _ = hf
    fig = stage_figures(an)["05_module_time_rank0"]
    ax = fig.axes[0]
    assert "ms per prefill step" in ax.get_xlabel() and "summed kernel durations" in ax.get_xlabel()
    assert "1 prefill step" in ax.get_title() and "15 paths" in ax.get_title()
    assert ax.get_yticklabels()[-1].get_text() == "Qwen2DecoderLayer/Qwen2Attention"


def test_a_stall_is_named_by_the_host_frame_it_lies_in(real_traces: Path, tmp_path: Path):
    """OWLv2 on H100: four 122-126 ms gaps in the device work, each inside a DataLoader's
    `__next__` (which covers 99.6 % of the gap; the copies on either side only bound it)."""
    an = analyze_traces([real_traces / "tracelens-h100-owlv2-dataloader.json.gz"], tmp_path, progress=False,
                        perfetto=False)
    nxt = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    gap = an.summary.decode.largest_gap
    assert gap.dur_ms == pytest.approx(126.054, abs=1e-3) and gap.macro
    assert gap.host_frame == nxt and gap.host_call is None
    assert gap.after == "memcpy: Memcpy HtoD (Pageable -> Device)"
    steps = pd.read_csv(tmp_path / "steps.csv")
    assert steps["gap_host_frame"].tolist() == [nxt]
    assert an.period_table().set_index("reading").loc["largest gap: inside host frame", "value"] == nxt


def test_activation_checkpoint_recompute_is_set_apart(real_traces: Path, tmp_path: Path):
    """ResNet DDP with activation checkpointing (MI300X): the backward pass reruns the
    checkpointed blocks' forward inside `torch/utils/checkpoint.py: recompute_fn`. An
    independent pass over the raw JSON (device events whose launch lies in one of the 12
    recompute_fn frames on its thread) finds 615 events, 1.4033 ms per step."""
    an = analyze_traces([real_traces / "tracelens-mi300x-resnet-ddp-rank0.json.gz"], tmp_path, progress=False,
                        perfetto=False)
    w = an.reference.work
    assert int(w["recompute"].sum()) == 615
    lv = an.category_levers.set_index("category")
    assert lv["recompute_ms_per_step"].sum() == pytest.approx(1.4033, abs=1e-4)
    assert lv.loc["conv", "recompute_ms_per_step"] == pytest.approx(0.743, abs=1e-3)
    assert lv.loc["all_reduce", "recompute_ms_per_step"] == 0.0
    m = pd.read_csv(tmp_path / "modules.csv").set_index("path")
    ckpt = "DistributedDataParallel/ResNet/CheckpointWrapper"
    assert m.loc[ckpt, "recompute_ms_per_step"] == pytest.approx(1.4033, abs=1e-4)
    assert m.loc["DistributedDataParallel/ResNet/Linear", "recompute_ms_per_step"] == 0.0


def test_a_vision_models_attention_softmax_is_its_largest_lever(real_traces: Path, tmp_path: Path):
    """OWLv2's eager attention: by name its softmax (`cunn_SoftMaxForward`) made elementwise
    the largest category (284 ms of the pass); inside `Owlv2Attention` it is attention, 271 ms,
    and elementwise falls to 12.5 ms."""
    an = analyze_traces([real_traces / "tracelens-h100-owlv2-dataloader.json.gz"], tmp_path, progress=False,
                        perfetto=False)
    lv = an.category_levers.set_index("category")
    assert lv.index[0] == "attention" and lv.loc["attention", "sum_ms_per_step"] == pytest.approx(271.380, abs=1e-3)
    assert lv.loc["attention", "module"].endswith("Owlv2EncoderLayer/Owlv2Attention")
    assert lv.loc["elementwise", "sum_ms_per_step"] == pytest.approx(12.528, abs=1e-3)


def test_the_reports_kernel_table_names_each_kernels_module(hf):
    """One cuBLAS kernel serves every Linear of the model: the module that holds most of its
    time is shown with that share, so a reader does not take it for the kernel's only home."""
    from stepscope.report.build import _category_kernels

    an, out = hf
    k = pd.read_csv(out / "category_kernels.csv")
    gemm = k[k["category"] == "dense_gemm"].iloc[0]
    assert gemm["module"] == f"{MLP}/Linear#0" and gemm["module_share"] == pytest.approx(0.229, abs=5e-4)
    text = _category_kernels(k, pd.read_csv(out / "decode_categories.csv"), {"mode": "gpu"})
    assert "| module |" in text and "Qwen2MLP/Linear#0 (23 %)" in text
    assert "Qwen2DecoderLayer/Qwen2RMSNorm#0 (49 %)" in text
