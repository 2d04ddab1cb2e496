"""`runfolder.save_figures`: with a second core a forked child renders every other figure;
the files must be the ones a serial save writes, and a failing child must cost nothing."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from stepscope import runfolder  # noqa: E402


def _figures() -> dict:
    figs = {}
    for i in range(5):
        fig, ax = plt.subplots(figsize=(4, 3), layout="constrained")
        ax.plot(range(10), [x * (i + 1) for x in range(10)], label=f"line {i}")
        ax.set_title(f"figure {i} (count: 10 points, unit: none)")
        ax.legend()
        figs[f"fig{i}"] = fig
    return figs


def _save(tmp_path, name, monkeypatch=None, serial=False):
    if serial:
        monkeypatch.setattr(runfolder, "_fork_saver", lambda jobs: None)
    paths = runfolder.save_figures(_figures(), tmp_path / name)
    return {p.name: p.read_bytes() for p in paths}


@pytest.mark.skipif(not hasattr(os, "fork") or runfolder._cores() < 2, reason="needs fork and two cores")
def test_parallel_save_writes_the_serial_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(runfolder, "_spare_core", lambda: True)
    before = set(plt.get_fignums())  # another test may have left a figure open
    forked = _save(tmp_path, "forked")
    assert set(plt.get_fignums()) <= before  # every figure closed, the child's share too
    serial = _save(tmp_path, "serial", monkeypatch, serial=True)
    assert list(forked) == [f"fig{i}.png" for i in range(5)]  # returned in the order given
    assert forked == serial and all(len(b) > 1000 for b in forked.values())


@pytest.mark.skipif(not hasattr(os, "fork") or runfolder._cores() < 2, reason="needs fork and two cores")
def test_failing_child_share_is_rendered_here(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(runfolder, "_spare_core", lambda: True)
    figs = _figures()
    parent = os.getpid()
    real = figs["fig1"].savefig  # fig1 is the child's (every other one, from the second)

    def fails_in_child(*a, **kw):
        if os.getpid() != parent:
            raise RuntimeError("child cannot render")
        return real(*a, **kw)

    figs["fig1"].savefig = fails_in_child
    with caplog.at_level("WARNING", logger="stepscope.runfolder"):
        paths = runfolder.save_figures(figs, tmp_path)
    assert [p.name for p in paths] == [f"fig{i}.png" for i in range(5)]
    assert all(p.stat().st_size > 1000 for p in paths)
    assert "rendering its figures here" in caplog.text
