"""The one read of a run that the analyses share: its meta, its records and their
matrices, read once (`read_timed_run`). The stragglers, hosts, diff, collectives and the
report take this object; none reads the timings again."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..._text import format_ranks
from ..core._options import StragglerOptions
from ._engine import RunRecords, read_run_records
from ._matrix import PhaseMatrices, matrices_of, shared_steps
from ._run import RunMeta, read_run_meta

__all__ = ["TimedRun", "ended_early", "give_back_freed", "read_timed_run"]

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class TimedRun:
    """A run's timings read and shaped for the analyses: its meta, records and matrices."""

    meta: RunMeta
    records: RunRecords
    matrices: PhaseMatrices
    apart: list[str] = field(default_factory=list)
    """The sampled steps left out for not every rank having them, said (_matrix.shared_steps)."""

    @property
    def notes(self) -> list[str]:
        """What the run's files say that bears on every answer: ranks configured apart,
        and ranks whose records end before the others'."""
        every = {rank: self.meta.sampling(rank) for rank in self.records.last_step}
        return [*self.meta.config_differences(), *ended_early(self.records.last_step, every)]

    @property
    def root(self) -> Path:
        return self.meta.root.resolve()

    @property
    def skipped(self) -> list[str]:
        """What the reading left out: bad meta and timings, and ranks without timings."""
        return [
            *self.meta.skipped,
            *self.records.skipped,
            *self.meta.say_missing(sorted(self.records.ranks)),
            *self.apart,
        ]


def ended_early(last_step: Mapping[int, int], every: Mapping[int, int]) -> list[str]:
    """A line per group of ranks whose records end before the latest rank's by more than
    their sampling interval (`every`): killed, crashed, or stopped apart."""
    if len(last_step) < 2:
        return []
    latest = max(last_step.values())
    early: dict[int, list[int]] = {}
    for rank, step in sorted(last_step.items()):
        if step + every.get(rank, 1) <= latest:
            early.setdefault(step, []).append(rank)
    return [
        f"{format_ranks(ranks)}: {'its' if len(ranks) == 1 else 'their'} records end at step "
        f"{step}, the others' go on to step {latest}: ended early (killed, crashed, or "
        "stopped apart; `rankscope hang` says which where the watch was on)"
        for step, ranks in sorted(early.items())
    ]


def read_timed_run(
    run_dir: str | os.PathLike[str] | RunMeta,
    options: StragglerOptions | None = None,
    *,
    progress: Progress | None = None,
    workers: int | None = None,
) -> TimedRun:
    """Read a run's meta and timings (the options' `time` and `attempt`) into matrices.

    A TraceError where the run has no usable timings (read/_engine.py says why)."""
    options = StragglerOptions() if options is None else options
    meta = run_dir if isinstance(run_dir, RunMeta) else read_run_meta(run_dir)
    records = read_run_records(
        meta.root,
        time=options.time,
        attempt=options.attempt,
        progress=progress,
        workers=workers,
    )
    matrices, apart = shared_steps(matrices_of(records))
    give_back_freed()
    return TimedRun(meta=meta, records=records, matrices=matrices, apart=apart)


def give_back_freed() -> None:
    """Hand the memory the used-up records freed back to the system. glibc keeps freed
    heap pages for reuse: at 4096 ranks x 200 steps the process went on holding 214 MB
    of them under the rules' own (429 MB resident after the read, 213 MB after this; the
    call takes milliseconds). A no-op where the C library has no malloc_trim."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return
    trim(0)
