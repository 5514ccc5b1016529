"""A small driver for headless Chromium over the DevTools protocol, stdlib only.

The browser starts with a fresh profile and `--remote-debugging-port=0`; the port it
picked is read from DevToolsActivePort, and the page target is driven over the minimal
websocket client below (RFC 6455 text frames, no extensions: all that CDP needs).
Every wait has a deadline, and `close()` kills the browser's process group and removes
the profile whatever happened before.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
TIMEOUT_S = 30.0

_WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class BrowserError(RuntimeError):
    """The browser did not start, answered with an error, or did not answer in time."""


@contextmanager
def chromium(timeout: float = TIMEOUT_S) -> Iterator[Chromium]:
    """A started browser, closed on exit; skips the test where Chromium is not installed."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not found (`make test` installs Debian's chromium)")
    browser = Chromium(timeout)
    try:
        browser.start()
        yield browser
    finally:
        browser.close()


class Chromium:
    """One headless browser with one page; collects the page's errors as they arrive."""

    def __init__(self, timeout: float = TIMEOUT_S) -> None:
        self.timeout = timeout
        self.errors: list[str] = []
        self._profile: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._ws: _WebSocket | None = None
        self._next_id = 0
        self._loads = 0  # load events seen, also those met while waiting for a reply

    def start(self) -> None:
        self._profile = tempfile.mkdtemp(prefix="rankscope-chromium-")
        log = open(os.path.join(self._profile, "stderr.log"), "wb")  # noqa: SIM115 (closed below)
        try:
            self._proc = subprocess.Popen(
                [
                    str(CHROMIUM),
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-quic",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    # containers often have a tiny /dev/shm; a full one crashes renderers
                    "--disable-dev-shm-usage",
                    f"--user-data-dir={self._profile}",
                    "--remote-debugging-port=0",
                    "about:blank",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                # its own process group, so close() can end the renderers with it
                start_new_session=True,
            )
        finally:
            log.close()
        port = self._wait_for_port()
        self._ws = _WebSocket(self._page_websocket_url(port), self.timeout)
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")

    def close(self) -> None:
        if self._ws is not None:
            self._ws.close()
            self._ws = None
        if self._proc is not None:
            with suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=self.timeout)
            self._proc = None
        if self._profile is not None:
            shutil.rmtree(self._profile, ignore_errors=True)
            self._profile = None

    def open(self, path: str | os.PathLike[str]) -> list[str]:
        """Navigate to a local file, wait for its load event; the errors seen so far."""
        self.errors.clear()
        url = Path(path).resolve().as_uri()
        result = self.call("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise BrowserError(f"navigating to {url}: {result['errorText']}")
        deadline = time.monotonic() + self.timeout
        # A load event may be the previous page's; the document itself says when it is ours.
        check = f"document.URL === {json.dumps(url)} && document.readyState === 'complete'"
        while True:
            loads = self._loads
            if self.evaluate(check):  # the round trip also drains the page's events so far
                return list(self.errors)
            while self._loads == loads:
                self._receive(deadline, f"the load of {url}")

    def evaluate(self, expression: str) -> Any:
        """The value of a JS expression (promises awaited); BrowserError where it throws."""
        result = self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} threw: {_describe(result['exceptionDetails'])}")
        return result.get("result", {}).get("value")

    def screenshot(self, path: str | os.PathLike[str], width: int = 1400) -> None:
        """A PNG of the whole page at `width` CSS pixels."""
        height = int(self.evaluate("document.documentElement.scrollHeight"))
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        # the page lays out again at the new width before the capture
        self.evaluate("new Promise((done) => requestAnimationFrame(() => done(0)))")
        shot = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        Path(path).write_bytes(base64.b64decode(shot["data"]))

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send one CDP command and return its result; events met on the way are kept."""
        ws = self._require_ws()
        self._next_id += 1
        ident = self._next_id
        ws.send_text(json.dumps({"id": ident, "method": method, "params": params or {}}))
        deadline = time.monotonic() + self.timeout
        while True:
            message = self._receive(deadline, method)
            if message.get("id") == ident:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result

    def _receive(self, deadline: float, waiting_for: str) -> dict[str, Any]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BrowserError(f"no answer to {waiting_for} within {self.timeout} s")
        try:
            message: dict[str, Any] = json.loads(self._require_ws().receive_text(left))
        except TimeoutError as exc:
            raise BrowserError(f"no answer to {waiting_for} within {self.timeout} s") from exc
        self._note(message)
        return message

    def _note(self, message: dict[str, Any]) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method == "Page.loadEventFired":
            self._loads += 1
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = [a.get("value", a.get("description", "")) for a in params.get("args", [])]
            self.errors.append(f"console.{params['type']}: {' '.join(map(str, args))}")
        elif method == "Runtime.exceptionThrown":
            self.errors.append(f"uncaught: {_describe(params.get('exceptionDetails', {}))}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            self.errors.append(f"log ({entry.get('source')}): {entry.get('text')}")

    def _wait_for_port(self) -> int:
        assert self._profile is not None and self._proc is not None
        port_file = Path(self._profile, "DevToolsActivePort")
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise BrowserError(
                    f"chromium exited with {self._proc.returncode}: {self._log_tail()}"
                )
            lines = port_file.read_text().splitlines() if port_file.exists() else []
            # the file is written whole once the browser listens; a partial read has no 2nd line
            if len(lines) >= 2 and lines[0].isdigit():
                return int(lines[0])
            time.sleep(0.02)
        raise BrowserError(
            f"chromium wrote no DevToolsActivePort in {self.timeout} s: {self._log_tail()}"
        )

    def _page_websocket_url(self, port: int) -> str:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{port}/json/list", timeout=self.timeout
            ) as r:
                targets = json.load(r)
            for target in targets:
                if target.get("type") == "page" and "webSocketDebuggerUrl" in target:
                    return str(target["webSocketDebuggerUrl"])
            time.sleep(0.02)
        raise BrowserError(f"chromium listed no page target in {self.timeout} s")

    def _require_ws(self) -> _WebSocket:
        if self._ws is None:
            raise BrowserError("the browser is not started (call start() first)")
        return self._ws

    def _log_tail(self) -> str:
        assert self._profile is not None
        try:
            return Path(self._profile, "stderr.log").read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"


def _describe(details: dict[str, Any]) -> str:
    exception = details.get("exception", {})
    text = exception.get("description") or details.get("text", "")
    return f"{text} at line {details.get('lineNumber')}, column {details.get('columnNumber')}"


class _WebSocket:
    """A client websocket: masked text frames out, (possibly fragmented) frames in."""

    def __init__(self, url: str, timeout: float) -> None:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._buffer = b""
        key = base64.b64encode(os.urandom(16)).decode()
        # No Origin header: Chromium refuses websocket origins it was not told to allow.
        self._sock.sendall(
            (
                f"GET {parts.path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        while b"\r\n\r\n" not in self._buffer:
            self._fill()
        head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        if " 101 " not in lines[0] + " ":
            raise BrowserError(f"websocket handshake refused: {lines[0]}")
        accept = base64.b64encode(hashlib.sha1((key + _WS_GUID).encode()).digest()).decode()
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])
        }
        if headers.get("sec-websocket-accept") != accept:
            raise BrowserError("websocket handshake: wrong Sec-WebSocket-Accept")

    def send_text(self, text: str) -> None:
        self._send_frame(0x1, text.encode())

    def receive_text(self, timeout: float) -> str:
        self._sock.settimeout(timeout)
        pieces: list[bytes] = []
        while True:
            fin, opcode, payload = self._read_frame()
            if opcode == 0x9:  # ping
                self._send_frame(0xA, payload)
            elif opcode == 0x8:
                raise BrowserError("the browser closed the websocket")
            elif opcode in (0x0, 0x1, 0x2):
                pieces.append(payload)
                if fin:
                    return b"".join(pieces).decode()

    def close(self) -> None:
        with suppress(OSError):
            self._send_frame(0x8, b"")
        self._sock.close()

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        n = len(payload)
        if n < 126:
            header = bytes([0x80 | opcode, 0x80 | n])
        elif n < 1 << 16:
            header = bytes([0x80 | opcode, 0x80 | 126]) + n.to_bytes(2, "big")
        else:
            header = bytes([0x80 | opcode, 0x80 | 127]) + n.to_bytes(8, "big")
        mask = os.urandom(4)
        self._sock.sendall(header + mask + _xor(payload, mask))

    def _read_frame(self) -> tuple[bool, int, bytes]:
        b0, b1 = self._read(2)
        n = b1 & 0x7F
        if n == 126:
            n = int.from_bytes(self._read(2), "big")
        elif n == 127:
            n = int.from_bytes(self._read(8), "big")
        mask = self._read(4) if b1 & 0x80 else b""
        payload = self._read(n)
        return bool(b0 & 0x80), b0 & 0x0F, _xor(payload, mask) if mask else payload

    def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            self._fill()
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def _fill(self) -> None:
        chunk = self._sock.recv(1 << 20)
        if not chunk:
            raise BrowserError("the browser closed the connection")
        self._buffer += chunk


def _xor(payload: bytes, mask: bytes) -> bytes:
    # one big-integer XOR instead of a Python loop over every byte
    n = len(payload)
    keystream = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(keystream, "big")).to_bytes(n, "big")
