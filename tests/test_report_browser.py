"""report.html in a real browser: every image decodes and nothing is fetched from the network.

Headless Debian `chromium`, driven over the DevTools protocol (`tests/browser.py`): the page's
own `naturalWidth` is read with Runtime.evaluate, and every request the page makes is seen.
"""

from __future__ import annotations

import pytest

from browser import CHROMIUM, run_browser
from stepscope.report.build import build_report
from stepscope.testing.synthetic import make_synthetic_run

pytestmark = pytest.mark.slow


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (setup: apt-get install -y chromium)")
def test_report_html_renders_in_headless_chromium(tmp_path):
    run = make_synthetic_run(tmp_path / "run")
    paths = build_report(run)
    shot = tmp_path / "report_screenshot.png"
    images, requests = run_browser(paths["html"], tmp_path, shot)
    n_figures = len([k for k in paths if k.startswith("figure_")])
    assert len(images) == n_figures >= 8
    assert all(i["complete"] and i["w"] > 0 and i["h"] > 0 for i in images), images
    assert all(i["src"].startswith("data:image/png;base64,") for i in images)
    # Only the report file itself may be requested: nothing over the network, not even localhost.
    assert requests and all(u.startswith(("file://", "data:")) for u in requests), requests
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (setup: apt-get install -y chromium)")
def test_report_html_with_missing_stages_renders(tmp_path):
    run = make_synthetic_run(tmp_path / "run", stages=("05_categorize",))
    paths = build_report(run)
    images, requests = run_browser(paths["html"], tmp_path, tmp_path / "partial.png")
    assert images and all(i["w"] > 0 for i in images)
    assert all(u.startswith(("file://", "data:")) for u in requests)
