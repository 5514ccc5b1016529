"""The DuckDB scan of the timings files (read/_engine.py runs it): a batch of files at a
time, each file read whole where every line is one the line-by-line reader would read
the same, else handed to that reader."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ...rundir._listing import open_regular
from ..core._parallel import file_size
from ._attempts import AttemptMark, mark_of
from ._duck import COLUMNS, connect, lines_sql, name_of
from ._rank_timings import RankTimings
from ._records import Floats, Int64s, RunRecords

__all__ = ["Scan", "WholeFile", "verdict"]


_BATCH_BYTES = 128 << 20
"""JSONL bytes per DuckDB query: its working memory follows a batch, not the run. At 4096
ranks x 200 steps (755 MB), 128 MB read as fast as 256 MB (2.95-3.28 s against
2.98-3.05 s) at a peak of 434-438 MB against 501-546 MB; 64 MB was slower."""
_HEAD = 1 << 16
"""Bytes read from a file's start to see that its first line opens its one attempt."""
_FIRST = 4096
"""What is read of them first: a first line is shorter (64 KB each was 0.3 s of 4096 files)."""

_SCAN = f"""
WITH {lines_sql(extra=", meta")}
SELECT filename, phase, kind,
    count(meta) FILTER (WHERE known AND record) AS valued,
    count(*) FILTER (WHERE NOT (known AND (record OR opens))) AS bad,
    count(*) FILTER (WHERE known AND opens) AS opens,
    count(DISTINCT attempt::VARCHAR) FILTER (WHERE known AND opens) AS tokens,
    count(*) FILTER (WHERE known AND record) AS records,
    min(rank) FILTER (WHERE known) AS low_rank,
    max(rank) FILTER (WHERE known) AS high_rank,
    min(depth) FILTER (WHERE known AND record) AS depth,
    max(step) FILTER (WHERE known AND record) AS last_step,
    count(*) FILTER (WHERE known AND record AND NOT error AND coll > 0) AS issued,
    count(*) FILTER (WHERE known AND record AND NOT error AND coll >= 0) AS said,
    count(*) FILTER (WHERE known AND record AND NOT error) AS used,
    list(step) FILTER (WHERE known AND record AND NOT error) AS step,
    list(coalesce({{ms}}, 'nan'::DOUBLE)) FILTER (WHERE known AND record AND NOT error) AS ms,
    list(start_ns) FILTER (WHERE known AND record AND NOT error) AS start_ns{{host}}
FROM lines
GROUP BY filename, phase, kind
"""
_COLUMNS = {**COLUMNS, "meta": "JSON"}
_HOST = ",\n    list(cpu_ms) FILTER (WHERE known AND record AND NOT error) AS host_ms"


def _batches(files: list[Path]) -> Iterator[list[Path]]:
    batch: list[Path] = []
    size = 0
    for path in files:
        batch.append(path)
        size += file_size(path)
        if size >= _BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


@dataclass(eq=False)
class WholeFile:
    """A file DuckDB read whole: one attempt; its records wait in the scan's batches."""

    rank: int
    attempts: list[AttemptMark]
    records: int
    skipped: list[str] = field(default_factory=list)
    attempt: npt.NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, np.int32))
    """No column per record: every record is of its one attempt (resolve_attempts fills it)."""

    def __len__(self) -> int:
        return self.records


@dataclass(eq=False)
class _Batch:
    """The records of a batch's whole files, an entry per record, and per (file, phase,
    kind) group what the kind votes, depths and last steps are made of."""

    records: tuple[Any, Any, Int64s, Floats, Int64s, Floats]
    """(rank, phase id (both int32), step, ms, start_ns, host ms: ms itself for host time)."""
    groups: tuple[Int64s, Int64s, list[str], Int64s, Int64s, Int64s, Int64s]
    """(rank, phase id, kind, smallest depth, last step, steps that issued a collective,
    steps that say whether they did) of each group with records."""


class Scan:
    """Reads the files with DuckDB, a batch at a time; sorts each file into `fast` (read
    whole: its records stay in `batches` as flat arrays, never an object per group) or
    `slow` (for the line-by-line reader). A restart's file (its attempts told apart by
    their lines' order, which DuckDB does not give) is slow: the line-by-line reader's
    regular expression reads the timer's lines as fast as a second DuckDB pass that tells
    attempts by the clock would, in less memory (measured)."""

    def __init__(self, ranks: dict[Path, int], time: str, workers: int | None) -> None:
        self.rank_of = ranks
        self.con = connect(workers)
        ms, host = ("cpu_ms", "") if time == "host" else ("gpu_ms", _HOST)
        self.query = _SCAN.replace("{ms}", ms).replace("{host}", host)
        self.fast: dict[Path, WholeFile | RankTimings | str] = {}
        self.slow: list[Path] = []
        self.names: dict[str, int] = {}
        self.batches: list[_Batch] = []
        self.valued: set[str] = set()
        """Phases a record of which (in a whole file) holds user values."""

    def read_all(self, progress: Callable[[int, int], None] | None, extra: int) -> None:
        done = 0
        for batch in _batches(sorted(self.rank_of)):
            self.read(batch)
            done += len(batch)
            if progress is not None:
                progress(done, len(self.rank_of) + extra)

    def read(self, files: list[Path]) -> None:
        index = {str(path): i for i, path in enumerate(files)}
        try:
            table = self.con.execute(self.query, {"files": list(index), "columns": _COLUMNS})
            table = table.fetchnumpy()
        except Exception:  # DuckDB's own errors: the line-by-line reader says what is wrong
            self.slow.extend(files)
            return
        file = np.array([index.get(name, -1) for name in table["filename"].tolist()], np.int64)
        if (file < 0).any():
            self.slow.extend(files)  # a name DuckDB gives otherwise: no file is trusted
            return
        phase = [name_of(raw) for raw in table["phase"].tolist()]
        kind = [name_of(raw) for raw in table["kind"].tolist()]
        records = table["records"].astype(np.int64)
        # a group of records whose phase or kind is no string
        unnamed = np.array(
            [p is None or k is None for p, k in zip(phase, kind, strict=True)], np.bool_
        )
        whole = self._whole_files(files, file, table, unnamed & (records > 0))
        keep = whole[file] & (records > 0)
        picked = np.flatnonzero(keep).tolist()
        self.valued.update(phase[i] for i in np.flatnonzero(keep & (table["valued"] > 0)).tolist())
        rank_of_file = np.array([self.rank_of[path] for path in files], np.int64)
        ids = np.array([self.names.setdefault(phase[i], len(self.names)) for i in picked], np.int64)
        used = table["used"].astype(np.int64)[keep]
        group_rank = rank_of_file[file[keep]]
        ms = _flat(table["ms"], keep, np.float64)
        host = _flat(table["host_ms"], keep, np.float64) if "host_ms" in table else ms
        self.batches.append(
            _Batch(
                records=(
                    np.repeat(group_rank.astype(np.int32), used),
                    np.repeat(ids.astype(np.int32), used),
                    _flat(table["step"], keep, np.int64),
                    ms,
                    _flat(table["start_ns"], keep, np.int64),
                    host,
                ),
                groups=(
                    group_rank,
                    ids,
                    [str(kind[i]) for i in picked],
                    table["depth"][keep].astype(np.int64),
                    table["last_step"][keep].astype(np.int64),
                    table["issued"][keep].astype(np.int64),
                    table["said"][keep].astype(np.int64),
                ),
            )
        )

    def _whole_files(
        self, files: list[Path], file: Int64s, table: dict[str, Any], unnamed: Any
    ) -> npt.NDArray[np.bool_]:
        """Which of `files` DuckDB read whole (the others go to `slow`); each whole file is
        added to `fast`. `file` is each group's file, `unnamed` the groups whose records
        have a phase or kind that is no string."""
        n = len(files)
        bad = np.bincount(file, weights=table["bad"], minlength=n) > 0
        # The timer opens each flush with its attempt line: a file of one attempt has
        # many such lines, all with one token.
        opens = np.bincount(file, weights=table["tokens"], minlength=n)
        own = np.array([self.rank_of[path] for path in files], np.int64)[file]
        named = ~np.ma.getmaskarray(table["low_rank"])  # groups with a line that names a rank
        low = np.ma.filled(table["low_rank"], -1).astype(np.int64)
        high = np.ma.filled(table["high_rank"], -1).astype(np.int64)
        other = named & ((low != own) | (high != own))
        wrong = np.bincount(file, weights=other | unnamed, minlength=n) > 0
        named_any = np.bincount(file, weights=named, minlength=n) > 0
        total = np.bincount(file, weights=table["records"], minlength=n)
        whole = np.zeros(n, np.bool_)
        for i, path in enumerate(files):
            rank = self.rank_of[path]
            marks = None
            if named_any[i] and not wrong[i]:
                ranks = {rank}  # every line that names a rank names this one
                marks = verdict(path, rank, bad=int(bad[i]), opens=int(opens[i]), ranks=ranks)
            if marks is None:
                self.slow.append(path)
            else:
                whole[i] = True
                self.fast[path] = WholeFile(rank, marks, int(total[i]))
        return whole

    def into(self, out: RunRecords, ranks: set[int]) -> None:
        """The records of the whole files of `ranks` (those the claims and attempts kept)."""
        alive = np.zeros(max(self.rank_of.values(), default=0) + 1, np.bool_)  # any file's rank
        alive[list(ranks)] = True
        names = list(self.names)
        out.valued |= self.valued
        while self.batches:
            batch = self.batches.pop(0)  # released as its records find their phases
            _add_groups(out, names, batch.groups, alive[batch.groups[0]])
            rank, ids, step, ms, start, host = batch.records
            mine = alive[rank]
            for p in np.unique(ids[mine]).tolist():
                sel = mine & (ids == p)
                picked_ms = ms[sel]
                picked_host = picked_ms if host is ms else host[sel]  # host time: one array
                out.phase(names[p]).parts.append(
                    (rank[sel], step[sel], picked_ms, start[sel], picked_host)
                )


def _add_groups(
    out: RunRecords,
    names: list[str],
    groups: tuple[Int64s, Int64s, list[str], Int64s, Int64s, Int64s, Int64s],
    mine: npt.NDArray[np.bool_],
) -> None:
    """What a batch's (file, phase, kind) groups tell the run: its ranks, each rank's last
    step, each phase's kind votes (a vote per group) and smallest depth; by numpy, never
    a Python step per group (28k of them at 4096 ranks). `mine`: the groups to add."""
    rank, ids, depths, last = groups[0][mine], groups[1][mine], groups[3][mine], groups[4][mine]
    kinds = [kind for kind, k in zip(groups[2], mine.tolist(), strict=True) if k]
    if not len(rank):
        return
    ranks, at = np.unique(rank, return_inverse=True)
    latest = np.full(len(ranks), np.iinfo(np.int64).min)
    np.maximum.at(latest, at, last)
    for r, step in zip(ranks.tolist(), latest.tolist(), strict=True):
        out.ranks.add(r)
        out.last_step[r] = max(out.last_step.get(r, step), step)
    kind_names = sorted(set(kinds))
    number = {name: i for i, name in enumerate(kind_names)}
    kind_id = np.fromiter((number[k] for k in kinds), np.int64, len(kinds))
    votes, counts = np.unique(ids * len(kind_names) + kind_id, return_counts=True)
    for vote, count in zip(votes.tolist(), counts.tolist(), strict=True):
        phase, kind = divmod(vote, len(kind_names))
        out.phase(names[phase]).kinds[kind_names[kind]] += count
    phases, at = np.unique(ids, return_inverse=True)
    smallest = np.full(len(phases), np.iinfo(np.int64).max)
    np.minimum.at(smallest, at, depths)
    issued = np.bincount(at, groups[5][mine], len(phases)).astype(np.int64)
    said = np.bincount(at, groups[6][mine], len(phases)).astype(np.int64)
    for phase, depth, i, s in zip(
        phases.tolist(), smallest.tolist(), issued.tolist(), said.tolist(), strict=True
    ):
        record = out.phase(names[phase])
        record.depth = min(record.depth, depth)
        record.issued += i
        record.said += s


def _flat(lists: Any, keep: npt.NDArray[np.bool_], dtype: type[np.generic]) -> Any:
    """The kept groups' DuckDB lists as one array (their order: the groups')."""
    chosen = [np.asarray(x, dtype) for x in lists[keep].tolist() if x is not None]  # None: NULL
    return np.concatenate(chosen) if chosen else np.zeros(0, dtype)


def verdict(
    path: Path, rank: int, *, bad: int, opens: int, ranks: set[int]
) -> list[AttemptMark] | None:
    """The one attempt of a file DuckDB can read whole, from what its scan saw (lines it
    could not take, the attempts its attempt lines name (`opens`: their distinct tokens),
    the ranks its lines name); None where the line-by-line reader must read the file."""
    if bad or ranks != {rank} or opens > 1:
        return None  # a bad line, another rank's line, or several attempts
    first, whole = _edges(path)
    if not whole:
        return None  # a torn last line (or a last line without its newline)
    if opens == 0:
        return [AttemptMark()]
    mark = _opening(first)
    return None if mark is None else [mark]  # None: records before the attempt line


def _edges(path: Path) -> tuple[bytes | None, bool]:
    """(the file's first line, None where it is longer than _HEAD; whether its last byte
    is a newline), in one open. (None, False) where it cannot be read."""
    try:
        with open_regular(path) as fh:
            head = fh.read(_FIRST)
            if b"\n" not in head and len(head) == _FIRST:
                head += fh.read(_HEAD - _FIRST)
            size = os.fstat(fh.fileno()).st_size
            if size > len(head):
                fh.seek(size - 1)
                whole = fh.read(1) == b"\n"
            else:
                whole = head[-1:] == b"\n" or not head
    except OSError:
        return None, False
    end = head.find(b"\n")
    return (head[:end] if end >= 0 else None), whole


def _opening(line: bytes | None) -> AttemptMark | None:
    """The attempt `line` opens; None where it opens none."""
    if line is None:
        return None
    try:
        first = json.loads(line)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(first, dict) or "step" in first or "attempt" not in first:
        return None
    mark = mark_of(first)
    return None if isinstance(mark, str) else mark
