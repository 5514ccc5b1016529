"""The straggler rules over each (rank, phase) row of a phase (analysis/stragglers/_stragglers.py
runs them phase by phase): a rank against the others' median at every sampled step; where
the phase ends in a collective, against the last rank to arrive, so that a rank that waits
is told from the rank it waits for; a slow row held back where it sheds its excess at its
fastest steps, until a rank is found waiting for it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..core._options import StragglerOptions
from ..read._matrix import STEP, PhaseMatrices, nanmedian, quiet
from ._arrivals import (
    arrivals,
    ends_in_a_collective,
    first_arrival,
    last_arrivals,
    lateness,
    times_of,
    whom_it_waits_for,
)
from ._model import RankPhase, StragglerFinding, StragglerReport, Undecided, rounded
from ._rows import Row, rows_of
from ._scopes import scopes_of

__all__ = ["PhaseJudge", "step_ms"]

Matrix = npt.NDArray[np.float64]
Vector = npt.NDArray[np.float64]

# A rank's fast steps: this percentile of its times (see _slow_at_its_best).
_FAST = 10


class PhaseJudge:
    """The rules over each (rank, phase) row (see the module): the slow rows and the
    waiting ones into the report's findings; the slow ones that shed their excess at their
    fastest steps held back (`unconfirmed`) until a rank is found waiting for them."""

    def __init__(
        self,
        m: PhaseMatrices,
        report: StragglerReport,
        options: StragglerOptions,
        hosts: Mapping[int, str] | None,
    ) -> None:
        self.m, self.report, self.options = m, report, options
        self.timeline = m.on_timeline()  # where phases are read on two clocks, the GPU's one
        self.arrive, self.leave = arrivals(self.timeline, hosts)
        self.floor = options.min_share * step_ms(m)
        # Where each rank's own work since the ranks were last together began: the step's
        # first phase, then the end of each phase that ends in a collective.
        self.since = first_arrival(m, self.arrive)
        self.tests = len(m.ranks) * len(m.phases) * max(1, len(m.steps))
        self.unconfirmed: list[StragglerFinding] = []
        self.steady: set[tuple[int, str]] = set()
        """Slow rows slow at their fastest steps too."""
        self.waiting: dict[tuple[int, str], Row] = {}
        """The rows of the "waits" findings."""

    def judge_phase(self, p: int) -> None:
        """Phase `p`'s rows: its table, and the rows that hold a finding."""
        m, report, options = self.m, self.report, self.options
        threshold, floor = options.threshold, self.floor
        phase = m.phases[p]
        d = m.ms[p]
        ref = _reference(d, report.reference)
        arrive, leave = self.arrive[p], self.leave[p]
        at = None
        if ends_in_a_collective(m, p, arrive, leave, self.timeline.ms[p], self.timeline):
            report.sync_phases.append(phase)
            # Work phases nested in it (a Trainer's batch fetch before its all-gather)
            # are each rank's own: it reaches the collective after them.
            held = self.timeline.work_inside({phase}).get(p)
            reach, d_sync = arrive, d
            if held is not None:
                reach, d_sync = arrive + held[1] * 1e6, d - held[1]
            # In a phase that ends in a collective a rank can only take longer by
            # arriving earlier: measure each rank against the last one to arrive.
            last = last_arrivals(reach)
            late_ns, made_ns = lateness(reach, self.since, last)
            # Where ranks leave it in groups (a pipeline's all-reduce per stage), each
            # waits for the last of its own group (analysis/stragglers/_scopes.py).
            once = phase not in m.repeats  # a p2p phase's last exit says nothing of groups
            scoped = (
                scopes_of(reach, leave, d_sync, self.since) if once and not m.on_device else None
            )
            if m.depths[p] == 0:
                self.since = np.where(np.isnan(leave), self.since, leave)
            at = _Arrived(last, late_ns, made_ns, scoped, d_sync)
        ratio, excess = _against(d, ref)
        report.table.extend(_table(m.ranks, phase, ratio, excess, threshold=threshold, floor=floor))
        if at is not None:
            theirs = (
                times_of(at.d, at.last)[None, :] if at.scoped is None else at.scoped.times(at.d)
            )
            ratio, excess = _against(at.d, theirs)
        # Only rows with enough steps above can hold a finding; on a clean run that is few.
        above = np.sum((ratio > threshold) & (excess >= floor), axis=1)
        steps = np.sum(np.isfinite(ratio), axis=1)
        needed = options.min_persistence * max(3, math.ceil(0.2 * steps.max()))
        # How often a rank is above here by chance: the share of the typical other rank.
        chances = _medians_without(above / np.maximum(steps, 1))
        candidates = np.flatnonzero(above >= needed)
        rows = rows_of(
            ratio,
            excess,
            candidates,
            threshold=threshold,
            floor=floor,
            min_persistence=options.min_persistence,
        )
        memo: dict[tuple[int, int], Any] = {}  # rows whose steps and window agree
        for r in candidates.tolist():
            self._judge_row(p, r, rows[r], float(chances[r]), ratio[r], at, memo)

    def _judge_row(  # noqa: PLR0917 - one row and what its phase's judgement holds
        self,
        p: int,
        r: int,
        row: Row,
        chance: float,
        ratios: Vector,
        at: _Arrived | None,
        memo: dict[tuple[int, int], Any],
    ) -> None:
        """Row `r` of phase `p`: a finding (slow, or waiting where the phase ends in a
        collective, `at`), an undecided row, or nothing."""
        m, report, options = self.m, self.report, self.options
        phase, rank = m.phases[p], m.ranks[r]
        onset = row.onset(options.min_persistence)
        if onset is None:
            return
        onset = _first_above(row, onset)  # its figures count from the step it says
        if row.median_excess(onset) < self.floor:
            return
        if at is None and not row.beyond_chance(onset, chance, self.tests):
            more = row.steps_needed(onset, chance, self.tests)
            if more is not None and _slow_at_its_best(
                m.ms[p], r, row.valid[onset:], options.threshold
            ):
                hits, n = int(np.sum(row.above[onset:])), len(row.valid) - onset
                ratio_r = row.median_ratio(onset)
                report.undecided.append(Undecided(rank, phase, "slow", ratio_r, hits, n, more))
            return
        waits_for: tuple[int, ...] = ()
        if at is not None:
            waits_for = self._waits_for(p, r, row, onset, at, memo)
            if not waits_for:
                return
        finding = StragglerFinding(
            rank=rank,
            phase=phase,
            kind=m.kinds[p],
            role="waits" if at is not None else "slow",
            median_ratio=row.median_ratio(onset),
            share_above=row.share(onset),
            lost_ms=row.lost(onset),
            steps=len(row.valid) - onset,
            since_step=m.steps[int(row.valid[onset])],
            waits_for=tuple(m.ranks[i] for i in waits_for),
            ratios=rounded(ratios),
            median_excess_ms=round(row.median_excess(onset), 3),
        )
        if at is not None:
            self.waiting[rank, phase] = row
        if at is not None or _slow_at_its_best(m.ms[p], r, row.valid[onset:], options.threshold):
            self.steady.add((rank, phase))
            report.findings.append(finding)
        else:
            self.unconfirmed.append(finding)

    def _waits_for(  # noqa: PLR0917 - one row and what its phase's judgement holds
        self,
        p: int,
        r: int,
        row: Row,
        onset: int,
        at: _Arrived,
        memo: dict[tuple[int, int], Any],
    ) -> tuple[int, ...]:
        """The rank indices row `r` waits for from `onset` on; where only more sampled
        steps could tell, an undecided row is added to the report."""
        # Waiting differs between rows only by the row's own rank leaving the window:
        # rows of every step that were never last there share an answer.
        key = (onset, r if row.whole and r in row.last_at(at.last, onset) else -1)
        cols = row.valid[onset:]
        if at.scoped is not None:
            memo[key] = whom_it_waits_for(
                r,
                cols,
                at.scoped.last[r],
                at.scoped.late_ns[r],
                at.scoped.made_ns[r],
                ranks=at.scoped.members(r, cols),
                tests=self.tests,
            )
        elif not row.whole or key not in memo:
            memo[key] = whom_it_waits_for(
                r, cols, at.last, at.late_ns, at.made_ns, ranks=len(self.m.ranks), tests=self.tests
            )
        waits_for: tuple[int, ...]
        waits_for, short = memo[key]
        if short is not None:
            hits, more, late = short
            n, ratio_r = len(row.valid) - onset, row.median_ratio(onset)
            rank, phase, late_rank = self.m.ranks[r], self.m.phases[p], (self.m.ranks[late],)
            self.report.undecided.append(
                Undecided(rank, phase, "waits", ratio_r, hits, n, more, late_rank)
            )
        return waits_for


@dataclass(frozen=True)
class _Arrived:
    """Of a phase that ends in a collective: per step the rank index that arrived last,
    how late it was and how much of that it made since the ranks were last together (ns),
    the groups it is left in (or None: all together), and the ranks' times in it less the
    work nested in it."""

    last: npt.NDArray[np.int64]
    late_ns: Vector
    made_ns: Vector
    scoped: Any
    d: Matrix


def _first_above(row: Row, onset: int) -> int:
    """The row's first step above the threshold from `onset` on: a finding is never said
    to begin at a step where the rank was not slow (the split that separates the steps
    best can fall a sample or two before the change)."""
    later = np.flatnonzero(row.above[onset:])
    return onset + int(later[0]) if len(later) else onset


def _reference(d: Matrix, reference: str) -> Matrix:
    """Per step, the cross-rank median (or the faster of two); NaN with fewer than two ranks."""
    present = np.sum(~np.isnan(d), axis=0)
    with np.errstate(invalid="ignore"), quiet():
        ref = nanmedian(d, 0) if reference == "median" else np.nanmin(d, axis=0)
    return np.where(present >= 2, ref, np.nan)


def step_ms(m: PhaseMatrices) -> float:
    if STEP in m.phases:
        values = m.ms[m.index(STEP)]
    else:
        tops = [m.ms[p] for p, depth in enumerate(m.depths) if depth == 0]
        values = np.nansum(np.stack(tops), axis=0) if tops else np.zeros(0)
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if finite.size else 0.0


def _table(
    ranks: list[int], phase: str, ratio: Matrix, excess: Matrix, *, threshold: float, floor: float
) -> list[RankPhase]:
    """Every rank's row for one phase, over all its steps."""
    with quiet():
        median = nanmedian(ratio, 1)
        present = np.sum(np.isfinite(ratio), axis=1)
        above = np.sum((ratio > threshold) & (excess >= floor), axis=1)
        share = np.where(present > 0, above / np.maximum(present, 1), 0.0)
        lost = np.nansum(np.clip(excess, 0, None), axis=1)
    return [
        RankPhase(rank, phase, round(float(m), 4), round(float(s), 4), round(float(lo), 3))
        for rank, m, s, lo in zip(ranks, median, share, lost, strict=True)
    ]


def _against(d: Matrix, ref: Matrix) -> tuple[Matrix, Matrix]:
    """(ratio, excess) of times `d` over a reference, NaN where either is missing."""
    with quiet():
        return np.where(ref > 0, d / ref, np.nan), d - ref


def _slow_at_its_best(d: Matrix, r: int, cols: npt.NDArray[np.int64], threshold: float) -> bool:
    """The rank's fast steps are above `threshold` times the other ranks' fast steps.

    Fast steps: the tenth percentile of the times over the steps `cols`. A rank whose
    own work is slower (a slower device, a throttled core, a sleep) is slower at every
    step, its fastest included; a rank that a busy machine slows now and then is not.
    The percentile is one of the times, never drawn between two: over a few steps (a
    late stretch of 6, 5 of them slowed by the host's scheduler) a value drawn between
    the fastest and the next one is half a slow step.
    """
    mine = d[r, cols]
    others = np.delete(d, r, axis=0)[:, cols]
    mine, others = mine[np.isfinite(mine)], others[np.isfinite(others)]
    if not mine.size or not others.size:
        return False
    theirs = float(np.percentile(others, _FAST, method="lower"))
    return theirs > 0 and float(np.percentile(mine, _FAST, method="lower")) > threshold * theirs


def _medians_without(values: Vector) -> Vector:
    """Per entry, the median of the other entries (NaN where there are none): one sort for
    all, where a median per entry would take time quadratic in the number of ranks."""
    n = len(values)
    if n < 2:
        return np.full(n, np.nan)
    order = np.argsort(values, kind="stable")
    ranked = values[order]
    place = np.empty(n, np.int64)
    place[order] = np.arange(n)  # where each entry sits in `ranked`

    def at(i: int) -> Vector:
        """The i-th of the others, sorted: `ranked` with the entry's own place skipped."""
        picked: Vector = np.where(place > i, ranked[i], ranked[min(i + 1, n - 1)])
        return picked

    half = (n - 1) // 2
    if (n - 1) % 2:
        return at(half)
    return (at(half - 1) + at(half)) / 2
