"""GPU telemetry during sweep levels (stepscope.sweep.gpu_telemetry): the absent path on any
machine, the real NVML path on a GPU box (`gpu`)."""

from __future__ import annotations

import math
import time

import pandas as pd
import pytest

from stepscope import schema
from stepscope.sweep import gpu_telemetry as gt


def test_without_nvml_the_level_records_why_and_nothing_else(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name, *a, **kw):  # the CPU install has no nvidia-ml-py; make sure of it here
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    got = gt.Sampler("c0001").stop()
    assert got == {"available": False, "reason": got["reason"], "rows": []}
    assert "nvidia-ml-py" in got["reason"]
    assert all(math.isnan(v) for v in gt.level_columns({"gpu_samples": got}).values())
    info = gt.write_artifacts(tmp_path, [{"level": "c0001", "gpu_samples": got}])
    assert not (tmp_path / "gpu_telemetry.csv").exists()
    on_disk = schema.read(tmp_path / "gpu_telemetry.json", schema.GpuTelemetryInfo)
    assert (on_disk.available, on_disk.reason, info["n_samples"]) == (False, got["reason"], 0)
    assert gt.Sampler("c0001", enabled=False).stop()["reason"] == "sweep.gpu_telemetry is false"


def _rows(level, gpu, clocks, used=50_000.0, total=80_000.0):
    return [{"level": level, "gpu": gpu, "t_s": 0.5 * i, "sm_clock_mhz": c, "mem_clock_mhz": 2600.0,
             "power_w": 300.0 + i, "temperature_c": 60.0, "memory_used_mib": used, "memory_total_mib": total,
             "gpu_util_pct": 90.0, "mem_util_pct": 40.0} for i, c in enumerate(clocks)]


def test_a_throttled_clock_and_a_full_memory_are_flagged_per_level():
    steady = {"gpu_samples": {"rows": _rows("c0001", 0, [1980, 1965, 1980]) + _rows("c0001", 1, [1980, 1950, 1970])}}
    throttled = {"gpu_samples": {"rows": _rows("c0008", 0, [1980, 1500, 1600]) + _rows("c0008", 1, [1980] * 3)}}
    full = {"gpu_samples": {"rows": _rows("c0064", 0, [1980] * 3, used=79_500.0)}}
    cols = {name: gt.level_columns(m) for name, m in (("c0001", steady), ("c0008", throttled), ("c0064", full))}
    assert cols["c0001"]["gpu_sm_clock_drop_share"] == pytest.approx(1 - 1950 / 1980)
    assert cols["c0008"]["gpu_sm_clock_drop_share"] == pytest.approx(1 - 1500 / 1980)
    assert cols["c0064"]["gpu_memory_used_share_max"] == pytest.approx(79_500 / 80_000)
    assert cols["c0001"]["gpu_power_w_max"] == 302.0
    levels = pd.DataFrame([{"level": k, **v} for k, v in cols.items()])
    flags = gt.level_flags(levels)
    assert len(flags) == 2
    assert flags[0].startswith("level c0008: a GPU's SM clock fell 24% below its own maximum")
    assert flags[1].startswith("level c0064: a GPU's memory was 99.4% full")


def test_samples_from_the_levels_become_one_typed_table(tmp_path):
    metas = [{"gpu_samples": {"available": True, "reason": None, "rows": _rows("c0001", 0, [1980, 1970])}},
             {"gpu_samples": {"available": True, "reason": None, "rows": _rows("c0002", 0, [1980, 1960])}}]
    info = gt.write_artifacts(tmp_path, metas)
    t = schema.check_frame(pd.read_csv(tmp_path / "gpu_telemetry.csv"), schema.GpuTelemetryRow, "gpu_telemetry.csv")
    assert list(t["level"]) == ["c0001", "c0001", "c0002", "c0002"] and info["n_gpus"] == 1
    assert info["available"] is True and info["reason"] is None


@pytest.mark.gpu
def test_nvml_samples_every_gpu_about_every_half_second():
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed (pip install -e '.[gpu]')")
    s = gt.Sampler("c0001")
    time.sleep(1.3)
    got = s.stop()
    assert got["available"], got["reason"]
    t = pd.DataFrame(got["rows"])
    per_gpu = t.groupby("gpu").size()
    assert (per_gpu >= 3).all()  # at 0, 0.5 and 1.0 s
    assert (t["sm_clock_mhz"] > 0).all() and (t["memory_total_mib"] > t["memory_used_mib"]).all()
    assert t["power_w"].between(1, 2000).all() and t["temperature_c"].between(0, 110).all()
    assert 0.4 < t.groupby("gpu")["t_s"].diff().dropna().median() < 0.7
