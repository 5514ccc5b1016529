"""Reading Kineto (torch.profiler) traces and summarising their kernels or top-level ops.

Imports no torch: analysis runs anywhere.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ._stream import scan_trace

__all__ = ["SUMMARY_VERSION", "load_trace", "scan_trace", "summarize_events", "summarize_trace"]

SUMMARY_VERSION = 1


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

    A trace with no GPU kernels (CPU only) is summarised per top-level CPU op instead:
    ops not nested inside another op on the same thread, so time is not counted twice.
    """
    table = _SummaryTable()
    for event in events:
        table.add(event)
    return table.result()


class _SummaryTable:
    """Accumulates a summary one event at a time (what a streaming read needs)."""

    def __init__(self) -> None:
        self.kernels: dict[str, list[float]] = {}
        self.cpu_ops: list[tuple[Any, Any, float, float, str]] = []

    def add(self, ev: object) -> None:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            return
        dur, name = ev.get("dur"), ev.get("name")
        if not isinstance(dur, (int, float)) or isinstance(dur, bool) or not isinstance(name, str):
            return
        cat = ev.get("cat")
        if cat == "kernel":
            _add_stat(self.kernels, name, float(dur))
        elif cat == "cpu_op" and not self.kernels:
            ts = ev.get("ts")
            if isinstance(ts, (int, float)):
                self.cpu_ops.append((ev.get("pid"), ev.get("tid"), float(ts), float(dur), name))

    def result(self) -> dict[str, Any]:
        if self.kernels:
            return {"kind": "gpu_kernels", **_table(self.kernels)}
        ops: dict[str, list[float]] = {}
        for name, dur in _top_level(self.cpu_ops):
            _add_stat(ops, name, dur)
        return {"kind": "cpu_ops", **_table(ops)}


def _add_stat(stats: dict[str, list[float]], name: str, dur: float) -> None:
    row = stats.get(name)
    if row is None:
        stats[name] = [1, dur, dur, dur]
    else:
        row[0] += 1
        row[1] += dur
        row[2] = min(row[2], dur)
        row[3] = max(row[3], dur)


def _top_level(ops: list[tuple[Any, Any, float, float, str]]) -> list[tuple[str, float]]:
    # Sorting by (thread, start, longest first) puts every op after the op that encloses it.
    ops.sort(key=lambda op: (str(op[0]), str(op[1]), op[2], -op[3]))
    out: list[tuple[str, float]] = []
    thread: tuple[Any, Any] | None = None
    open_until = float("-inf")
    for pid, tid, ts, dur, name in ops:
        if (pid, tid) != thread:
            thread, open_until = (pid, tid), float("-inf")
        if ts >= open_until:
            out.append((name, dur))
            open_until = ts + dur
    return out


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
