"""What a run's timings say of its steps, for the hang analysis: the order a step runs its
phases in, and which phases end in a collective (read once per change of the timings)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..._errors import TraceError
from ...rundir._layout import RunDir
from ..read._run import RunMeta

if TYPE_CHECKING:
    from ..read._timed import TimedRun

__all__ = ["StepOrder", "step_order"]


@dataclass(frozen=True, slots=True)
class StepOrder:
    """What a run's timings say of its steps: the order a step runs its phases in, and
    which phases end in a collective."""

    places: dict[str, int]
    """Each phase's place in the step, the first 0."""
    sync: frozenset[str]
    """The phases of kind "comm", and those whose ranks leave them together though they
    enter apart (analysis/stragglers/_stragglers.py's rule: a DDP backward)."""
    last_step: dict[int, int] = field(default_factory=dict)
    """Each rank's latest step with a record: where the timings last saw it."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "order": sorted(self.places, key=self.places.__getitem__),
            "end_in_collective": sorted(self.sync, key=self.places.__getitem__),
        }


@dataclass
class _LastRead:
    """The last order read, and the timings files it was read from (name, size, mtime):
    `rankscope top` asks every second, and a hung run's timings rarely change."""

    key: tuple[Path, tuple[tuple[str, int, int], ...]] | None = None
    order: StepOrder | None = None
    skipped: list[str] = field(default_factory=list)


_LAST_READ = _LastRead()


def step_order(meta: RunMeta, skipped: list[str], run: TimedRun | None = None) -> StepOrder | None:
    """The order a step of the run runs its phases in, and which end in a collective,
    from its timings (`run`, where the caller read them on the default clocks already,
    analysis/core/_clocks.py); None
    without timings. What of the timings could not be used is added to `skipped`. Read
    again only when a timings file changed since the last call."""
    if run is not None:
        return _order_of(run)
    last = _LAST_READ
    key = (meta.root.resolve(), _timings_files(meta.root))
    if last.key != key:
        last.order, last.skipped = _read_order(meta)
        last.key = key
    skipped.extend(last.skipped)
    return last.order


def _timings_files(root: Path) -> tuple[tuple[str, int, int], ...]:
    out = []
    for found in RunDir(root).timings():
        try:
            st = os.stat(found.path, follow_symlinks=False)
        except OSError:
            continue
        out.append((found.path.name, st.st_size, st.st_mtime_ns))
    return tuple(out)


def _read_order(meta: RunMeta) -> tuple[StepOrder | None, list[str]]:
    # Imported here: `rankscope top` and a run without a stalled rank need no DuckDB.
    from ..read._timed import read_timed_run

    try:
        run = read_timed_run(meta)
    except TraceError:
        return None, []
    return _order_of(run), list(run.records.skipped)


def _order_of(run: TimedRun) -> StepOrder:
    from ..read._matrix import STEP
    from ..stragglers._stragglers import ends_in_collective

    m = run.matrices
    named = [phase for phase in m.phases if phase != STEP]
    places = {phase: i for i, phase in enumerate(named)}
    return StepOrder(
        places=places,
        sync=frozenset(ends_in_collective(m, run.meta.hosts)),
        last_step=dict(run.records.last_step),
    )
