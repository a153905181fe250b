"""Open a page in headless Chromium and report what a user's browser would see.

Talks the DevTools protocol over `--remote-debugging-pipe` (JSON messages ending in
NUL on file descriptors 3 and 4), so it needs no websocket package: Chromium itself
(Debian's `chromium`, installed by .ci/run) is the only requirement.

    with Chromium() as browser:
        seen = browser.visit(Path("report.html"), expect_plots=8)
    seen.console_errors, seen.exceptions, seen.requests, seen.plots, seen.screenshot
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BINARY = next((p for p in (shutil.which("chromium"), "/usr/bin/chromium") if p
               and Path(p).exists()), None)
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--mute-audio",
         "--allow-file-access-from-files", "--remote-debugging-pipe", "--hide-scrollbars"]

COUNT_PLOTS = """(() => { const divs = [...document.querySelectorAll('.plotly-graph-div')];
  return JSON.stringify({divs: divs.length,
    drawn: divs.filter(d => d.querySelector('.main-svg') && d._fullLayout).length,
    scripts: document.querySelectorAll('script').length,
    injected: window.__injected === true}); })()"""


@dataclass
class Seen:
    console_errors: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)   # anything not file: or data:
    plots: int = 0
    plot_divs: int = 0
    injected: bool = False
    text: str = ""
    screenshot: bytes | None = None


class Chromium:
    def __init__(self, width: int = 1400, height: int = 900) -> None:
        if BINARY is None:
            raise RuntimeError("chromium is not installed")
        self.size = (width, height)
        self._id = 0
        self._events: list[dict] = []
        self._buf = b""

    def __enter__(self) -> Chromium:
        self.profile = tempfile.mkdtemp(prefix="chromium-profile-")
        to_r, self._w = os.pipe()      # we write commands, Chromium reads fd 3
        self._r, from_w = os.pipe()    # Chromium writes fd 4, we read
        def onto_3_and_4() -> None:  # in the child: its ends of the pipes as fds 3 and 4
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_r, from_w)]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.proc = subprocess.Popen(
            [BINARY, *FLAGS, f"--user-data-dir={self.profile}",
             f"--window-size={self.size[0]},{self.size[1]}", "about:blank"],
            close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=onto_3_and_4)
        os.close(to_r)
        os.close(from_w)
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target,
                                 flatten=True)["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.call(f"{domain}.enable", session=True)
        return self

    def __exit__(self, *exc: Any) -> None:
        with contextlib.suppress(Exception):
            self.call("Browser.close", timeout=10)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self.profile, ignore_errors=True)

    # --- the protocol ----------------------------------------------------------------
    def call(self, method: str, session: bool = False, timeout: float = 60, **params: Any):
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._events.append(reply)

    def _read(self, deadline: float) -> dict:
        import select

        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def pump(self, seconds: float) -> None:
        """Collect events for a while."""
        deadline = time.monotonic() + seconds
        try:
            while True:
                self._events.append(self._read(deadline))
        except TimeoutError:
            pass

    def evaluate(self, expression: str) -> Any:
        r = self.call("Runtime.evaluate", session=True, expression=expression,
                      returnByValue=True)
        return r.get("result", {}).get("value")

    # --- a visit ---------------------------------------------------------------------
    def visit(self, path: Path, expect_plots: int | None = None, screenshot: bool = False,
              timeout: float = 60, settle: float = 0.5) -> Seen:
        """Load `path`, wait until its figures are drawn, then `settle` seconds more for
        late console messages or requests."""
        self._events.clear()
        self.call("Page.navigate", session=True, url=Path(path).resolve().as_uri())
        deadline = time.monotonic() + timeout
        while not any(ev.get("method") == "Page.loadEventFired" for ev in self._events):
            self.pump(0.05)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} did not load in {timeout} s")
        count: dict = {}
        while time.monotonic() < deadline:  # plotly draws after load; wait until all are
            count = json.loads(self.evaluate(COUNT_PLOTS))
            if count["drawn"] >= (count["divs"] if expect_plots is None else expect_plots):
                break
            self.pump(0.05)
        self.drawn_after = time.monotonic() - (deadline - timeout)
        self.pump(settle)
        seen = Seen(plots=count.get("drawn", 0), plot_divs=count.get("divs", 0),
                    injected=count.get("injected", False),
                    text=self.evaluate("document.body.innerText") or "")
        for ev in self._events:
            method, p = ev.get("method"), ev.get("params", {})
            if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                seen.console_errors.append(" ".join(str(a.get("value", a.get("description")))
                                                    for a in p.get("args", [])))
            elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
                seen.console_errors.append(p["entry"].get("text", ""))
            elif method == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                seen.exceptions.append(d.get("exception", {}).get("description") or d.get("text"))
            elif method == "Network.requestWillBeSent":
                url = p["request"]["url"]
                if not url.startswith(("file:", "data:", "about:", "blob:")):
                    seen.requests.append(url)
        if screenshot:
            w, h = self.evaluate("[document.documentElement.scrollWidth, "
                                 "document.documentElement.scrollHeight]")
            self.call("Emulation.setDeviceMetricsOverride", session=True, width=self.size[0],
                      height=min(h, 16000), deviceScaleFactor=1, mobile=False)
            self.pump(1.0)
            shot = self.call("Page.captureScreenshot", session=True, format="png",
                             captureBeyondViewport=True)
            seen.screenshot = base64.b64decode(shot["data"])
            self.call("Emulation.clearDeviceMetricsOverride", session=True)
        return seen
