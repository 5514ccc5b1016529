"""Merging several ranks' Kineto traces into one timeline (`rankscope merge`).

Every input is streamed event by event (`scan_trace`), rewritten and written out at
once, so memory stays bounded whatever the traces' size. The choices, and why:

- One process per rank. All of rank N's events get pid ``N << 12``, named "rank N" and
  sorted by rank (``process_sort_index``), so Perfetto and chrome://tracing show one
  collapsible group per rank. Perfetto sorts processes by activity, not by pid, so a
  process per (rank, original pid) would scatter a rank's CPU and GPU rows. Each of the
  rank's original (pid, tid) pairs becomes a thread ``pid + k`` (k = 1..4095) named after
  its origin ("CPU · thread 4037 (python)", "GPU 0 · stream 7"), CPU before GPU as
  Kineto sorts them. Thread ids are unique across the whole file and never equal a
  pid, because Perfetto's JSON importer names threads by tid alone. The inputs' own
  process/thread metadata is absorbed into these names (their process names become the
  rank's ``process_labels``). Ranks go up to 2**20 - 1, threads and streams to 4095.
- Clocks. The output's ``baseTimeNanoseconds`` is the smallest input base and every
  input's ``ts`` moves by its own base minus that, computed in integer nanoseconds so
  times keep their 3 decimals without float noise. An input without a base (older
  torch) holds absolute microseconds: its base counts as 0. Without any base, ``ts``
  stays as written. Kineto writes the base after the events, so each input's top-level
  fields are found first by a cheap pass (decompress, parse the head, look the keys up
  at the tail); should the full read disagree, the merge runs again with what it read.
- Ids. Flow ids (``id``, ``bind_id``, ``id2.global``) and the args ``correlation`` and
  ``External id`` of rank N become ``N << 32`` plus the id (negative ids minus it),
  which stays below 2**53 where JavaScript numbers are exact; a flow id written as a hex
  string (Perfetto reads it so) is read as that number first. Anything else becomes
  the string ``"rankN:<id>"``. Flows therefore pair up within a rank and never across.
  Global instant events become process-scoped: one rank's marker is not the world's.
- The rank comes from the caller's ``ranks`` when given (it overrides the files: two
  single-GPU runs both say rank 0), else ``distributedInfo.rank``, else a file name such
  as ``rank-00003.pt.trace.json.gz`` or ``rank3_trace.json``; a trace with none of
  these is an error, never silently rank 0.
- Each input's distributedInfo and deviceProperties are kept under the output's
  top-level ``"rankscope": {"merged": [...]}``, with its rank, source, pid and base.
- Inputs are read by worker processes (one per core) when there is enough to read,
  while this process compresses (gzip level 1) and writes. It takes one chunk from each
  worker in turn, so the same inputs always give the same bytes. The output is written
  under a hidden temporary name and renamed when complete; after an error none is left.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import pickle
import queue
import re
import secrets
import subprocess
import sys
import threading
import traceback
import zlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import IO, Any, cast

from .._errors import ConfigError, TraceError
from .._layout import temp_name
from .read._stream import scan_trace

__all__ = ["MergeResult", "MergedInput", "merge_traces"]

_RANK_LIMIT = 1 << 20
_THREAD_BITS = 12
_MAX_THREADS = (1 << _THREAD_BITS) - 1  # k = 0 is the process's own id
_ID_SPAN = 1 << 32  # ids at or beyond this are not Kineto's and become strings

_BATCH = 256  # events per chunk; bigger batches cost more: their objects churn memory pages
_GZIP_LEVEL = 1  # level 6 compresses 3x slower for ~25% smaller output
_READ_CHUNK = 256 << 10
_HEAD_BYTES = 2 << 20  # what precedes traceEvents (deviceProperties, distributedInfo)
_TAIL_BYTES = 1 << 20  # what follows it (baseTimeNanoseconds, traceName)
_PARALLEL_MIN_BYTES = 8 << 20  # of JSON; below this a worker's start-up costs more than it saves
_GZIP_RATIO = 8  # about what Kineto's JSON shrinks by: enough to guess the JSON's size
_QUEUE_DEPTH = 32  # chunks a worker may run ahead of the writer
# A worker is a fresh interpreter (never a fork: the caller may hold threads and locks)
# that takes sys.path, then its inputs, as pickles on stdin and sends pickles back.
# Ctrl-C is the parent's to handle: it kills the workers.
_WORKER_BOOT = (
    "import pickle, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "sys.path[:] = pickle.load(sys.stdin.buffer); "
    "from rankscope.analysis._merge import _serve; _serve()"
)

_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])rank[-_]?(\d+)(?![0-9])", re.IGNORECASE)
_HEX_ID = re.compile(r"(?:0[xX])?[0-9a-fA-F]+")
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
_INSTANT = ("i", "I")
# The key in each absorbed metadata event's args that holds its value.
_META_ARG = {
    "process_name": "name",
    "process_labels": "labels",
    "process_sort_index": "sort_index",
    "thread_name": "name",
    "thread_sort_index": "sort_index",
}


class _Missing:
    """A field the trace does not have; one object in every process (it pickles by name)."""

    def __reduce__(self) -> str:
        return "_MISSING"

    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()


@dataclass(frozen=True)
class MergedInput:
    """What the merge did with one input trace."""

    source: str
    """The path as given."""
    rank: int
    rank_from: str
    """Where the rank came from: "given", "distributedInfo" or "file name"."""
    pid: int
    """The pid of the rank's process group in the output."""
    base_time_ns: int | None
    """The input's baseTimeNanoseconds (None: its ts are absolute)."""
    events: int
    """Events read from the input."""
    bytes_read: int
    """Size of the file as stored (compressed or not)."""
    json_bytes: int
    """Size of its JSON text, uncompressed."""


@dataclass(frozen=True)
class MergeResult:
    """What `merge_traces` wrote."""

    output: Path
    ranks: tuple[int, ...]
    """The inputs' ranks, in input order."""
    events_written: int
    """Events in the output: the inputs' less their absorbed metadata, plus the new metadata."""
    bytes_read: int
    """Input bytes as stored; the total that `progress` counts up to."""
    json_bytes: int
    """Input JSON bytes, uncompressed."""
    base_time_ns: int | None
    inputs: tuple[MergedInput, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe data (what `rankscope merge --json` prints)."""
        data = asdict(self)
        data["output"] = str(self.output)
        data["ranks"] = list(self.ranks)
        data["inputs"] = list(data["inputs"])
        return data


def merge_traces(
    inputs: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    ranks: Sequence[int] | None = None,
    progress: Callable[[int], None] | None = None,
) -> MergeResult:
    """Merge per-rank Kineto traces into one Perfetto-ready timeline at `output`.

    `output` is gzip-compressed when its name ends in `.gz`; its directory must exist.
    `ranks` gives each input's rank (overriding what the file says). `progress` is
    called with the input bytes read so far (as stored; the total is the sum of the
    files' sizes). A bad or missing input, two inputs of one rank, or an input whose
    rank cannot be told raise TraceError naming the file; nothing is written then.
    """
    sources = _check_inputs(inputs, ranks)
    final = Path(output)
    if not final.parent.is_dir():
        raise TraceError(f"{final}: cannot write: directory {final.parent} does not exist")
    if final.is_dir():
        raise TraceError(f"{final}: cannot write: it is a directory")
    lanes = _lane_count(sources)
    workers = _Workers.start(lanes)  # they start up while the headers are read
    try:
        with ThreadPoolExecutor(max_workers=lanes) as pool:
            # zlib lets go of the GIL, so the cheap first reads share the cores.
            headers = list(pool.map(_read_header, sources))
        corrected: set[int] = set()
        while True:
            jobs, base = _plan(sources, headers, ranks)
            try:
                return _write(
                    jobs=jobs,
                    base=base,
                    headers=headers,
                    final=final,
                    progress=progress,
                    workers=workers,
                )
            except _Misread as exc:
                if exc.index in corrected:
                    raise TraceError(f"{sources[exc.index]}: changed while it was read") from None
                corrected.add(exc.index)
                headers[exc.index] = exc.header
                workers.close()
                workers = _Workers.start(lanes)
    finally:
        workers.close()


def _check_inputs(
    inputs: Sequence[str | os.PathLike[str]], ranks: Sequence[int] | None
) -> list[str]:
    if isinstance(inputs, (str, bytes, os.PathLike)):
        raise ConfigError("inputs", inputs, "a list of trace paths", "a single path, not a list")
    sources = [os.fspath(path) for path in inputs]
    if not sources:
        raise ConfigError("inputs", [], "one or more trace paths", "nothing to merge")
    if ranks is not None:
        given = list(ranks)
        if len(given) != len(sources):
            raise ConfigError(
                "ranks", given, f"one rank per input ({len(sources)})", f"{len(given)} given"
            )
        for rank in given:
            if not _is_int(rank) or not 0 <= rank < _RANK_LIMIT:
                raise ConfigError("ranks", given, f"whole numbers in 0..{_RANK_LIMIT - 1}")
    return sources


def _lane_count(sources: list[str]) -> int:
    """How many processes read inputs: one per core, when there is enough to read."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    lanes = min(cores, len(sources))
    if lanes < 2:
        return 1
    json_bytes = 0
    for source in sources:
        with contextlib.suppress(OSError), open(source, "rb") as raw:
            packed = raw.read(2) == b"\x1f\x8b"
            json_bytes += os.fstat(raw.fileno()).st_size * (_GZIP_RATIO if packed else 1)
    return lanes if json_bytes >= _PARALLEL_MIN_BYTES else 1


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# -- the first, cheap read of each input ---------------------------------------------


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

    meta = scan_trace(source, count, whole=False)
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
    with open(source, "rb") as raw:
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
    except ValueError:  # invalid, or runs past the head: the full read will tell
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
        except ValueError:
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
    except ValueError:
        return False


# -- deciding ranks and clocks -------------------------------------------------------


@dataclass(frozen=True)
class _Job:
    """One input as a worker reads it."""

    index: int
    source: str
    rank: int
    rank_from: str
    base: int | None
    shift_ns: int
    """Added to every ts (in ns); 0 leaves ts as written."""


def _plan(
    sources: list[str], headers: list[_Header], ranks: Sequence[int] | None
) -> tuple[list[_Job], int | None]:
    """Each input's rank and clock shift, and the output's base time."""
    bases = [_base_of(source, header.base) for source, header in zip(sources, headers, strict=True)]
    known = [base for base in bases if base is not None]
    out_base = min(known) if known else None
    jobs = []
    holder: dict[int, str] = {}
    for index, (source, header) in enumerate(zip(sources, headers, strict=True)):
        rank, rank_from = _rank_of(source, header, None if ranks is None else ranks[index])
        if rank in holder:
            raise TraceError(f"{source}: rank {rank} is also the rank of {holder[rank]}")
        holder[rank] = source
        base = bases[index]
        shift = 0 if out_base is None else (base or 0) - out_base
        jobs.append(_Job(index, source, rank, rank_from, base, shift))
    return jobs, out_base


def _base_of(source: str, raw: Any) -> int | None:
    if raw is _MISSING or raw is None:
        return None
    if _is_int(raw) and raw >= 0:
        return int(raw)
    if isinstance(raw, float) and raw.is_integer() and raw >= 0:
        return int(raw)
    raise TraceError(f"{source}: baseTimeNanoseconds is {raw!r}, not a time in nanoseconds")


def _rank_of(source: str, header: _Header, given: int | None) -> tuple[int, str]:
    if given is not None:
        return given, "given"
    if header.info_rank is not _MISSING:
        rank = header.info_rank
        if not _is_int(rank) or not 0 <= rank < _RANK_LIMIT:
            raise TraceError(
                f"{source}: distributedInfo.rank is {rank!r}, not a rank in 0..{_RANK_LIMIT - 1}"
            )
        return int(rank), "distributedInfo"
    found = _RANK_IN_NAME.findall(Path(source).name)
    if found:
        rank = int(found[-1])
        if rank >= _RANK_LIMIT:
            raise TraceError(
                f"{source}: rank {rank} (from the file name) is over {_RANK_LIMIT - 1}"
            )
        return rank, "file name"
    raise TraceError(
        f"{source}: cannot tell its rank: no distributedInfo.rank in the trace and no "
        "rank-N in the file name; give the ranks explicitly"
    )


# -- rewriting one rank's events -----------------------------------------------------


class _RankEvents:
    """Rewrites one input's events into its rank's process group and sends them in chunks."""

    def __init__(self, job: _Job, send: Callable[[tuple[Any, ...]], None]) -> None:
        self._job = job
        self._send = send
        self._pid = job.rank << _THREAD_BITS
        self._id_base = job.rank * _ID_SPAN
        self._prefix = f"rank{job.rank}:"
        self._threads: dict[tuple[Any, Any], int] = {}
        self._thread_meta: dict[tuple[Any, Any], dict[str, Any]] = {}
        self._process_meta: dict[Any, dict[str, Any]] = {}
        self._batch: list[dict[str, Any]] = []
        self._encode = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode
        self._first_ts: float | None = None
        self._absorbed = 0
        self._flushed = 0
        self.visit = self._visitor()

    def _visitor(self) -> Callable[[Any], None]:  # noqa: PLR0915 - one hot function, measured
        # The one hot path of the merge: locals, not attributes, and the common cases inline.
        threads = self._threads
        new_thread = self._new_thread
        absorb = self._absorb
        flush = self._flush
        batch = self._batch
        pid = self._pid
        shift = self._job.shift_ns
        whole_us = shift // 1000 if shift % 1000 == 0 else None
        id_base = self._id_base
        other_id = self._id
        flow_id = self._flow_id
        rare = self._rare
        meta_names = _META_ARG
        span = _ID_SPAN

        def visit(event: Any) -> None:  # scan_trace hands out dicts only
            ph = event.get("ph")
            if ph == "M" and event.get("name") in meta_names:
                absorb(event)
                return
            key = (event.get("pid"), event.get("tid"))
            try:
                tid = threads[key]
            except KeyError:
                tid = new_thread(key)
            except TypeError:  # a list or object as pid/tid: keep such threads apart by their text
                key = (_hashable(key[0]), _hashable(key[1]))
                tid = threads.get(key) or new_thread(key)
            event["pid"] = pid
            event["tid"] = tid
            if shift:
                ts = event.get("ts")
                if ts.__class__ is float and ts - ts == 0:  # finite: nan and inf stay
                    # Whole ns, divided once: the float nearest the 3-decimal value, no noise.
                    if -1e12 < ts < 1e12:
                        event["ts"] = (round(ts * 1000) + shift) / 1000
                    else:  # absolute us, beyond what ts * 1000 holds: read it as written
                        ns = int((Decimal(repr(ts)) * 1000).to_integral_value())
                        event["ts"] = (ns + shift) / 1000
                elif ts.__class__ is int:
                    event["ts"] = (
                        ts + whole_us if whole_us is not None else (ts * 1000 + shift) / 1000
                    )
            if "id" in event:
                event["id"] = flow_id(event["id"])
            args = event.get("args")
            if args.__class__ is dict:
                value = args.get("External id")
                if value is not None:
                    args["External id"] = (
                        value + id_base
                        if value.__class__ is int and 0 <= value < span
                        else other_id(value)
                    )
                value = args.get("correlation")
                if value is not None:
                    args["correlation"] = (
                        value + id_base
                        if value.__class__ is int and 0 <= value < span
                        else other_id(value)
                    )
            if ph in _INSTANT or "bind_id" in event or "id2" in event:
                rare(event)
            batch.append(event)
            if len(batch) >= _BATCH:
                flush()

        return visit

    def finish(self, meta: Mapping[str, Any]) -> None:
        """Send the rank's process and thread metadata, then the input's summary."""
        read = self._flushed + len(self._batch) + self._absorbed
        self._batch.extend(self._metadata())
        self._flush()
        info = meta.get("distributedInfo", _MISSING)
        self._send(
            (
                "end",
                self._job.index,
                {
                    "essentials": _essentials(meta),
                    "distributedInfo": None if info is _MISSING else info,
                    "deviceProperties": meta.get("deviceProperties"),
                    "read": read,
                    "written": self._flushed,
                },
            )
        )

    def _flush(self) -> None:
        batch = self._batch
        if not batch:
            return
        if self._first_ts is None:
            self._first_ts = next((e["ts"] for e in batch if _is_number(e.get("ts"))), None)
        text = self._encode(batch)
        self._flushed += len(batch)
        batch.clear()
        self._send(("chunk", self._job.index, text.encode(), self._flushed + self._absorbed))

    def _id(self, value: Any) -> Any:
        if _is_int(value) and -_ID_SPAN < value < _ID_SPAN:
            return value + self._id_base if value >= 0 else value - self._id_base
        if isinstance(value, float) and value.is_integer() and abs(value) < _ID_SPAN:
            return self._id(int(value))
        return f"{self._prefix}{value}"

    def _flow_id(self, value: Any) -> Any:
        if value.__class__ is int and 0 <= value < _ID_SPAN:
            return value + self._id_base
        if isinstance(value, str) and _HEX_ID.fullmatch(value):
            number = int(value, 16)
            if number < _ID_SPAN:
                return number + self._id_base
        return self._id(value)

    def _rare(self, event: dict[str, Any]) -> None:
        if event.get("s") == "g":
            event["s"] = "p"
        if "bind_id" in event:
            event["bind_id"] = self._flow_id(event["bind_id"])
        id2 = event.get("id2")
        if type(id2) is dict and "global" in id2:
            id2["global"] = self._flow_id(id2["global"])

    def _new_thread(self, key: tuple[Any, Any]) -> int:
        k = len(self._threads) + 1
        if k > _MAX_THREADS:
            raise TraceError(
                f"{self._job.source}: more than {_MAX_THREADS} threads and streams; "
                "a merged trace keeps at most that many per rank"
            )
        self._threads[key] = tid = self._pid + k
        return tid

    def _absorb(self, event: dict[str, Any]) -> None:
        self._absorbed += 1
        name = event["name"]
        args = event.get("args")
        if type(args) is not dict:
            return
        pid = event.get("pid")
        if name.startswith("process_"):
            table = self._process_meta.setdefault(_hashable(pid), {})
        else:
            key = (_hashable(pid), _hashable(event.get("tid")))
            if key not in self._threads:
                self._new_thread(key)
            table = self._thread_meta.setdefault(key, {})
        table[name] = args.get(_META_ARG[name])

    def _metadata(self) -> list[dict[str, Any]]:
        pid = self._pid
        ts = self._first_ts if isinstance(self._first_ts, (int, float)) else 0

        def meta(name: str, tid: int, args: dict[str, Any]) -> dict[str, Any]:
            return {"ph": "M", "name": name, "pid": pid, "tid": tid, "ts": ts, "args": args}

        events = [
            meta("process_name", pid, {"name": f"rank {self._job.rank}"}),
            meta("process_sort_index", pid, {"sort_index": self._job.rank}),
        ]
        names = {
            str(info["process_name"])
            for info in self._process_meta.values()
            if info.get("process_name") not in (None, "")
        }
        if names:
            events.append(meta("process_labels", pid, {"labels": ", ".join(sorted(names))}))
        order = sorted(self._threads.items(), key=self._thread_order)
        for position, (key, tid) in enumerate(order):
            events.append(meta("thread_name", tid, {"name": self._thread_name(key)}))
            events.append(meta("thread_sort_index", tid, {"sort_index": position}))
        return events

    def _thread_order(self, item: tuple[tuple[Any, Any], int]) -> tuple[Any, ...]:
        (pid, tid), k = item
        process = self._process_meta.get(pid, {})
        thread = self._thread_meta.get((pid, tid), {})
        process_index = process.get("process_sort_index")
        if not _is_number(process_index) and _is_number(pid):
            # Kineto's own rule where it wrote none: the CPU process by pid, devices after.
            gpu = str(process.get("process_labels", "")).startswith("GPU")
            process_index = (1 << 24) + pid if gpu else pid
        thread_index = thread.get("thread_sort_index")
        if not _is_number(thread_index):
            thread_index = tid
        return (_sort_key(process_index), _sort_key(thread_index), k)

    def _thread_name(self, key: tuple[Any, Any]) -> str:
        pid, tid = key
        process = self._process_meta.get(pid, {})
        origin = _text(process.get("process_labels")) or _text(process.get("process_name"))
        if not origin:
            origin = f"pid {pid}" if _is_number(pid) else _text(pid)
        name = _text(self._thread_meta.get(key, {}).get("thread_name"))
        if not name:
            name = f"thread {tid}" if _is_number(tid) else _text(tid)
        if origin and name:
            return f"{origin} · {name}"
        return origin or name or "(unnamed)"


def _text(value: Any) -> str:
    return "" if value is None else str(value).strip()


def _sort_key(value: Any) -> tuple[int, float]:
    # Numbers first, in order; anything else (string pids, none) after them.
    return (0, float(value)) if _is_number(value) else (1, 0.0)


def _hashable(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return json.dumps(value, sort_keys=True)
    return value


def _run_lane(jobs: Sequence[_Job], send: Callable[[tuple[Any, ...]], None]) -> None:
    for job in jobs:
        events = _RankEvents(job, send)
        meta = scan_trace(job.source, events.visit, whole=False)
        events.finish(meta)


def _serve() -> None:
    """A worker process: read the inputs sent on stdin, send their chunks on stdout."""
    channel = sys.stdout.buffer
    sys.stdout = sys.stderr  # the pipe carries messages alone
    pickle.dump(("ready",), channel)
    channel.flush()
    try:
        jobs = pickle.load(sys.stdin.buffer)
    except EOFError:
        return  # the merge ended (or failed) before it needed this worker
    pending: queue.Queue[tuple[Any, ...] | None] = queue.Queue(_QUEUE_DEPTH)

    def pump() -> None:
        try:
            while (message := pending.get()) is not None:
                pickle.dump(message, channel, pickle.HIGHEST_PROTOCOL)
                channel.flush()
        except BaseException:  # the writer is gone: nothing left to work for
            os._exit(1)

    # A thread writes while this one reads on: the writer takes chunks in turns.
    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    try:
        _run_lane(jobs, pending.put)
        pending.put(("done",))
    except BaseException as exc:  # every failure goes back to the writer
        pending.put(("error", _portable(exc)))
    pending.put(None)
    thread.join()


def _portable(exc: BaseException) -> BaseException:
    """`exc` in a form that crosses to the writer.

    A TraceError stays one; anything else carries its worker-side traceback in its
    message, so that a bug is found where it happened.
    """
    if isinstance(exc, TraceError):
        return TraceError(*exc.args)
    text = "".join(traceback.format_exception(exc)).rstrip()
    return RuntimeError(f"merge worker failed: {type(exc).__name__}: {exc}\n{text}")


# -- writing ---------------------------------------------------------------------------


class _Misread(Exception):
    """The cheap first read of an input disagreed with its full read."""

    def __init__(self, index: int, header: _Header) -> None:
        super().__init__(index)
        self.index = index
        self.header = header


class _Output:
    """The output file under its temporary name, compressed on the way when asked."""

    def __init__(self, path: Path, final: Path) -> None:
        self._final = final
        self._file = open(path, "xb")  # noqa: SIM115 - closed in close()
        gz = final.name.endswith(".gz")
        self._zip = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, 31) if gz else None

    def write(self, data: bytes | memoryview) -> None:
        self.write_raw(data if self._zip is None else self._zip.compress(data))

    def finish(self) -> None:
        if self._zip is not None:
            self.write_raw(self._zip.flush())
        try:
            self._file.close()
        except OSError as exc:
            raise TraceError(f"{self._final}: cannot write ({exc.strerror or exc})") from None

    def write_raw(self, data: bytes | memoryview) -> None:
        try:
            self._file.write(data)
        except OSError as exc:
            raise TraceError(f"{self._final}: cannot write ({exc.strerror or exc})") from None

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()


class _Merger:
    """Writes the chunks that the lanes send, in one JSON object, and keeps the account."""

    def __init__(
        self,
        out: _Output,
        jobs: list[_Job],
        headers: list[_Header],
        progress: Callable[[int], None] | None,
    ) -> None:
        self._out = out
        self._jobs = jobs
        self._headers = headers
        self._progress = progress
        self._read_bytes = 0  # whole inputs plus the estimated part of those being read
        self._partial = [0] * len(jobs)
        self._ends: dict[int, dict[str, Any]] = {}
        self._first = True
        self.written = 0

    def start(self, base: int | None) -> None:
        head: dict[str, Any] = {"schemaVersion": 1, "displayTimeUnit": "ms"}
        if base is not None:
            head["baseTimeNanoseconds"] = base
        self._out.write(json.dumps(head)[:-1].encode() + b', "traceEvents": [\n')

    def handle(self, message: tuple[Any, ...]) -> None:
        kind, index = message[0], message[1]
        if kind == "chunk":
            if not self._first:
                self._out.write(b",\n")
            self._out.write(memoryview(message[2])[1:-1])  # the chunk is a JSON list
            self._first = False
            header = self._headers[index]
            guess = (
                header.size * min(message[3], header.events_guess) // max(1, header.events_guess)
            )
            self._advance(index, guess)
        else:
            self._end(index, message[2])

    def _end(self, index: int, info: dict[str, Any]) -> None:
        header = self._headers[index]
        base, info_rank = info["essentials"]
        if (base, info_rank) != (header.base, header.info_rank):
            raise _Misread(index, replace(header, base=base, info_rank=info_rank))
        self._ends[index] = info
        self.written += info["written"]
        self._advance(index, header.size)

    def _advance(self, index: int, done: int) -> None:
        self._read_bytes += done - self._partial[index]
        self._partial[index] = done
        if self._progress is not None:
            self._progress(self._read_bytes)

    def finish(self, final: Path, base: int | None) -> MergeResult:
        merged = []
        inputs = []
        for job, header in zip(self._jobs, self._headers, strict=True):
            info = self._ends[job.index]
            pid = job.rank << _THREAD_BITS
            entry: dict[str, Any] = {
                "rank": job.rank,
                "source": job.source,
                "pid": pid,
                "baseTimeNanoseconds": job.base,
                "distributedInfo": info["distributedInfo"],
            }
            if info["deviceProperties"] is not None:
                entry["deviceProperties"] = info["deviceProperties"]
            merged.append(entry)
            inputs.append(
                MergedInput(
                    source=job.source,
                    rank=job.rank,
                    rank_from=job.rank_from,
                    pid=pid,
                    base_time_ns=job.base,
                    events=info["read"],
                    bytes_read=header.size,
                    json_bytes=header.json_bytes,
                )
            )
        tail = json.dumps({"rankscope": {"version": 1, "merged": merged}})
        self._out.write(b"\n],\n" + tail[1:].encode() + b"\n")
        return MergeResult(
            output=final,
            ranks=tuple(job.rank for job in self._jobs),
            events_written=self.written,
            bytes_read=sum(header.size for header in self._headers),
            json_bytes=sum(header.json_bytes for header in self._headers),
            base_time_ns=base,
            inputs=tuple(inputs),
        )


def _write(
    *,
    jobs: list[_Job],
    base: int | None,
    headers: list[_Header],
    final: Path,
    progress: Callable[[int], None] | None,
    workers: _Workers,
) -> MergeResult:
    temp = temp_name(final, f"merge-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        out = _Output(temp, final)
    except OSError as exc:
        raise TraceError(f"{final}: cannot write ({exc.strerror or exc})") from None
    try:
        merger = _Merger(out, jobs, headers, progress)
        merger.start(base)
        lanes = [jobs[lane :: workers.count] for lane in range(workers.count)]
        if not workers.run(lanes, merger.handle):
            _run_lane(jobs, merger.handle)
        result = merger.finish(final, base)
        out.finish()
        try:
            os.replace(temp, final)
        except OSError as exc:
            raise TraceError(f"{final}: cannot write ({exc.strerror or exc})") from None
    except BaseException:
        out.discard()
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    return result


class _Workers:
    """Worker processes, started early and given their inputs once the plan is made."""

    def __init__(self) -> None:
        self._procs: list[tuple[subprocess.Popen[bytes], IO[bytes], IO[bytes]]] = []

    @property
    def count(self) -> int:
        return len(self._procs)

    @classmethod
    def start(cls, count: int) -> _Workers:
        workers = cls()
        if count < 2 or not sys.executable or getattr(sys, "frozen", False):
            return workers  # this process reads (a frozen app has no interpreter to start)
        try:
            for _ in range(count):
                proc = subprocess.Popen(
                    [sys.executable, "-c", _WORKER_BOOT],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                )
                to_worker, from_worker = cast(IO[bytes], proc.stdin), cast(IO[bytes], proc.stdout)
                workers._procs.append((proc, to_worker, from_worker))
                pickle.dump(sys.path, to_worker)
                to_worker.flush()
        except OSError:  # no interpreter to start: read here instead
            workers.close()
            return cls()
        return workers

    def run(self, lanes: list[list[_Job]], handle: Callable[[tuple[Any, ...]], None]) -> bool:
        """Send each worker its lane, then take their chunks in turn, one each per round.

        False if there are no workers, or they could not start (rankscope not importable
        by a fresh interpreter): then this process reads, and nothing has been handled.
        """
        if not self._procs:
            return False
        for _, _, from_worker in self._procs:
            try:
                ready = pickle.load(from_worker)
            except (EOFError, OSError, pickle.UnpicklingError):
                ready = None
            if ready != ("ready",):
                self.close()
                return False
        for (_, to_worker, _), jobs in zip(self._procs, lanes, strict=True):
            try:
                pickle.dump(jobs, to_worker)
                to_worker.close()
            except OSError:
                pass  # it has died: reading from it below says so
        active = list(range(len(lanes)))
        ended = [0] * len(lanes)
        while active:
            for lane in tuple(active):
                reading = lanes[lane][min(ended[lane], len(lanes[lane]) - 1)].source
                message = self._receive(lane, reading)
                if message[0] == "done":
                    active.remove(lane)
                elif message[0] == "error":
                    raise message[1]
                else:
                    ended[lane] += message[0] == "end"
                    handle(message)
        return True

    def _receive(self, lane: int, reading: str) -> tuple[Any, ...]:
        proc, _, from_worker = self._procs[lane]
        try:
            message: tuple[Any, ...] = pickle.load(from_worker)
        except (EOFError, OSError, pickle.UnpicklingError):
            proc.kill()
            raise TraceError(
                f"{reading}: the process reading it stopped (exit code {proc.wait()})"
            ) from None
        return message

    def close(self) -> None:
        for proc, to_worker, from_worker in self._procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for pipe in (to_worker, from_worker):
                with contextlib.suppress(OSError):
                    pipe.close()
        self._procs = []
