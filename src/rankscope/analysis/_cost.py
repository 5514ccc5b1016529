"""What a straggler costs: the step time the job would have if a finding were fixed.

The model of a synchronised step, from the phase timings alone. A step's top-level
phases, in the order they run, fall into segments: the phases up to a collective (a
phase found to end in one, or declared comm), then the collective. Every rank does its
own segment's work; the collective ends when the last rank arrives, plus its own time,
which is the time the last rank to arrive spends in it (it waits for no one). So

    step time = sum over segments of (the slowest rank's work + the collective's time)

and the time a rank spends in a step outside any phase (the step record less its
phases) is work of the last segment. A fix sets a rank's phase to the median of the
other ranks at each sampled step (never slower than it was) and the model is run again:
the saving is the difference, so the collective's own time, which no fix changes, drops
out. A "waits" finding costs what fixing the rank it waits for costs: that rank's work
in the segment before the collective set to the others' median.

What it cannot see: overlap of compute with communication inside one phase (a DDP
backward with its all-reduce inside is one collective here), work the phases do not
cover, and pipelines, where a stage waits for the one before it, not for all ranks.
`model_step_ms` against the measured step time says how well the model fits a run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ._findings import Cost, HostCost, StragglerFinding, StragglerReport
from ._matrix import STEP, PhaseMatrices, quiet

__all__ = ["Costs", "estimate_costs"]

Matrix = npt.NDArray[np.float64]
Vector = npt.NDArray[np.float64]
_MS_PER_HOUR = 3.6e6


@dataclass(frozen=True)
class Costs:
    """The costs of a report's findings: one per finding (in their order), all at once,
    and per host."""

    each: list[Cost]
    all: Cost
    hosts: list[HostCost]
    model_step_ms: float


def estimate_costs(
    m: PhaseMatrices, report: StragglerReport, hosts: Mapping[int, str] | None = None
) -> Costs:
    """What fixing each finding of `report` (found over `m`) would save, and all of them."""
    model = _StepModel(m, set(report.sync_phases))
    fixes = [model.fixes(f) for f in report.findings]
    since = {f.since_step for f in report.findings}
    said: dict[tuple[frozenset[tuple[int, int]], int], Cost] = {}  # findings that share a fix
    for f, fix in zip(report.findings, fixes, strict=True):
        key = (frozenset(fix), f.since_step)
        if key not in said:
            said[key] = model.cost(fix, f.since_step)
    each = [
        said[frozenset(fix), f.since_step] for f, fix in zip(report.findings, fixes, strict=True)
    ]
    every = {cell for fix in fixes for cell in fix}
    host_costs = []
    if hosts:
        held: dict[str, list[int]] = {}
        for i, f in enumerate(report.findings):
            host = hosts.get(f.rank)
            if host is not None and f.role == "slow":
                held.setdefault(host, []).append(i)
        for host, found in sorted(held.items()):
            cells = {cell for i in found for cell in fixes[i]}
            first = min(report.findings[i].since_step for i in found)
            ranks = tuple(sorted({report.findings[i].rank for i in found}))
            host_costs.append(HostCost(host, ranks, model.cost(cells, first)))
        host_costs.sort(key=lambda h: -h.cost.step_ms_saved)
    return Costs(
        each=each,
        all=model.cost(every, min(since)),
        hosts=host_costs,
        model_step_ms=round(model.modelled_step_ms(), 3),
    )


class _StepModel:
    """A run's steps as segments of work that end in a collective (see the module)."""

    def __init__(self, m: PhaseMatrices, sync: set[str]) -> None:
        self.m = m
        self.segments: list[list[int]] = [[]]
        """Each segment's work phases (indices into m.phases), in the order they run."""
        self.segment_of: dict[int, int] = {}
        self.closing: dict[str, int] = {}
        """A collective's name -> the segment it closes."""
        top = [p for p, d in enumerate(m.depths) if d == 0 and m.phases[p] != STEP]
        collective = np.zeros(len(m.steps))
        for p in top:
            if m.phases[p] in sync:
                self.closing[m.phases[p]] = len(self.segments) - 1
                with quiet():  # the last to arrive waits for no one: its time is the collective's
                    collective += np.nan_to_num(np.nanmin(m.ms[p], axis=0))
                self.segments.append([])
            else:
                self.segment_of[p] = len(self.segments) - 1
                self.segments[-1].append(p)
        self.collective = collective
        ranks, steps = len(m.ranks), len(m.steps)
        self.work = np.zeros((len(self.segments), ranks, steps))
        for p, k in self.segment_of.items():
            self.work[k] += np.nan_to_num(m.ms[p])
        self.measured = self._measured_steps(top)
        self.span = _steps_each_stands_for(m.steps)
        self.now = self._modelled(self.work)
        self.known: dict[frozenset[tuple[int, int]], Vector] = {}
        self.rank_index = {rank: i for i, rank in enumerate(m.ranks)}

    def _measured_steps(self, top: list[int]) -> Vector:
        """Per sampled step, the step time measured (the step record's median over ranks);
        the model's where there is no step record. Time outside any phase joins the last
        segment's work."""
        if STEP not in self.m.phases:
            return self._modelled(self.work)
        step = self.m.ms[self.m.index(STEP)]
        phases = np.zeros_like(step)
        for p in top:
            phases += np.nan_to_num(self.m.ms[p])
        outside = np.clip(np.nan_to_num(step - phases), 0, None)
        self.work[-1] += outside
        with quiet():
            measured: Vector = np.nanmedian(step, axis=0)
        return np.where(np.isfinite(measured), measured, self._modelled(self.work))

    def _modelled(self, work: Matrix) -> Vector:
        """Per sampled step, the model's step time for `work` (segment x rank x step)."""
        slowest: Vector = np.max(work, axis=1).sum(axis=0)
        return slowest + self.collective

    def modelled_step_ms(self) -> float:
        return float(np.mean(self.now)) if len(self.m.steps) else 0.0

    def fixes(self, finding: StragglerFinding) -> set[tuple[int, int]]:
        """The (rank index, phase index) cells a fix of `finding` sets to the median."""
        ranks = self.rank_index
        if finding.role == "slow":
            p = self.m.index(finding.phase)
            return {(ranks[finding.rank], p)} if p in self.segment_of else set()
        segment = self.closing.get(finding.phase)
        late = ranks.get(finding.waits_for[0]) if finding.waits_for else None
        if segment is None or late is None:
            return set()
        return {(late, p) for p in self.segments[segment]}

    def cost(self, cells: set[tuple[int, int]], since_step: int) -> Cost:
        """What setting `cells` to the other ranks' median saves, from `since_step` on."""
        saved = self._saved(frozenset(cells))
        after = np.asarray(self.m.steps) >= since_step
        if not after.any():
            after[:] = True
        per_step = max(0.0, float(np.mean(saved[after])))
        now = float(np.mean(self.measured[after]))
        hours = max(0.0, float(np.sum(saved[after] * self.span[after]))) / _MS_PER_HOUR
        return Cost(
            step_ms_saved=round(per_step, 3),
            run_hours_saved=_significant(hours),
            gpu_hours_saved=_significant(hours * len(self.m.ranks)),
            speedup=round(now / (now - per_step), 4) if now > per_step > 0 else 1.0,
            step_ms=round(now, 3),
        )

    def _saved(self, cells: frozenset[tuple[int, int]]) -> Vector:
        """Per sampled step, the step time a fix of `cells` saves. Many findings share a
        fix (every rank that waits for one rank): each is worked out once."""
        if cells not in self.known:
            work = self.work.copy() if cells else self.work
            for r, p in sorted(cells):
                d = self.m.ms[p]
                with quiet():
                    others = np.nanmedian(np.delete(d, r, axis=0), axis=0)
                fixed = np.fmin(d[r], others)  # never slower than it was; NaN: as it was
                work[self.segment_of[p], r] -= np.nan_to_num(d[r] - fixed)
            self.known[cells] = self.now - self._modelled(work)
        return self.known[cells]


def _significant(value: float, digits: int = 4) -> float:
    """`value` to `digits` significant digits: hours saved range from seconds to days."""
    return float(f"{value:.{digits}g}")


def _steps_each_stands_for(steps: list[int]) -> Vector:
    """Per sampled step, how many steps of the run it stands for: the gap to the next
    sampled step (the last one: the typical gap)."""
    if not steps:
        return np.zeros(0)
    at = np.asarray(steps, np.float64)
    gaps = np.diff(at)
    typical = float(np.median(gaps)) if len(gaps) else 1.0
    return np.append(gaps, typical)
