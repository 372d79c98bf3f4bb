"""The live view in a browser (`--web`, textual-serve), checked in a real
headless Chromium driven over the DevTools protocol: the page opens, the
panels render, a replay advances; a live run's pages follow its recording and
never see the API key."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import signal
import subprocess
import time
from pathlib import Path

import aiohttp
import httpx
import pytest

from rampwatch.drivers.sim.profiles import make_profile
from tests import procs
from tests.conftest import answers, free_port, rampwatch_cmd
from tests.simhost import ThreadedSim
from tests.test_export import chromium, headless_chromium

ROOT = Path(__file__).resolve().parents[1]
GLM = ROOT / "recordings" / "glm-like-2x1m.sample.jsonl"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
# How long Chromium and rampwatch --web may take to start: only a waiting limit (both start in seconds when idle;
# beside two other suites, load average 33, neither had in 30 and 60 s).
STARTUP_S = 120

# Before the page's own script runs: keep every frame its websocket receives (what xterm.js draws).
KEEP_FRAMES = """
(() => {
  const Native = window.WebSocket;
  window.__frames = [];
  const decoder = new TextDecoder();
  function Recorded(...args) {
    const ws = new Native(...args);
    ws.addEventListener("message", (m) => {
      if (typeof m.data === "string") window.__frames.push(m.data);
      else if (m.data instanceof ArrayBuffer) window.__frames.push(decoder.decode(m.data));
      else if (m.data instanceof Blob) m.data.text().then((t) => window.__frames.push(t));
    });
    return ws;
  }
  Recorded.prototype = Native.prototype;
  Object.assign(Recorded, Native);
  window.WebSocket = Recorded;
})();
"""


class Browser:
    """Headless Chromium with one page, spoken to over the DevTools protocol."""

    def __init__(self, tmp: Path):
        self.port = free_port()
        self.proc = procs.Popen(
            [*headless_chromium(tmp), f"--remote-debugging-port={self.port}", "--window-size=1400,900", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._id = 0

    async def __aenter__(self) -> Browser:
        deadline = time.monotonic() + STARTUP_S
        while True:
            try:
                pages = httpx.get(f"http://127.0.0.1:{self.port}/json", timeout=1).json()
                ws_url = next(p["webSocketDebuggerUrl"] for p in pages if p.get("type") == "page")
                break
            except (httpx.HTTPError, StopIteration, ValueError):
                if time.monotonic() > deadline:
                    pytest.fail("headless Chromium did not open its DevTools port")
                await asyncio.sleep(0.2)
        self._session = aiohttp.ClientSession()
        self._ws = await self._session.ws_connect(ws_url, max_msg_size=0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._ws.close()
        await self._session.close()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)

    async def call(self, method: str, **params: object) -> dict:
        self._id += 1
        await self._ws.send_json({"id": self._id, "method": method, "params": params})
        while True:
            msg = json.loads((await self._ws.receive()).data)
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                return msg.get("result", {})

    async def open(self, url: str) -> None:
        await self.call("Page.enable")
        await self.call("Page.addScriptToEvaluateOnNewDocument", source=KEEP_FRAMES)
        await self.call("Page.navigate", url=url)

    async def screen_text(self) -> str:
        """Everything the app has sent the page so far, escape codes removed."""
        r = await self.call("Runtime.evaluate", expression="(window.__frames || []).join('')", returnByValue=True)
        return ANSI.sub("", r["result"].get("value") or "")

    async def screenshot(self, path: Path) -> bytes:
        data = base64.b64decode((await self.call("Page.captureScreenshot", format="png"))["data"])
        path.write_bytes(data)
        return data

    async def wait_for_text(self, pattern: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = await self.screen_text()
            if re.search(pattern, text, re.S):
                return text
            if time.monotonic() > deadline:
                pytest.fail(f"the page never showed {pattern!r}; it showed: {text[-600:]!r}")
            await asyncio.sleep(0.5)


def serve(args: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = procs.Popen(
        [*rampwatch_cmd(), *args, "--web", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_S
    while not answers(url):
        if proc.poll() is not None:
            pytest.fail(f"rampwatch --web exited {proc.returncode}: {proc.stderr.read()[-1000:]}")
        if time.monotonic() > deadline:
            pytest.fail("rampwatch --web did not serve its page")
        time.sleep(0.2)
    return proc, url


def stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    return err


def test_a_replay_in_the_browser_renders_the_panels_and_advances(tmp_path):
    chromium()
    proc, url = serve(["replay", str(GLM)])
    try:

        async def look() -> tuple[str, set[str], set[str], bytes, bytes]:
            async with Browser(tmp_path) as b:
                await b.open(url)
                first = await b.wait_for_text(r"Sessions.*Prefill in flight.*Decode tokens/s.*Server.*GPUs.*Events")
                shot1 = await b.screenshot(tmp_path / "first.png")
                clocks = set(re.findall(r"\d:\d\d:\d\d", first))
                # The replay reaches its first finished turn: a new Events line, written whole (a ticking clock
                # sends only the cells that changed, so the stream never spells the new time out).
                later_text = await b.wait_for_text(r"\d:\d\d:\d\d s\d+ turn \d", timeout=60)
                later = set(re.findall(r"\d:\d\d:\d\d", later_text))
                return first, clocks, later, shot1, await b.screenshot(tmp_path / "later.png")

        first, clocks, later, shot1, shot2 = asyncio.run(look())
    finally:
        err = stop(proc)
    assert "replay 1x playing" in first
    assert later - clocks, (clocks, later)  # the run clock moved on in the page: the replay advanced
    assert shot1 != shot2 and len(shot1) > 20_000  # a drawn page, and a different picture later
    assert "still serving" in err


def test_a_live_run_in_the_browser_follows_its_recording_without_the_key(tmp_path, monkeypatch):
    chromium()
    rec = tmp_path / "live.jsonl"
    key = "sk-web-test-secret-4242"
    with ThreadedSim(make_profile("tiny", time_scale=0.3), api_key=key) as sim:
        monkeypatch.setenv("RW_TEST_KEY", key)
        proc, url = serve(
            [
                "run",
                sim.url,
                "--sessions",
                "2",
                "--scale-to",
                "8k",
                "--output-tokens",
                "32",
                "--ignore-eos",
                "--gpu",
                "none",
                "--api-key-env",
                "RW_TEST_KEY",
                "--record",
                str(rec),
            ]
        )
        try:

            async def look() -> str:
                async with Browser(tmp_path) as b:
                    await b.open(url)
                    await b.wait_for_text(r"live \(web\)|run done", timeout=90)
                    # The events line, written whole (the header's state changes only the cells that differ).
                    text = await b.wait_for_text(r"run done \(exit \d+\)", timeout=120)
                    html = (
                        await b.call(
                            "Runtime.evaluate", expression="document.documentElement.outerHTML", returnByValue=True
                        )
                    )["result"]["value"]
                    return text + html

            seen = asyncio.run(look())
        finally:
            err = stop(proc)
    assert "s1" in seen and "s2" in seen and "needle" in seen
    assert key not in seen and key not in rec.read_text()
    assert "still serving" in err
