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
from ..read._matrix import STEP, PhaseMatrices, nanmedian, quiet
from ._imbalance import balanced, imbalance_cells
from ._model import ROUGH_FIT, Cost, HostCost, SlowGroup, StragglerFinding, StragglerReport

__all__ = ["Costs", "estimate_costs", "without_waiting"]

Matrix = npt.NDArray[np.float64]
Vector = npt.NDArray[np.float64]
_MS_PER_HOUR = 3.6e6
Cell = tuple[int, int, int, bool]
"""A fix: (rank index, phase index, the step it applies from, balanced): balanced, the
phase's load made even (analysis/stragglers/_imbalance.py balanced); not, the rank made like the
others (their median). One rank's phase fixed both ways takes the faster at each step."""


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
    none; its steps are priced by it where it fits them.
    """
    model = _StepModel(
        m, set(report.sync_phases), pipeline if isinstance(pipeline, Replay) else None
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


def _in_model(model: _StepModel, cells: set[Cell]) -> bool:
    """The model can price a fix of these cells: their phases are top-level work."""
    return all(model.segment(p) is not None for _, p, _, _ in cells)


@dataclass(frozen=True)
class _Pricing:
    """The costs of one report: per step over the steps from `basis` on, hours from each
    fix's own start."""

    model: _StepModel
    basis: int
    gpus: bool | None

    def cost(self, cells: set[Cell], since_step: int) -> Cost:
        return self.model.cost(cells, since_step, self.basis, self.gpus)


class _StepModel:
    """A run's steps as segments of work that end in a collective (see the module)."""

    def __init__(self, m: PhaseMatrices, sync: set[str], replay: Replay | None = None) -> None:
        self.m = m
        self.segments: list[list[int]] = [[]]
        """Each segment's work phases (indices into m.phases), in the order they run."""
        self.segment_of: dict[int, int] = {}
        self.closing: dict[str, int] = {}
        """A collective's name -> the segment it closes."""
        top = [p for p, d in enumerate(m.depths) if d == 0 and m.phases[p] != STEP]
        held = m.holders()
        self.parent = {p: q for p, (q, _) in held.items() if m.phases[q] not in sync}
        """A nested phase -> the top-level work phase it runs inside (at most steps)."""
        inside = m.work_inside(sync)
        self.inside = {p: q for q, (phases, _) in inside.items() for p in phases}
        """A work phase nested in a phase that ends in a collective -> that phase: its
        time is work of the segment that collective closes."""
        collective = np.zeros(len(m.steps))
        self.hidden: dict[int, npt.NDArray[np.float32]] = {}
        """Per segment closed by a phase that holds work and a collective, draws of the
        work each rank does inside it (see _hidden_work)."""
        for p in top:
            if m.phases[p] in sync:
                self.closing[m.phases[p]] = len(self.segments) - 1
                own = inside[p][1] if p in inside else 0.0
                with quiet():  # the last to arrive waits for no one: its time is the collective's
                    last = np.nanmin(m.ms[p] - own, axis=0)
                collective += np.nan_to_num(last)
                if m.kinds[p] != "comm":
                    draws = _hidden_work(last, len(m.ranks))
                    if draws is not None:
                        self.hidden[len(self.segments) - 1] = draws
                self.segments.append([])
            else:
                self.segment_of[p] = len(self.segments) - 1
                self.segments[-1].append(p)
        self.collective = collective
        ranks, steps = len(m.ranks), len(m.steps)
        self.work = np.zeros((len(self.segments), ranks, steps))
        for p, k in self.segment_of.items():
            self.work[k] += np.nan_to_num(m.ms[p])
        for q, (_, own) in inside.items():
            self.work[self.closing[m.phases[q]]] += own
        self.measured = self._measured_steps(top)
        self.span = _steps_each_stands_for(m.steps)
        self.now = self._modelled(self.work)
        self.unfit: str | None = None
        """Why the pipeline's replay is not used, where it was built and does not fit."""
        self.replay = self._fitting(replay)
        """The pipeline's replay, where it fits the measured steps (then it gives `now` and
        the savings at the steps it replayed)."""
        if self.replay is not None:
            self.now = np.where(self.replay.ok, self.replay.steps, self.now)
        self.known: dict[frozenset[Cell], Vector] = {}
        self.scales: dict[int, float] = {}
        """The hidden work's scale for a fix from a step on (see _hidden_scale)."""
        self.rank_index = {rank: i for i, rank in enumerate(m.ranks)}
        self.targets: dict[int, Matrix] = {}
        """Per phase found uneven (analysis/stragglers/_imbalance.py), what balancing it makes each
        rank's times (a balanced cell's target); a fix of a slow rank makes it the median
        of the others, in an uneven phase too: balancing keeps a slow stage's pace."""

    def _fitting(self, replay: Replay | None) -> Replay | None:
        """`replay`, where its steps are within ROUGH_FIT of the measured ones (`unfit`
        says so where not). It is taken over the segment model even where that fits
        closer: a model's step fitting the measured one does not make it price a fix
        right (the segment model's step fits a 1F1B pipeline's exactly and prices its
        slow first stage 41% too high)."""
        if replay is None or STEP not in self.m.phases:
            return None
        ok = replay.ok & np.isfinite(replay.steps) & np.isfinite(self.measured)
        if not ok.any():
            return None
        replayed, measured = float(np.mean(replay.steps[ok])), float(np.mean(self.measured[ok]))
        if abs(replayed / measured - 1) <= ROUGH_FIT:
            return replay
        self.unfit = (
            f"the pipeline's replay gives a {replayed:.3g} ms step against {measured:.3g} ms "
            f"measured ({replayed / measured:.2f}x): its savings are the step model's"
        )
        return None

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
            measured: Vector = nanmedian(step, 0)
        return np.where(np.isfinite(measured), measured, self._modelled(self.work))

    def _modelled(self, work: Matrix, scale: float = 1.0) -> Vector:
        """Per sampled step, the model's step time for `work` (segment x rank x step): the
        slowest rank's work of each segment (with the work hidden inside its collective,
        the mean over the draws, scaled by `scale`), plus the collectives."""
        total: Vector = self.collective.copy()
        for k in range(len(work)):
            hidden = self.hidden.get(k)
            if hidden is None:
                total += np.max(work[k], axis=0)
            else:
                # a draw at a time: one rank x step array at a time, not all the draws'
                slowest = [np.max(work[k] + scale * draw, axis=0) for draw in hidden]
                total += np.mean(slowest, axis=0)
        return total

    def _hidden_scale(self, before: int) -> float:
        """What the hidden work's draws are scaled by for a fix from step `before` on: the
        scale (0 to 1) at which the model's mean step over the sampled steps before it is
        the measured one, where it is longer with the whole draws; 1 with fewer than
        `_FIT_STEPS` such steps (a fault from the start).

        The draws stand for how far the ranks' work inside a collective phase strays when
        they arrive together, which is how a fix leaves them; the steps before the fault
        are such steps, and say how much the slowest of those strays really adds. The last
        arriver's time holds more than its work's jitter on a busy machine (the
        scheduler's delays, common to every rank at a step): a 4-rank FSDP job on two
        cores strayed by 8 ms there, and a fix worth 15.7 ms was priced at 7.4."""
        if before in self.scales:
            return self.scales[before]
        scale = 1.0
        ok = np.isfinite(self.measured) & (np.asarray(self.m.steps) < before)
        if self.hidden and int(ok.sum()) >= _FIT_STEPS and STEP in self.m.phases:
            measured = float(np.mean(self.measured[ok]))

            def mean_step(at: float) -> float:
                return float(np.mean(self._modelled(self.work, at)[ok]))

            if mean_step(1.0) > measured:
                low, high = 0.0, 1.0
                if mean_step(0.0) >= measured:
                    high = 0.0
                for _ in range(_FIT_ROUNDS if high > 0 else 0):
                    mid = (low + high) / 2
                    low, high = (mid, high) if mean_step(mid) < measured else (low, mid)
                scale = (low + high) / 2
        self.scales[before] = scale
        return scale

    def modelled_step_ms(self, since_step: int) -> float:
        """The model's step time, mean over the sampled steps from `since_step` on (the
        steps `cost` measures the step time over)."""
        after = self._after(since_step)
        return float(np.mean(self.now[after])) if after.any() else 0.0

    def _after(self, since_step: int) -> npt.NDArray[np.bool_]:
        after = np.asarray(self.m.steps) >= since_step
        if not after.any():
            after[:] = True
        return after

    def fixes(self, finding: StragglerFinding) -> set[Cell] | str:
        """The (rank index, phase index, from step) cells a fix of `finding` sets to the
        median, from the step its finding began on (before it, the rank was as the
        others and a fix would only take out its noise); why it cannot be costed where
        it cannot."""
        ranks, since = self.rank_index, finding.since_step
        if finding.role == "slow":
            p = self.m.index(finding.phase)
            if self.segment(p) is not None:
                return {(ranks[finding.rank], p, since, False)}
            return (
                "it runs inside a phase that ends in a collective and is no work the model "
                "places before it (a collective of its own, or nested two levels down)"
            )
        segment = self.closing.get(finding.phase)
        late = ranks.get(finding.waits_for[0]) if finding.waits_for else None
        if segment is None:
            return "the model takes only top-level phases for collectives"
        if late is None:
            return "no rank is named as the one it waits for"
        held = [p for p, q in self.inside.items() if self.m.phases[q] == finding.phase]
        return {(late, p, since, False) for p in [*self.segments[segment], *held]}

    def segment(self, p: int) -> tuple[int, int] | None:
        """The segment whose work phase `p`'s time is, and the top-level phase that holds
        it (`p` itself where it is top-level work); None where the model cannot see it."""
        if p in self.segment_of:
            return self.segment_of[p], p
        if p in self.parent:
            return self.segment_of[self.parent[p]], self.parent[p]
        if p in self.inside:
            q = self.inside[p]
            return self.closing[self.m.phases[q]], q
        return None

    def _scales(self, cuts: dict[tuple[int, int], Vector]) -> dict[tuple[int, int], Vector]:
        """Per (rank, top-level phase), what a fix that takes `cuts` off it multiplies its
        ops' times by, at each step."""
        out = {}
        for (r, top), cut in cuts.items():
            whole = np.nan_to_num(self.m.ms[top][r])
            with quiet():
                out[r, top] = np.where(whole > 0, 1 - cut / whole, 1.0)
        return out

    def cost(self, cells: set[Cell], since_step: int, basis: int, gpus: bool | None) -> Cost:
        """What the fix of `cells` saves: per step over the steps from `basis` on, in hours
        over those from `since_step` on."""
        earliest: dict[tuple[int, int, bool], int] = {}  # fixed by two findings: the earlier
        for r, p, step, even in cells:
            earliest[r, p, even] = min(step, earliest.get((r, p, even), step))
        saved = self._saved(
            frozenset((r, p, step, even) for (r, p, even), step in earliest.items())
        )
        over = self._after(basis)
        per_step = max(0.0, float(np.mean(saved[over])))
        now = float(np.mean(self.measured[over]))
        after = self._after(since_step)
        hours = max(0.0, float(np.sum(saved[after] * self.span[after]))) / _MS_PER_HOUR
        ranks = _significant(hours * len(self.m.ranks))
        return Cost(
            step_ms_saved=round(per_step, 3),
            run_hours_saved=_significant(hours),
            rank_hours_saved=ranks,
            gpu_hours_saved=ranks if gpus else None,
            speedup=round(now / (now - per_step), 4) if now > per_step > 0 else 1.0,
            step_ms=round(now, 3),
            steps_from=int(np.asarray(self.m.steps)[over][0]),
        )

    def _saved(self, cells: frozenset[Cell]) -> Vector:
        """Per sampled step, the step time a fix of `cells` saves. Many findings share a
        fix (every rank that waits for one rank): each is worked out once."""
        if cells not in self.known:
            work = self.work.copy() if cells else self.work
            fixed: dict[tuple[int, int], Vector] = {}  # (rank, phase) -> its time fixed
            for r, p, since, even in sorted(cells):
                d = self.m.ms[p]
                if even:
                    target = self.targets[p][r]
                else:
                    with quiet():
                        target = nanmedian(np.delete(d, r, 0), axis=0)
                mine = np.fmin(d[r], target)  # never slower than it was
                mine = np.where(np.asarray(self.m.steps) >= since, mine, d[r])
                fixed[r, p] = np.fmin(fixed.get((r, p), d[r]), mine)
            cuts: dict[tuple[int, int], Vector] = {}  # (rank, top-level phase) -> ms taken off
            for (r, p), mine in fixed.items():
                # A nested phase's time is its parent's: the fix shortens the parent.
                segment, top = self.segment(p) or (-1, p)
                cut = np.nan_to_num(self.m.ms[p][r] - mine)  # NaN (no record): as it was
                work[segment, r] -= cut
                cuts[r, top] = cuts.get((r, top), 0.0) + cut
            scale = self._hidden_scale(min((c[2] for c in cells), default=0))
            now = self.now if scale == 1.0 else self._modelled(self.work, scale)
            saved = now - self._modelled(work, scale)
            replayed = self.replay.step_ms(self._scales(cuts)) if self.replay is not None else None
            if self.replay is not None and replayed is not None:
                saved = np.where(self.replay.ok, self.now - replayed, saved)
            self.known[cells] = saved
        return self.known[cells]


_DRAWS = 8
_FIT_ROUNDS = 10
"""Halvings in fitting the hidden work's scale: to a thousandth."""
_FIT_STEPS = 5
"""Sampled steps before a fix's first that the hidden work's scale is fitted on."""
_LOCAL = 9
"""Sampled steps around each that its hidden work's typical time is taken over."""
"""Draws of the work hidden inside a collective phase (the cost's mean is over them)."""


def _hidden_work(last: Vector, ranks: int) -> npt.NDArray[np.float32] | None:
    """Draws (draw x rank x step) of how each rank's work inside a phase that holds work
    and ends in a collective (a DDP backward) strays from the typical. The timings cannot
    show it: every rank leaves the phase together, and only the last rank to arrive,
    which waits for no one, shows its own time there. Its time over the sampled steps
    is taken as what any rank's might have been (drawn with a fixed seed: the same run
    gives the same figures). Without it the next slowest rank after a fix would be found
    among too few, and a fix would look to save more than it does (1.2x to 1.8x too much
    on 8 to 256 simulated ranks)."""
    seen = last[np.isfinite(last)]
    if len(seen) < 2:
        return None
    strays = (seen - _local_median(seen)).astype(np.float32)
    rng = np.random.default_rng(0)
    return rng.choice(strays, size=(_DRAWS, ranks, len(last)))


def _local_median(values: Vector) -> Vector:
    """Per value, the median of the `_LOCAL` values around it (fewer at the ends): where a
    fault changed which rank arrives last, the typical time before it and after it differ,
    and strays from one median over both would be that change, not the work's jitter
    (on a 4-rank DDP job slowed part-way, strays from 5 ms below to 6 ms above, twice the
    jitter either side of the change)."""
    if len(values) <= _LOCAL:
        return np.full_like(values, np.median(values))
    half = _LOCAL // 2
    padded = np.pad(values, half, mode="edge")
    windows = np.lib.stride_tricks.sliding_window_view(padded, _LOCAL)
    out: Vector = np.median(windows, axis=1)
    return out


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
    draws = _hidden_work(last, arrived.shape[0])
    if draws is None:
        return np.zeros(arrived.shape[1])
    latest = np.max(arrived, axis=0)
    total = np.zeros(arrived.shape[1])
    for draw in draws:
        total += np.max(arrived + draw, axis=0) - latest
    return total / len(draws)


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
