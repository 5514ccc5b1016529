"""The top-level records of a pipeline-shaped run, each rank's in the order it ran them:
what the pipeline replay (analysis/pipeline/_replay.py) reads, where phase matrices keep a sum per
step and lose the order of a step's microbatches."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["OpsGatherer", "StepOps"]

Int64s = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class StepOps:
    """One entry per top-level record, sorted by rank, step and start."""

    names: tuple[str, ...]
    """The phases `phase` indexes."""
    rank: Int64s
    step: Int64s
    phase: Int64s
    start_ns: Floats
    """Host time at entry, ns after the run's origin (on a GPU: the launch order)."""
    end_ns: Floats
    """Host time at exit."""
    ms: Floats
    """On the clock its phase is read on (the phase matrices' durations)."""
    device_ms: Floats
    """The GPU's time (NaN where the record has none): the timeline where phases are read
    on two clocks."""


@dataclass
class _Part:
    phase: int
    rank: Int64s
    step: Int64s
    start_ns: Floats
    end_ns: Floats
    ms: Floats
    device_ms: Floats


class OpsGatherer:
    """Collects top-level phases' records as matrices_of reads them (it makes one only
    where some phase runs more than once in a rank's step: a run of once-a-step phases
    is what the phase matrices say whole)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.parts: list[_Part] = []

    def add(
        self,
        name: str,
        *,
        rank: Int64s,
        step: Int64s,
        start_ns: Floats,
        end_ns: Floats,
        ms: Floats,
        device_ms: Floats | None,
    ) -> None:
        self.parts.append(
            _Part(
                len(self.names),
                rank,
                step,
                start_ns,
                end_ns,
                ms,
                np.full(len(ms), np.nan) if device_ms is None else device_ms,
            )
        )
        self.names.append(name)

    def done(self) -> StepOps | None:
        if not self.parts:
            return None
        cat = np.concatenate
        rank = cat([p.rank for p in self.parts])
        step = cat([p.step for p in self.parts])
        start = cat([p.start_ns for p in self.parts])
        order = _by_rank_and_start(rank, step, start)
        return StepOps(
            names=tuple(self.names),
            rank=rank[order],
            step=step[order],
            phase=cat([np.full(len(p.rank), p.phase, np.int64) for p in self.parts])[order],
            start_ns=start[order],
            end_ns=cat([p.end_ns for p in self.parts])[order],
            ms=cat([p.ms for p in self.parts])[order],
            device_ms=cat([p.device_ms for p in self.parts])[order],
        )


def _by_rank_and_start(rank: Int64s, step: Int64s, start: Floats) -> Int64s:
    """The order of the records by rank, step and start. Each phase's records come in
    by rank and time already, and a rank's steps follow each other in time: one int64
    key, rank then start, merges those few sorted runs (0.3 s for 10M records, where a
    three-key sort took 4 s). Where a step's records start before the step before it has
    ended (they overlap), the full sort."""
    if not len(rank):
        return np.zeros(0, np.int64)
    rank, step = rank.astype(np.int64), step.astype(np.int64)
    at = np.nan_to_num(start).astype(np.int64)
    at -= at.min()
    span = int(at.max()) + 1
    if int(rank.max()) < np.iinfo(np.int64).max // span:
        order: Int64s = np.argsort(rank * span + at, kind="stable")
        if np.all(np.diff(rank[order] * (int(step.max()) + 1) + step[order]) >= 0):
            return order
    cell = rank * (int(step.max()) + 1) + step
    full: Int64s = np.lexsort((start, cell))
    return full
