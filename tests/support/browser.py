"""Drive the OS's headless Chromium over the DevTools protocol, for the course's real-browser tests.

    with Chromium() as page:             # /usr/bin/chromium, network blocked except 127.0.0.1
        page.goto("file:///.../deck.slides.html")
        page.evaluate("1 + 1")           # -> 2
        page.screenshot("build/test-artifacts/deck.png")

No browser is downloaded and no browser-automation package is needed: the only dependency is
`websocket-client`, which jupyter_server already requires. `find_chromium()` returns None when no
Chromium is installed, so a test can skip with a clear reason.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import websocket  # websocket-client, a dependency of jupyter_server

from m11_helpers.procs import stop

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# every host name fails to resolve except the loopback ones: a deck that needs a CDN breaks visibly
OFFLINE_RULES = "MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1"


def find_chromium() -> str | None:
    """$M11_CHROMIUM, else the first Chromium/Chrome on PATH; None when there is none."""
    env = os.environ.get("M11_CHROMIUM")
    if env:
        return env if Path(env).is_file() else None
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.2):
    """Poll predicate until it returns something truthy; raise TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    last_err: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if value := predicate():
                return value
        except Exception as err:  # noqa: BLE001 - a page still loading throws; keep polling
            last_err = err
        time.sleep(interval)
    raise TimeoutError(f"waited {timeout:.0f} s for {what}" + (f" (last error: {last_err})" if last_err else ""))


class CDPError(RuntimeError):
    """The browser answered a DevTools command with an error, or a script threw."""


class Chromium:
    """One headless Chromium process with one page, driven over its DevTools websocket."""

    def __init__(self, binary: str | None = None, width: int = 1280, height: int = 800, offline: bool = True):
        self.binary = binary or find_chromium()
        if self.binary is None:
            raise FileNotFoundError("no Chromium found: install the OS package (`apt-get install chromium`)")
        self.size = (width, height)
        self.offline = offline
        self.proc: subprocess.Popen | None = None
        self.ws: websocket.WebSocket | None = None
        self._ids = itertools.count(1)
        self.events: list[dict] = []  # every event received, in order (Network.*, Runtime.*, ...)

    # -- life cycle -----------------------------------------------------------------------------
    def __enter__(self) -> Chromium:
        self.profile = tempfile.mkdtemp(prefix="m11-chromium-")
        args = [self.binary, "--headless=new", "--remote-debugging-port=0", f"--user-data-dir={self.profile}",
                "--no-first-run", "--no-default-browser-check", "--disable-gpu", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--mute-audio", "--allow-file-access-from-files",
                f"--window-size={self.size[0]},{self.size[1]}", "about:blank"]
        if self.offline:
            args.insert(1, f"--host-resolver-rules={OFFLINE_RULES}")
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium refuses to run its sandbox as root (CI containers)
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port_file = Path(self.profile) / "DevToolsActivePort"
            port = int(wait_for(lambda: port_file.is_file() and port_file.read_text().split("\n")[0],
                                30, "Chromium to open its DevTools port"))
            targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
            page = next(t for t in targets if t.get("type") == "page")
            # suppress_origin: Chromium refuses websocket clients that send an Origin it does not allow
            self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
            for domain in ("Page", "Runtime", "Network"):
                self.send(f"{domain}.enable")
            self.send("Emulation.setDeviceMetricsOverride", width=self.size[0], height=self.size[1],
                      deviceScaleFactor=1, mobile=False)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.ws is not None:
            self.ws.close()
        if self.proc is not None:
            stop(self.proc, grace=10)
        shutil.rmtree(self.profile, ignore_errors=True)

    # -- protocol -------------------------------------------------------------------------------
    def send(self, method: str, **params) -> dict:
        """Send one DevTools command and return its result; events that arrive meanwhile are kept."""
        msg_id = next(self._ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise CDPError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def evaluate(self, expression: str, await_promise: bool = True):
        """The JSON value of a JavaScript expression in the page (promises are awaited)."""
        res = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=await_promise)
        if "exceptionDetails" in res:
            details = res["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise CDPError(f"{expression[:80]!r} threw: {text}")
        return res["result"].get("value")

    def goto(self, url: str, timeout: float = 30) -> None:
        """Navigate and wait until the document has loaded."""
        self.send("Page.navigate", url=url)
        wait_for(lambda: self.evaluate("document.readyState") == "complete" and
                 self.evaluate("location.href").startswith(url.split("?")[0].split("#")[0]), timeout, f"{url} to load")

    def screenshot(self, path: str | Path) -> bytes:
        """Save a PNG of the viewport to path (folders created) and return its bytes."""
        data = base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"])
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return data

    def requests(self) -> list[str]:
        """Every URL the page asked for so far."""
        return [e["params"]["request"]["url"] for e in self.events if e["method"] == "Network.requestWillBeSent"]

    def failed_requests(self) -> list[str]:
        """`url: error` for each request that failed (blocked, not found, refused)."""
        urls = {e["params"]["requestId"]: e["params"]["request"]["url"]
                for e in self.events if e["method"] == "Network.requestWillBeSent"}
        return [f"{urls.get(e['params']['requestId'], '?')}: {e['params'].get('errorText')}"
                for e in self.events if e["method"] == "Network.loadingFailed"]

    # -- input, as a user gives it --------------------------------------------------------------
    def box(self, selector: str, text: str | None = None) -> dict:
        """The viewport rectangle {x, y, width, height} of the first element matching selector
        (and, when text is given, whose trimmed text starts with it), scrolled into view."""
        js = (f"(() => {{ const text = {json.dumps(text)};"
              f" const el = [...document.querySelectorAll({json.dumps(selector)})]"
              "   .find(e => text === null || e.textContent.trim().startsWith(text)); if (!el) return null;"
              " el.scrollIntoView({block: 'center'}); const r = el.getBoundingClientRect();"
              " return {x: r.x, y: r.y, width: r.width, height: r.height}; })()")
        rect = self.evaluate(js)
        if not rect:
            raise CDPError(f"no element matches {selector!r}" + (f" with text {text!r}" if text else ""))
        return rect

    def click(self, selector: str, text: str | None = None) -> None:
        """A real mouse click (press + release) at the centre of the element (see `box`)."""
        r = self.box(selector, text)
        x, y = r["x"] + r["width"] / 2, r["y"] + r["height"] / 2
        self.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def drag(self, selector: str, dx: float, steps: int = 8, text: str | None = None) -> None:
        """Press on the element's centre, move dx pixels to the right in steps, release."""
        r = self.box(selector, text)
        x, y = r["x"] + r["width"] / 2, r["y"] + r["height"] / 2
        self.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        self.send("Input.dispatchMouseEvent", type="mousePressed", x=x, y=y, button="left", clickCount=1)
        for i in range(1, steps + 1):
            self.send("Input.dispatchMouseEvent", type="mouseMoved", x=x + dx * i / steps, y=y, button="left",
                      buttons=1)
        self.send("Input.dispatchMouseEvent", type="mouseReleased", x=x + dx, y=y, button="left", clickCount=1)

    def key(self, key: str, code: str | None = None, key_code: int = 0) -> None:
        """Press and release one key (e.g. "ArrowRight", key_code=39) on the focused element."""
        for kind in ("rawKeyDown", "keyUp"):
            self.send("Input.dispatchKeyEvent", type=kind, key=key, code=code or key,
                      windowsVirtualKeyCode=key_code, nativeVirtualKeyCode=key_code)


class JupyterLab:
    """A JupyterLab server on a free 127.0.0.1 port with a known token, isolated from the user's
    config, runtime files, workspaces and settings (news and update checks off)."""

    def __init__(self, root_dir: str | Path, token: str = "m11-browser-test", python: str | None = None):
        self.root_dir, self.token = Path(root_dir), token
        self.python = python or sys.executable
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def url(self, path: str = "lab") -> str:
        return f"http://127.0.0.1:{self.port}/{path}?token={self.token}"

    def __enter__(self) -> JupyterLab:
        self.home = Path(tempfile.mkdtemp(prefix="m11-lab-"))
        settings = self.home / "settings" / "@jupyterlab" / "apputils-extension"
        settings.mkdir(parents=True)
        (settings / "notification.jupyterlab-settings").write_text(
            json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        # Every cell rendered, not only those in view: with JupyterLab's windowing the lab test twice found the
        # notebook idle, every cell run, and its widget's plot never drawn in 30 s of scrolling to it
        # (build/test-artifacts/browser/lab/02-no-plot.png: the view back at the top). What is tested is the
        # lab, not JupyterLab's virtual scrolling.
        tracker = self.home / "settings" / "@jupyterlab" / "notebook-extension"
        tracker.mkdir(parents=True)
        (tracker / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
        env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(self.home / "runtime"),
                   JUPYTER_CONFIG_DIR=str(self.home / "config"), JUPYTER_DATA_DIR=str(self.home / "data"))
        args = [self.python, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
                "--ServerApp.open_browser=False", f"--IdentityProvider.token={self.token}",
                f"--ServerApp.root_dir={self.root_dir}", f"--LabApp.user_settings_dir={self.home / 'settings'}",
                f"--LabApp.workspaces_dir={self.home / 'workspaces'}"]
        if os.geteuid() == 0:
            args.append("--allow-root")  # CI containers run as root
        self.log = self.home / "server.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)

        def up() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n{self.log.read_text()[-2000:]}")
            try:
                return urllib.request.urlopen(self.url("api/status"), timeout=2).status == 200
            except OSError:
                return False

        try:
            wait_for(up, 90, "JupyterLab to answer on /api/status")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            stop(self.proc, grace=20)  # the server shuts its kernels down on SIGTERM
        shutil.rmtree(self.home, ignore_errors=True)


def warm_font_cache() -> float:
    """Build matplotlib's font cache (in MPLCONFIGDIR, shared with the kernel) if missing; the seconds it took."""
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", "import matplotlib.font_manager"], check=True, timeout=300)
    return round(time.monotonic() - start, 1)


# the prompts of a JupyterLab notebook's code cells ('[*]:' running, '[3]:' done)
CELL_STATE = """[...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(e => e.textContent.trim())"""


def wait_for_cells(page: Chromium, count: int, stall: float, limit: float) -> list[float]:
    """Wait until every code cell's prompt shows a number; return the seconds at which each did.

    TimeoutError when no cell finishes for `stall` seconds (naming the cell that was running) or
    after `limit` seconds in all."""
    start = last = time.monotonic()
    finished: dict[int, float] = {}
    while True:
        prompts = page.evaluate(CELL_STATE)
        now = time.monotonic()
        for i, prompt in enumerate(prompts):
            if re.fullmatch(r"\[\d+\]:", prompt) and i not in finished:
                finished[i], last = round(now - start, 1), now
        if len(finished) == count:
            return [finished[i] for i in range(count)]
        running = [i for i, p in enumerate(prompts) if p == "[*]:"]
        if now - last > stall or now - start > limit:
            raise TimeoutError(f"code cells finished at {finished} s; still running: {running} "
                               f"(prompts {prompts}) after {now - start:.0f} s")
        time.sleep(0.3)
