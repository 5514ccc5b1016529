"""One side of a diff read: a run directory or one of its windows, its phases from the
run's one read (read/_timed.py; a window keeps its sampled steps) and its kernels from the
windows' summaries (as `rankscope kernels` reads them). _diff.py compares two."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..._errors import TraceError
from ...rundir._layout import META, TIMINGS, TRACES, window_steps
from ...rundir._listing import is_run_dir, is_window_folder
from ..core._options import StragglerOptions
from ..kernels._kernels import find_traces, latest_of_the_same_steps, read_summaries
from ..read._matrix import STEP
from ..read._run import run_root
from ..read._timed import read_timed_run
from ..stragglers._arrivals import ends_in_collective
from ..stragglers._cost import without_waiting
from ._noise import MEDIAN_SE, PerRank, median_of, strays, z_for

__all__ = ["KernelKind", "Phases", "Side"]

Matrix = npt.NDArray[np.float64]
Vector = npt.NDArray[np.float64]


@dataclass(eq=False)
class Phases:
    """A side's phases: per phase a [rank, step] matrix of its time (waiting taken out of
    phases that end in a collective)."""

    ranks: list[int]
    values: dict[str, Matrix]
    whole: dict[str, Matrix]
    """The whole run's (`values` holds a window's steps alone): spreads are judged on these."""
    kinds: dict[str, str]
    depths: dict[str, int]
    sync: set[str]
    steps: int
    clocks: dict[str, str]
    """The clock each phase was read on."""
    window: bool = False
    """The steps of a window of the run, not the whole run."""
    _errors: dict[str, tuple[Vector, float]] = field(default_factory=dict)

    def errors(self, phase: str) -> tuple[Vector, float]:
        """How far this side's medians may stray by chance: per rank (against the change
        the others share), and for the change the ranks share. A window is judged by how
        far blocks of as many steps elsewhere in its run stray (`strays`: one spike moves
        a window of two steps); a whole run by `z_for` standard errors of its medians."""
        if phase not in self._errors:
            found = strays(self.whole[phase], self.steps) if self.window else None
            if found is None:
                per = self.per_rank(phase).pooled()
                se = per.se()
                z = z_for(len(self.ranks) * (median_of(per.basis) - 1))
                # A rank is measured against the others' shared change, itself an estimate.
                many = len(self.ranks)
                shared_se = median_of(se) * (1.0 if many < 3 else MEDIAN_SE / math.sqrt(many))
                found = (z * np.hypot(se, shared_se), z * median_of(se))
            self._errors[phase] = found
        return self._errors[phase]

    def per_rank(self, phase: str) -> PerRank:
        return PerRank.of(self.values[phase], self.whole[phase])

    def step_ms(self) -> float | None:
        """The median step time: of the step records, or of the top phases summed."""
        tops = [STEP] if STEP in self.values else [p for p in self.values if self.depths[p] == 0]
        if not tops:
            return None
        cells = np.stack([self.values[p] for p in tops])
        cells = np.where(np.all(np.isnan(cells), axis=0), np.nan, np.nansum(cells, axis=0))
        finite = cells[np.isfinite(cells)]
        return float(np.median(finite)) if finite.size else None


@dataclass(eq=False)
class KernelKind:
    """A side's traces of one kind: per trace its steps; per name, (us, count) per trace."""

    steps: list[int] = field(default_factory=list)
    names: dict[str, dict[int, tuple[float, int]]] = field(default_factory=dict)

    def add(self, summary: dict[str, Any], steps: int) -> None:
        index = len(self.steps)
        self.steps.append(steps)
        for item in summary["items"]:
            self.names.setdefault(item["name"], {})[index] = (item["total_us"], item["count"])

    def per_trace_ms(self, name: str) -> Vector:
        """The kernel's ms per step in each trace (0 where a trace lacks it)."""
        out = np.zeros(len(self.steps))
        for index, (total_us, _) in self.names.get(name, {}).items():
            out[index] = total_us / 1000 / self.steps[index]
        return out

    def figures(self, name: str) -> dict[str, Any] | None:
        held = self.names.get(name)
        if not held:
            return None
        total_us = sum(t for t, _ in held.values())
        count = sum(c for _, c in held.values())
        steps = sum(self.steps)
        return {
            "ms_per_step": total_us / 1000 / steps,
            "count_per_step": count / steps,
            "total_ms": total_us / 1000,
            "count": count,
            "traces": len(held),
        }

    def total_ms_per_step(self) -> float:
        total_us = sum(t for held in self.names.values() for t, _ in held.values())
        return total_us / 1000 / max(1, sum(self.steps))


@dataclass(eq=False)
class Side:
    label: str
    path: Path
    run_dir: Path
    window: str | None
    phases: Phases | None = None
    kernels: dict[str, KernelKind] = field(default_factory=dict)
    traces: int = 0
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @classmethod
    def read(
        cls, label: str, source: str | os.PathLike[str], time: str, workers: int | None
    ) -> Side:
        path = run_root(source)  # a TraceError where it is no directory at all
        if is_run_dir(path):
            side = cls(label, path, path, None)
        elif is_window_folder(path) and is_run_dir(path.parent.parent):
            side = cls(label, path, path.parent.parent, path.name)
        else:
            raise TraceError(
                f"{path}: neither a run directory (it has no {META}/, {TIMINGS}/ or {TRACES}/ "
                f"folder) nor a window of one ({TRACES}/<window>)"
            )
        side.phases = side._read_phases(time, workers)
        side._read_kernels(workers)
        return side

    def describe(self) -> dict[str, Any]:
        steps = None if self.window is None else window_steps(self.window)
        return {
            "path": str(self.path),
            "run_dir": str(self.run_dir),
            "window": self.window,
            "steps": None if steps is None else list(steps),
            "ranks": 0 if self.phases is None else len(self.phases.ranks),
            "sampled_steps": 0 if self.phases is None else self.phases.steps,
            "traces": self.traces,
        }

    def _read_phases(self, time: str, workers: int | None) -> Phases | None:
        try:  # the run's one read, as every analysis takes it
            run = read_timed_run(self.run_dir, StragglerOptions(time=time), workers=workers)
        except TraceError as exc:
            self.notes.append(f"{self.label}: phases not compared: {exc}")
            return None
        self.skipped += run.skipped
        if run.records.attempts.note is not None:
            self.notes.append(f"{self.label}: {run.records.attempts.note}")
        m, hosts = run.matrices, run.meta.hosts
        # Judged over the whole run: a window's few steps cannot show which phases end together.
        sync = set(ends_in_collective(m, hosts))
        values = without_waiting(m, sync)
        cols = np.arange(len(m.steps))
        if self.window is not None:
            span = window_steps(self.window)
            if span is None:
                self.notes.append(
                    f"{self.label}: window {self.window} names no steps: its phases are not compared"
                )
                return None
            cols = np.flatnonzero([span[0] <= s <= span[1] for s in m.steps])
            if not cols.size:
                self.notes.append(
                    f"{self.label}: no timings at steps {span[0]}-{span[1]} of window "
                    f"{self.window} (the timer samples every N steps): phases not compared"
                )
                return None
        timed = {
            p: (v if self.window is None else v[:, cols], v)
            for p, v in zip(m.phases, values, strict=True)
            if np.isfinite(v[:, cols]).any()  # device time: none where no GPU was in use
        }
        if not timed:
            self.notes.append(f"{self.label}: no {time} times in its timings: phases not compared")
            return None
        return Phases(
            ranks=list(m.ranks),
            values={p: v for p, (v, _) in timed.items()},
            whole={p: whole for p, (_, whole) in timed.items()},
            kinds=dict(zip(m.phases, m.kinds, strict=True)),
            depths=dict(zip(m.phases, m.depths, strict=True)),
            sync=sync,
            steps=len(cols),
            clocks=dict(zip(m.phases, m.clocks, strict=True)),
            window=self.window is not None,
        )

    def _read_kernels(self, workers: int | None) -> None:
        said: list[str] = []
        try:
            traces = find_traces([self.path], left_out=said)
        except TraceError:
            self.skipped += said  # no trace at all: nothing to say but what looked like one
            return
        read = latest_of_the_same_steps(read_summaries(traces, said, workers=workers), said)
        self.skipped += said
        self.traces = len(read)
        unnamed: set[str] = set()
        for path, summary in read:
            span = window_steps(path.parent.name)
            if span is None:
                unnamed.add(path.parent.name)
            steps = 1 if span is None else span[1] - span[0] + 1
            self.kernels.setdefault(summary["kind"], KernelKind()).add(summary, steps)
        if unnamed:
            names = ", ".join(sorted(unnamed))
            self.notes.append(
                f"{self.label}: window(s) {names} name no steps: their kernels count per capture"
            )
