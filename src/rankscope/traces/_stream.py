"""Streaming a Kineto trace in batches of events, in bounded memory.

A multi-GB trace parsed whole takes several times its size in memory; this reads it a
chunk at a time. Within the traceEvents list it cuts the text after the last event that
looks complete and decodes that batch with one C call: a typed msgspec decoder where the
caller has one (msgspec is the analysis side's, never the job's), else the stdlib's json.
A cut is a guess, and decoding checks it: "[" + batch + "]" is valid JSON only where the
batch ends at the end of an event of the list. Where it is not (a "}" inside a string,
or a fault in the file), the events up to that cut are read one by one by the same
scanner, which says exactly what is wrong with a bad file.

Shared by the job's summaries (`_kineto`) and the analysis's trace readers; it imports
neither side.
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

from .._errors import TraceError
from ..rundir._listing import open_regular

__all__ = ["DICTS", "BatchDecoder", "plain_events", "scan_batches", "scan_trace"]

_CHUNK = 1 << 20
# Text of at least this much is decoded per batch (a whole batch's objects live at once).
_BATCH = 1 << 19
# One event (or top-level field) larger than this is not something a trace holds.
_MAX_VALUE = 256 << 20
# How many "}" from the end of the buffer are tried as the end of a batch.
_CUT_TRIES = 8
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_AFTER_EVENT = re.compile(r"[ \t\n\r]*[,\]]")
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


def plain_events(text: str) -> list[dict[str, Any]] | None:
    """The events of `text`, a JSON list of objects, by the stdlib; None for anything else."""
    try:
        events = json.loads(text)
    except (ValueError, RecursionError):  # JSONDecodeError, too many digits, too deep
        return None
    if all(type(event) is dict for event in events):
        return events  # type: ignore[no-any-return]
    return None


class BatchDecoder:
    """How a batch of events is decoded, and what a caller gets per event.

    `decode` takes the text of a JSON list of objects and returns the caller's events,
    or None where it cannot (the scanner then reads those events one by one); `shape`
    makes the same kind of events from events already parsed as dicts.
    """

    __slots__ = ("decode", "shape")

    def __init__(
        self,
        decode: Callable[[str], list[Any] | None],
        shape: Callable[[list[dict[str, Any]]], list[Any]],
    ) -> None:
        self.decode = decode
        self.shape = shape


DICTS = BatchDecoder(plain_events, lambda events: events)
"""Every event as the dict the stdlib's json makes of it."""


def scan_trace(path: str | os.PathLike[str], visit: Callable[[Any], None]) -> dict[str, Any]:
    """Call `visit` on every event (a dict) of the trace's traceEvents, in file order.

    Returns the other top-level fields (distributedInfo, baseTimeNanoseconds, ...).
    Reads `.json` and `.json.gz` (detected by content); only a regular file is opened.
    Any fault in the file is a TraceError naming it; exceptions raised by `visit` pass
    through.
    """

    def visit_batch(events: list[Any]) -> None:
        for event in events:
            visit(event)

    return scan_batches(path, visit_batch, DICTS)


def scan_batches(
    path: str | os.PathLike[str],
    visit: Callable[[list[Any]], None],
    decoder: BatchDecoder = DICTS,
) -> dict[str, Any]:
    """Call `visit` on each batch of the trace's events, in file order, as `decoder` makes them.

    Otherwise as `scan_trace`: the other top-level fields are returned, a fault in the
    file is a TraceError naming it. A batch holds about half a MB of the file's text.
    """
    name = os.fspath(path)
    try:
        with open_regular(name) as raw:
            compressed = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            read: Callable[[int], bytes] = raw.read
            if compressed:
                size = os.fstat(raw.fileno()).st_size
                read = _bounded(gzip.GzipFile(fileobj=raw).read, size, name)
            return _Scanner(read, name, decoder).trace(visit)
    except FileNotFoundError:
        raise TraceError(f"{name}: no such file") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise TraceError(f"{name}: truncated or corrupt gzip ({exc})") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"{name}: not valid JSON ({exc})") from None
    except OSError as exc:
        raise TraceError(f"{name}: cannot read ({exc.strerror or exc})") from None


MAX_INFLATION = 100
"""A gzip trace is read up to this many times its size (real ones: 9-19x), and at least
_INFLATED_FLOOR: one that inflates further (a 2 MB gzip of a few GB) is refused, so the
time a read takes follows the file's size, not what it claims to hold."""
_INFLATED_FLOOR = 64 << 20


def _bounded(read: Callable[[int], bytes], size: int, name: str) -> Callable[[int], bytes]:
    """`read`, refusing past MAX_INFLATION times `size` bytes inflated."""
    limit = max(_INFLATED_FLOOR, MAX_INFLATION * size)
    done = 0

    def bounded(n: int) -> bytes:
        nonlocal done
        chunk = read(n)
        done += len(chunk)
        if done > limit:
            raise TraceError(
                f"{name}: inflates past {limit >> 20} MB, {MAX_INFLATION}x its size "
                f"({size} bytes): no trace compresses so far (real ones 9-19x); refused"
            )
        return chunk

    return bounded


class _Scanner:
    """A cursor over the decoded text of a file, refilled a chunk at a time."""

    def __init__(self, read: Callable[[int], bytes], name: str, decoder: BatchDecoder) -> None:
        self._read = read
        self._name = name
        self._decoder = decoder
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._buf = ""
        self._pos = 0
        self._eof = False
        # A cut that did not decode: events up to it are read one by one.
        self._distrust = -1

    def trace(self, visit: Callable[[list[Any]], None]) -> dict[str, Any]:
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

    def _events(self, visit: Callable[[list[Any]], None]) -> None:
        if self._peek() == "]":
            self._pos += 1
            return
        number = 0
        while True:
            events = self._batch() if self._pos > self._distrust else None
            if events is None:
                event = self._value()
                number += 1
                if not isinstance(event, dict):
                    kind = _JSON_KIND.get(type(event), "a value")
                    raise self._error(f"not a trace (event {number} is {kind}, not an object)")
                events = self._decoder.shape([event])
            else:
                number += len(events)
            visit(events)
            if self._expect(",]") == "]":
                return

    def _batch(self) -> list[Any] | None:
        """The events from here to the last one that looks complete in the buffer, decoded
        at once; None where there is none, or the cut was wrong."""
        while len(self._buf) - self._pos < _BATCH and self._fill():
            pass
        buf, start, end = self._buf, self._pos, len(self._buf)
        for _ in range(_CUT_TRIES):
            cut = buf.rfind("}", start, end)
            if cut < 0:
                return None  # one event larger than the buffer: read on, one by one
            if _AFTER_EVENT.match(buf, cut + 1):
                break
            end = cut
        else:
            return None
        events = self._decoder.decode(f"[{buf[start : cut + 1]}]")
        if events is None:
            self._distrust = cut
            return None
        self._pos = cut + 1
        return events

    def _end(self) -> None:
        if self._peek() is not None:
            raise self._error("not valid JSON (data after the trace)")

    def _fill(self, size: int | None = None) -> bool:
        if self._eof:
            return False
        data = self._read(size or _CHUNK)
        if self._pos:
            self._buf = self._buf[self._pos :]
            self._distrust -= self._pos
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
                # Most often the value runs past the chunk; read on and try again, with
                # twice as much text each time (trying every MB again read a value of
                # hundreds of MB hundreds of times over).
                held = len(self._buf) - self._pos
                if held > _MAX_VALUE:
                    raise self._error(
                        f"an event or value of more than {_MAX_VALUE >> 20} MB, past any "
                        "trace's: refused, not read on"
                    ) from None
                if not self._fill(max(_CHUNK, held)):
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
