"""Reading Kineto (torch.profiler) traces and summarising their kernels, or their CPU ops.

Shared by both sides, so it imports neither: the job's trace finaliser writes each
window's summary with it (capture/_finalize.py) and the analysis reads and checks those
summaries with it (analysis/kernels/_kernels.py); it imports no torch and no numpy. A summary
decodes only the seven fields it reads, batch by batch: with a typed msgspec decoder
where msgspec can be imported (the analysis extra), else with the stdlib's json; the two
give the same summary. The capture side summarises with the stdlib alone: a training job
imports no msgspec.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import islice
from pathlib import Path
from typing import Any

from .._text import shown
from ._stream import BatchDecoder, plain_events, scan_batches, scan_trace

__all__ = [
    "MAX_DUR_US",
    "SUMMARY_VERSION",
    "kernel_category",
    "left_out_lines",
    "load_trace",
    "scan_trace",
    "summarize_events",
    "summarize_trace",
    "summary_problem",
]

SUMMARY_VERSION = 2
_NUMBER = (int, float)
# The events a summary counts, by "cat"; a tuple, not a set: a list as cat must not raise.
_COUNTED = ("kernel", "cpu_op", "gpu_memcpy", "gpu_memset")
_EVENTS_PER_BATCH = 4096  # summarize_events' batches: a few MB of events at a time
MAX_DUR_US = 1e15
"""A dur at or past this (31 years) is not a time: the event is left out and counted."""
_MAX_TS_US = 1e18
_FAULTS = {
    "dur": "a bad dur (not a number from 0 to 1e15 us)",
    "ts": "a bad ts (not a finite number)",
    "name": "a bad name (not a string)",
}


def load_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a `.json` or `.json.gz` Kineto trace whole; TraceError names the file and the fault.

    Holds every event in memory: for large traces prefer `scan_trace`.
    """
    events: list[Any] = []
    meta = scan_trace(path, events.append)
    return {**meta, "traceEvents": events}


def summarize_trace(
    path: str | os.PathLike[str],
    *,
    use_msgspec: bool = True,
    keep: Callable[[list[Any]], list[Any]] | None = None,
    **labels: Any,
) -> dict[str, Any]:
    """Summary of one trace file, read in one streaming pass; `labels` (window) are stored alongside.

    `use_msgspec=False` decodes with the stdlib's json even where msgspec is installed
    (the capture side's choice); the summary is the same either way. `keep` picks from
    each batch of events (with the fields ph, cat, name, dur, ts, pid, tid) the ones
    summarised: analysis/stragglers/_evidence.py summarises one phase's ranges alone.
    """
    table = _SummaryTable()
    add = table.add_batch if keep is None else lambda events: table.add_batch(keep(events))
    meta = scan_batches(path, add, _decoder(use_msgspec))
    info = meta.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, Mapping) else None
    return {
        "v": SUMMARY_VERSION,
        "trace": Path(path).name,
        "rank": rank,
        **labels,
        **table.result(),
    }


def summarize_events(events: Iterable[object]) -> dict[str, Any]:
    """Per GPU kernel name: count, total/mean/min/max time (us) and share of kernel time.

    `categories` adds kernel time by kind of work (computation, communication) and the
    device's memcpy and memset time. A trace with no GPU kernels (CPU only) is
    summarised per CPU op by self time instead: an op's own time, the ops nested inside
    it on the same thread taken out, so nothing is counted twice. Events that would
    count but cannot (a dur that is not a time, a name that is not a string) are left
    out and counted per field under `left_out` (absent when none are). What is not a
    dict is no event and is passed over.
    """
    table = _SummaryTable()
    dicts = (event for event in events if type(event) is dict)
    while batch := list(islice(dicts, _EVENTS_PER_BATCH)):
        table.add_batch(_fields(batch))
    return table.result()


class _Fields:
    """The fields of an event a summary reads; what the stdlib decoder makes of an event."""

    __slots__ = ("cat", "dur", "name", "ph", "pid", "tid", "ts")

    def __init__(self, event: dict[str, Any]) -> None:
        get = event.get
        self.ph = get("ph")
        self.cat = get("cat")
        self.name = get("name")
        self.dur = get("dur")
        self.ts = get("ts")
        self.pid = get("pid")
        self.tid = get("tid")


def _fields(events: list[dict[str, Any]]) -> list[Any]:
    return [_Fields(event) for event in events]


def _plain_fields(text: str) -> list[Any] | None:
    events = plain_events(text)
    return None if events is None else _fields(events)


_PLAIN = BatchDecoder(_plain_fields, _fields)
_TYPED: list[BatchDecoder] = []  # built on first use: importing msgspec is not free


def _decoder(use_msgspec: bool) -> BatchDecoder:
    """The typed msgspec decoder where asked for and importable, else the stdlib's."""
    if not use_msgspec:
        return _PLAIN
    if not _TYPED:
        _TYPED.append(_typed_decoder() or _PLAIN)
    return _TYPED[0]


def _typed_decoder() -> BatchDecoder | None:
    try:
        import msgspec  # the analysis extra's, imported on first use: it costs a few ms
    except ImportError:
        return None

    # Every field is Any, not its JSON type: a dur that is a string is an event to count
    # under left_out, not a batch the decoder refuses. The other fields are skipped
    # (validated, never built), which is where the time goes. No gc: nothing to cycle.
    class _Event(msgspec.Struct, gc=False):
        ph: Any = None
        cat: Any = None
        name: Any = None
        dur: Any = None
        ts: Any = None
        pid: Any = None
        tid: Any = None

    typed = msgspec.json.Decoder(list[_Event]).decode
    failed = (msgspec.DecodeError, RecursionError)

    def decode(text: str) -> list[Any] | None:
        try:
            return typed(text)
        except failed:  # not an object, NaN, 1e400, a lone surrogate: as the stdlib reads it
            return _plain_fields(text)

    return BatchDecoder(decode, _fields)


def kernel_category(name: str) -> str:
    """ "communication" for collective kernels, else "computation"."""
    return "communication" if name.lower().startswith(("nccl", "rccl")) else "computation"


class _SummaryTable:
    """Accumulates a summary one event at a time (what a streaming read needs)."""

    def __init__(self) -> None:
        self.kernels: dict[str, list[float]] = {}
        self.memory: dict[str, list[float]] = {}
        # CPU ops as columns: a CPU-only trace can hold millions of them.
        self.op_thread: list[int] = []
        self.op_ts: list[float] = []
        self.op_dur: list[float] = []
        self.op_name: list[int] = []
        self._threads: dict[tuple[str, str], int] = {}
        self._names: dict[str, int] = {}
        self.bad: dict[tuple[str, str], int] = {}
        """Events left out, per (cat, field at fault)."""

    def add_batch(self, events: list[Any]) -> None:
        """Count a batch of events (with the attributes of `_Fields`)."""
        # Called per event of traces with millions: checks are ordered by how often
        # they end the work, and `type(x) in _NUMBER` also rejects bools. A comparison
        # chain is false for NaN and too-large ints alike, and never raises.
        kernels, memory, bad = self.kernels, self.memory, self._bad
        for ev in events:
            if ev.ph != "X":
                continue
            cat = ev.cat
            if cat not in _COUNTED:
                continue
            dur = ev.dur
            if type(dur) not in _NUMBER or not 0 <= dur < MAX_DUR_US:
                bad(cat, "dur")
                continue
            name = ev.name
            if type(name) is not str:
                bad(cat, "name")
                continue
            if cat == "kernel":
                _add_stat(kernels, name, float(dur))
            elif cat == "cpu_op":
                if not kernels:
                    self._add_op(ev, name, dur)
            else:
                _add_stat(memory, "memcpy" if cat == "gpu_memcpy" else "memset", float(dur))

    def _add_op(self, ev: Any, name: str, dur: float) -> None:
        ts = ev.ts
        if type(ts) not in _NUMBER or not -_MAX_TS_US < ts < _MAX_TS_US:
            self._bad("cpu_op", "ts")
            return
        thread = (str(ev.pid), str(ev.tid))
        self.op_thread.append(self._threads.setdefault(thread, len(self._threads)))
        self.op_ts.append(float(ts))
        self.op_dur.append(float(dur))
        self.op_name.append(self._names.setdefault(name, len(self._names)))

    def _bad(self, cat: str, field: str) -> None:
        self.bad[cat, field] = self.bad.get((cat, field), 0) + 1

    def result(self) -> dict[str, Any]:
        if self.kernels:
            categories: dict[str, list[float]] = {}
            for name, (count, total, lo, hi) in self.kernels.items():
                row = categories.setdefault(kernel_category(name), [0, 0.0, lo, hi])
                row[0] += count
                row[1] += total
                row[2], row[3] = min(row[2], lo), max(row[3], hi)
            categories.update(self.memory)
            out = {
                "kind": "gpu_kernels",
                **_table(self.kernels),
                "categories": _table(categories)["items"],
            }
        else:
            out = {"kind": "cpu_ops", **_table(self._self_times()), "categories": []}
        # Only what the table would have counted: a GPU trace's CPU ops are not in it.
        counted = (
            ("cpu_op",) if out["kind"] == "cpu_ops" else ("kernel", "gpu_memcpy", "gpu_memset")
        )
        left_out: dict[str, int] = {}
        for (cat, field), events in sorted(self.bad.items()):
            if cat in counted:
                left_out[field] = left_out.get(field, 0) + events
        if left_out:
            out["left_out"] = left_out
        return out

    def _self_times(self) -> dict[str, list[float]]:
        names = list(self._names)
        stats: dict[str, list[float]] = {}
        for name, own in _self_times(self.op_thread, self.op_ts, self.op_dur, self.op_name):
            _add_stat(stats, names[name], own)
        return stats


def left_out_lines(left_out: Mapping[str, int]) -> list[str]:
    """What a summary's `left_out` counts, in words: "3 events with a bad dur (...) left out"."""
    return [
        f"{events} event{'s' if events != 1 else ''} with {_FAULTS.get(field, f'a bad {field}')} left out"
        for field, events in left_out.items()
    ]


def _add_stat(stats: dict[str, list[float]], name: str, dur: float) -> None:
    row = stats.get(name)
    if row is None:
        stats[name] = [1, dur, dur, dur]
    else:
        row[0] += 1
        row[1] += dur
        row[2] = min(row[2], dur)
        row[3] = max(row[3], dur)


# Kineto writes times in us with 3 decimals: an op may end this much past its parent.
_NESTING_SLACK_US = 1e-3


def _self_times(
    thread: list[int], ts: list[float], dur: list[float], name: list[int]
) -> Iterator[tuple[int, float]]:
    """(name index, self time) per op: its duration less the ops directly inside it."""
    # Thread, then start, then longest first: every op comes after the op that holds it.
    order = sorted(range(len(ts)), key=lambda i: (thread[i], ts[i], -dur[i]))
    inner = [0.0] * len(ts)
    stack: list[int] = []
    current = -1
    for i in order:
        if thread[i] != current:
            current, stack = thread[i], []
        while stack:
            end = ts[stack[-1]] + dur[stack[-1]]
            if end > ts[i] + _NESTING_SLACK_US and ts[i] + dur[i] <= end + _NESTING_SLACK_US:
                inner[stack[-1]] += dur[i]  # i runs inside the op on top
                break
            stack.pop()  # ended before i began, or overlaps it without holding it
        stack.append(i)
    for i in range(len(ts)):
        yield name[i], max(0.0, dur[i] - inner[i])


def _table(by_name: dict[str, list[float]]) -> dict[str, Any]:
    total = sum(row[1] for row in by_name.values())
    items: list[dict[str, Any]] = [
        {
            "name": name,
            "count": int(count),
            "total_us": tot,
            "mean_us": tot / count,
            "min_us": lo,
            "max_us": hi,
            "share": tot / total if total > 0 else 0.0,
        }
        for name, (count, tot, lo, hi) in by_name.items()
    ]
    items.sort(key=lambda item: (-float(item["total_us"]), str(item["name"])))
    return {
        "count": sum(int(row[0]) for row in by_name.values()),
        "total_us": total,
        "items": items,
    }


# -- checking a summary read back from a file ---------------------------------------------

_MAX_TOTAL_US = 1e18  # any sum of times a trace holds stays below this
_ROW_TIMES = ("total_us", "min_us", "max_us")


def summary_problem(  # noqa: PLR0911 - a return per check
    data: Mapping[str, Any], name_rank: int | None = None
) -> str | None:
    """What makes `data` (a summary of this version, read back from its file) unusable, in
    words; None when its figures can be summed as they are.

    `name_rank` is the rank its trace's name gives: a summary saying another rank is
    not of that trace. Every number is checked to be one (no NaN, no string), the rows
    to add up to the totals, so a table built from summaries holds only finite figures.
    """
    kind = data.get("kind")
    if kind not in ("gpu_kernels", "cpu_ops"):
        return f"kind is {shown(kind)}, not gpu_kernels or cpu_ops"
    rank = data.get("rank")
    if rank is not None and (not _is_count(rank) or rank >= 1 << 31):
        return f"rank is {shown(rank)}, not a rank"
    if rank is not None and name_rank is not None and rank != name_rank:
        return f"it says rank {rank}, its name rank {name_rank}"
    for key in ("count", "total_us"):
        value = data.get(key)
        if not (_is_count(value) if key == "count" else _is_total(value)):
            what = "a whole number >= 0" if key == "count" else "a time in us >= 0"
            return f"{key} is {shown(value)}, not {what}"
    for key in ("items", "categories"):
        problem = _rows_problem(key, data.get(key))
        if problem is not None:
            return problem
    items = data["items"]
    if sum(item["count"] for item in items) != data["count"]:
        return "its items' counts do not add up to its count"
    if not math.isclose(
        sum(item["total_us"] for item in items), data["total_us"], rel_tol=1e-6, abs_tol=1e-3
    ):
        return "its items' times do not add up to its total_us"
    left_out = data.get("left_out", {})
    if not isinstance(left_out, dict) or not all(
        isinstance(k, str) and _is_count(v) for k, v in left_out.items()
    ):
        return f"left_out is {shown(left_out)}, not counts of events"
    return None


def _rows_problem(key: str, rows: Any) -> str | None:  # noqa: PLR0911 - a return per check
    if not isinstance(rows, list):
        return f"{key} is {shown(rows)}, not a list"
    for number, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            return f"{key}[{number}] is {shown(row)}, not an object"
        if not isinstance(row.get("name"), str):
            return f"{key}[{number}].name is {shown(row.get('name'))}, not a string"
        if not _is_count(row.get("count")) or row["count"] < 1:
            return f"{key}[{number}].count is {shown(row.get('count'))}, not a whole number >= 1"
        for field in _ROW_TIMES:
            if not _is_total(row.get(field)):
                return f"{key}[{number}].{field} is {shown(row.get(field))}, not a time in us >= 0"
        if not row["min_us"] <= row["max_us"] <= row["total_us"] * (1 + 1e-9):
            return f"{key}[{number}]: min_us, max_us and total_us disagree"
    return None


def _is_count(value: object) -> bool:
    return type(value) is int and value >= 0


def _is_total(value: object) -> bool:
    return type(value) in _NUMBER and 0 <= value < _MAX_TOTAL_US  # type: ignore[operator]
