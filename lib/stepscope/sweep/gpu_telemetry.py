"""GPU telemetry during each sweep level, through NVML (`nvidia-ml-py`).

A background thread samples clocks, power, temperature, memory and utilisation; without NVML the meta says why
and nothing else changes (docs/methods.md#gpu-telemetry).
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd

from stepscope.thresholds import GPU_MEMORY_FULL_SHARE, GPU_THROTTLE_DROP_SHARE

SAMPLE_PERIOD_S = 0.5
"""About AIPerf's default telemetry period; NVML's power reading itself averages over ~1 s."""

ROW_COLUMNS = ["level", "gpu", "t_s", "sm_clock_mhz", "mem_clock_mhz", "power_w", "temperature_c",
               "memory_used_mib", "memory_total_mib", "gpu_util_pct", "mem_util_pct"]

LEVEL_COLUMNS = ["gpu_sm_clock_drop_share", "gpu_memory_used_share_max", "gpu_power_w_max"]
"""levels.csv columns: the largest fall of any GPU's SM clock below its own maximum during
the level (0-1), the fullest GPU memory (0-1), the highest power draw (W)."""


def _nvml():
    """The initialised pynvml module and its device count, or (None, reason)."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py (pynvml) is not installed: pip install -e '.[gpu]'"
    try:
        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:  # no driver, no device
        return None, f"NVML could not start: {exc}"
    if n == 0:
        return None, "NVML found no GPU"
    return (pynvml, n), None


def read_gpus(nvml, n: int, level: str, t_s: float) -> list[dict[str, Any]]:
    """One row per GPU; a reading the device does not support is None, never a guess."""
    rows = []
    for i in range(n):
        h = nvml.nvmlDeviceGetHandleByIndex(i)

        def get(fn, *a, scale: float = 1.0):
            try:
                return float(fn(h, *a)) * scale
            except nvml.NVMLError:
                return None

        try:
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            used, total = mem.used / 2**20, mem.total / 2**20
        except nvml.NVMLError:
            used = total = None
        try:
            u = nvml.nvmlDeviceGetUtilizationRates(h)
            gpu_util, mem_util = float(u.gpu), float(u.memory)
        except nvml.NVMLError:
            gpu_util = mem_util = None
        rows.append({"level": level, "gpu": i, "t_s": t_s,
                     "sm_clock_mhz": get(nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_SM),
                     "mem_clock_mhz": get(nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_MEM),
                     "power_w": get(nvml.nvmlDeviceGetPowerUsage, scale=1e-3),
                     "temperature_c": get(nvml.nvmlDeviceGetTemperature, nvml.NVML_TEMPERATURE_GPU),
                     "memory_used_mib": used, "memory_total_mib": total,
                     "gpu_util_pct": gpu_util, "mem_util_pct": mem_util})
    return rows


class Sampler:
    """Samples every GPU from construction until `stop()`, which returns
    {available, reason, rows}."""

    def __init__(self, level: str, enabled: bool = True, period_s: float = SAMPLE_PERIOD_S):
        self.level, self.rows, self._stop = level, [], threading.Event()
        self.reason: str | None = None
        self._thread = None
        got, self.reason = _nvml() if enabled else (None, "sweep.gpu_telemetry is false")
        if got is None:
            return
        nvml, n = got
        t0 = time.perf_counter()

        def loop() -> None:
            while True:
                self.rows.extend(read_gpus(nvml, n, level, time.perf_counter() - t0))
                if self._stop.wait(period_s):
                    return

        self._thread = threading.Thread(target=loop, name="stepscope-nvml", daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, Any]:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
        return {"available": self._thread is not None, "reason": self.reason, "rows": self.rows}


def level_columns(meta: dict[str, Any]) -> dict[str, float]:
    """The LEVEL_COLUMNS of one level from its meta's `gpu_samples` (NaN without samples)."""
    out = {c: math.nan for c in LEVEL_COLUMNS}
    rows = (meta.get("gpu_samples") or {}).get("rows") or []
    if not rows:
        return out
    t = pd.DataFrame(rows, columns=ROW_COLUMNS)
    for c in ROW_COLUMNS[2:]:
        t[c] = pd.to_numeric(t[c], errors="coerce")
    by = t.groupby("gpu")
    drop = 1 - by["sm_clock_mhz"].min() / by["sm_clock_mhz"].max()
    out["gpu_sm_clock_drop_share"] = float(drop.max()) if drop.notna().any() else math.nan
    share = t["memory_used_mib"] / t["memory_total_mib"]
    out["gpu_memory_used_share_max"] = float(share.max()) if share.notna().any() else math.nan
    out["gpu_power_w_max"] = float(t["power_w"].max()) if t["power_w"].notna().any() else math.nan
    return out


def level_flags(levels: pd.DataFrame) -> list[str]:
    """A throttled SM clock or a full GPU memory, per level, in words."""
    flags = []
    if "gpu_sm_clock_drop_share" not in levels:
        return flags
    for _, r in levels.iterrows():
        if r["gpu_sm_clock_drop_share"] > GPU_THROTTLE_DROP_SHARE:
            flags.append(f"level {r['level']}: a GPU's SM clock fell {r['gpu_sm_clock_drop_share']:.0%} below its "
                         "own maximum during the level (throttling: power, thermal or a clock limit); "
                         "its throughput is low for a reason outside the server")
        if r["gpu_memory_used_share_max"] >= GPU_MEMORY_FULL_SHARE:
            flags.append(f"level {r['level']}: a GPU's memory was {r['gpu_memory_used_share_max']:.1%} full; "
                         "another process may share the GPU, or the server preempts for lack of KV cache")
    return flags


def telemetry_artifacts(metas: list[dict[str, Any]]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """gpu_telemetry.csv (every sample of every level) and gpu_telemetry.json (available,
    reason, n_samples, n_gpus, period_s) from the levels' meta files."""
    rows = [r for m in metas for r in ((m.get("gpu_samples") or {}).get("rows") or [])]
    table = pd.DataFrame(rows, columns=ROW_COLUMNS)
    reasons = [(m.get("gpu_samples") or {}).get("reason") for m in metas if m.get("gpu_samples")]
    available = bool(rows)
    reason = None if available else next((r for r in reasons if r), "no level recorded GPU telemetry")
    return table, {"available": available, "reason": reason, "n_samples": int(len(table)),
                   "n_gpus": int(table["gpu"].nunique()) if len(table) else 0, "period_s": SAMPLE_PERIOD_S}


def write_artifacts(out_dir: str | Path, metas: list[dict[str, Any]]) -> dict[str, Any]:
    """Write gpu_telemetry.csv (only with samples) and gpu_telemetry.json; return the json."""
    from stepscope import schema

    table, info = telemetry_artifacts(metas)
    out_dir = Path(out_dir)
    if len(table):
        schema.write_table(table, out_dir / "gpu_telemetry.csv", schema.GpuTelemetryRow)
    else:
        (out_dir / "gpu_telemetry.csv").unlink(missing_ok=True)
    schema.write(out_dir / "gpu_telemetry.json", info, schema.GpuTelemetryInfo)
    return info
