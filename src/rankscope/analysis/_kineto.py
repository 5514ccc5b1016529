"""Reading Kineto (torch.profiler) traces and summarising their kernels or top-level ops.

Imports no torch: analysis runs anywhere.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .._errors import TraceError

__all__ = ["SUMMARY_VERSION", "load_trace", "summarize_events", "summarize_trace"]

SUMMARY_VERSION = 1


def load_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a `.json` or `.json.gz` Kineto trace; TraceError names the file and the fault."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as fh:
            raw = fh.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        data = json.loads(raw)
    except FileNotFoundError:
        raise TraceError(f"{name}: no such file") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise TraceError(f"{name}: truncated or corrupt gzip ({exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(f"{name}: not valid JSON ({exc})") from None
    except OSError as exc:
        raise TraceError(f"{name}: cannot read ({exc.strerror or exc})") from None
    if isinstance(data, list):  # the bare-array form of the Chrome trace format
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{name}: not a trace (no traceEvents list)")
    return data


def summarize_trace(path: str | os.PathLike[str], **labels: Any) -> dict[str, Any]:
    """Summary of one trace file; `labels` (rank, window) are stored alongside."""
    trace = load_trace(path)
    summary = summarize_events(trace["traceEvents"])
    info = trace.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, Mapping) else None
    return {"v": SUMMARY_VERSION, "trace": Path(path).name, "rank": rank, **labels, **summary}


def summarize_events(events: Iterable[object]) -> dict[str, Any]:
    """Per GPU kernel name: count, total/mean/min/max time (us) and share of kernel time.

    A trace with no GPU kernels (CPU only) is summarised per top-level CPU op instead:
    ops not nested inside another op on the same thread, so time is not counted twice.
    """
    kernels: list[tuple[str, float]] = []
    cpu_ops: list[tuple[Any, Any, float, float, str]] = []
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        dur, name = ev.get("dur"), ev.get("name")
        if not isinstance(dur, (int, float)) or isinstance(dur, bool) or not isinstance(name, str):
            continue
        cat = ev.get("cat")
        if cat == "kernel":
            kernels.append((name, float(dur)))
        elif cat == "cpu_op":
            ts = ev.get("ts")
            if isinstance(ts, (int, float)):
                cpu_ops.append((ev.get("pid"), ev.get("tid"), float(ts), float(dur), name))
    if kernels:
        return {"kind": "gpu_kernels", **_table(kernels)}
    return {"kind": "cpu_ops", **_table(_top_level(cpu_ops))}


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


def _table(rows: list[tuple[str, float]]) -> dict[str, Any]:
    by_name: dict[str, list[float]] = {}
    for name, dur in rows:
        stats = by_name.get(name)
        if stats is None:
            by_name[name] = [1, dur, dur, dur]
        else:
            stats[0] += 1
            stats[1] += dur
            stats[2] = min(stats[2], dur)
            stats[3] = max(stats[3], dur)
    total = sum(s[1] for s in by_name.values())
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
    return {"count": len(rows), "total_us": total, "items": items}
