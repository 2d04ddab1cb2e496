"""report.html in a real browser: every image decodes and nothing is fetched from the network.

Headless Debian `chromium`, driven over the DevTools protocol (CDP) with aiohttp's websocket
client (already a dependency): the page's own `naturalWidth` is read with Runtime.evaluate,
and every request the page makes is seen through the Network domain's requestWillBeSent.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest

from stepscope.report.build import build_report
from stepscope.testing.synthetic import make_synthetic_run

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run",
                  "--disable-default-apps", "--disable-extensions", "--metrics-recording-only",
                  "--mute-audio", "--remote-debugging-port=0", "--remote-allow-origins=*"]

IMAGES_JS = """JSON.stringify(Array.from(document.images).map(i => ({
  src: i.src.slice(0, 40), complete: i.complete, w: i.naturalWidth, h: i.naturalHeight})))"""


class Cdp:
    """The few DevTools-protocol calls the test needs, on one flattened page session."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse):
        self.ws, self.next_id, self.events, self.session = ws, 0, [], None

    async def call(self, method: str, params: dict | None = None, timeout: float = 30.0) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if self.session and not method.startswith("Target."):
            msg["sessionId"] = self.session
        await self.ws.send_str(json.dumps(msg))
        deadline = time.monotonic() + timeout
        while True:
            raw = await asyncio.wait_for(self.ws.receive(), max(0.1, deadline - time.monotonic()))
            data = json.loads(raw.data)
            if data.get("id") == self.next_id:
                if "error" in data:
                    raise RuntimeError(f"{method}: {data['error']}")
                return data.get("result", {})
            if "method" in data:
                self.events.append(data)

    async def wait_event(self, name: str, timeout: float = 30.0) -> dict:
        for ev in self.events:
            if ev["method"] == name:
                return ev
        deadline = time.monotonic() + timeout
        while True:
            raw = await asyncio.wait_for(self.ws.receive(), max(0.1, deadline - time.monotonic()))
            data = json.loads(raw.data)
            if "method" in data:
                self.events.append(data)
                if data["method"] == name:
                    return data


async def _inspect(ws_url: str, page_url: str, shot: Path) -> tuple[list[dict], list[str]]:
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url, max_msg_size=0) as ws:
        cdp = Cdp(ws)
        target = await cdp.call("Target.createTarget", {"url": "about:blank"})
        att = await cdp.call("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
        cdp.session = att["sessionId"]
        await cdp.call("Network.enable")
        await cdp.call("Page.enable")
        await cdp.call("Emulation.setDeviceMetricsOverride",
                       {"width": 1200, "height": 900, "deviceScaleFactor": 1, "mobile": False})
        await cdp.call("Page.navigate", {"url": page_url})
        await cdp.wait_event("Page.loadEventFired")
        res = await cdp.call("Runtime.evaluate", {"expression": IMAGES_JS, "returnByValue": True})
        images = json.loads(res["result"]["value"])
        shot_png = await cdp.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        shot.write_bytes(base64.b64decode(shot_png["data"]))
        requests = [ev["params"]["request"]["url"] for ev in cdp.events
                    if ev["method"] == "Network.requestWillBeSent"]
        return images, requests


def _run_browser(html: Path, tmp: Path, shot: Path) -> tuple[list[dict], list[str]]:
    profile = tmp / "chromium-profile"
    proc = subprocess.Popen([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        ws_url, deadline = None, time.monotonic() + 60
        while ws_url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            m = re.search(r"DevTools listening on (ws://\S+)", line)
            if m:
                ws_url = m.group(1)
        assert ws_url, "chromium did not open its DevTools port"
        return asyncio.run(_inspect(ws_url, html.as_uri(), shot))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (setup: apt-get install -y chromium)")
def test_report_html_renders_in_headless_chromium(tmp_path):
    run = make_synthetic_run(tmp_path / "run")
    paths = build_report(run)
    shot = tmp_path / "report_screenshot.png"
    images, requests = _run_browser(paths["html"], tmp_path, shot)
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
    images, requests = _run_browser(paths["html"], tmp_path, tmp_path / "partial.png")
    assert images and all(i["w"] > 0 for i in images)
    assert all(u.startswith(("file://", "data:")) for u in requests)
