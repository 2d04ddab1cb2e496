"""`runfolder.save_figures`: one forked child per idle core renders its round-robin share of
the figures; the files must be the ones a serial save writes, and a failing child must cost
nothing."""

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


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("idle, n_children", [(1, 1), (3, 3), (9, 4)])  # 5 figures: at most 4 children
def test_parallel_save_writes_the_serial_bytes(tmp_path, monkeypatch, idle, n_children):
    monkeypatch.setattr(runfolder, "_idle_cores", lambda: idle)
    forks = []
    real_fork = runfolder._fork_saver
    monkeypatch.setattr(runfolder, "_fork_saver", lambda jobs: forks.append(len(jobs)) or real_fork(jobs))
    before = set(plt.get_fignums())  # another test may have left a figure open
    forked = _save(tmp_path, "forked")
    assert len(forks) == n_children and sum(forks) == 5 - -(-5 // (n_children + 1))  # this process keeps the first share
    assert set(plt.get_fignums()) <= before  # every figure closed, the child's share too
    serial = _save(tmp_path, "serial", monkeypatch, serial=True)
    assert list(forked) == [f"fig{i}.png" for i in range(5)]  # returned in the order given
    assert forked == serial and all(len(b) > 1000 for b in forked.values())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_failing_child_share_is_rendered_here(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(runfolder, "_idle_cores", lambda: 1)
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


@pytest.mark.parametrize("cores, load, idle", [(2, 0.6, 1), (2, 1.4, 1), (2, 1.6, 0), (2, 5.0, 0),
                                               (16, 1.0, 15), (16, 0.0, 15), (16, 12.2, 4), (1, 0.0, 0)])
def test_idle_cores_from_the_load_average(monkeypatch, cores, load, idle):
    monkeypatch.setattr(runfolder, "_cores", lambda: cores)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert runfolder._idle_cores() == idle


def test_no_fork_inside_a_jupyter_kernel(tmp_path, monkeypatch):
    # A kernel's ZMQ and channel threads make fork unsafe: render here, whatever the idle cores.
    import types

    import IPython

    monkeypatch.setattr(runfolder, "_idle_cores", lambda: 3)
    monkeypatch.setattr(IPython, "get_ipython", lambda: types.SimpleNamespace(kernel=object()))
    forked = []
    monkeypatch.setattr(runfolder, "_fork_saver", lambda share: forked.append(share))
    paths = runfolder.save_figures(_figures(), tmp_path)
    assert forked == [] and all(p.is_file() for p in paths)
