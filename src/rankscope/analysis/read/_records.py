"""A run's usable records by phase, as both readers hand them over (read/_engine.py
read_run_records): what the phase matrices (read/_matrix.py) are built from."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ..._text import one_line
from ._attempts import Attempts
from ._rank_timings import RankTimings

__all__ = ["Floats", "Int64s", "PhaseRecords", "RunRecords"]


_SPREAD = np.int64(-7046029254386353131)
"""An odd 64-bit constant (the golden ratio's): a rank times it spreads over every bit."""
Int64s = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]


@dataclass(eq=False)
class PhaseRecords:
    """One phase's usable records, in parts (a part per file or per batch): one entry per
    record in each array of a part."""

    parts: list[tuple[Int64s, Int64s, Floats, Int64s, Floats]] = field(default_factory=list)
    """(rank, step, duration in ms, start_ns, host ms) per part, an entry per record."""
    kinds: Counter[str] = field(default_factory=Counter)
    """Each rank's vote for the phase's kind."""
    depth: int = 2**62
    """The smallest nesting depth it was recorded at."""
    issued: int = 0
    """Records of the phase that say they issued a collective ("coll")...
    (records, not distinct rank-steps: counting distinct steps took 38% of DuckDB's scan,
    and the two differ only where a phase runs more than once in a step)"""
    said: int = 0
    """...of those that say how many they issued (0 included)."""

    def add(self, columns: tuple[Int64s, Int64s, Floats, Int64s, Floats], depth: int) -> None:
        """Records of the phase: (rank, step, duration in ms, start_ns, host ms)."""
        self.parts.append(columns)
        self.depth = min(self.depth, depth)

    def drop_twins(self) -> int:
        """Keep one of the records that share a rank, step, start (to the ns) and time: the
        same record written twice, which would count the phase twice in its step (and read as
        a phase that runs twice: a pipeline). How many were dropped."""
        if not self.parts:
            return 0
        # A rank and a start in one number (two ranks can start at one ns; a rank's own
        # two records cannot): where no two are alike (nearly always) the parts stay as
        # they are, and take() joins them once.
        mixed = np.concatenate([part[3] ^ (part[0] * _SPREAD) for part in self.parts])
        ordered = np.sort(mixed)
        if not (ordered[1:] == ordered[:-1]).any():
            return 0
        rank, step, ms, start, host = self.take()
        key = np.stack((rank, step, start, ms.view(np.int64)))
        _, first = np.unique(key, axis=1, return_index=True)
        if len(first) == len(rank):
            self.parts = [(rank, step, ms, start, host)]
            return 0
        keep = np.sort(first)
        ms_kept = ms[keep]  # the host time stays the same array where it is the durations
        self.parts = [
            (rank[keep], step[keep], ms_kept, start[keep], ms_kept if host is ms else host[keep])
        ]
        return len(rank) - len(keep)

    def take(self) -> tuple[Int64s, Int64s, Floats, Int64s, Floats]:
        """(rank, step, ms, start_ns, host ms), one entry per record; the parts are released."""
        parts, self.parts = self.parts, []
        if not parts:
            empty = np.zeros(0, np.int64)
            return empty, empty, np.zeros(0), empty, np.zeros(0)
        rank, step, ms, start = (np.concatenate(c) for c in list(zip(*parts, strict=True))[:4])
        same = all(part[4] is part[2] for part in parts)  # host time: the durations themselves
        host = ms if same else np.concatenate([part[4] for part in parts])
        return rank, step, ms, start, host


@dataclass(eq=False)
class RunRecords:
    """The usable records of a run, by phase: what phase matrices are built from."""

    run_dir: Path
    time: str
    """"host" (cpu_ms) or "device" (gpu_ms; NaN where a record has none)."""
    phases: dict[str, PhaseRecords] = field(default_factory=dict)
    ranks: set[int] = field(default_factory=set)
    """The ranks with usable records."""
    skipped: list[str] = field(default_factory=list)
    attempts: Attempts = field(default_factory=Attempts)
    last_step: dict[int, int] = field(default_factory=dict)
    """Each rank's latest step with a record."""
    valued: set[str] = field(default_factory=set)
    """Phases a record of which holds user values ("meta"), read by read/_values.py."""

    def drop_all_twins(self) -> None:
        """drop_twins of every phase, each said in `skipped`."""
        for name, phase in self.phases.items():
            twins = phase.drop_twins()
            if twins:
                self.skipped.append(
                    f"{name}: {twins} record{'s' if twins != 1 else ''} the same as another "
                    "(rank, step, start and time) counted once: a flush written twice, or a "
                    "file copied into itself"
                )

    def phase(self, name: str) -> PhaseRecords:
        # A name is shown, never acted on: its control characters written out (a newline
        # in it would print a line of its own, an escape sequence clear a terminal).
        return self.phases.setdefault(one_line(name), PhaseRecords())

    def add_rank(self, timings: RankTimings) -> None:
        """A rank read line by line (its attempts already resolved)."""
        if len(timings) == 0:
            return
        self.ranks.add(timings.rank)
        self.last_step[timings.rank] = int(timings.step.max())
        self.valued |= timings.valued
        dur = timings.cpu_ms if self.time == "host" else timings.gpu_ms
        for index, name in enumerate(timings.names):
            mine = timings.phase == index
            if not mine.any():
                continue
            phase = self.phase(name)
            for kind in np.unique(timings.kind[mine]).tolist():
                phase.kinds[timings.kinds[kind]] += 1
            use = mine & ~timings.error
            counted = timings.coll[use]
            phase.issued += int(np.sum(counted > 0))
            phase.said += int(np.sum(counted >= 0))
            ranks = np.full(int(use.sum()), timings.rank, np.int64)
            columns = (
                ranks,
                timings.step[use],
                dur[use],
                timings.start_ns[use],
                timings.cpu_ms[use],
            )
            phase.add(columns, int(timings.depth[mine].min()))
