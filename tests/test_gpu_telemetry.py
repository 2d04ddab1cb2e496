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


def _no_pynvml(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name, *a, **kw):
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)


def test_the_capture_records_why_there_is_no_telemetry_and_nothing_else_changes(tmp_path, monkeypatch):
    """Stage 04 samples the profiled window (batch 1 and a load level c<C>/); without NVML its
    gpu_telemetry.json says why, no csv is written, and the capture is whole."""
    from stepscope.capture import capture_profile
    from stepscope.capture_load import capture_load_level
    from stepscope.config import CaptureParams, SweepParams
    from stepscope.sweep.client import ServerInfo
    from stepscope.testing.fake_server import FakeBehaviour, FakeServer

    _no_pynvml(monkeypatch)
    pdir, stage = tmp_path / "prof", tmp_path / "04_profiler_capture"
    pdir.mkdir()
    cap = CaptureParams(warmup_requests=0, requests=2, input_len=4, output_len=4, wait_timeout_s=5,
                        load_window_s=0.3)
    sweep = SweepParams(input_len=4, output_len=40, warmup_requests=0)
    with FakeServer(FakeBehaviour(profiler_dir=str(pdir), tp=1, chunk_delay_s=0.01)) as fake:
        server = ServerInfo(base_url=fake.base_url, served_model="fake", engine="vllm", tp=1,
                            engine_version="0.32.0", profiler_dir=str(pdir))
        res = capture_profile(server, cap, stage)
        window = capture_load_level(server, cap, sweep, 2, stage)
    assert res.manifest["ranks_found"] == [0] and window["concurrency"] == 2
    for where in (stage, stage / "c2"):
        info = schema.read(where / "gpu_telemetry.json", schema.GpuTelemetryInfo)
        assert (info.available, info.n_samples, info.n_gpus) == (False, 0, 0)
        assert "nvidia-ml-py" in info.reason
        assert not (where / "gpu_telemetry.csv").exists()
    assert (stage / "c2" / "manifest.json").is_file() and (stage / "capture_latency.json").is_file()


def test_a_capture_with_samples_writes_them_as_a_typed_table(tmp_path, monkeypatch):
    """The same path with NVML's readings stood in by rows (a GPU cannot run here): the
    capture's window becomes gpu_telemetry.csv under the stage's folder."""
    got = {"available": True, "reason": None, "rows": _rows("capture", 0, [1980, 1975, 1980])}

    class _Sampler:  # a fake, named as one: what Sampler returns on a GPU box
        def __init__(self, level, enabled=True):
            self.level = level

        def stop(self):
            return {**got, "rows": [{**r, "level": self.level} for r in got["rows"]]}

    monkeypatch.setattr(gt, "Sampler", _Sampler)
    from stepscope.capture import capture_profile
    from stepscope.config import CaptureParams
    from stepscope.sweep.client import ServerInfo
    from stepscope.testing.fake_server import FakeBehaviour, FakeServer

    pdir = tmp_path / "prof"
    pdir.mkdir()
    with FakeServer(FakeBehaviour(profiler_dir=str(pdir), tp=1)) as fake:
        capture_profile(ServerInfo(base_url=fake.base_url, served_model="fake", engine="vllm", tp=1,
                                   engine_version="0.32.0", profiler_dir=str(pdir)),
                        CaptureParams(warmup_requests=0, requests=1, input_len=2, output_len=2, wait_timeout_s=5),
                        tmp_path / "stage")
    t = schema.check_frame(pd.read_csv(tmp_path / "stage" / "gpu_telemetry.csv"), schema.GpuTelemetryRow, "csv")
    assert list(t["level"]) == ["capture"] * 3 and list(t["sm_clock_mhz"]) == [1980, 1975, 1980]
    assert schema.read(tmp_path / "stage" / "gpu_telemetry.json", schema.GpuTelemetryInfo).n_gpus == 1
