"""The known-device peak table: matched from real traces' deviceProperties, never guessed."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.hardware import KNOWN_DEVICES, device_from_trace, lookup_device
from stepscope.trace.load import load_rank


@pytest.mark.parametrize("trace, key, bw, tflops, how", [
    ("hf-h100-qwen1.5-0.5b-eager.json.gz", "h100-sxm", 3350.0, 989.5, "name"),
    # Meta's A100 board is named by part number; its 40 GB settles the variant.
    ("hta-a100-ddp-nccl.json.gz", "a100-40gb", 1555.0, 312.0, "name + memory size"),
    ("sglang-mi300x-qwen3-8b-decode.json.gz", "mi300x", 5300.0, 1307.4, "name"),
    # This ROCm trace leaves the name empty: gfx 9.4, 304 CUs and 192 GB are an MI300X.
    ("vllm-mi300x-gptoss-decode-fullgraph.json.gz", "mi300x", 5300.0, 1307.4,
     "properties (gfx 9.4, 304 CUs, 192 GB)"),
])
def test_real_traces_devices(real_traces: Path, trace, key, bw, tflops, how):
    rt = load_rank(real_traces / trace, allow_no_rank=True)
    m = lookup_device(rt.meta["device_name"], rt.meta["device_properties"])
    assert m.known and m.device.key == key and m.matched_by == how
    d = m.as_dict()
    assert (d["peak_mem_bw_gbps"], d["peak_tflops"], d["known"]) == (bw, tflops, True)


def test_cpu_trace_is_unknown(real_traces: Path):
    rt = load_rank(real_traces / "vllm-cpu-tinyllama-tp2-rank0.pt.trace.json.gz")
    m = lookup_device(rt.meta["device_name"], rt.meta["device_properties"])
    assert not m.known and m.as_dict() == {
        "name": "unknown", "trace_name": None, "peak_mem_bw_gbps": None, "peak_tflops": None,
        "known": False, "matched_by": "unknown: the trace names no device", "source": None}
    assert device_from_trace({}).matched_by.startswith("unknown: no deviceProperties")


@pytest.mark.parametrize("name, key, bw, tflops", [
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "rtx-pro-6000-ws", 1792.0, 503.8),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000-server", 1597.0, None),
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "rtx-pro-6000-maxq", 1792.0, None),
    ("NVIDIA H100 PCIe", "h100-pcie", 2000.0, 756.5),
    ("NVIDIA H100 NVL", "h100-nvl", 3900.0, 835.5),
    ("NVIDIA H200", "h200-sxm", 4800.0, 989.5),
    ("NVIDIA H200 NVL", "h200-nvl", 4800.0, 835.5),
    ("NVIDIA B200", "b200", 7700.0, 2250.0),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb-sxm", 2039.0, 312.0),
    ("NVIDIA A100 80GB PCIe", "a100-80gb-pcie", 1935.0, 312.0),
    ("NVIDIA A100-PCIE-40GB", "a100-40gb", 1555.0, 312.0),
    ("NVIDIA L40S", "l40s", 864.0, 362.05),
    ("AMD Instinct MI300X", "mi300x", 5300.0, 1307.4),
])
def test_names_the_drivers_report(name, key, bw, tflops):
    m = lookup_device(name)
    assert m.device.key == key and (m.device.mem_bw_gbps, m.device.bf16_dense_tflops) == (bw, tflops)


@pytest.mark.parametrize("name, props", [
    ("NVIDIA RTX PRO 6000 Blackwell", None),    # which edition? they differ by 11 % in bandwidth
    ("NVIDIA GB200", None),                     # not a B200 (another TDP and clock)
    ("NVIDIA GeForce RTX 4090", None),
    ("NVIDIA H100", None),                      # SXM, PCIe or NVL?
    ("NVIDIA A100-PG509-210", {"totalGlobalMem": 85899345920}),  # 80 GB, form factor unknown
    ("", {"computeMajor": 9, "computeMinor": 4, "numSms": 304, "totalGlobalMem": 274877906944}),
])
def test_unknown_is_said_never_guessed(name, props):
    m = lookup_device(name, props)
    assert not m.known and m.matched_by.startswith("unknown")
    assert m.as_dict()["peak_mem_bw_gbps"] is None and m.as_dict()["peak_tflops"] is None


def test_every_entry_names_its_source():
    assert len({d.key for d in KNOWN_DEVICES}) == len(KNOWN_DEVICES)
    assert all("datasheet" in d.source or "specifications" in d.source or "data sheet" in d.source
               for d in KNOWN_DEVICES)


def test_docs_table_matches_the_code():
    # docs/hardware.md states every figure; a change in one without the other fails here.
    doc = (Path(__file__).resolve().parents[1] / "docs" / "hardware.md").read_text()

    def fmt(x):
        return "unknown" if x is None else f"{x:,.2f}".rstrip("0").rstrip(".")

    for d in KNOWN_DEVICES:
        assert f"| `{d.key}` | {d.name} | {fmt(d.mem_bw_gbps)} | {fmt(d.bf16_dense_tflops)} | {d.source} |" in doc
