"""The step explorer's controls (issue 38, item 4): a slider over the steps of the chosen kind
and a box to type a step id (it was a 155-entry dropdown), a time window that zooms the
timeline, and the events in the window listed under it, in place of hover."""

from __future__ import annotations

import pandas as pd
import pytest

from stepscope.report.explorer import step_span_us, window_events
from stepscope.testing.synthetic import make_synthetic_run


def test_the_window_lists_the_events_that_overlap_it_in_start_order():
    ev = pd.DataFrame({"start_us": [1000.0, 1010.0, 1050.0, 1100.0], "dur_us": [5.0, 50.0, 10.0, 20.0],
                       "stream": [7, 7, 13, 7], "category": ["a", "b", "c", "d"], "name": ["k1", "k2", "k3", "k4"]})
    assert step_span_us(ev) == 120.0
    w = window_events(ev, 20.0, 60.0)  # µs since the step's first event
    assert list(w["name"]) == ["k2", "k3"] and list(w["start_us"]) == [10.0, 50.0]
    assert list(window_events(ev, 0.0, 120.0, n=3)["name"]) == ["k1", "k2", "k3"]
    assert window_events(ev, 200.0, 300.0).empty and step_span_us(ev.iloc[:0]) == 0.0


def _widgets(box) -> dict:
    found: dict = {}

    def walk(w):
        if hasattr(w, "children"):
            for c in w.children:
                walk(c)
        if getattr(w, "description", None):
            found[w.description] = w
    walk(box)
    return found


def test_steps_are_chosen_by_slider_or_typed_id_and_the_window_follows_the_step(tmp_path, monkeypatch):
    pytest.importorskip("ipywidgets")
    from stepscope.report import explorer, step_explorer

    monkeypatch.setattr(explorer, "_batch_shell", lambda: False)  # a JupyterLab kernel here
    w = _widgets(step_explorer(make_synthetic_run(tmp_path / "run")))
    step, goto, kind, window = w["step"], w["go to step"], w["steps"], w["window µs"]
    assert type(step).__name__ == "SelectionSlider" and len(step.options) == 155  # the decode steps
    assert step.value == goto.value and step.value in step.options
    decode = set(step.options)
    span = window.max
    assert window.value == (0.0, span) and span > 0
    window.value = (0.0, span / 4)  # zoom: redraws, the span stays the slider's range
    assert window.max == span
    kind.value = "prefill"
    assert len(step.options) == 10 and not decode & set(step.options)
    target = step.options[3]
    goto.value = target  # a typed id of the chosen kind
    assert step.value == target
    goto.value = 10_000  # no such step: the nearest one
    assert step.value == max(step.options) and goto.value == max(step.options)
