"""Reading the timer's JSONL files: every rank of a run, column by column.

A run of 1024 ranks x 200 sampled steps x 7 records is 1.4M lines; keeping each as
a Python object would take hundreds of MB, so a rank's records are held as typed
columns (`array`), with phase and kind names interned.
"""

from __future__ import annotations

import json
import math
import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import TraceError

__all__ = ["RankTimings", "RunTimings", "read_rank_timings", "read_timings"]

_RANK_FILE = re.compile(r"rank-(\d+)\.jsonl")
# Lines parsed per json.loads: one call over a JSON array is ~2x faster than one a line.
_BATCH = 4096
# In a line that starts with "{" and ends with "}", a top-level comma (which would make
# one line several values) must follow a "}": without this pattern no line can split.
_SPLIT = re.compile(rb"\}\s*,")


@dataclass(eq=False)
class RankTimings:
    """One rank's records, as columns of equal length (one entry per record)."""

    rank: int
    path: Path
    names: list[str] = field(default_factory=list)
    """Phase names; `phase[i]` indexes into it."""
    kinds: list[str] = field(default_factory=list)
    """Kind names; `kind[i]` indexes into it."""
    step: array[int] = field(default_factory=lambda: array("q"))
    phase: array[int] = field(default_factory=lambda: array("i"))
    kind: array[int] = field(default_factory=lambda: array("i"))
    start_ns: array[int] = field(default_factory=lambda: array("q"))
    cpu_ms: array[float] = field(default_factory=lambda: array("d"))
    gpu_ms: array[float] = field(default_factory=lambda: array("d"))
    """Device time, NaN where the record has none."""
    depth: array[int] = field(default_factory=lambda: array("q"))
    error: array[int] = field(default_factory=lambda: array("b"))
    skipped: list[str] = field(default_factory=list)
    """What was left out of this file and why, one line each (a torn last line, a bad line)."""

    def __len__(self) -> int:
        return len(self.step)

    def _intern(self, table: list[str], index: dict[str, int], name: str) -> int:
        found = index.get(name)
        if found is None:
            found = index[name] = len(table)
            table.append(name)
        return found


@dataclass(eq=False)
class RunTimings:
    """Every rank's timings in a run directory."""

    run_dir: Path
    ranks: dict[int, RankTimings]
    skipped: list[str] = field(default_factory=list)
    """What was left out of the run and why (whole files, and each file's own skips)."""


def read_timings(run_dir: str | Path) -> RunTimings:
    """Read RUN_DIR/timings/rank-*.jsonl. A file or line that cannot be used is skipped and
    said in `skipped`; a run with nothing usable is a TraceError naming why."""
    root = Path(run_dir)
    if not root.exists():
        raise TraceError(f"{root}: no such directory")
    if not root.is_dir():
        raise TraceError(f"{root}: not a directory (expected a run directory)")
    folder = root / "timings"
    files = sorted(folder.glob("rank-*.jsonl")) if folder.is_dir() else []
    if not files:
        raise TraceError(f"{root}: no timings (no timings/rank-*.jsonl; was the timer on?)")
    ranks: dict[int, RankTimings] = {}
    skipped: list[str] = []
    for path in files:
        try:
            timings = read_rank_timings(path)
        except TraceError as exc:
            skipped.append(str(exc))
            continue
        skipped.extend(timings.skipped)
        if len(timings) == 0:
            skipped.append(f"{path}: no records")
            continue
        ranks[timings.rank] = timings
    if not ranks:
        raise TraceError(f"{root}: no usable timings ({'; '.join(skipped)})")
    return RunTimings(run_dir=root, ranks=ranks, skipped=skipped)


def read_rank_timings(path: str | Path) -> RankTimings:
    """Read one rank's file. Its rank comes from its name (rank-00003.jsonl); records that
    claim another rank, and lines that are not records, are skipped and said in `skipped`."""
    path = Path(path)
    named = _RANK_FILE.fullmatch(path.name)
    if named is None:
        raise TraceError(f"{path}: not a timings file (expected a name like rank-00003.jsonl)")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    out = RankTimings(rank=int(named.group(1)), path=path)
    lines = data.split(b"\n")
    torn = lines.pop()  # b"" when the file ends with a newline, else a line cut short
    names: dict[str, int] = {}
    kinds: dict[str, int] = {}
    for first in range(0, len(lines), _BATCH):
        batch = lines[first : first + _BATCH]
        for number, record in _parse(batch, first + 1, path, out.skipped):
            problem = _add(out, record, names, kinds)
            if problem:
                out.skipped.append(f"{path}:{number}: {problem}")
    if torn.strip():
        out.skipped.append(
            f"{path}:{len(lines) + 1}: the last line is cut short (a crash mid-write?)"
        )
    return out


def _parse(
    lines: list[bytes], first_number: int, path: Path, skipped: list[str]
) -> list[tuple[int, Any]]:
    """(line number, parsed value) for each non-blank line; bad lines are skipped and said."""
    numbered = [(first_number + i, line.strip()) for i, line in enumerate(lines) if line.strip()]
    if not numbered:
        return []
    joined = b",".join(line for _, line in numbered)
    # One parse for the whole batch, when it cannot misattribute: every line an object
    # that cannot split into several values, so lines that merge make the count fall short.
    if all(line[:1] == b"{" and line[-1:] == b"}" for _, line in numbered) and not any(
        _SPLIT.search(line) for _, line in numbered
    ):
        try:
            values = json.loads(b"[" + joined + b"]")
        except (ValueError, UnicodeDecodeError, RecursionError):
            values = None
        if values is not None and len(values) == len(numbered):
            return [(n, v) for (n, _), v in zip(numbered, values, strict=True)]
    # A bad line somewhere in the batch (or nested meta): parse the lines one by one.
    out = []
    for number, line in numbered:
        try:
            out.append((number, json.loads(line)))
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            skipped.append(f"{path}:{number}: not valid JSON ({type(exc).__name__})")
    return out


_REQUIRED = ("rank", "step", "phase", "kind", "start_ns", "cpu_ms")
_INT_MAX = 2**63 - 1


def _problem(record: Any, rank: int) -> str | None:  # noqa: PLR0911 - a return per rule reads best
    """Why `record` cannot be used as a record of `rank`; None when it can."""
    if not isinstance(record, dict):
        return "not a record (not a JSON object)"
    missing = [key for key in _REQUIRED if key not in record]
    if missing:
        return f"a record without {', '.join(missing)}"
    if record["rank"] != rank or isinstance(record["rank"], bool):
        return f"a record of rank {record['rank']!r} in the file of rank {rank}"
    ints = (record["step"], record["start_ns"], record.get("depth", 0))
    if not all(_is_int(v) and 0 <= v <= _INT_MAX for v in ints):
        return "step, start_ns and depth must be integers >= 0"
    if not (isinstance(record["phase"], str) and isinstance(record["kind"], str)):
        return "phase and kind must be strings"
    gpu_ms = record.get("gpu_ms")
    if not _is_number(record["cpu_ms"]) or not (gpu_ms is None or _is_number(gpu_ms)):
        return "cpu_ms and gpu_ms must be numbers (gpu_ms may be null)"
    return None


def _add(out: RankTimings, record: Any, names: dict[str, int], kinds: dict[str, int]) -> str | None:
    """Append one record to the columns, or say why it cannot be used."""
    problem = _problem(record, out.rank)
    if problem is not None:
        return problem
    step, phase, kind = record["step"], record["phase"], record["kind"]
    start_ns, cpu_ms, gpu_ms = record["start_ns"], record["cpu_ms"], record.get("gpu_ms")
    depth, error = record.get("depth", 0), record.get("error", False)
    out.step.append(step)
    out.start_ns.append(start_ns)
    out.depth.append(depth)
    out.phase.append(out._intern(out.names, names, phase))
    out.kind.append(out._intern(out.kinds, kinds, kind))
    out.cpu_ms.append(float(cpu_ms))
    out.gpu_ms.append(math.nan if gpu_ms is None else float(gpu_ms))
    out.error.append(1 if error is True else 0)
    return None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
