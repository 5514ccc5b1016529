"""Finding the rank that holds a job back, and telling it from the ranks that wait for it.

For every (rank, phase) and sampled step: the ratio of the rank's time to the cross-rank
median (with two ranks, to the faster one). A pair is a finding when it is above
`threshold` at `min_persistence` of its sampled steps (from the step where that began,
when it began part-way), far more often than the other ranks are, and the time lost is
not negligible against the step. An excess must also hold at the rank's fast steps (a
rank that is slower is slower every time); one that comes and goes, as a busy machine's
does, stands only where other ranks are found waiting for that rank.

Who waits for whom, from when the ranks arrive: _arrivals.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from ..._text import format_ranks
from ..collectives._collective_clocks import unmeasured_clocks
from ..core._options import StragglerOptions
from ..pipeline._replay import Replay
from ..pipeline._replay_build import build_replay
from ..read._matrix import STEP, PhaseMatrices, nanmedian, quiet
from ..read._values import CpuTimes, PhaseValues
from ._arrivals import (
    arrivals,
    ends_in_a_collective,
    ends_in_collective,
    first_arrival,
    last_arrivals,
    lateness,
    times_of,
    whom_it_waits_for,
)
from ._cause import causes_of
from ._cheap import drop_the_cheap
from ._cost import estimate_costs
from ._findings import left_out_note, ratio_text, sentences
from ._groups import slow_groups, waiting_for_groups
from ._imbalance import find_imbalance
from ._model import RankPhase, StragglerFinding, StragglerReport, Undecided, rounded
from ._pipeline_waits import waiting_in_pipeline
from ._rows import Row, prime, rows_of
from ._scopes import scopes_of
from ._turns import CpuReads, let_turns_go

__all__ = [
    "StragglerFinding",
    "StragglerReport",
    "Undecided",
    "ends_in_collective",
    "find_stragglers",
    "format_ranks",
    "ratio_text",
]

Matrix = npt.NDArray[np.float64]
Vector = npt.NDArray[np.float64]

# A rank's fast steps: this percentile of its times (see _slow_at_its_best).
_FAST = 10


def find_stragglers(
    m: PhaseMatrices,
    options: StragglerOptions | None = None,
    *,
    hosts: Mapping[int, str] | None = None,
    groups: Mapping[int, Mapping[str, object]] | None = None,
    values: Callable[[set[str]], PhaseValues] | None = None,
    gpus: bool | None = None,
    shared_cores: bool = False,
    cpu_times: Callable[[set[str], set[int]], CpuTimes] | None = None,
) -> StragglerReport:
    """Name the persistently slow (rank, phase) pairs of `m` and the ranks that wait for
    them, what fixing them would save (analysis/stragglers/_cost.py) and why each slow rank is slow
    (analysis/stragglers/_cause.py), by the rules of `options` (their defaults without it).

    `m` holds the durations the options' `time` chose when the run was read
    (analysis/stragglers/_analyse.py reads, shapes and judges a run in one call).
    `min_share` drops findings whose median excess is below that share of the median
    step time (a 0.1 ms phase 20% slower costs nothing). Steps need two ranks or more.
    `hosts` (rank -> host name, from the meta files) says which ranks share a clock;
    without it every rank's clock may be off. `groups` (rank -> the parallel groups it
    named) and `values` (given the phases with a slow rank, their per-step values:
    read/_values.py read_phase_values) serve the causes; `values` is called only where
    there is a slow rank. `gpus` (the ranks ran on GPUs, from the meta files) words the
    costs in GPU-hours, rank-hours otherwise. `shared_cores` (some host ran more ranks
    than it has CPUs, from the meta files): ranks taking turns on cores spread any phase,
    so a phase's spread alone does not say uneven data (analysis/stragglers/_imbalance.py), and a
    rank slow only by waiting for a CPU there is no finding (analysis/stragglers/_turns.py).
    `cpu_times(phases, ranks)` (read/_values.py read_cpu_times) gives the slow findings'
    phases' CPU times, of their ranks and some others: where their extra time went.
    """
    if not isinstance(m, PhaseMatrices):
        raise TypeError(
            f"find_stragglers takes PhaseMatrices (phase_matrices), not {type(m).__name__}"
        )
    options = StragglerOptions() if options is None else options
    report = _empty_report(m, options)
    if len(m.ranks) < 2 or not m.steps:
        return report
    # 1. Each (rank, phase) row: slow, waiting, or neither.
    rows = _Rows(m, report, options, hosts)
    for p in range(len(m.phases)):
        if m.phases[p] != STEP:
            rows.judge_phase(p)
    reads = CpuReads(cpu_times)
    unconfirmed = rows.unconfirmed
    if shared_cores:  # ranks taking turns on the cores: a wait for one is no one's fault
        unconfirmed = let_turns_go(
            m,
            report,
            unconfirmed,
            reads,
            threshold=options.threshold,
            min_persistence=options.min_persistence,
            floor=rows.floor,
        )
    # An excess the rank sheds at its fastest steps comes and goes, as a busy machine's
    # does: it stands only where the others are found waiting for this rank.
    waited_for = {f.waits_for[0] for f in report.findings if f.waits_for}
    report.findings.extend(f for f in unconfirmed if f.rank in waited_for)
    # 2. The pipeline's replay (analysis/pipeline/_replay.py): its sends and recvs say who
    # waits for whom, its stages are the ranks whose loads are taken against one pace,
    # and it prices the fixes where it fits.
    pipeline = build_replay(rows.timeline, set(report.sync_phases), groups)
    if isinstance(pipeline, Replay):
        for finding, row in waiting_in_pipeline(
            m,
            pipeline,
            report.findings,
            threshold=options.threshold,
            min_persistence=options.min_persistence,
            floor=rows.floor,
        ):
            report.findings.append(finding)
            rows.waiting[finding.rank, finding.phase] = row
    report.findings = _waiting_since_the_cause(report.findings, rows.waiting, m.steps)
    # The cause before its consequence: a slow rank's waiters often lose more time than it.
    report.findings.sort(key=lambda f: (f.role != "slow", -f.lost_ms, f.rank, f.phase))
    # 3. Uneven data, and groups slow as one.
    report.imbalance = find_imbalance(
        m,
        set(report.sync_phases),
        threshold=options.threshold,
        min_persistence=options.min_persistence,
        floor=rows.floor,
        slow={(f.rank, f.phase) for f in report.findings if f.role == "slow"},
        values=values,
        groups=groups,
        hosts=hosts,
        stages=pipeline.stages() if isinstance(pipeline, Replay) else None,
        shared_cores=shared_cores,
    )
    report.groups = waiting_for_groups(
        slow_groups(report.findings, m.ranks, groups),
        rows.timeline,
        set(report.sync_phases),
        threshold=options.threshold,
        min_persistence=options.min_persistence,
        floor=rows.floor,
    )
    # 4. What each costs, and why.
    left_out = None
    if report.findings or report.imbalance:
        left_out = _price_and_explain(
            report,
            m,
            rows,
            options,
            pipeline,
            _Context(hosts=hosts, groups=groups, values=values, gpus=gpus, reads=reads),
        )
    clocks = unmeasured_clocks(m, hosts)
    if clocks is not None:
        report.notes.append(clocks)
    report.summary = sentences(report)
    if left_out is not None:  # said, so that "no straggler" never reads "no rank is slower"
        report.notes.append(left_out)
    return report


def _empty_report(m: PhaseMatrices, options: StragglerOptions) -> StragglerReport:
    """The report before any finding: the settings and what the matrices hold."""
    return StragglerReport(
        threshold=options.threshold,
        min_persistence=options.min_persistence,
        min_share=options.min_share,
        reference="median" if len(m.ranks) > 2 else "faster rank",
        time=m.time,
        clocks=dict(zip(m.phases, m.clocks, strict=True)),
        untimed=m.untimed,
        ranks=m.ranks,
        steps=m.steps,
        phases=[p for p in m.phases if p != STEP],
        sync_phases=[],
    )


@dataclass(frozen=True)
class _Context:
    """What the run's files say that the costs and causes read (see find_stragglers)."""

    hosts: Mapping[int, str] | None
    groups: Mapping[int, Mapping[str, object]] | None
    values: Callable[[set[str]], PhaseValues] | None
    gpus: bool | None
    reads: CpuReads


def _price_and_explain(  # noqa: PLR0917 - the report and what pricing it reads
    report: StragglerReport,
    m: PhaseMatrices,
    rows: _Rows,
    options: StragglerOptions,
    pipeline: Replay | str | None,
    run: _Context,
) -> str | None:
    """Each finding's, group's and uneven phase's cost (the cheap ones dropped) and each
    slow finding's cause, into `report`; what was dropped as cheap, said, or None."""
    costs = estimate_costs(rows.timeline, report, run.hosts, run.gpus, pipeline)
    top = [p for p, d in zip(m.phases, m.depths, strict=True) if d == 0 and p != STEP]
    said = bool(top) and all(p in m.issued for p in top)
    floor_ms = options.min_saving * _step_ms(m)
    told = len(report.findings) + len(report.imbalance) + len(report.groups)
    left_out = None
    if drop_the_cheap(report, costs, floor_ms, collectives_said=said):
        left = told - len(report.findings) - len(report.imbalance) - len(report.groups)
        left_out = left_out_note(left, floor_ms, options.min_saving)
        if not (report.findings or report.imbalance):
            return left_out
        costs = estimate_costs(rows.timeline, report, run.hosts, run.gpus, pipeline)
    report.imbalance = [
        replace(u, cost=c) for u, c in zip(report.imbalance, costs.imbalance, strict=True)
    ]
    report.groups = [replace(g, cost=c) for g, c in zip(report.groups, costs.groups, strict=True)]
    slow = {f.phase for f in report.findings if f.role == "slow"}
    known = run.values(slow) if run.values is not None and slow else None
    slow_ranks = {f.rank for f in report.findings if f.role == "slow"}
    causes = causes_of(
        m,
        report.findings,
        threshold=options.threshold,
        steady=rows.steady,
        values=known,
        hosts=run.hosts,
        groups=run.groups,
        gpus=run.gpus,
        cpu=run.reads(slow, slow_ranks),
    )
    report.findings = [
        replace(f, cost=c, cost_of=of, cause=why)
        for f, c, of, why in zip(report.findings, costs.each, costs.of, causes, strict=True)
    ]
    report.notes = costs.notes + (known.notes if known is not None else [])
    report.cost, report.host_costs = costs.all, costs.hosts
    report.model_step_ms = costs.model_step_ms
    return left_out


class _Rows:
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
        self.floor = options.min_share * _step_ms(m)
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
        if ends_in_a_collective(m, p, arrive, leave, self.timeline.ms[p]):
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


def _waiting_since_the_cause(
    findings: list[StragglerFinding], rows: dict[tuple[int, str], Row], steps: list[int]
) -> list[StragglerFinding]:
    """The "waits" findings of a rank with a slow finding, taken from the step that rank
    turned slow: they wait for it from then, not from the start of the run (their own
    onset can fall earlier, where the noise of waiting put a few steps above). Their
    ratio, share, lost time and steps follow."""
    began: dict[int, int] = {}
    for f in findings:
        if f.role == "slow":
            began[f.rank] = min(f.since_step, began.get(f.rank, f.since_step))
    moved: dict[int, tuple[Row, int]] = {}  # finding -> its row and the cause's onset
    sampled = np.asarray(steps)
    for i, f in enumerate(findings):
        row = rows.get((f.rank, f.phase))
        cause = began.get(f.waits_for[0]) if f.role == "waits" and f.waits_for else None
        if row is None or cause is None or cause == f.since_step:
            continue
        at = sampled[row.valid] >= cause
        if at.any():
            moved[i] = (row, int(np.argmax(at)))
    prime(list(moved.values()))
    out = []
    for i, f in enumerate(findings):
        if i not in moved:
            out.append(f)
            continue
        row, onset = moved[i]
        out.append(
            replace(
                f,
                median_ratio=row.median_ratio(onset),
                share_above=row.share(onset),
                lost_ms=row.lost(onset),
                steps=len(row.valid) - onset,
                since_step=steps[int(row.valid[onset])],
                median_excess_ms=round(row.median_excess(onset), 3),
            )
        )
    return out


def _reference(d: Matrix, reference: str) -> Matrix:
    """Per step, the cross-rank median (or the faster of two); NaN with fewer than two ranks."""
    present = np.sum(~np.isnan(d), axis=0)
    with np.errstate(invalid="ignore"), quiet():
        ref = nanmedian(d, 0) if reference == "median" else np.nanmin(d, axis=0)
    return np.where(present >= 2, ref, np.nan)


def _step_ms(m: PhaseMatrices) -> float:
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
