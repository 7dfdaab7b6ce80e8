"""Headless Chromium driven over the DevTools protocol on a pipe: the standard library only.

`--remote-debugging-pipe` makes Chromium read protocol messages (JSON, each ended by a NUL byte)
on its file descriptor 3 and write replies and events on 4 (the transport Puppeteer and
Playwright use), so no port, websocket library or browser driver is needed.

`find_chromium` looks for a browser; `install_chromium` installs Debian's `chromium` package
where this process may (root with apt-get); `Page` opens one file and records what the page
logged, threw and fetched.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_ENV = "ARCHSEARCH_CHROMIUM"  # a browser binary to use instead of searching PATH
TIMEOUT_S = 120.0  # generous: a loaded 2-core machine parses plotly.js in seconds, not minutes


def find_chromium() -> str | None:
    """A Chromium on PATH, or None."""
    return next((path for name in CANDIDATES if (path := shutil.which(name))), None)


def install_chromium() -> str:
    """Install Debian's chromium with apt-get; returns why not where it cannot (else "")."""
    if not shutil.which("apt-get"):
        return "no apt-get on this machine"
    if os.geteuid() != 0:
        return "installing chromium needs root (apt-get install chromium)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]
    for step in (None, ["apt-get", "update"]):  # update the lists only if the first try fails
        if step is not None:
            subprocess.run(step, env=env, capture_output=True, timeout=600, check=False)
        done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode == 0:
            return ""
    return f"apt-get install chromium failed: {done.stderr.strip().splitlines()[-1:]}"


class BrowserError(RuntimeError):
    pass


class Page:
    """One headless Chromium with one page; use as a context manager (the browser is killed on
    exit, whatever happened).

    Attributes:
        errors: console errors, uncaught exceptions and error log entries, as text.
        requests: URLs the page asked for other than file: and data: ones (a page that needs
            no network asks for none).
    """

    def __init__(self, executable: str, profile_dir: Path, width: int = 1400, height: int = 1000) -> None:
        self.errors: list[str] = []
        self.requests: list[str] = []
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._replies: dict[int, dict[str, Any]] = {}
        self._next_id = 0
        to_child, self._write = os.pipe()
        self._read, from_child = os.pipe()
        # The child's ends above fd 4, so placing them at 3 and 4 cannot clobber one another.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_child, from_child)]
        for fd in (to_child, from_child):
            os.close(fd)

        def child_fds() -> None:
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        args = [
            executable, "--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
            f"--user-data-dir={profile_dir}", "--no-first-run", "--no-default-browser-check",
            "--disable-extensions", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--hide-scrollbars", "--mute-audio",
            # Any network fetch goes to a closed port: the page must work without one.
            "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
            f"--window-size={width},{height}", "about:blank",
        ]  # fmt: skip
        self._process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            close_fds=False, preexec_fn=child_fds, start_new_session=True,  # its own group, killed as one
        )  # fmt: skip
        for fd in high:
            os.close(fd)
        self._stderr: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self._session: str | None = None
        self._size = (width, height)

    # --- the protocol ------------------------------------------------------------------------
    def _pump(self) -> None:
        buffer = b""
        with os.fdopen(self._read, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                buffer += chunk
                *messages, buffer = buffer.split(b"\0")
                for raw in messages:
                    self._events.put(json.loads(raw))

    def _drain_stderr(self) -> None:
        assert self._process.stderr is not None
        for line in self._process.stderr:
            self._stderr.append(line.decode(errors="replace").rstrip())

    def _send(
        self, method: str, params: dict[str, Any] | None = None, session: bool = True
    ) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session and self._session:
            message["sessionId"] = self._session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        reply = self._wait(lambda m: m.get("id") == message["id"], f"a reply to {method}")
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def _wait(self, wanted: Any, what: str, timeout: float = TIMEOUT_S) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or self._process.poll() is not None:
                tail = "\n".join(self._stderr[-5:])
                raise BrowserError(f"no {what} from chromium within {timeout:.0f} s\n{tail}")
            try:
                message = self._events.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            self._record(message)
            if wanted(message):
                return message

    def _record(self, message: dict[str, Any]) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append(
                " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            )
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.errors.append(details.get("exception", {}).get("description") or details.get("text", ""))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.errors.append(f"{params['entry'].get('url', '')}: {params['entry']['text']}")
        elif method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            if not url.startswith(("file:", "data:", "about:", "blob:")):
                self.requests.append(url)

    # --- what tests use ----------------------------------------------------------------------
    def __enter__(self) -> Page:
        target = self._send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        attached = self._send("Target.attachToTarget", {"targetId": target, "flatten": True}, session=False)
        self._session = attached["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self._send(f"{domain}.enable")
        width, height = self._size
        self._send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        return self

    def __exit__(self, *exc: object) -> None:
        # The browser and its renderer and zygote processes: the group it leads, none other.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signal.SIGKILL)
        self._process.wait(timeout=30)
        os.close(self._write)
        deadline = time.monotonic() + 10  # until its children are gone too, none left behind
        while time.monotonic() < deadline:
            try:
                os.killpg(self._process.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)

    def open(self, path: Path) -> None:
        """Load a file and wait for its load event."""
        self._send("Page.navigate", {"url": path.resolve().as_uri()})
        self._wait(lambda m: m.get("method") == "Page.loadEventFired", "load event")

    def reset(self) -> None:
        """Back to a blank page, with the errors and requests recorded so far forgotten (what a
        page loaded before logged, even late, is taken in first)."""
        self._send("Page.navigate", {"url": "about:blank"})
        self._wait(lambda m: m.get("method") == "Page.loadEventFired", "load event")
        self.settle()
        self.errors.clear()
        self.requests.clear()

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serialisable values)."""
        params = {"expression": expression, "returnByValue": True, "awaitPromise": True}
        result = self._send("Runtime.evaluate", params)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = TIMEOUT_S) -> None:
        """Poll until a JavaScript expression is truthy."""
        deadline = time.monotonic() + timeout
        while not self.evaluate(expression):
            if time.monotonic() > deadline:
                raise BrowserError(f"still false after {timeout:.0f} s: {expression}")
            time.sleep(0.1)

    def screenshot(self) -> bytes:
        """The viewport as PNG."""
        return base64.b64decode(self._send("Page.captureScreenshot", {"format": "png"})["data"])

    def settle(self) -> None:
        """Take in every event sent so far (console messages logged after the last evaluation)."""
        self.evaluate("new Promise(r => setTimeout(r, 200)).then(() => true)")
        while True:
            try:
                self._record(self._events.get_nowait())
            except queue.Empty:
                return
