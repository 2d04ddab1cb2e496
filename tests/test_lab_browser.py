"""The step explorer in JupyterLab, in a real browser.

`stepscope analyze` writes a run from the real TP=2 traces; `start_lab` (what `stepscope lab
RUN` runs) serves its executed notebooks; headless Debian Chromium, driven by Playwright's
Python package (no browser download: `executable_path`), opens 06_writeup, runs every cell
from JupyterLab's Run menu, and changes the explorer's selections. The widget must render
from JupyterLab's own widget extension (installed with ipywidgets, nothing built) and each
selection must change what it shows.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TP2 = ["vllm-cpu-tinyllama-tp2-rank0.pt.trace.json.gz", "vllm-cpu-tinyllama-tp2-rank1.pt.trace.json.gz"]
RUN_ALL_S = 240_000
"""ms: the kernel's start, the report's build and the explorer's first render, on 2 busy cores."""


def _dropdown(page, label: str):
    return page.locator(f".widget-dropdown:has(label:text-is('{label}')) select").last


def _explorer_output(page):
    """The explorer's table area (the step's categories, the top names)."""
    return page.locator(".widget-vbox .widget-output").first


def _timeline_output(page):
    """The explorer's timeline area (the image, and the events in its time window)."""
    return page.locator(".widget-vbox .widget-output").last


def _step_box(page):
    """The "go to step" box beside the step slider."""
    return page.locator(".widget-text:has(label:text-is('go to step')) input").last


@pytest.fixture(scope="module")
def lab(real_traces, tmp_path_factory):
    from stepscope.cli import main
    from stepscope.lab import start_lab

    tmp = tmp_path_factory.mktemp("lab")
    run = tmp / "analyze-tp2"
    assert main(["analyze", *[str(real_traces / n) for n in TP2], "--tp", "2", "--out", str(run),
                 "--no-progress"]) == 0
    # JupyterLab's per-user state (settings, workspaces, runtime files) stays in tmp.
    env = {"JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "ws"),
           "JUPYTER_RUNTIME_DIR": str(tmp / "runtime")}
    server = start_lab(run, env=env, log_path=tmp / "lab.log")
    yield server
    server.stop()
    assert server.proc.poll() is not None


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM:
        pytest.fail("chromium not found: `bash .ci/setup` installs Debian's chromium")
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


def test_explorer_renders_and_follows_its_selections(lab, browser, tmp_path):
    assert lab.host == "127.0.0.1" and lab.url.startswith("http://127.0.0.1:")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{lab.base_url}/lab/tree/notebooks/06_writeup.ipynb?token={lab.token}")
    page.locator(".jp-Notebook").wait_for(timeout=60_000)
    page.locator("#jp-main-statusbar :text-matches('Idle')").first.wait_for(timeout=60_000)

    page.locator(".lm-MenuBar-itemLabel:text-is('Run')").click()
    page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click()
    for label in ("rank", "steps", "category"):
        _dropdown(page, label).wait_for(timeout=RUN_ALL_S)
    out, timeline = _explorer_output(page), _timeline_output(page)
    timeline.locator("img").first.wait_for(timeout=60_000)
    page.locator(".widget-vbox").last.screenshot(path=str(tmp_path / "explorer.png"))
    assert "union_us" in out.inner_text()  # the per-category table of the step
    assert "In the window" in timeline.inner_text() and "category" in timeline.inner_text()  # events, for hover
    assert page.locator(".widget-hslider:has(label:text-is('step'))").count() == 1  # a slider, not a dropdown
    assert page.locator(".widget-hslider:has(label:text-is('window µs'))").count() == 1
    assert _dropdown(page, "rank").locator("option").all_inner_texts() == ["0", "1"]
    first_img = timeline.locator("img").first.get_attribute("src")

    # A category: its top kernels in this step appear under the table.
    categories = _dropdown(page, "category").locator("option").all_inner_texts()
    assert "all_reduce" in categories and categories[0] == "(all)"
    assert "top kernels in this step" not in out.inner_text()
    _dropdown(page, "category").select_option("all_reduce")
    out.locator("text=top kernels in this step").wait_for(timeout=60_000)
    assert "all_reduce" in out.inner_text()

    # Another step, typed into the box: loaded from the rank's trace, drawn as a different timeline.
    import pandas as pd

    steps = pd.read_csv(lab.root / "05_categorize" / "steps.csv")
    decode = [int(s) for s in steps[(steps["rank"] == 0) & (steps["label"] == "decode")]["step_id"]]
    box = _step_box(page)
    current = int(box.input_value())
    other = next(s for s in decode if s != current)
    box.fill(str(other))
    box.press("Enter")
    step_img = _wait_for_new_image(page, timeline, first_img, "the step")
    assert int(box.input_value()) == other

    # Another rank: its trace is drawn.
    _dropdown(page, "rank").select_option("1")
    _wait_for_new_image(page, timeline, step_img, "the rank")
    assert not errors, errors
    # JupyterLab never asked whether to fetch news (its toast would say "official Jupyter news").
    assert page.locator(".Toastify__toast").filter(has_text="news").count() == 0
    assert "official Jupyter news" not in page.content()


def _wait_for_new_image(page, out, old_src: str, what: str, timeout_s: float = 120.0) -> str:
    deadline = time.monotonic() + timeout_s
    while out.locator("img").count() == 0 or out.locator("img").first.get_attribute("src") == old_src:
        assert time.monotonic() < deadline, f"the timeline did not change with {what}"
        page.wait_for_timeout(250)
    return out.locator("img").first.get_attribute("src")
