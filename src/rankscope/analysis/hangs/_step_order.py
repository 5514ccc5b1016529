"""What a run's timings say of its steps, for the hang analysis: the order a step runs its
phases in, and which phases end in a collective (read once per change of the timings)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..._errors import TraceError
from ...rundir._listing import RunDir
from ..read._run import RunMeta

if TYPE_CHECKING:
    from ..read._timed import TimedRun

__all__ = ["StepOrder", "StepOrders"]


@dataclass(frozen=True, slots=True)
class StepOrder:
    """What a run's timings say of its steps: the order a step runs its phases in, and
    which phases end in a collective."""

    places: dict[str, int]
    """Each phase's place in the step, the first 0."""
    sync: frozenset[str]
    """The phases of kind "comm", and those whose ranks leave them together though they
    enter apart (analysis/stragglers/_arrivals.py's rule: a DDP backward)."""
    last_step: dict[int, int] = field(default_factory=dict)
    """Each rank's latest step with a record: where the timings last saw it."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "order": sorted(self.places, key=self.places.__getitem__),
            "end_in_collective": sorted(self.sync, key=self.places.__getitem__),
        }


class StepOrders:
    """Reads a run's step order (`step_order`), and again only when a timings file changed
    since its last read (name, size, mtime): one is held by a caller that asks every
    second (`rankscope top`: a hung run's timings rarely change). Each holder its own:
    nothing is kept between callers."""

    def __init__(self) -> None:
        self._key: tuple[Path, tuple[tuple[str, int, int], ...]] | None = None
        self._order: StepOrder | None = None
        self._skipped: list[str] = []

    def __call__(
        self, meta: RunMeta, skipped: list[str], run: TimedRun | None = None
    ) -> StepOrder | None:
        if run is not None:
            return _order_of(run)
        key = (meta.root.resolve(), _timings_files(meta.root))
        if self._key != key:
            self._order, self._skipped = _read_order(meta)
            self._key = key
        skipped.extend(self._skipped)
        return self._order


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
    from ..stragglers._arrivals import ends_in_collective

    m = run.matrices
    named = [phase for phase in m.phases if phase != STEP]
    places = {phase: i for i, phase in enumerate(named)}
    return StepOrder(
        places=places,
        sync=frozenset(ends_in_collective(m, run.meta.hosts)),
        last_step=dict(run.records.last_step),
    )
