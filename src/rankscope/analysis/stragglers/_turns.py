"""Ranks that take turns on shared cores: slowness that is only a wait for a CPU.

Where a host runs more ranks than it has CPUs (its meta files say: `cpus`), its ranks
take turns on the cores, and the scheduler now and then keeps one of them off for
several steps running: that rank is slower there with no more work and no sleep in
it. Its records say so: the thread's wait for a CPU in the phase ("runq_ms",
timing/_runqueue.py) holds its extra time. No rank is the cause of that, and fixing
none saves it, so it is no finding: with each rank's wait for a CPU taken out of its
time, a rank no longer above the others at `min_persistence` of its steps is let go,
and so are the ranks found waiting only for it.

A rank that slept (a slow loader's queue, I/O) did not wait for a CPU, and one given
more work ran on one longer: both stay. On a host with cores to spare, a rank kept
off its cores by something else (its loader's workers, another job) stays too, and
its cause says so (analysis/stragglers/_cause.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..read._matrix import PhaseMatrices, nanmedian, quiet
from ..read._values import CpuTimes
from ._model import StragglerFinding, StragglerReport, Undecided

__all__ = ["CpuReads", "let_turns_go"]

Matrix = npt.NDArray[np.float64]

_FEWEST = 3
"""Steps with a wait for a CPU known, on the rank and the others, to judge by it at all."""


@dataclass
class CpuReads:
    """The CPU times of the analysis's slow ranks, read once (read/_values.py read_cpu_times
    reads files): a later ask for fewer phases and ranks is answered from the first."""

    read: Callable[[set[str], set[int]], CpuTimes] | None
    also: frozenset[str] = frozenset()
    """Phases read with every ask (the step record, where the costs will want it)."""
    _done: tuple[set[str], set[int], CpuTimes] | None = None

    def __call__(self, phases: set[str], ranks: set[int]) -> CpuTimes | None:
        if self.read is None or not phases:
            return None
        if self._done is not None and phases <= self._done[0] and ranks <= self._done[1]:
            return self._done[2]
        asked = set(phases) | self.also
        times = self.read(asked, ranks)
        self._done = (asked, set(ranks), times)
        return times


def let_turns_go(
    m: PhaseMatrices,
    report: StragglerReport,
    unconfirmed: list[StragglerFinding],
    reads: CpuReads,
    *,
    threshold: float,
    min_persistence: float,
    floor: float,
) -> list[StragglerFinding]:
    """Take the slow findings and undecided rows of ranks that only waited for a CPU out
    of `report` (and of `unconfirmed`, which it returns), with the ranks that wait only
    for them. Call it only where a host's ranks share its cores."""
    slow = [f for f in (*report.findings, *unconfirmed) if f.role == "slow"]
    maybe = [u for u in report.undecided if u.role == "slow"]
    rows: list[StragglerFinding | Undecided] = [*slow, *maybe]
    times = reads({f.phase for f in rows}, {f.rank for f in rows})
    if times is None or not times.runq:
        return unconfirmed
    gone: set[tuple[int, str]] = set()
    for f in slow:
        if _only_waited(m, f.rank, f.phase, _since(m, f), times, threshold, min_persistence, floor):
            gone.add((f.rank, f.phase))
    for u in maybe:
        if _only_waited(m, u.rank, u.phase, _last(m, u), times, threshold, min_persistence, floor):
            gone.add((u.rank, u.phase))
    if not gone:
        return unconfirmed
    kept = {f.rank for f in slow if (f.rank, f.phase) not in gone}
    freed = {rank for rank, _ in gone} - kept

    def stays(f: StragglerFinding | Undecided) -> bool:
        if (f.rank, f.phase) in gone and f.role == "slow":
            return False
        return not (f.role == "waits" and f.waits_for and set(f.waits_for) <= freed)

    report.findings = [f for f in report.findings if stays(f)]
    report.undecided = [u for u in report.undecided if stays(u)]
    return [f for f in unconfirmed if stays(f)]


def _since(m: PhaseMatrices, f: StragglerFinding) -> npt.NDArray[np.bool_]:
    return np.asarray(m.steps) >= f.since_step


def _last(m: PhaseMatrices, u: Undecided) -> npt.NDArray[np.bool_]:
    """The undecided row's steps: the last `u.steps` at which its rank has a time."""
    cols = np.zeros(len(m.steps), np.bool_)
    valid = np.flatnonzero(np.isfinite(m.ms[m.index(u.phase)][m.ranks.index(u.rank)]))
    cols[valid[len(valid) - u.steps :]] = True
    return cols


def _only_waited(  # noqa: PLR0917 - the row, its steps and the rules it is held to
    m: PhaseMatrices,
    rank: int,
    phase: str,
    cols: npt.NDArray[np.bool_],
    times: CpuTimes,
    threshold: float,
    min_persistence: float,
    floor: float,
) -> bool:
    """The rank is above the others in the phase at fewer than `min_persistence` of the
    steps `cols` once every rank's wait for a CPU is taken out of its time."""
    runq = times.runq.get(phase)
    if runq is None or phase not in m.phases or rank not in m.ranks:
        return False
    p, r = m.index(phase), m.ranks.index(rank)
    if m.clocks[p] != "host":
        return False  # on device time the host's turns are not in it
    own = m.ms[p][:, cols] - runq[:, cols]
    others = np.delete(np.arange(len(m.ranks)), r)
    with quiet():
        theirs = nanmedian(own[others], axis=0)
    mine = own[r]
    known = np.isfinite(mine) & np.isfinite(theirs)
    if known.sum() < _FEWEST:
        return False
    mine, theirs = mine[known], theirs[known]
    above = (mine > threshold * theirs) & (mine - theirs >= floor)
    return bool(np.mean(above) < min_persistence)
