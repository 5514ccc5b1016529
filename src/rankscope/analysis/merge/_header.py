"""The first, cheap read of each input: the top-level fields its events depend on.

Kineto writes baseTimeNanoseconds after the events, yet every event's ts moves by it.
So each input is decompressed once, its head parsed up to "traceEvents" and the keys
looked up in its tail; where that cannot tell, the full streaming reader reads the
fields exactly (or says what is wrong with the file).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ...rundir._listing import open_regular
from ...traces._stream import scan_trace

_READ_CHUNK = 256 << 10
_HEAD_BYTES = 2 << 20  # what precedes traceEvents (deviceProperties, distributedInfo)
_TAIL_BYTES = 1 << 20  # what follows it (baseTimeNanoseconds, traceName)
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class _Missing:
    """A field the trace does not have; one object in every process (it pickles by name)."""

    def __reduce__(self) -> str:
        return "_MISSING"

    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()


# A JSON true is a Python int too, but never a rank, a time or an id.
def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class _Header:
    """The top-level fields an input's events depend on, read before its events."""

    size: int
    json_bytes: int
    events_guess: int
    """Occurrences of '"ph"': close to the event count, for progress only."""
    base: Any
    """The raw baseTimeNanoseconds, or _MISSING."""
    info_rank: Any
    """The raw distributedInfo.rank, or _MISSING."""


def _read_header(source: str) -> _Header:
    try:
        header, complete = _read_header_fast(source)
    except (OSError, EOFError, zlib.error):
        header, complete = None, False
    if complete and header is not None:
        return header
    # The cheap read found something odd: the full reader either says exactly what is
    # wrong with the file (TraceError) or reads the fields exactly.
    events = 0

    def count(_: object) -> None:
        nonlocal events
        events += 1

    meta = scan_trace(source, count)
    base, info_rank = _essentials(meta)
    if header is None:  # the cheap read failed where the full one did not: sizes as stored
        size = os.path.getsize(source)
        return _Header(size, size, events, base, info_rank)
    return replace(header, events_guess=events, base=base, info_rank=info_rank)


def _read_header_fast(source: str) -> tuple[_Header, bool]:
    """Decompress once, parsing the head and the tail; False if they do not tell the fields."""
    head = bytearray()
    before: dict[str, Any] | None = None
    tail: deque[bytes] = deque()
    tail_bytes = json_bytes = 0
    with open_regular(source) as raw:
        size = os.fstat(raw.fileno()).st_size
        compressed = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        stream = gzip.GzipFile(fileobj=raw) if compressed else raw
        while chunk := stream.read(_READ_CHUNK):
            json_bytes += len(chunk)
            if before is None and len(head) < _HEAD_BYTES:
                head += chunk[: _HEAD_BYTES - len(head)]
                before = _fields_before_events(head.decode("utf-8", errors="replace"))
            tail.append(chunk)
            tail_bytes += len(chunk)
            while tail_bytes - len(tail[0]) >= _TAIL_BYTES:
                tail_bytes -= len(tail.popleft())
    end = b"".join(tail)
    # Counting every event costs as much as decompressing: the ends tell the density.
    if json_bytes <= len(end):
        events = end.count(b'"ph"')
    else:
        sample = head.count(b'"ph"') + end.count(b'"ph"')
        events = sample * json_bytes // (len(head) + len(end))
    header = _Header(size, json_bytes, events, _MISSING, _MISSING)
    if before is None:
        return header, False
    after = end.decode("utf-8", errors="replace")
    fields = dict(before)
    for key in ("baseTimeNanoseconds", "distributedInfo"):
        value = _last_top_level_value(after, key)
        if value is not _MISSING:
            fields[key] = value  # a key given twice: the later wins, as in a full parse
    base, info_rank = _essentials(fields)
    return replace(header, base=base, info_rank=info_rank), True


def _essentials(fields: Mapping[str, Any]) -> tuple[Any, Any]:
    info = fields.get("distributedInfo", _MISSING)
    info_rank = info.get("rank", _MISSING) if isinstance(info, dict) else _MISSING
    return fields.get("baseTimeNanoseconds", _MISSING), info_rank


def _ws(text: str, pos: int) -> int:
    return _WHITESPACE.match(text, pos).end()  # type: ignore[union-attr]


def _fields_before_events(text: str) -> dict[str, Any] | None:
    """The top-level fields before "traceEvents"; None if `text` cannot tell them."""
    pos = _ws(text, 0)
    if text.startswith("[", pos):
        return {}  # the bare-array form has no fields at all
    if not text.startswith("{", pos):
        return None
    fields: dict[str, Any] = {}
    pos += 1
    try:
        while True:
            key, pos = _DECODER.raw_decode(text, _ws(text, pos))
            pos = _ws(text, pos)
            if not isinstance(key, str) or not text.startswith(":", pos):
                return None
            if key == "traceEvents":
                return fields
            fields[key], pos = _DECODER.raw_decode(text, _ws(text, pos + 1))
            pos = _ws(text, pos)
            if not text.startswith(",", pos):
                # No traceEvents in the whole text: not a trace, which the full read says.
                return None
            pos += 1
    except (ValueError, RecursionError):  # invalid, or runs past the head: the full read tells
        return None


def _last_top_level_value(text: str, key: str) -> Any:
    """The value of `key` in the object that `text` (the end of a file) closes, or _MISSING.

    A match counts only where the rest of `text` is more members of that object and its
    closing brace: a key of an event or of a nested object is followed by more closers.
    """
    pattern = re.compile(rf'"{re.escape(key)}"[ \t\n\r]*:[ \t\n\r]*')
    for match in reversed(list(pattern.finditer(text))):
        start = match.start()
        slashes = 0
        while start - slashes > 0 and text[start - slashes - 1] == "\\":
            slashes += 1
        if slashes % 2:
            continue  # an escaped quote: inside a string
        try:
            value, end = _DECODER.raw_decode(text, match.end())
        except (ValueError, RecursionError):
            continue
        if _closes_object(text, end):
            return value
    return _MISSING


def _closes_object(text: str, pos: int) -> bool:
    try:
        while True:
            pos = _ws(text, pos)
            if text.startswith("}", pos):
                return _ws(text, pos + 1) == len(text)
            if not text.startswith(",", pos):
                return False
            key, pos = _DECODER.raw_decode(text, _ws(text, pos + 1))
            pos = _ws(text, pos)
            if not isinstance(key, str) or not text.startswith(":", pos):
                return False
            _, pos = _DECODER.raw_decode(text, _ws(text, pos + 1))
    except (ValueError, RecursionError):
        return False
