"""Render a page in headless Chromium and report what a person would see: a screenshot, each
figure's drawn size and content, and every console message or uncaught error.

Chromium is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: JSON messages
ended by NUL on file descriptors 3 and 4), so nothing but the standard library and Debian's
``chromium`` is needed, and no port is opened.

    python tests/ci/chromium.py report.html shot.png     # prints the figure check as JSON
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the flags a closed network and a root CI account need (no sandbox: root; no background fetches)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--hide-scrollbars", "--remote-debugging-pipe"]  # fmt: skip

# every <figure class="plot">: its svg's box on the page and how many shapes it drew
FIGURES_JS = """
Array.from(document.querySelectorAll('figure.plot')).map(f => {
  const svg = f.querySelector('svg');
  const box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
  const shapes = svg ? svg.querySelectorAll('path, rect, line, polyline, circle, use').length : 0;
  let drawn = 0;
  if (svg) for (const p of svg.querySelectorAll('path')) {
    const b = p.getBBox();
    if (b.width > 0 || b.height > 0) drawn++;
  }
  return {kind: f.dataset.kind, width: box.width, height: box.height, shapes: shapes, drawn_paths: drawn};
})
"""


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class _Pipe:
    def __init__(self, proc: subprocess.Popen, write_fd: int, read_fd: int):
        self.proc, self.w, self.r = proc, write_fd, read_fd
        self.next_id, self.buffer, self.events = 0, b"", []

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self.buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self.r, 1 << 16)
            if not chunk:
                raise RuntimeError(f"chromium closed the pipe (exit {self.proc.poll()})")
            self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout=60.0) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, timeout=60.0) -> dict:
        deadline = time.monotonic() + timeout
        for e in self.events:
            if e.get("method") == method:
                return e
        while True:
            e = self._read_message(deadline)
            self.events.append(e)
            if e.get("method") == method:
                return e


def _high(*fds: int) -> list[int]:
    """The fds moved to numbers >= 10 (close-on-exec), so the child's dup2 onto 3 and 4 cannot
    overwrite one of them before it is copied."""
    import fcntl

    out = []
    for fd in fds:
        out.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10))
        os.close(fd)
    return out


def render(page: Path, screenshot: Path, width: int = 1200) -> dict:
    """Load ``page`` (a local file), save a full-page PNG screenshot, and return ``{figures,
    console_errors, console}``."""
    exe = find_chromium()
    if exe is None:
        raise FileNotFoundError("no chromium on PATH")
    to_chrome_r, to_chrome_w = _high(*os.pipe())
    from_chrome_r, from_chrome_w = _high(*os.pipe())
    profile = tempfile.mkdtemp(prefix="mcpc-chromium-")

    def child_fds():  # chromium reads commands on fd 3 and writes replies on fd 4
        os.dup2(to_chrome_r, 3)
        os.dup2(from_chrome_w, 4)

    proc = subprocess.Popen(
        [exe, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},900", "about:blank"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        close_fds=False, preexec_fn=child_fds,
    )  # fmt: skip
    os.close(to_chrome_r)
    os.close(from_chrome_w)
    cdp = _Pipe(proc, to_chrome_w, from_chrome_r)
    try:
        target = cdp.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            cdp.call(f"{domain}.enable", session=session)
        metrics = {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}
        cdp.call("Emulation.setDeviceMetricsOverride", metrics, session=session)
        cdp.events.clear()
        cdp.call("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
        cdp.wait_event("Page.loadEventFired")
        figures = cdp.call(
            "Runtime.evaluate", {"expression": FIGURES_JS, "returnByValue": True}, session=session
        )
        figures = figures["result"]["value"]
        shot = cdp.call(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=session
        )
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        console, errors = [], []
        for e in cdp.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.consoleAPICalled":
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                console.append((params.get("type"), text))
                if params.get("type") in ("error", "assert"):
                    errors.append(text)
            elif method == "Runtime.exceptionThrown":
                errors.append(params.get("exceptionDetails", {}).get("text", "exception"))
            elif method == "Log.entryAdded":
                entry = params.get("entry", {})
                console.append((entry.get("level"), entry.get("text")))
                if entry.get("level") == "error":
                    errors.append(entry.get("text"))
        return {"figures": figures, "console_errors": errors, "console": console}
    finally:
        try:
            cdp.call("Browser.close", timeout=10)
        except Exception:
            pass
        os.close(to_chrome_w)
        os.close(from_chrome_r)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    result = render(Path(sys.argv[1]), Path(sys.argv[2]))
    print(json.dumps({k: result[k] for k in ("figures", "console_errors")}, indent=1))
