"""Streaming a Kineto trace event by event, in bounded memory.

A multi-GB trace parsed whole takes several times its size in memory; this reads it in
chunks and hands each event to a callback, keeping only one chunk and one event alive.
A trace of a few MB is parsed whole instead, by one C call, which is about twice as
fast and costs a few tens of MB at most; should that parse fail, the streaming reader
reads the same bytes again to say exactly what is wrong.
"""

from __future__ import annotations

import codecs
import gzip
import json
import os
import re
import zlib
from collections.abc import Callable
from typing import Any

from ..._errors import TraceError
from ..._layout import open_regular

__all__ = ["scan_trace"]

_CHUNK = 1 << 20
# Traces with at most this much JSON are parsed whole.
_WHOLE = 8 << 20
# One event (or top-level field) larger than this is not something a trace holds.
_MAX_VALUE = 256 << 20
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_NUMBER_CHARS = re.compile(r"[0-9eE.+-]*")
_DECODER = json.JSONDecoder()
_JSON_KIND = {
    list: "a list",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "true or false",
    type(None): "null",
}


def scan_trace(
    path: str | os.PathLike[str], visit: Callable[[Any], None], *, whole: bool = True
) -> dict[str, Any]:
    """Call `visit` on every event (a dict) of the trace's traceEvents, in file order.

    Returns the other top-level fields (distributedInfo, baseTimeNanoseconds, ...).
    Reads `.json` and `.json.gz` (detected by content); only a regular file is opened.
    Any fault in the file is a TraceError naming it; exceptions raised by `visit` pass
    through. `whole=False` streams even small traces, for callers that read many files
    side by side in a few MB each (the first 8 MB read at once would hold up the others).
    """
    name = os.fspath(path)
    try:
        with open_regular(name) as raw:
            compressed = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            read = gzip.GzipFile(fileobj=raw).read if compressed else raw.read
            head = read(_WHOLE + 1) if whole else b""
            if whole and len(head) <= _WHOLE:
                parsed = _parse_whole(head)
                if parsed is not None:
                    events, meta = parsed
                    for event in events:
                        visit(event)
                    return meta
            return _Scanner(_after(head, read), name).trace(visit)
    except FileNotFoundError:
        raise TraceError(f"{name}: no such file") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise TraceError(f"{name}: truncated or corrupt gzip ({exc})") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"{name}: not valid JSON ({exc})") from None
    except OSError as exc:
        raise TraceError(f"{name}: cannot read ({exc.strerror or exc})") from None


def _parse_whole(data: bytes) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """The events and other fields of a well-formed trace; None for anything else."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, too deep
        return None
    if isinstance(doc, list):
        events, meta = doc, {}
    elif isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        meta = dict(doc)
        events = meta.pop("traceEvents")
    else:
        return None
    if not all(isinstance(event, dict) for event in events):
        return None
    return events, meta


def _after(head: bytes, read: Callable[[int], bytes]) -> Callable[[int], bytes]:
    """`read`, with `head` (already read from it) handed out first."""
    pending = [head] if head else []

    def read_on(size: int) -> bytes:
        return pending.pop() if pending else read(size)

    return read_on


class _Scanner:
    """A cursor over the decoded text of a file, refilled a chunk at a time."""

    def __init__(self, read: Callable[[int], bytes], name: str) -> None:
        self._read = read
        self._name = name
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._buf = ""
        self._pos = 0
        self._eof = False

    def trace(self, visit: Callable[[Any], None]) -> dict[str, Any]:
        first = self._peek()
        if first is None:
            raise self._error("not valid JSON (the file is empty)")
        if first == "[":  # the bare-array form of the Chrome trace format
            self._pos += 1
            self._events(visit)
            self._end()
            return {}
        if first != "{":
            raise self._error("not a trace (no traceEvents list)")
        self._pos += 1
        meta: dict[str, Any] = {}
        seen_events = False
        if self._peek() == "}":
            self._pos += 1
        else:
            while True:
                key = self._value()
                if not isinstance(key, str):
                    raise self._error("not valid JSON (an object key is not a string)")
                self._expect(":")
                if key == "traceEvents" and self._peek() == "[":
                    self._pos += 1
                    self._events(visit)
                    seen_events = True
                else:
                    meta[key] = self._value()
                if self._expect(",}") == "}":
                    break
        self._end()
        if not seen_events:
            raise self._error("not a trace (no traceEvents list)")
        return meta

    def _events(self, visit: Callable[[Any], None]) -> None:
        if self._peek() == "]":
            self._pos += 1
            return
        number = 0
        while True:
            event = self._value()
            number += 1
            if not isinstance(event, dict):
                kind = _JSON_KIND.get(type(event), "a value")
                raise self._error(f"not a trace (event {number} is {kind}, not an object)")
            visit(event)
            if self._expect(",]") == "]":
                return

    def _end(self) -> None:
        if self._peek() is not None:
            raise self._error("not valid JSON (data after the trace)")

    def _fill(self) -> bool:
        if self._eof:
            return False
        data = self._read(_CHUNK)
        if self._pos:
            self._buf = self._buf[self._pos :]
            self._pos = 0
        if not data:
            self._eof = True
            self._buf += self._utf8.decode(b"", final=True)
            return False
        self._buf += self._utf8.decode(data)
        return True

    def _peek(self) -> str | None:
        while True:
            self._pos = _WHITESPACE.match(self._buf, self._pos).end()  # type: ignore[union-attr]
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._fill():
                return None

    def _expect(self, allowed: str) -> str:
        char = self._peek()
        if char is None:
            raise self._error("truncated (the file ends inside the trace)")
        if char not in allowed:
            raise self._error(f"not valid JSON (expected {' or '.join(allowed)!s}, found {char!r})")
        self._pos += 1
        return char

    def _value(self) -> Any:
        first = self._peek()
        if first is None:
            raise self._error("truncated (the file ends inside the trace)")
        if first == "-" or first.isdigit():
            # A number has no closing mark: read on until something that cannot be part
            # of it follows, or the file ends, so a chunk boundary never splits it.
            while _NUMBER_CHARS.match(self._buf, self._pos).end() == len(self._buf):  # type: ignore[union-attr]
                if len(self._buf) - self._pos > _MAX_VALUE:
                    raise self._error("not a trace (a number of millions of digits)")
                if not self._fill():
                    break
        while True:
            try:
                value, end = _DECODER.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as exc:
                # Most often the value runs past the chunk; read on and try again.
                if len(self._buf) - self._pos > _MAX_VALUE:
                    raise self._error(f"not valid JSON ({exc.msg})") from None
                if not self._fill():
                    if exc.pos >= len(self._buf) - 1 or "Unterminated" in exc.msg:
                        raise self._error("truncated (the file ends inside the trace)") from None
                    raise self._error(f"not valid JSON ({exc.msg})") from None
                continue
            except ValueError:  # an integer of more digits than Python converts
                raise self._error("not a trace (a number of thousands of digits)") from None
            except RecursionError:
                raise self._error("not a trace (values nested too deep)") from None
            self._pos = end
            return value

    def _error(self, what: str) -> TraceError:
        return TraceError(f"{self._name}: {what}")
