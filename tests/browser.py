"""Headless Debian `chromium` driven over the DevTools protocol (CDP), for the tests that open
what stepscope wrote: aiohttp's websocket client (already a dependency) speaks the protocol, a
page's own state is read with Runtime.evaluate, and every request the page makes is seen
through the Network domain's requestWillBeSent."""

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

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run",
                  "--disable-default-apps", "--disable-extensions", "--metrics-recording-only",
                  "--mute-audio", "--remote-debugging-port=0", "--remote-allow-origins=*"]

IMAGES_JS = """JSON.stringify(Array.from(document.images).map(i => ({
  src: i.src.slice(0, 40), complete: i.complete, w: i.naturalWidth, h: i.naturalHeight})))"""


class Cdp:
    """The few DevTools-protocol calls the tests need, on one flattened page session."""

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


async def _inspect(ws_url: str, page_url: str, shot: Path | None, expression: str, settle_s: float
                   ) -> tuple[object, list[str]]:
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
        await asyncio.sleep(settle_s)  # an image's error handler fires after the load event
        res = await cdp.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        value = json.loads(res["result"]["value"])
        if shot is not None:
            shot_png = await cdp.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
            shot.write_bytes(base64.b64decode(shot_png["data"]))
        requests = [ev["params"]["request"]["url"] for ev in cdp.events
                    if ev["method"] == "Network.requestWillBeSent"]
        return value, requests


def run_browser(html: Path, tmp: Path, shot: Path | None = None, expression: str = IMAGES_JS,
                settle_s: float = 0.0) -> tuple[object, list[str]]:
    """Open `html` in a fresh headless Chromium; (the JSON `expression` returned, the URLs the
    page requested). `shot`, if given, gets a full-page screenshot."""
    profile = tmp / f"chromium-profile-{html.stem}"
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
        return asyncio.run(_inspect(ws_url, html.as_uri(), shot, expression, settle_s))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
