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
out. A "waits" finding is the cost of the slow finding of the rank it waits for, and
has none of its own; where that rank has no slow finding (it is slow across phases, or
its slow phase is not sampled), the fix is that rank's work in the segment before the
collective set to the others' median.

Where ranks share cores, the others' work after a fault's onset is not what it would be
without the fault: a rank that sleeps leaves its core to them, a fault that puts the
ranks in step has them all want a core at once. The step records say how long each rank
waited for a CPU; the change in that wait at the onset (the median over the ranks) is
taken off a fix's saving, up to the saving itself either way
(_step_model.py StepModel._turns_undone). On 2 cores with a test suite beside them, 37
of 51 kept fault runs were priced within 0.7-1.4x of the step's measured growth with it
and 30 without; a 3-rank HF job whose rank 1 sleeps 20 ms more in forward was priced at
2.2x that growth (its median over 3 runs) before it. Runs on a core per rank wait near
0, and are priced as before.

What it cannot see: overlap of compute with communication inside one phase (a DDP
backward with its all-reduce inside is one collective here), work the phases do not
cover, and pipelines, where a stage waits for the one before it, not for all ranks:
1F1B hides part of an early stage's work in the later stages' bubbles, and the segment
model priced a slow first or second stage of four 41% and 23% too high though its step
fitted the measured one. Where the ranks name their pipeline stages, the steps are
replayed from the order each rank ran its ops instead (analysis/pipeline/_replay.py), where that
replay fits the measured steps: on simulated GPipe and 1F1B pipelines a slow stage is
then priced within 1% of the truth, on a real gloo pipeline within 3%.
`model_step_ms` against the measured step time says how well the model fits a run as it
is, not how well it prices a fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..pipeline._replay import Replay
from ..read._matrix import STEP, PhaseMatrices, quiet
from ._imbalance import balanced, imbalance_cells
from ._model import Cost, HostCost, SlowGroup, StragglerFinding, StragglerReport
from ._step_model import Cell, StepModel, hidden_work

__all__ = ["Costs", "estimate_costs", "without_waiting"]

Matrix = npt.NDArray[np.float64]
Vector = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Costs:
    """The costs of a report's findings: one per finding (in their order), all at once,
    and per host."""

    each: list[Cost | None]
    """None where a finding cannot be costed (said in `notes`), or is another's cost."""
    of: list[tuple[int, str] | str | None]
    """Per finding, the (rank, phase) of the slow finding whose cost it is ("waits"), or
    the name of the slow group whose cost it is."""
    all: Cost | None
    """None where no finding could be priced (`notes` says why)."""
    hosts: list[HostCost]
    model_step_ms: float
    notes: list[str]
    imbalance: list[Cost | None]
    """One per `report.imbalance`: every rank of the phase made like the others."""
    groups: list[Cost | None]
    """One per `report.groups`: every slow finding of the group's ranks in its phase."""


def estimate_costs(
    m: PhaseMatrices,
    report: StragglerReport,
    hosts: Mapping[int, str] | None = None,
    gpus: bool | None = None,
    pipeline: Replay | str | None = None,
    *,
    cpu_waits: Matrix | None = None,
) -> Costs:
    """What fixing each finding of `report` (found over `m`) would save, and all of them.

    One answer: every saving per step is taken over the same steps, those from the
    latest start of a costed finding on, where every finding holds and every fix
    applies. At each of those steps fixing more never saves less (the model's step is a
    sum of maxima), so fixing every finding saves at least what fixing any one does, and
    each line's "of a ... step" is the same step. Hours over the run so far are each
    fix's own, from the step its finding began. A rank that waits for a rank with a slow
    finding costs nothing of its own: its wait is that finding's cost (`of`). `gpus`
    says whether the ranks ran on GPUs (GPU-hours), where known. `pipeline`: the run's
    pipeline replay (analysis/pipeline/_replay_build.py build_replay), or why a pipeline-shaped run has
    none; its steps are priced by it where it fits them. `cpu_waits` (rank x step, each
    rank's wait for a CPU over its step), where ranks share cores: a fix takes back the
    change in it at its finding's onset (_step_model.py StepModel._turns_shift).
    """
    model = StepModel(
        m,
        set(report.sync_phases),
        pipeline if isinstance(pipeline, Replay) else None,
        cpu_waits,
    )
    slow_of: dict[int, StragglerFinding] = {}
    for f in report.findings:
        if f.role == "slow" and f.rank not in slow_of:
            slow_of[f.rank] = f  # the first: the most time lost
    of: list[tuple[int, str] | str | None] = []
    for f in report.findings:
        cause = slow_of.get(f.waits_for[0]) if f.role == "waits" and f.waits_for else None
        of.append(None if cause is None else (cause.rank, cause.phase))
    found = [
        None if o is not None else model.fixes(f) for f, o in zip(report.findings, of, strict=True)
    ]
    notes = sorted(
        {
            f"{f.phase} (rank {f.rank}, {f.role}): not costed; {fix}"
            for f, fix in zip(report.findings, found, strict=True)
            if isinstance(fix, str)
        }
    )
    if isinstance(pipeline, str):
        notes.append(
            f"the pipeline's steps were not replayed: {pipeline}; its savings are the step "
            "model's, which takes every collective to join all ranks (docs/analysis.md, "
            '"Pipelines")'
        )
    elif model.unfit is not None:
        notes.append(model.unfit)
    fixes = [fix if isinstance(fix, set) else set() for fix in found]
    uneven = [{(*cell, True) for cell in imbalance_cells(m, i)} for i in report.imbalance]
    for uneven_phase in report.imbalance:
        model.targets[m.index(uneven_phase.phase)] = balanced(m, uneven_phase)
    costed = [
        f.since_step
        for f, fix in zip(report.findings, found, strict=True)
        if isinstance(fix, set) and fix
    ] + [i.since_step for i in report.imbalance]
    since = [f.since_step for f in report.findings] + [i.since_step for i in report.imbalance]
    first = min(costed, default=min(since))
    basis = max(costed, default=first)
    price = _Pricing(model, basis, gpus)
    said: dict[tuple[frozenset[Cell], int], Cost] = {}  # findings that share a fix
    each: list[Cost | None] = []
    for f, fix in zip(report.findings, found, strict=True):
        if not isinstance(fix, set):
            each.append(None)
            continue
        key = (frozenset(fix), f.since_step)
        if key not in said:
            said[key] = price.cost(fix, f.since_step)
        each.append(said[key])
    every = {cell for fix in [*fixes, *uneven] for cell in fix}
    host_costs = []
    if hosts:
        held: dict[str, list[int]] = {}
        for i, f in enumerate(report.findings):
            host = hosts.get(f.rank)
            if host is not None and f.role == "slow":
                held.setdefault(host, []).append(i)
        for host, indices in sorted(held.items()):
            cells = {cell for i in indices for cell in fixes[i]}
            began = min(report.findings[i].since_step for i in indices)
            ranks = tuple(sorted({report.findings[i].rank for i in indices}))
            if cells:  # a host whose findings the model could not price has no saving of 0
                host_costs.append(HostCost(host, ranks, price.cost(cells, began)))
        host_costs.sort(key=lambda h: -h.cost.step_ms_saved)
    group_costs = [_group_cost(price, report, fixes, g) for g in report.groups]
    # A rank that waits for a rank of a slow group waits for the group: fixing that rank
    # alone leaves its group-mates the slowest there, so its wait is the group's cost.
    for i, blamed in enumerate(of):
        for g in report.groups:
            if isinstance(blamed, tuple) and blamed[0] in g.slow and blamed[1] in g.phases:
                of[i], each[i] = g.name, None
    return Costs(
        each=each,
        of=of,
        # Nothing the model could price is no saving of 0: the notes say why.
        all=price.cost(every, first) if every else None,
        hosts=host_costs,
        model_step_ms=round(model.modelled_step_ms(basis), 3),
        notes=notes,
        imbalance=[
            price.cost(cells, i.since_step) if _in_model(model, cells) else None
            for i, cells in zip(report.imbalance, uneven, strict=True)
        ],
        groups=group_costs,
    )


def _group_cost(
    price: _Pricing, report: StragglerReport, fixes: list[set[Cell]], group: SlowGroup
) -> Cost | None:
    cells = {
        cell
        for f, fix in zip(report.findings, fixes, strict=True)
        if f.role == "slow" and f.phase in group.phases and f.rank in group.slow
        for cell in fix
    }
    return price.cost(cells, group.since_step) if cells else None


def _in_model(model: StepModel, cells: set[Cell]) -> bool:
    """The model can price a fix of these cells: their phases are top-level work."""
    return all(model.segment(p) is not None for _, p, _, _ in cells)


@dataclass(frozen=True)
class _Pricing:
    """The costs of one report: per step over the steps from `basis` on, hours from each
    fix's own start."""

    model: StepModel
    basis: int
    gpus: bool | None

    def cost(self, cells: set[Cell], since_step: int) -> Cost:
        return self.model.cost(cells, since_step, self.basis, self.gpus)


"""Draws of the work hidden inside a collective phase (the cost's mean is over them)."""


def without_waiting(m: PhaseMatrices, sync: set[str]) -> list[Matrix]:
    """Each phase's times, less (in a top-level phase that ends in a collective) the time
    each rank waited there for the last to arrive: a rank arrives after its own work since
    the step began or the ranks last left a collective (the top-level phases between), and
    waits as long as it arrived before the last. What is left is the collective's own time.

    In a phase that also holds work (a DDP backward) what is left is more than that: the
    collective starts when the rank whose arrival plus work is latest is done, which
    with ranks that arrive close together is a far tail of their work's spread, and with
    one rank far behind is that rank's own work. So one slow rank elsewhere would make
    such a phase look faster, the more so the more ranks. That tail, as expected from
    the arrivals of each step (_hidden_work_tail), is taken out too."""
    out = list(m.ms)
    t = m.on_timeline()  # arrivals on the GPU's timeline where phases are read on two clocks
    inside = t.work_inside(sync)
    since = np.zeros((len(m.ranks), len(m.steps)))
    for p, phase in enumerate(m.phases):
        if phase == STEP or m.depths[p] != 0:
            continue
        if phase in sync:
            # Work nested in it (a batch fetch before the collective) is the rank's own.
            own = inside[p][1] if p in inside else 0.0
            since = since + own
            with quiet():
                last = np.nanmax(since, axis=0)
            left = t.ms[p] - (last[None, :] - since)
            if m.kinds[p] != "comm":
                with quiet():
                    tail = _hidden_work_tail(since, np.nanmin(t.ms[p] - own, axis=0))
                left = left - tail[None, :]
            out[p] = np.maximum(left, 0.0)
            since = np.zeros_like(since)
        else:
            since = since + np.nan_to_num(t.ms[p])
    return out


def _hidden_work_tail(arrived: Matrix, last: Vector) -> Vector:
    """Per step, how much later than the last rank to arrive the work hidden inside a
    collective phase is expected to end: the mean over draws of the latest of (arrival
    + hidden work) less the latest arrival. `arrived` (rank x step, no NaN: a rank with
    no record is taken to arrive at the origin) is when each rank reached the phase, from
    any common origin; `last` the last arriver's time in it."""
    draws = hidden_work(last, arrived.shape[0])
    if draws is None:
        return np.zeros(arrived.shape[1])
    latest = np.max(arrived, axis=0)
    total = np.zeros(arrived.shape[1])
    for draw in draws:
        total += np.max(arrived + draw, axis=0) - latest
    return total / len(draws)
