"""Peak memory bandwidth and dense BF16/FP16 tensor throughput of known devices, from vendor datasheets.

Dense rates are the datasheet's dense figure, else `sparse / 2`. An unknown device or an unsettled variant is
`known=False` with its reason, never a guess. The table's sources: docs/hardware.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DevicePeak:
    """One device's ceilings."""

    key: str
    name: str
    mem_bw_gbps: float | None
    """Peak DRAM (HBM/GDDR) bandwidth, GB/s (10^9 bytes/s), as the datasheet prints it."""
    bf16_dense_tflops: float | None
    """Peak dense BF16 (= FP16) tensor-core throughput, TFLOP/s (10^12), FP32 accumulate."""
    source: str


KNOWN_DEVICES: tuple[DevicePeak, ...] = (
    # H100 datasheet: SXM 3.35 TB/s, BF16 1,979 TFLOPS with sparsity.
    DevicePeak("h100-sxm", "NVIDIA H100 SXM5 80GB", 3350.0, 1979 / 2, "NVIDIA H100 datasheet (H100 SXM)"),
    # H100 datasheet: PCIe 2 TB/s, BF16 1,513 TFLOPS with sparsity.
    DevicePeak("h100-pcie", "NVIDIA H100 PCIe 80GB", 2000.0, 1513 / 2, "NVIDIA H100 datasheet (H100 PCIe)"),
    # H100 datasheet: NVL 3.9 TB/s, BF16 1,671 TFLOPS with sparsity.
    DevicePeak("h100-nvl", "NVIDIA H100 NVL 94GB", 3900.0, 1671 / 2, "NVIDIA H100 datasheet (H100 NVL)"),
    # H200 datasheet: SXM 4.8 TB/s, BF16 1,979 TFLOPS with sparsity.
    DevicePeak("h200-sxm", "NVIDIA H200 SXM 141GB", 4800.0, 1979 / 2, "NVIDIA H200 datasheet (H200 SXM)"),
    # H200 datasheet: NVL 4.8 TB/s, BF16 1,671 TFLOPS with sparsity.
    DevicePeak("h200-nvl", "NVIDIA H200 NVL 141GB", 4800.0, 1671 / 2, "NVIDIA H200 datasheet (H200 NVL)"),
    # HGX B200 per GPU: 7.7 TB/s, FP16/BF16 4.5 PFLOPS with sparsity.
    DevicePeak("b200", "NVIDIA B200 (HGX) 180GB", 7700.0, 4500 / 2, "NVIDIA HGX specifications (HGX B200, per GPU)"),
    # A100 datasheet: BF16 312 TFLOPS dense (624 with sparsity) on every A100;
    # 40GB (PCIe and SXM) 1,555 GB/s, 80GB PCIe 1,935 GB/s, 80GB SXM 2,039 GB/s.
    DevicePeak("a100-40gb", "NVIDIA A100 40GB (SXM or PCIe)", 1555.0, 312.0, "NVIDIA A100 datasheet (A100 40GB)"),
    DevicePeak("a100-80gb-pcie", "NVIDIA A100 80GB PCIe", 1935.0, 312.0, "NVIDIA A100 datasheet (A100 80GB PCIe)"),
    DevicePeak("a100-80gb-sxm", "NVIDIA A100 80GB SXM", 2039.0, 312.0, "NVIDIA A100 datasheet (A100 80GB SXM)"),
    # L40S datasheet: 864 GB/s, BF16 tensor 362.05 TFLOPS dense (733 with sparsity).
    DevicePeak("l40s", "NVIDIA L40S", 864.0, 362.05, "NVIDIA L40S datasheet"),
    # RTX PRO 6000 Blackwell Workstation Edition datasheet: 1,792 GB/s. RTX Blackwell
    # architecture whitepaper: FP16/BF16 tensor, FP32 accumulate, 503.8 TFLOPS dense.
    DevicePeak("rtx-pro-6000-ws", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 1792.0, 503.8,
               "NVIDIA RTX PRO 6000 Blackwell Workstation Edition datasheet; RTX Blackwell architecture whitepaper"),
    # Max-Q Workstation Edition datasheet: 1,792 GB/s; no BF16 rate printed.
    DevicePeak("rtx-pro-6000-maxq", "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", 1792.0, None,
               "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition datasheet"),
    # Server Edition datasheet: 1,597 GB/s; no BF16 rate printed.
    DevicePeak("rtx-pro-6000-server", "NVIDIA RTX PRO 6000 Blackwell Server Edition", 1597.0, None,
               "NVIDIA RTX PRO 6000 Blackwell Server Edition datasheet"),
    # MI300X data sheet: 5.3 TB/s; peak BF16 1,307.4 TFLOPS dense (2,614.9 with sparsity).
    DevicePeak("mi300x", "AMD Instinct MI300X", 5300.0, 1307.4, "AMD Instinct MI300X data sheet"),
)
_BY_KEY = {d.key: d for d in KNOWN_DEVICES}

_GIB = 1 << 30


@dataclass(frozen=True)
class DeviceMatch:
    """What the table says about one trace's device."""

    trace_name: str | None
    device: DevicePeak | None
    matched_by: str
    """`name`, `name + memory size`, `properties (...)`, or why it is unknown."""

    @property
    def known(self) -> bool:
        return self.device is not None

    def as_dict(self) -> dict[str, Any]:
        """The `roofline.device` record of stage 05's summary.json."""
        d = self.device
        return {
            "name": d.name if d else (self.trace_name or "unknown"),
            "trace_name": self.trace_name,
            "peak_mem_bw_gbps": d.mem_bw_gbps if d else None,
            "peak_tflops": d.bf16_dense_tflops if d else None,
            "known": self.known,
            "matched_by": self.matched_by,
            "source": d.source if d else None,
        }


def lookup_device(name: str | None, properties: dict[str, Any] | None = None) -> DeviceMatch:
    """Match a device name (and, where the name is silent, its `deviceProperties` entry)."""
    props = properties or {}
    n = (name or "").strip()
    low = n.lower()
    mem_gib = _mem_gib(props.get("totalGlobalMem"))
    if not low:
        return _by_properties(props)
    if "rtx pro 6000" in low and "blackwell" in low:
        if "max-q" in low:
            return _hit(n, "rtx-pro-6000-maxq")
        if "server" in low:
            return _hit(n, "rtx-pro-6000-server")
        if "workstation" in low:
            return _hit(n, "rtx-pro-6000-ws")
        return _miss(n, "RTX PRO 6000 Blackwell without its edition in the name: the Workstation "
                        "(1,792 GB/s) and Server (1,597 GB/s) editions differ")
    if re.search(r"\bh100\b", low):
        if "nvl" in low:
            return _hit(n, "h100-nvl")
        if "pcie" in low:
            return _hit(n, "h100-pcie")
        if "sxm" in low or "hbm3" in low:  # the SXM part reports itself as "H100 80GB HBM3"
            return _hit(n, "h100-sxm")
        return _miss(n, "H100 form factor (SXM, PCIe or NVL) not in the name")
    if re.search(r"\bh200\b", low):
        return _hit(n, "h200-nvl" if "nvl" in low else "h200-sxm")
    if re.search(r"(?<![a-z])b200\b", low):
        return _hit(n, "b200")
    if re.search(r"\ba100\b", low):
        return _a100(n, low, mem_gib)
    if re.search(r"\bl40s\b", low):
        return _hit(n, "l40s")
    if re.search(r"\bmi300x\b", low):
        return _hit(n, "mi300x")
    return _miss(n, "not in stepscope.hardware.KNOWN_DEVICES")


def _a100(n: str, low: str, mem_gib: float | None) -> DeviceMatch:
    size = 80 if "80gb" in low else 40 if "40gb" in low else None
    how = "name"
    if size is None and mem_gib is not None:
        # Boards named by part number (e.g. "A100-PG509-200") carry their size only in memory.
        size = 80 if mem_gib > 60 else 40
        how = "name + memory size"
    if size == 40:
        return _hit(n, "a100-40gb", how)
    if size == 80 and "pcie" in low:
        return _hit(n, "a100-80gb-pcie", how)
    if size == 80 and "sxm" in low:
        return _hit(n, "a100-80gb-sxm", how)
    return _miss(n, "A100 whose size or form factor (SXM or PCIe) the name does not give")


def _by_properties(props: dict[str, Any]) -> DeviceMatch:
    # ROCm traces sometimes carry an empty name. gfx 9.4 with 304 compute units and 192 GB
    # is an MI300X only (MI300A has 228 CUs; MI325X has 256 GB).
    mem = _mem_gib(props.get("totalGlobalMem"))
    if (props.get("computeMajor"), props.get("computeMinor"), props.get("numSms")) == (9, 4, 304) \
            and mem is not None and 180 <= mem <= 200:
        return DeviceMatch(None, _BY_KEY["mi300x"], "properties (gfx 9.4, 304 CUs, 192 GB)")
    return DeviceMatch(None, None, "unknown: the trace names no device")


def _mem_gib(v: Any) -> float | None:
    return v / _GIB if isinstance(v, (int, float)) and v > 0 else None


def _hit(name: str, key: str, how: str = "name") -> DeviceMatch:
    return DeviceMatch(name, _BY_KEY[key], how)


def _miss(name: str, why: str) -> DeviceMatch:
    return DeviceMatch(name, None, f"unknown: {why}")


def device_from_trace(top: dict[str, Any]) -> DeviceMatch:
    """The device of a trace from its top-level metadata (the first `deviceProperties` entry)."""
    dev = top.get("deviceProperties")
    first = dev[0] if isinstance(dev, list) and dev and isinstance(dev[0], dict) else None
    if first is None:
        return DeviceMatch(None, None, "unknown: no deviceProperties (a CPU trace?)")
    return lookup_device(first.get("name"), first)
