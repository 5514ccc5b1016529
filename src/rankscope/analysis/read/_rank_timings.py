"""One rank's timer records as numpy columns (`RankTimings`), what both ways of reading a
timings file give (_timings.py the timer's own lines, _any_lines.py any other layout)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ._attempts import AttemptMark

__all__ = ["INT_MAX", "MAX_MS", "Bools", "Floats", "Int32s", "Int64s", "RankTimings", "interleaved"]

INT_MAX = 2**63 - 1

MAX_MS = 7 * 24 * 3600 * 1000.0
"""The longest a record's phase can take (a week): 1.8e308 ms in a line is no time, and
summed with others it made the step infinite and every saving 0."""

Int64s = npt.NDArray[np.int64]

Int32s = npt.NDArray[np.int32]

Floats = npt.NDArray[np.float64]

Bools = npt.NDArray[np.bool_]


@dataclass(eq=False)
class RankTimings:
    """One rank's records, as numpy columns of equal length (one entry per record)."""

    rank: int
    path: Path
    names: list[str] = field(default_factory=list)
    """Phase names; `phase[i]` indexes into it."""
    kinds: list[str] = field(default_factory=list)
    """Kind names; `kind[i]` indexes into it."""
    step: Int64s = field(default_factory=lambda: np.zeros(0, np.int64))
    phase: Int32s = field(default_factory=lambda: np.zeros(0, np.int32))
    kind: Int32s = field(default_factory=lambda: np.zeros(0, np.int32))
    start_ns: Int64s = field(default_factory=lambda: np.zeros(0, np.int64))
    cpu_ms: Floats = field(default_factory=lambda: np.zeros(0, np.float64))
    gpu_ms: Floats = field(default_factory=lambda: np.zeros(0, np.float64))
    """Device time, NaN where the record has none."""
    depth: Int64s = field(default_factory=lambda: np.zeros(0, np.int64))
    error: Bools = field(default_factory=lambda: np.zeros(0, np.bool_))
    coll: Int64s = field(default_factory=lambda: np.zeros(0, np.int64))
    """Collectives the phase issued ("coll"), -1 where the record does not say."""
    oncpu_ms: Floats = field(default_factory=lambda: np.zeros(0, np.float64))
    """The thread's CPU time in the phase ("oncpu_ms"), NaN where the record does not say."""
    runq_ms: Floats = field(default_factory=lambda: np.zeros(0, np.float64))
    """The thread's wait for a CPU in the phase ("runq_ms"), NaN where the record does not say."""
    attempt: Int32s = field(default_factory=lambda: np.zeros(0, np.int32))
    """Which of `attempts` wrote each record."""
    attempts: list[AttemptMark] = field(default_factory=lambda: [AttemptMark()])
    """This rank's attempts in the order they started (read/_attempts.py)."""
    interleaved: set[tuple[int, int]] = field(default_factory=set)
    """Pairs of `attempts` (indexes) whose records interleave in the file: an attempt's
    records after another's began, so both ran at the same time (two jobs with one
    output_dir). Each flush of the timer starts with its attempt line, so the records
    of each stay told apart by their token."""
    skipped: list[str] = field(default_factory=list)
    """What was left out of this file and why, one line each (a torn last line, a bad line)."""
    valued: set[str] = field(default_factory=set)
    """Phases a record of which holds user values ("meta": read/_values.py reads them)."""

    def __len__(self) -> int:
        return len(self.step)

    def keep(self, rows: Bools) -> None:
        """Keep only the records where `rows` is True."""
        names = (
            "step",
            "phase",
            "kind",
            "start_ns",
            "cpu_ms",
            "gpu_ms",
            "depth",
            "error",
            "coll",
            "oncpu_ms",
            "runq_ms",
        )
        for name in names:
            setattr(self, name, getattr(self, name)[rows])
        self.attempt = self.attempt[rows]


def interleaved(chunks: list[int]) -> set[tuple[int, int]]:
    """The pairs of attempts whose chunks interleave: an attempt's chunk after another
    attempt's began, when its own had begun before (a restart only ever follows)."""
    out: set[tuple[int, int]] = set()
    seen: list[int] = []
    for attempt in chunks:
        if seen and seen[-1] == attempt:
            continue
        if attempt in seen:
            out.update(
                (min(attempt, other), max(attempt, other))
                for other in seen[seen.index(attempt) + 1 :]
            )
        seen.append(attempt)
    return {pair for pair in out if pair[0] != pair[1]}
