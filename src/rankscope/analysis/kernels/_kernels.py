"""Kernel (or CPU op) tables across one trace or many: what `rankscope kernels` prints."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ..._errors import ConfigError, TraceError
from ...rundir._layout import rank_of_file, summary_of, window_steps
from ...rundir._listing import (
    RunDir,
    is_run_dir,
    is_window_folder,
    not_regular,
    open_regular,
    traces_under,
)
from ...traces._kineto import SUMMARY_VERSION, left_out_lines, summarize_trace, summary_problem
from ..core._options import KernelOptions
from ..core._parallel import PARALLEL_BYTES, file_size, ordered_map

__all__ = [
    "KernelReport",
    "KernelTable",
    "find_traces",
    "kernel_report",
    "latest_of_the_same_steps",
    "read_summaries",
]

_PARALLEL_BYTES = PARALLEL_BYTES  # tests lower it to read small traces in workers
_SUMMARY_MAX_BYTES = 64 << 20  # a summary of 100,000 kernel names is a few MB


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

    __slots__ = ("notes", "skipped", "tables", "traces")

    def __init__(
        self,
        *,
        tables: list[KernelTable],
        traces: list[dict[str, Any]],
        skipped: list[str],
        notes: list[str] | None = None,
    ) -> None:
        self.tables = tables
        self.traces = traces
        """Per trace: path, rank, window, kind, count, total_us."""
        self.skipped = skipped
        """What could not be used, one line each naming the file and why."""
        self.notes = notes or []
        """What the tables show otherwise than asked (--by category on CPU ops)."""

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        return {
            "tables": [t.to_dict(top) for t in self.tables],
            "traces": self.traces,
            "skipped": self.skipped,
            "notes": self.notes,
        }


def find_traces(
    sources: Iterable[str | os.PathLike[str]],
    window: str | None = None,
    *,
    left_out: list[str] | None = None,
) -> list[Path]:
    """The trace files named, and those under the folders named (a run directory, a window).

    `window` keeps only traces in a folder of that name (step-000003-000004). A missing
    path, or a folder with no trace, is a TraceError naming it. Only regular files are
    returned, each once however it was named: what is named like a trace but is not one
    (a FIFO, a folder, a link in a loop) is added to `left_out` as "PATH: why".
    """
    said = left_out if left_out is not None else []
    found: list[Path] = []
    for source in sources:
        path = Path(source)
        if path.is_dir():
            if is_run_dir(path):  # its traces, never its meta or timings
                run = RunDir(path)
                inside = [t.path for t in run.traces(window)]
                said.extend(run.left_out)
            else:
                inside = [
                    t.path
                    for t in traces_under(path, window, lambda p, why: said.append(f"{p}: {why}"))
                ]
            if not inside:
                where = f" in a window named {window}" if window is not None else ""
                also = f"; {'; '.join(said)}" if said else ""
                raise TraceError(f"{path}: no trace files (*.json, *.json.gz){where}{also}")
            found.extend(inside)
        elif not os.path.lexists(path):
            raise TraceError(f"{path}: no such file or directory")
        elif window is None or path.parent.name == window:
            why = not_regular(path)
            if why is None:
                found.append(path)
            else:
                said.append(f"{path}: {why}")
    if not found:
        if window is None:
            raise TraceError("; ".join(said) or "no trace given")
        raise TraceError(f"no trace in {', '.join(str(s) for s in sources)} is in window {window}")
    return _distinct(found)


def kernel_report(
    sources: Sequence[str | os.PathLike[str]],
    options: KernelOptions | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
    workers: int | None = None,
) -> KernelReport:
    """Summaries of every trace found, summed per kernel name (or category) across them.

    A trace that cannot be read is skipped and said; TraceError when none can be. So
    are two traces that claim one rank in one window of a run directory: neither can be
    trusted over the other (a folder gathered from elsewhere may hold several jobs'
    rank 0). A capture's own summary next to its trace is used when it is current (same
    version, newer than the trace) and sound; a summary that is not is said, and its
    trace read instead. The options' `by="category"` groups GPU kernels; CPU ops have no categories,
    so it is a ConfigError where the traces hold CPU ops only, and a note (`notes`)
    beside their table, which stays per op, where they are mixed.
    """
    options = KernelOptions() if options is None else options
    by, window = options.by, options.window
    skipped: list[str] = []
    paths = find_traces(sources, window, left_out=skipped)
    read = read_summaries(paths, skipped, progress=progress, workers=workers)
    summaries = latest_of_the_same_steps(read, skipped)
    if not summaries:
        raise TraceError(f"no readable trace ({'; '.join(skipped)})")
    traces = [
        {
            "path": str(path),
            "rank": _rank_of(path, s),
            "window": path.parent.name,
            "kind": s["kind"],
            "count": s["count"],
            "total_us": s["total_us"],
        }
        for path, s in summaries
    ]
    tables = []
    notes: list[str] = []
    for kind in ("gpu_kernels", "cpu_ops"):
        chosen = [s for _, s in summaries if s["kind"] == kind]
        if chosen:
            tables.append(_merge(kind, by if kind == "gpu_kernels" else "name", chosen))
    if by == "category" and tables[-1].kind == "cpu_ops":
        if len(tables) == 1:  # nothing to group: saying so beats a table by name unasked
            raise ConfigError(
                "by",
                by,
                "name",
                "the traces hold CPU ops only, no GPU kernels, and CPU ops have no categories",
            )
        notes.append(
            f"{tables[-1].traces} trace(s) hold CPU ops only, no GPU kernels: "
            "--by category does not apply to them; their ops are listed by name"
        )
    return KernelReport(tables=tables, traces=traces, skipped=skipped, notes=notes)


def _distinct(paths: list[Path]) -> list[Path]:
    """`paths` without a second name for the same file (a folder given twice, a link)."""
    seen: set[tuple[int, int] | Path] = set()
    out = []
    for path in paths:
        try:
            info = path.stat()
            key: tuple[int, int] | Path = (info.st_dev, info.st_ino)
        except OSError:  # its reader says why
            key = path
        if key not in seen:
            seen.add(key)
            out.append(path)
    return out


def _one_per_rank(
    read: list[tuple[Path, dict[str, Any]]], skipped: list[str]
) -> list[tuple[Path, dict[str, Any]]]:
    """`read` less the traces that claim a rank another trace of their window claims too."""
    claims: dict[tuple[Path, int], list[Path]] = {}
    for path, summary in read:
        rank = _rank_of(path, summary)
        if rank is not None and is_window_folder(path.parent):
            claims.setdefault((path.parent, rank), []).append(path)
    doubled = set()
    for (folder, rank), paths in claims.items():
        if len(paths) > 1:
            names = ", ".join(path.name for path in paths)
            skipped.append(
                f"{folder}: rank {rank} is claimed by {len(paths)} traces ({names}); "
                "all skipped: neither can be trusted over the other"
            )
            doubled.update(paths)
    return [(path, summary) for path, summary in read if path not in doubled]


def latest_of_the_same_steps(
    read: list[tuple[Path, dict[str, Any]]], skipped: list[str]
) -> list[tuple[Path, dict[str, Any]]]:
    """`read` less the traces of a rank whose steps a later trace of that rank holds too.

    Windows of one attempt never share a step (a window that would is refused when
    asked for), so two that do come from two attempts: a step that ran again after a
    restart, captured again under another name. The later trace wins, as the latest
    record of a step does in the timings; no step is summed twice.
    """
    by_rank: dict[tuple[Path, int], list[tuple[int, int, float, Path]]] = {}
    for path, summary in read:
        rank, steps = _rank_of(path, summary), window_steps(path.parent.name)
        if rank is None or steps is None or not is_window_folder(path.parent):
            continue
        try:
            written = path.stat().st_mtime
        except OSError:
            continue
        by_rank.setdefault((path.parent.parent, rank), []).append((*steps, written, path))
    dropped: set[Path] = set()
    for (_, rank), windows in by_rank.items():
        for first, last, written, path in windows:
            later = [
                (when, str(other), other)
                for start, end, when, other in windows
                if start <= last and first <= end and (when, str(other)) > (written, str(path))
            ]
            if later:
                dropped.add(path)
                used = max(later)[2].parent.name
                skipped.append(
                    f"{path}: rank {rank}'s steps {first}-{last} were captured again later, "
                    f"in {used} (a step that ran again after a restart); that one is used"
                )
    return [(path, summary) for path, summary in read if path not in dropped]


def _merge(kind: str, by: str, summaries: list[dict[str, Any]]) -> KernelTable:
    rows: dict[str, list[float]] = {}
    seen_in: dict[str, int] = {}
    for summary in summaries:
        items = summary["items"] if by == "name" else summary["categories"]
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
    # One total for every row: by category, memcpy and memset are in it with the kernels.
    total = sum(row[1] for row in rows.values())
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
        count=sum(int(row[0]) for row in rows.values()),
        total_us=total,
        items=items,
    )


def _rank_of(path: Path, summary: dict[str, Any]) -> int | None:
    rank = summary.get("rank")
    if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0:
        return rank
    return rank_of_file(path.name)


def read_summaries(
    traces: list[Path],
    skipped: list[str],
    *,
    progress: Callable[[int, int], None] | None = None,
    workers: int | None = None,
) -> list[tuple[Path, dict[str, Any]]]:
    """(trace, its summary) for each trace that can be read, one per rank in a window: two
    that claim one rank are both left out. What is left out is said in `skipped`."""
    read: list[tuple[Path, dict[str, Any]]] = []
    for path, (summary, said) in zip(traces, _summaries(traces, progress, workers), strict=True):
        skipped.extend(said)
        if summary is not None:
            read.append((path, summary))
    return _one_per_rank(read, skipped)


def _summaries(
    paths: list[Path], progress: Callable[[int, int], None] | None, workers: int | None
) -> list[tuple[dict[str, Any] | None, list[str]]]:
    size = sum(file_size(p) for p in paths)
    return ordered_map(
        _summary_or_say,
        paths,
        size=size,
        workers=workers,
        progress=progress,
        min_bytes=_PARALLEL_BYTES,
    )


def _summary_or_say(path: Path) -> tuple[dict[str, Any] | None, list[str]]:
    """The summary of the trace at `path` (None where it cannot be read), and what to say."""
    said: list[str] = []
    try:
        summary = _current_summary(path, said) or summarize_trace(path, window=path.parent.name)
    except TraceError as exc:
        return None, [*said, str(exc)]
    said.extend(f"{path}: {line}" for line in left_out_lines(summary.get("left_out", {})))
    return summary, said


def _current_summary(trace: Path, said: list[str]) -> dict[str, Any] | None:
    """The capture's summary of `trace`, if it is of this version, newer than the trace and
    sound; a summary there that cannot be used is added to `said`."""
    summary = summary_of(trace)
    if summary is None or not os.path.lexists(summary):
        return None
    try:
        data = _read_current(summary, trace)
    except OSError:
        return None  # gone meanwhile, or the trace is: its reader says what is wrong
    except TraceError as exc:
        said.append(f"{exc}; its trace was read instead")
        return None
    if data is None:
        return None
    problem = summary_problem(data, rank_of_file(trace.name))
    if problem is None:
        return data
    said.append(f"{summary}: not a usable summary ({problem}); its trace was read instead")
    return None


def _read_current(summary: Path, trace: Path) -> dict[str, Any] | None:
    """The JSON object in `summary`; None where it is older than the trace or of another
    version. TraceError naming it where it cannot be read or is no summary at all."""
    why = not_regular(summary)
    if why is not None:
        raise TraceError(f"{summary}: {why}")
    info = summary.stat()
    if info.st_mtime < trace.stat().st_mtime:
        return None  # stale: the trace was written again since
    if info.st_size > _SUMMARY_MAX_BYTES:
        raise TraceError(f"{summary}: over {_SUMMARY_MAX_BYTES >> 20} MB, not a summary")
    try:
        with open_regular(summary) as fh:
            data = json.loads(fh.read(_SUMMARY_MAX_BYTES + 1))
    except OSError as exc:
        raise TraceError(f"{summary}: cannot read ({exc.strerror or exc})") from None
    except (ValueError, RecursionError) as exc:
        raise TraceError(f"{summary}: not valid JSON ({type(exc).__name__})") from None
    version = data.get("v") if isinstance(data, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version != SUMMARY_VERSION:
        return None  # another version's: read the trace, as after an upgrade
    if version != SUMMARY_VERSION:
        what = f"v is {version!r}" if isinstance(data, dict) else "not a JSON object"
        raise TraceError(f"{summary}: not a usable summary ({what})")
    return data  # type: ignore[no-any-return]
