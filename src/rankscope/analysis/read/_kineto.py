"""Reading Kineto (torch.profiler) traces and summarising their kernels, or their CPU ops.

Imports no torch: analysis runs anywhere.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ._stream import scan_trace

__all__ = [
    "SUMMARY_VERSION",
    "kernel_category",
    "load_trace",
    "scan_trace",
    "summarize_events",
    "summarize_trace",
]

SUMMARY_VERSION = 2
_NUMBER = (int, float)


def load_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a `.json` or `.json.gz` Kineto trace whole; TraceError names the file and the fault.

    Holds every event in memory: for large traces prefer `scan_trace`.
    """
    events: list[Any] = []
    meta = scan_trace(path, events.append)
    return {**meta, "traceEvents": events}


def summarize_trace(path: str | os.PathLike[str], **labels: Any) -> dict[str, Any]:
    """Summary of one trace file, read in one streaming pass; `labels` (window) are stored alongside."""
    table = _SummaryTable()
    meta = scan_trace(path, table.add)
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
    it on the same thread taken out, so nothing is counted twice.
    """
    table = _SummaryTable()
    for event in events:
        table.add(event)
    return table.result()


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

    def add(self, ev: object) -> None:
        # Called once per event of traces with millions: checks are ordered by how
        # often they end the work, and `type(x) in _NUMBER` also rejects bools.
        if type(ev) is not dict or ev.get("ph") != "X":
            return
        dur: Any = ev.get("dur")
        name, cat = ev.get("name"), ev.get("cat")
        if type(dur) not in _NUMBER or type(name) is not str:
            return
        if cat == "kernel":
            _add_stat(self.kernels, name, float(dur))
        elif cat == "cpu_op":
            ts: Any = ev.get("ts")
            if type(ts) in _NUMBER and not self.kernels:
                thread = (str(ev.get("pid")), str(ev.get("tid")))
                self.op_thread.append(self._threads.setdefault(thread, len(self._threads)))
                self.op_ts.append(float(ts))
                self.op_dur.append(float(dur))
                self.op_name.append(self._names.setdefault(name, len(self._names)))
        elif cat in ("gpu_memcpy", "gpu_memset"):
            _add_stat(self.memory, "memcpy" if cat == "gpu_memcpy" else "memset", float(dur))

    def result(self) -> dict[str, Any]:
        if self.kernels:
            categories: dict[str, list[float]] = {}
            for name, (count, total, lo, hi) in self.kernels.items():
                row = categories.setdefault(kernel_category(name), [0, 0.0, lo, hi])
                row[0] += count
                row[1] += total
                row[2], row[3] = min(row[2], lo), max(row[3], hi)
            categories.update(self.memory)
            return {
                "kind": "gpu_kernels",
                **_table(self.kernels),
                "categories": _table(categories)["items"],
            }
        return {"kind": "cpu_ops", **_table(self._self_times()), "categories": []}

    def _self_times(self) -> dict[str, list[float]]:
        names = list(self._names)
        stats: dict[str, list[float]] = {}
        for name, own in _self_times(self.op_thread, self.op_ts, self.op_dur, self.op_name):
            _add_stat(stats, names[name], own)
        return stats


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
