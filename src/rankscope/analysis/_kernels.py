"""Kernel (or CPU op) tables across one trace or many: what `rankscope kernels` prints."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from .._errors import ConfigError, TraceError
from .._layout import RunDir, is_trace_name, rank_of_file
from ._parallel import PARALLEL_BYTES, file_size, ordered_map
from .read._kineto import SUMMARY_VERSION, summarize_trace

__all__ = ["KernelReport", "KernelTable", "find_traces", "kernel_report"]

BY = ("name", "category")
_PARALLEL_BYTES = PARALLEL_BYTES  # tests lower it to read small traces in workers


# Plain classes, not dataclasses: importing dataclasses (and inspect with it) would cost
# a one-off `rankscope kernels` on a small trace more than reading the trace does.
class KernelTable:
    """One kind of row (GPU kernels, or CPU ops by self time) summed over traces."""

    __slots__ = ("by", "count", "items", "kind", "total_us", "traces")

    def __init__(
        self,
        *,
        kind: str,
        by: str,
        traces: int,
        count: int,
        total_us: float,
        items: list[dict[str, Any]],
    ) -> None:
        self.kind = kind
        """"gpu_kernels" or "cpu_ops"."""
        self.by = by
        self.traces = traces
        self.count = count
        self.total_us = total_us
        self.items = items
        """name, count, total_us, mean_us, min_us, max_us, share, traces; largest total first."""

    def __repr__(self) -> str:
        return f"KernelTable(kind={self.kind!r}, by={self.by!r}, traces={self.traces}, count={self.count})"

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "by": self.by,
            "traces": self.traces,
            "count": self.count,
            "total_us": self.total_us,
            "items": self.items if top is None else self.items[:top],
        }


class KernelReport:
    """Tables for the traces read, what each trace held, and what was skipped."""

    __slots__ = ("skipped", "tables", "traces")

    def __init__(
        self, *, tables: list[KernelTable], traces: list[dict[str, Any]], skipped: list[str]
    ) -> None:
        self.tables = tables
        self.traces = traces
        """Per trace: path, rank, window, kind, count, total_us."""
        self.skipped = skipped

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        return {
            "tables": [t.to_dict(top) for t in self.tables],
            "traces": self.traces,
            "skipped": self.skipped,
        }


def find_traces(sources: Iterable[str | os.PathLike[str]], window: str | None = None) -> list[Path]:
    """The trace files named, and those under the folders named (a run directory, a window).

    `window` keeps only traces in a folder of that name (step-000003-000004). A missing
    path, or a folder with no trace, is a TraceError naming it.
    """
    found: list[Path] = []
    for source in sources:
        path = Path(source)
        if path.is_dir():
            if RunDir.looks_like(path):  # its traces, never its meta or timings
                inside = [t.path for t in RunDir(path).traces(window)]
            else:
                inside = sorted(
                    p
                    for p in path.rglob("*")
                    if is_trace_name(p.name)
                    and p.is_file()
                    and (window is None or p.parent.name == window)
                )
            if not inside:
                where = f" in a window named {window}" if window is not None else ""
                raise TraceError(f"{path}: no trace files (*.json, *.json.gz){where}")
            found.extend(inside)
        elif path.is_file():
            if window is None or path.parent.name == window:
                found.append(path)
        else:
            raise TraceError(f"{path}: no such file or directory")
    if not found:
        raise TraceError(f"no trace in {', '.join(str(s) for s in sources)} is in window {window}")
    return list(dict.fromkeys(found))


def kernel_report(
    sources: Sequence[str | os.PathLike[str]],
    *,
    by: str = "name",
    window: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    workers: int | None = None,
) -> KernelReport:
    """Summaries of every trace found, summed per kernel name (or category) across them.

    A trace that cannot be read is skipped and said; TraceError when none can be. A
    capture's own summary next to its trace is used when it is current (same version,
    newer than the trace), so a run directory reads in milliseconds.
    """
    if by not in BY:
        raise ConfigError("by", by, " or ".join(BY))
    paths = find_traces(sources, window)
    results = _summaries(paths, progress, workers)
    summaries: list[tuple[Path, dict[str, Any]]] = []
    skipped: list[str] = []
    for path, result in zip(paths, results, strict=True):
        if isinstance(result, str):
            skipped.append(result)
        else:
            summaries.append((path, result))
    if not summaries:
        raise TraceError(f"no readable trace ({'; '.join(skipped)})")
    traces = [
        {
            "path": str(path),
            "rank": _rank_of(path, s),
            "window": s.get("window", path.parent.name),
            "kind": s["kind"],
            "count": s["count"],
            "total_us": s["total_us"],
        }
        for path, s in summaries
    ]
    tables = []
    for kind in ("gpu_kernels", "cpu_ops"):
        chosen = [s for _, s in summaries if s["kind"] == kind]
        if chosen:
            tables.append(_merge(kind, by, chosen))
    return KernelReport(tables=tables, traces=traces, skipped=skipped)


def _merge(kind: str, by: str, summaries: list[dict[str, Any]]) -> KernelTable:
    rows: dict[str, list[float]] = {}
    seen_in: dict[str, int] = {}
    for summary in summaries:
        items = summary["items"] if by == "name" or kind == "cpu_ops" else summary["categories"]
        for item in items:
            row = rows.get(item["name"])
            if row is None:
                rows[item["name"]] = [
                    item["count"],
                    item["total_us"],
                    item["min_us"],
                    item["max_us"],
                ]
            else:
                row[0] += item["count"]
                row[1] += item["total_us"]
                row[2] = min(row[2], item["min_us"])
                row[3] = max(row[3], item["max_us"])
            seen_in[item["name"]] = seen_in.get(item["name"], 0) + 1
    # Shares are of kernel time: memcpy and memset rows (by category) stand beside it.
    memory = {"memcpy", "memset"} if by == "category" and kind == "gpu_kernels" else set()
    total = sum(row[1] for name, row in rows.items() if name not in memory)
    items = [
        {
            "name": name,
            "count": int(count),
            "total_us": tot,
            "mean_us": tot / count if count else 0.0,
            "min_us": lo,
            "max_us": hi,
            "share": tot / total if total > 0 else 0.0,
            "traces": seen_in[name],
        }
        for name, (count, tot, lo, hi) in rows.items()
    ]
    items.sort(key=lambda item: (-float(item["total_us"]), str(item["name"])))
    return KernelTable(
        kind=kind,
        by=by,
        traces=len(summaries),
        count=sum(int(row[0]) for name, row in rows.items() if name not in memory),
        total_us=total,
        items=items,
    )


def _rank_of(path: Path, summary: dict[str, Any]) -> int | None:
    rank = summary.get("rank")
    if isinstance(rank, int) and not isinstance(rank, bool):
        return rank
    return rank_of_file(path.name)


def _summaries(
    paths: list[Path], progress: Callable[[int, int], None] | None, workers: int | None
) -> list[dict[str, Any] | str]:
    size = sum(file_size(p) for p in paths)
    return ordered_map(
        _summary_or_say,
        paths,
        size=size,
        workers=workers,
        progress=progress,
        min_bytes=_PARALLEL_BYTES,
    )


def _summary_or_say(path: Path) -> dict[str, Any] | str:
    try:
        return _current_summary(path) or summarize_trace(path, window=path.parent.name)
    except TraceError as exc:
        return str(exc)


def _current_summary(trace: Path) -> dict[str, Any] | None:
    """The capture's summary of `trace`, if it is of this version and newer than the trace."""
    summary = RunDir.summary_of(trace)
    if summary is None:
        return None
    try:
        if summary.stat().st_mtime < trace.stat().st_mtime:
            return None
        data = json.loads(summary.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("v") != SUMMARY_VERSION:
        return None
    return data
