"""Rewriting one rank's events into its process group, sent on in chunks.

This is the merge's one hot path, and the job a worker process runs (`_read_input`).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from ..._errors import TraceError
from ...traces._stream import scan_trace
from ._header import _MISSING, _essentials, _is_int, _is_number
from ._plan import _Job

_THREAD_BITS = 12
_MAX_THREADS = (1 << _THREAD_BITS) - 1  # k = 0 is the process's own id
_ID_SPAN = 1 << 32  # ids at or beyond this are not Kineto's and become strings
_BATCH = 256  # events per chunk; bigger batches cost more: their objects churn memory pages
_HEX_ID = re.compile(r"(?:0[xX])?[0-9a-fA-F]+")
_INSTANT = ("i", "I")
# The key in each absorbed metadata event's args that holds its value.
_META_ARG = {
    "process_name": "name",
    "process_labels": "labels",
    "process_sort_index": "sort_index",
    "thread_name": "name",
    "thread_sort_index": "sort_index",
}


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
        # NaN and Infinity are not JSON (Perfetto refuses the file): see _flush.
        self._encode = json.JSONEncoder(
            separators=(",", ":"), check_circular=False, allow_nan=False
        ).encode
        self._not_finite = 0
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
        far = self._far_ts
        meta_names = _META_ARG
        span = _ID_SPAN

        def visit(event: Any) -> None:  # scan_trace hands out dicts only
            ph = event.get("ph")
            if ph == "M" and event.get("name").__class__ is str and event["name"] in meta_names:
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
                if ts.__class__ is float and -1e12 < ts < 1e12:  # nan and inf stay
                    # Whole ns, divided once: the float nearest the 3-decimal value, no noise.
                    event["ts"] = (round(ts * 1000) + shift) / 1000
                elif ts.__class__ is int:  # older Kineto writes every ts so
                    try:  # noqa: SIM105 - a try costs nothing here; suppress() is a call per event
                        event["ts"] = (
                            ts + whole_us if whole_us is not None else (ts * 1000 + shift) / 1000
                        )
                    except OverflowError:  # past what a float holds: kept as written
                        pass
                elif ts.__class__ is float:
                    far(event, ts)
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
                    "not_finite": self._not_finite,
                },
            )
        )

    def _flush(self) -> None:
        batch = self._batch
        if not batch:
            return
        if self._first_ts is None:
            self._first_ts = next((e["ts"] for e in batch if _is_time(e.get("ts"))), None)
        try:
            text = self._encode(batch)
        except ValueError:  # a NaN or an infinity, which JSON has no word for: null instead
            finite = [_finite(event) for event in batch]
            self._not_finite += sum(new != old for new, old in zip(finite, batch, strict=True))
            text = self._encode(finite)
        except RecursionError:
            raise TraceError(f"{self._job.source}: an event nested too deep to write") from None
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

    def _far_ts(self, event: dict[str, Any], ts: float) -> None:
        """Shift a float ts beyond what ts * 1000 holds exactly (absolute us), read as
        written; NaN, infinity and a ts a float cannot shift stay as written."""
        if ts - ts != 0:
            return  # nan, inf
        with contextlib.suppress(OverflowError):
            ns = int((Decimal(repr(ts)) * 1000).to_integral_value())
            event["ts"] = (ns + self._job.shift_ns) / 1000

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
    # Numbers first, in order; anything else (string pids, none, nan, 10**400) after them.
    return (0, float(value)) if _is_time(value) else (1, 0.0)


def _is_time(value: Any) -> bool:
    """A number a float holds and JSON writes: not nan, not infinite, not 10**400."""
    return _is_number(value) and -1e300 < value < 1e300


def _finite(value: Any) -> Any:
    """`value` with every NaN and infinity in it made None (null)."""
    if value.__class__ is float:
        return value if value - value == 0 else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


def _hashable(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return json.dumps(value, sort_keys=True)
    return value


def _read_input(job: _Job, send: Callable[[tuple[Any, ...]], None]) -> None:
    """Read one input and send its chunks, then its end; what a worker runs per job."""
    events = _RankEvents(job, send)
    meta = scan_trace(job.source, events.visit)
    events.finish(meta)
