"""Headless Chromium driven over the DevTools protocol: enough of a browser driver for the playground's tests.

No WebDriver is needed: Chromium listens for the protocol itself, and `websockets` (already in the environment,
uvicorn's) speaks it. Every network request the page makes is recorded (`Network.requestWillBeSent`). A browser that
cannot start raises: a test that needs one fails, it is not skipped.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

BINARIES = ("chromium", "chromium-browser", "google-chrome")
START_S = 30.0  # a cold Chromium on a busy 2-core machine takes a few seconds


class BrowserError(RuntimeError):
    pass


class Browser:
    """One headless Chromium with one page; `requests` lists the URL of every request the page made."""

    def __init__(self, profile: Path, width: int = 1400, height: int = 1000):
        binary = next((b for b in map(shutil.which, BINARIES) if b), None)
        if binary is None:
            raise BrowserError(
                f"no Chromium found (looked for {', '.join(BINARIES)}); .ci/run installs Debian's chromium"
            )
        args = [
            binary,
            "--headless=new",
            "--no-sandbox",  # CI runs as root, where Chromium's sandbox cannot start
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--no-first-run",
            "--no-default-browser-check",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            "about:blank",
        ]
        profile.mkdir(parents=True, exist_ok=True)
        self.log = profile.with_name(profile.name + ".log")  # a file, not a pipe: a full pipe would stall Chromium
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
        self.events: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self._connection = contextlib.ExitStack()  # websockets wants its connection entered, closed on exit
        try:
            port = self._port(profile / "DevToolsActivePort")
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                targets = json.load(r)
            page = next(t for t in targets if t["type"] == "page")
            ws = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=10)
            self.ws = self._connection.enter_context(ws)
            self.call("Network.enable")
            self.call("Page.enable")
            self.call("Runtime.enable")
        except BaseException:
            self.close()
            raise

    def _port(self, path: Path) -> int:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = self.log.read_text(errors="replace")
                raise BrowserError(f"Chromium exited with {self.process.returncode}: {err[-2000:]}")
            if path.exists() and path.read_text().strip():
                return int(path.read_text().split()[0])
            time.sleep(0.05)
        raise BrowserError(f"Chromium did not open its DevTools port within {START_S:.0f} s")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One protocol command; events that arrive before its reply are kept in `events`."""
        id_ = next(self._ids)
        self.ws.send(json.dumps({"id": id_, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=60))
            if message.get("id") == id_:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(f"{expression[:80]}: {details.get('exception', {}).get('description', details)}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20.0) -> Any:
        """Poll until the expression is truthy; its value (a DOM node comes back as {}: test it against null).
        The timeout only keeps a broken page from hanging."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"the page never satisfied: {expression}")
            time.sleep(0.03)

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'")

    def click(self, selector: str) -> None:
        self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")

    def fill(self, selector: str, value: str) -> None:
        """Set a field's value as typing would, with its input and change events."""
        self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.value = {json.dumps(value)};"
            " for (const kind of ['input', 'change']) e.dispatchEvent(new Event(kind, {bubbles: true})); })()"
        )

    @property
    def requests(self) -> list[str]:
        self.evaluate("0")  # collect the events that arrived since the last command
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        self._connection.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
