"""Reading a timings file of any layout line by line, through json: any key order, meta
lines, another writer's records; what it skips is said. The timer's own lines take the
faster way in _timings.py; both give the same columns."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ._attempts import AttemptMark, mark_of
from ._rank_timings import INT_MAX, MAX_MS, RankTimings, interleaved

__all__ = ["read_any_lines"]

# Lines parsed per json.loads on the slow path: one call over a JSON array is ~2x
# faster than one a line.
_BATCH = 4096

# In a line that starts with "{" and ends with "}", a top-level comma (which would make
# one line several values) must follow a "}": without this pattern no line can split.
_SPLIT = re.compile(rb"\}\s*,")

_VERSIONS = (1,)
"""The record schema versions this reader knows."""

_REQUIRED = ("rank", "step", "phase", "kind", "start_ns", "cpu_ms")


def _a_time(value: object) -> float:
    """A time in ms another writer put in a record: a finite number >= 0 (not a bool), or
    none (NaN), and the record stands without it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    try:
        number = float(value)
    except OverflowError:  # an int past any double
        return math.nan
    return number if math.isfinite(number) and number >= 0 else math.nan


@dataclass
class _Columns:
    step: list[int] = field(default_factory=list)
    phase: list[int] = field(default_factory=list)
    kind: list[int] = field(default_factory=list)
    start_ns: list[int] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    gpu_ms: list[float] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)
    error: list[bool] = field(default_factory=list)
    coll: list[int] = field(default_factory=list)
    oncpu_ms: list[float] = field(default_factory=list)
    runq_ms: list[float] = field(default_factory=list)
    attempt: list[int] = field(default_factory=list)
    names: dict[str, int] = field(default_factory=dict)
    kinds: dict[str, int] = field(default_factory=dict)
    attempts: list[AttemptMark] = field(default_factory=list)
    current: int = 0
    """The attempt whose lines these are (an index into `attempts`)."""
    chunks: list[int] = field(default_factory=list)
    """The attempt of each run of lines after an attempt line, in the file's order."""

    def begin(self, mark: AttemptMark) -> None:
        """Records from here on are `mark`'s: an attempt is known by its token, wherever
        its lines lie (the same process starting again adds none)."""
        known = [i for i, m in enumerate(self.attempts) if m.token == mark.token]
        if known:
            self.current = known[0]
        else:
            self.current = len(self.attempts)
            self.attempts.append(mark)
        self.chunks.append(self.current)

    def add(self, record: dict[str, Any]) -> None:
        if not self.attempts:
            self.attempts.append(AttemptMark())  # records before any attempt line
            self.chunks.append(0)
        self.attempt.append(self.current)
        gpu_ms = record.get("gpu_ms")
        self.step.append(record["step"])
        self.start_ns.append(record["start_ns"])
        self.depth.append(record.get("depth", 0))
        self.phase.append(self.names.setdefault(record["phase"], len(self.names)))
        self.kind.append(self.kinds.setdefault(record["kind"], len(self.kinds)))
        self.cpu_ms.append(float(record["cpu_ms"]))
        self.gpu_ms.append(math.nan if gpu_ms is None else float(gpu_ms))
        self.error.append(record.get("error", False) is True)
        coll = record.get("coll")
        # Another writer's count that is not one is no count: the record stands without it.
        self.coll.append(coll if type(coll) is int and 0 <= coll < INT_MAX else -1)
        self.oncpu_ms.append(_a_time(record.get("oncpu_ms")))
        self.runq_ms.append(_a_time(record.get("runq_ms")))

    def into(self, out: RankTimings) -> RankTimings:
        out.names, out.kinds = list(self.names), list(self.kinds)
        out.step = np.array(self.step, np.int64)
        out.phase = np.array(self.phase, np.int32)
        out.kind = np.array(self.kind, np.int32)
        out.start_ns = np.array(self.start_ns, np.int64)
        out.cpu_ms = np.array(self.cpu_ms, np.float64)
        out.gpu_ms = np.array(self.gpu_ms, np.float64)
        out.depth = np.array(self.depth, np.int64)
        out.error = np.array(self.error, np.bool_)
        out.coll = np.array(self.coll, np.int64)
        out.oncpu_ms = np.array(self.oncpu_ms, np.float64)
        out.runq_ms = np.array(self.runq_ms, np.float64)
        out.attempt = np.array(self.attempt, np.int32)
        out.attempts = self.attempts or [AttemptMark()]
        out.interleaved = interleaved(self.chunks)
        return out


def read_any_lines(body: bytes, rank: int, path: Path) -> RankTimings:
    out = RankTimings(rank=rank, path=path)
    columns = _Columns()
    versions: dict[object, int] = {}  # lines of a schema version this reader does not know
    lines = body.split(b"\n")[:-1]
    for first in range(0, len(lines), _BATCH):
        batch = lines[first : first + _BATCH]
        for number, record in _parse(batch, first + 1, path, out.skipped):
            if isinstance(record, dict) and record.get("v", 1) not in _VERSIONS:
                version = record["v"]
                key = version if isinstance(version, (int, str)) else repr(version)
                versions[key] = versions.get(key, 0) + 1
                continue
            if _opens_attempt(record):
                problem = _begin_attempt(record, rank, columns)
            else:
                problem = _problem(record, rank)
                if problem is None:
                    columns.add(record)
                    if isinstance(record.get("meta"), dict):
                        out.valued.add(record["phase"])
            if problem is not None:
                out.skipped.append(f"{path}:{number}: {problem}")
    for version, count in versions.items():
        known = ", ".join(map(str, _VERSIONS))
        out.skipped.append(
            f"{path}: {count} line(s) of schema version {version!r} left out "
            f"(this rankscope reads version {known}; a newer rankscope wrote them?)"
        )
    return columns.into(out)


def _opens_attempt(record: Any) -> bool:
    return isinstance(record, dict) and "attempt" in record and "step" not in record


def _begin_attempt(record: dict[str, Any], rank: int, columns: _Columns) -> str | None:
    """Begin the attempt the line opens; why it cannot, where it cannot."""
    if record.get("rank") != rank or isinstance(record.get("rank"), bool):
        return f"an attempt line of rank {record.get('rank')!r} in the file of rank {rank}"
    mark = mark_of(record)
    if isinstance(mark, str):
        return mark
    columns.begin(mark)
    return None


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
    if not all(_is_int(v) and 0 <= v <= INT_MAX for v in ints):
        return "step, start_ns and depth must be integers >= 0"
    if not (isinstance(record["phase"], str) and isinstance(record["kind"], str)):
        return "phase and kind must be strings"
    gpu_ms = record.get("gpu_ms")
    if not _is_number(record["cpu_ms"]) or not (gpu_ms is None or _is_number(gpu_ms)):
        return (
            f"cpu_ms and gpu_ms must be numbers from 0 to {MAX_MS:.0f} (a week; gpu_ms may be null)"
        )
    return None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    """A time from 0 to MAX_MS (a value too large for a double is not one)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value) and 0 <= value <= MAX_MS
    except OverflowError:  # an int past a double's range
        return False
