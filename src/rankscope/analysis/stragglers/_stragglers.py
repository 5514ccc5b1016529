"""Finding the rank that holds a job back, and telling it from the ranks that wait for it.

For every (rank, phase) and sampled step: the ratio of the rank's time to the cross-rank
median (with two ranks, to the faster one). A pair is a finding when it is above
`threshold` at `min_persistence` of its sampled steps (from the step where that began,
when it began part-way), far more often than the other ranks are, and the time lost is
not negligible against the step. An excess must also hold at the rank's fast steps (a
rank that is slower is slower every time); one that comes and goes, as a busy machine's
does, stands only where other ranks are found waiting for that rank.

Waiting is told apart by when ranks arrive. A phase that ends in a collective (kind
"comm", or a phase whose ranks leave it together although they entered it apart, such as
a DDP backward with its gradient all-reduce inside) lasts longer on the ranks that
arrive early: their excess there is waiting, and the rank that arrives last is the one
they wait for. Arrival is the host wall clock at phase entry, corrected by each rank's
clock offset where comm phases show one; with device times it is the device time spent
in the step before the phase. Lateness a rank carries in, having left the last
collective (or entered the step) after the others, is not its own: on one host that is
the order the scheduler woke them in. It waits for a rank only when that rank made most
of its lateness in its own work.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from ..._text import format_ranks
from ..collectives._collective_clocks import clock_offsets, unmeasured_clocks
from ..core._chance import binomial_tail, steps_needed
from ..core._options import StragglerOptions
from ..pipeline._replay import Replay
from ..pipeline._replay_build import build_replay
from ..read._matrix import STEP, PhaseMatrices, nanmedian, quiet
from ..read._values import CpuTimes, PhaseValues
from ._cause import causes_of
from ._cost import drop_the_cheap, estimate_costs
from ._findings import ratio_text, sentences
from ._groups import slow_groups, waiting_for_groups
from ._imbalance import find_imbalance
from ._model import RankPhase, StragglerFinding, StragglerReport, Undecided, rounded
from ._pipeline_waits import waiting_in_pipeline
from ._rows import Row, rows_of
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

# A phase is taken to end in a collective at a step when its exits spread across ranks
# by less than this share of how far its entries spread...
_SYNC_SPREAD = 0.25
# ...judged only at steps where entries spread by at least this share of its time.
_CONCLUSIVE = 0.05
# A phase that issued a collective ends in it unless its exits spread by more than
# this share of its time (and twice its entries) at most steps: work follows the collective.
_APART = 0.25
# ...on this many steps or more (fewer cannot overturn what the records say).
_OVERTURN = 5
# A late rank is late by its own work when it made at least this share of its lateness
# after the ranks were last together (the step began, or they left a collective).
_EXPLAINED = 0.5
# A rank's fast steps: this percentile of its times (see _slow_at_its_best).
_FAST = 10


def find_stragglers(  # noqa: PLR0915 - one pass over phases and rows, read top to bottom
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
    threshold, min_persistence = options.threshold, options.min_persistence
    min_share = options.min_share
    reference = "median" if len(m.ranks) > 2 else "faster rank"
    report = StragglerReport(
        threshold=threshold,
        min_persistence=min_persistence,
        min_share=min_share,
        reference=reference,
        time=m.time,
        clocks=dict(zip(m.phases, m.clocks, strict=True)),
        untimed=m.untimed,
        ranks=m.ranks,
        steps=m.steps,
        phases=[p for p in m.phases if p != STEP],
        sync_phases=[],
    )
    if len(m.ranks) < 2 or not m.steps:
        return report
    timeline = m.on_timeline()  # where phases are read on two clocks, the GPU's one
    arrive, leave = _arrivals(timeline, hosts)
    floor = min_share * _step_ms(m)
    # Where each rank's own work since the ranks were last together began: the step's
    # first phase, then the end of each phase that ends in a collective.
    since = _first_arrival(m, arrive)
    unconfirmed: list[StragglerFinding] = []
    steady: set[tuple[int, str]] = set()  # slow rows slow at their fastest steps too
    waiting: dict[tuple[int, str], Row] = {}  # the rows of the "waits" findings
    for p, (phase, kind) in enumerate(zip(m.phases, m.kinds, strict=True)):
        if phase == STEP:
            continue
        d = m.ms[p]
        ref = _reference(d, reference)
        sync = _sync(m, p, arrive[p], leave[p], timeline.ms[p])
        scoped = None
        if sync:
            report.sync_phases.append(phase)
            # Work phases nested in it (a Trainer's batch fetch before its all-gather)
            # are each rank's own: it reaches the collective after them.
            held = timeline.work_inside({phase}).get(p)
            at, d_sync = arrive[p], d
            if held is not None:
                at, d_sync = arrive[p] + held[1] * 1e6, d - held[1]
            # In a phase that ends in a collective a rank can only take longer by
            # arriving earlier: measure each rank against the last one to arrive.
            last = _last_arrivals(at)
            late_ns, made_ns = _lateness(at, since, last)
            # Where ranks leave it in groups (a pipeline's all-reduce per stage), each
            # waits for the last of its own group (analysis/stragglers/_scopes.py).
            once = phase not in m.repeats  # a p2p phase's last exit says nothing of groups
            scoped = scopes_of(at, leave[p], d_sync, since) if once and not m.on_device else None
            if m.depths[p] == 0:
                since = np.where(np.isnan(leave[p]), since, leave[p])
            ref_w = _times_of(d_sync, last)
        ratio, excess = _against(d, ref)
        report.table.extend(_table(m.ranks, phase, ratio, excess, threshold=threshold, floor=floor))
        if sync:
            ratio, excess = _against(
                d_sync, ref_w[None, :] if scoped is None else scoped.times(d_sync)
            )
        # Only rows with enough steps above can hold a finding; on a clean run that is few.
        above = np.sum((ratio > threshold) & (excess >= floor), axis=1)
        steps = np.sum(np.isfinite(ratio), axis=1)
        needed = min_persistence * max(3, math.ceil(0.2 * steps.max()))
        # How often a rank is above here by chance: the share of the typical other rank.
        shares = above / np.maximum(steps, 1)
        tests = len(m.ranks) * len(m.phases) * max(1, len(m.steps))
        chances = _medians_without(shares)
        candidates = np.flatnonzero(above >= needed)
        rows = rows_of(
            ratio,
            excess,
            candidates,
            threshold=threshold,
            floor=floor,
            min_persistence=min_persistence,
        )
        waits_memo: dict[tuple[int, int], Any] = {}  # rows whose steps and window agree
        for r in candidates.tolist():
            rank = m.ranks[r]
            row = rows[r]
            onset = row.onset(min_persistence)
            if onset is None:
                continue
            onset = _first_above(row, onset)  # its figures count from the step it says
            if row.median_excess(onset) < floor:
                continue
            chance = float(chances[r])
            if not sync and not row.beyond_chance(onset, chance, tests):
                more = row.steps_needed(onset, chance, tests)
                if more is not None and _slow_at_its_best(d, r, row.valid[onset:], threshold):
                    hits, n = int(np.sum(row.above[onset:])), len(row.valid) - onset
                    ratio_r = row.median_ratio(onset)
                    report.undecided.append(Undecided(rank, phase, "slow", ratio_r, hits, n, more))
                continue
            waits_for: tuple[int, ...] = ()
            if sync:
                # Waiting differs between rows only by the row's own rank leaving the
                # window: rows of every step that were never last there share an answer.
                key = (onset, r if row.whole and r in row.last_at(last, onset) else -1)
                if scoped is not None:
                    cols = row.valid[onset:]
                    waits_memo[key] = _waited_for(
                        r,
                        cols,
                        scoped.last[r],
                        scoped.late_ns[r],
                        scoped.made_ns[r],
                        ranks=scoped.members(r, cols),
                        tests=tests,
                    )
                elif not row.whole or key not in waits_memo:
                    waits_memo[key] = _waited_for(
                        r,
                        row.valid[onset:],
                        last,
                        late_ns,
                        made_ns,
                        ranks=len(m.ranks),
                        tests=tests,
                    )
                waits_for, short = waits_memo[key]
                if short is not None:
                    hits, more, late = short
                    n, ratio_r = len(row.valid) - onset, row.median_ratio(onset)
                    late_rank = (m.ranks[late],)
                    report.undecided.append(
                        Undecided(rank, phase, "waits", ratio_r, hits, n, more, late_rank)
                    )
                if not waits_for:
                    continue
            finding = StragglerFinding(
                rank=rank,
                phase=phase,
                kind=kind,
                role="waits" if sync else "slow",
                median_ratio=row.median_ratio(onset),
                share_above=row.share(onset),
                lost_ms=row.lost(onset),
                steps=len(row.valid) - onset,
                since_step=m.steps[int(row.valid[onset])],
                waits_for=tuple(m.ranks[i] for i in waits_for),
                ratios=rounded(ratio[r]),
            )
            if sync:
                waiting[rank, phase] = row
            if sync or _slow_at_its_best(d, r, row.valid[onset:], threshold):
                steady.add((rank, phase))
                report.findings.append(finding)
            else:
                unconfirmed.append(finding)
    reads = CpuReads(cpu_times)
    if shared_cores:  # ranks taking turns on the cores: a wait for one is no one's fault
        unconfirmed = let_turns_go(
            m,
            report,
            unconfirmed,
            reads,
            threshold=threshold,
            min_persistence=min_persistence,
            floor=floor,
        )
    # An excess the rank sheds at its fastest steps comes and goes, as a busy machine's
    # does: it stands only where the others are found waiting for this rank.
    waited_for = {f.waits_for[0] for f in report.findings if f.waits_for}
    report.findings.extend(f for f in unconfirmed if f.rank in waited_for)
    # The pipeline's replay (analysis/pipeline/_replay.py): its sends and recvs say who waits for
    # whom, its stages are the ranks whose loads are taken against one pace, and it
    # prices the fixes where it fits.
    pipeline = build_replay(timeline, set(report.sync_phases), groups)
    if isinstance(pipeline, Replay):
        for finding, row in waiting_in_pipeline(
            m,
            pipeline,
            report.findings,
            threshold=threshold,
            min_persistence=min_persistence,
            floor=floor,
        ):
            report.findings.append(finding)
            waiting[finding.rank, finding.phase] = row
    report.findings = _waiting_since_the_cause(report.findings, waiting, m.steps)
    # The cause before its consequence: a slow rank's waiters often lose more time than it.
    report.findings.sort(key=lambda f: (f.role != "slow", -f.lost_ms, f.rank, f.phase))
    report.imbalance = find_imbalance(
        m,
        set(report.sync_phases),
        threshold=threshold,
        min_persistence=min_persistence,
        floor=floor,
        slow={(f.rank, f.phase) for f in report.findings if f.role == "slow"},
        values=values,
        groups=groups,
        hosts=hosts,
        stages=pipeline.stages() if isinstance(pipeline, Replay) else None,
        shared_cores=shared_cores,
    )
    report.groups = waiting_for_groups(
        slow_groups(report.findings, m.ranks, groups),
        timeline,
        set(report.sync_phases),
        threshold=threshold,
        min_persistence=min_persistence,
        floor=floor,
    )
    costs = None
    if report.findings or report.imbalance:
        costs = estimate_costs(timeline, report, hosts, gpus, pipeline)
        if drop_the_cheap(report, costs, options.min_saving * _step_ms(m)):
            found = report.findings or report.imbalance
            costs = estimate_costs(timeline, report, hosts, gpus, pipeline) if found else None
    if costs is not None:
        report.imbalance = [
            replace(u, cost=c) for u, c in zip(report.imbalance, costs.imbalance, strict=True)
        ]
        report.groups = [
            replace(g, cost=c) for g, c in zip(report.groups, costs.groups, strict=True)
        ]
        slow = {f.phase for f in report.findings if f.role == "slow"}
        known = values(slow) if values is not None and slow else None
        slow_ranks = {f.rank for f in report.findings if f.role == "slow"}
        cpu = reads(slow, slow_ranks)
        causes = causes_of(
            m,
            report.findings,
            threshold=threshold,
            steady=steady,
            values=known,
            hosts=hosts,
            groups=groups,
            gpus=gpus,
            cpu=cpu,
        )
        report.findings = [
            replace(f, cost=c, cost_of=of, cause=why)
            for f, c, of, why in zip(report.findings, costs.each, costs.of, causes, strict=True)
        ]
        report.notes = costs.notes + (known.notes if known is not None else [])
        report.cost, report.host_costs = costs.all, costs.hosts
        report.model_step_ms = costs.model_step_ms
    clocks = unmeasured_clocks(m, hosts)
    if clocks is not None:
        report.notes.append(clocks)
    report.summary = sentences(report)
    return report


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
    out = []
    for f in findings:
        row = rows.get((f.rank, f.phase))
        cause = began.get(f.waits_for[0]) if f.role == "waits" and f.waits_for else None
        if row is None or cause is None or cause == f.since_step:
            out.append(f)
            continue
        at = np.asarray(steps)[row.valid] >= cause
        if not at.any():
            out.append(f)
            continue
        onset = int(np.argmax(at))
        out.append(
            replace(
                f,
                median_ratio=row.median_ratio(onset),
                share_above=row.share(onset),
                lost_ms=row.lost(onset),
                steps=len(row.valid) - onset,
                since_step=steps[int(row.valid[onset])],
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


def ends_in_collective(m: PhaseMatrices, hosts: Mapping[int, str] | None = None) -> list[str]:
    """The phases of `m` that end in a collective: kind "comm", or ranks that leave the
    phase together although they entered it apart (a DDP backward). The one rule the
    stragglers, the hangs and the diff share."""
    timeline = m.on_timeline()
    arrive, leave = _arrivals(timeline, hosts)
    return [
        phase
        for p, (phase, kind) in enumerate(zip(m.phases, m.kinds, strict=True))
        if phase != STEP and _sync(m, p, arrive[p], leave[p], timeline.ms[p])
    ]


def _sync(m: PhaseMatrices, p: int, arrive: Matrix, leave: Matrix, d: Matrix) -> bool:
    """Phase `p` ends in a collective: kind "comm"; else where its records say whether
    a collective was issued in it, what they say; else where ranks leave it together
    though they entered it apart (a guess that a busy machine's late wake-ups defeat).
    In a pipeline (a comm phase runs more than once in
    a rank's step: its sends and recvs), a work phase that runs once per microbatch does
    not: each run is followed by a send, and on device time, where arrivals are the time
    spent before a phase, two stages' backwards were taken to leave together."""
    if m.kinds[p] == "comm":
        return True
    if m.pipelined and m.phases[p] in m.repeats:
        return False
    said = m.issued.get(m.phases[p])
    if said is not None:  # the records say (timing/_collectives.py)
        return said and not _leave_apart(arrive, leave, d)
    return _ends_together(arrive, leave, d)


def _arrivals(
    m: PhaseMatrices, hosts: Mapping[int, str] | None
) -> tuple[list[Matrix], list[Matrix]]:
    """Per phase, when each rank entered and left it, on one clock for all ranks."""
    if m.on_device:
        # No device timestamps: arrival is the time the step spent before the phase, each
        # phase on its own clock (host time where the host is the work).
        arrive, leave = [], []
        before = np.zeros((len(m.ranks), len(m.steps)))
        for p, depth in enumerate(m.depths):
            d = np.nan_to_num(m.ms[p]) * 1e6  # ns, as host arrivals are
            arrive.append(before.copy())
            leave.append(before + d)
            if depth == 0 and m.phases[p] != STEP:
                before = before + d
        return arrive, leave
    offset = clock_offsets(m, hosts)
    if offset.ndim == 1:  # one offset a rank for the whole run
        offset = offset[:, None]
    return [s - offset for s in m.start_ns], [e - offset for e in m.end_ns]


def _leave_apart(arrive: Matrix, leave: Matrix, d: Matrix) -> bool:
    """Ranks leave the phase much further apart than they entered it, at most steps, and
    the same rank leaves last at most of those: its collective comes first and one rank's
    work after it is longer (FSDP's all-gathers open a forward; one rank's compute after
    them is slow), so the phase does not end in it. What the records say (a collective
    was issued) is overturned only on `_OVERTURN` such steps or more. A busy machine's
    late wake-ups after a collective spread the exits too, by more than `_APART` of a
    0.1 ms DDP backward, but a different rank's each time."""
    with quiet():
        entered = np.nanmax(arrive, axis=0) - np.nanmin(arrive, axis=0)
        left = np.nanmax(leave, axis=0) - np.nanmin(leave, axis=0)
        typical = nanmedian(d, 0) * 1e6
    known = np.isfinite(entered) & np.isfinite(left) & np.isfinite(typical)
    if not known.any():
        return False
    apart = known & (left > 2 * entered) & (left > _APART * typical)
    if apart.sum() < _OVERTURN or apart.sum() < 0.5 * known.sum():
        return False
    last = np.argmax(np.where(np.isfinite(leave[:, apart]), leave[:, apart], -np.inf), axis=0)
    return bool(np.bincount(last).max() >= 0.5 * len(last))


def _ends_together(arrive: Matrix, leave: Matrix, d: Matrix) -> bool:
    """Ranks leave the phase together though they entered it apart, at most conclusive steps."""
    with quiet():
        entered = np.nanmax(arrive, axis=0) - np.nanmin(arrive, axis=0)
        left = np.nanmax(leave, axis=0) - np.nanmin(leave, axis=0)
        typical = nanmedian(d, 0) * 1e6
    conclusive = entered > _CONCLUSIVE * typical
    if not conclusive.any():
        return False
    together = left[conclusive] < _SYNC_SPREAD * entered[conclusive]
    return bool(together.mean() >= 0.5)


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


def _last_arrivals(arrive: Matrix) -> npt.NDArray[np.int64]:
    """Per step, the index of the rank that entered last; -1 where fewer than two did."""
    present = np.sum(~np.isnan(arrive), axis=0)
    last = np.argmax(np.where(np.isnan(arrive), -np.inf, arrive), axis=0)
    return np.where(present >= 2, last, -1)


def _first_arrival(m: PhaseMatrices, arrive: list[Matrix]) -> Matrix:
    """Per rank and step, when it entered the step's first top-level phase."""
    for p, depth in enumerate(m.depths):
        if depth == 0 and m.phases[p] != STEP:
            return arrive[p]
    return np.full((len(m.ranks), len(m.steps)), np.nan)


def _lateness(arrive: Matrix, since: Matrix, last: npt.NDArray[np.int64]) -> tuple[Vector, Vector]:
    """Per step, how late the last rank to arrive was, and how much of that it made since `since`.

    Both are against the median rank, in ns; NaN where a record is missing.
    """
    cols = np.arange(arrive.shape[1])
    at = np.maximum(last, 0)
    own = arrive - since
    with quiet():
        late = arrive[at, cols] - nanmedian(arrive, 0)
        made = own[at, cols] - nanmedian(own, 0)
    return late, made


def _late_by_own_work(late: Vector, made: Vector) -> bool:
    """Most of the lateness was made in the rank's own work, not carried in.

    A rank that left the previous collective after the others, or entered the step after
    them, carries that lateness in: on one host that is the scheduler waking it last (or
    the collective releasing ranks in a fixed order), not its own work.
    """
    known = np.isfinite(late) & np.isfinite(made)
    if not known.any():
        return True  # nothing to tell it by: as before this was checked
    total = float(np.sum(np.clip(late[known], 0, None)))
    return total <= 0 or float(np.sum(made[known])) >= _EXPLAINED * total


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


def _waited_for(
    r: int,
    cols: npt.NDArray[np.int64],
    last: npt.NDArray[np.int64],
    late_ns: Vector,
    made_ns: Vector,
    *,
    ranks: int,
    tests: int,
) -> tuple[tuple[int, ...], tuple[int, int, int] | None]:
    """The ranks that row `r` waits for over the steps `cols` (() where it is not
    waiting), and where only more sampled steps could tell: (times the same rank was
    last, about how many steps would tell, that rank's index).

    Waiting for whoever is late this time is jitter, not a straggler: the same rank must
    arrive last far more often than one time in len(ranks) (a binomial test at 1% over
    all the rows tried), and be late by its own work, not by leaving a collective late.
    """
    window = last[cols]
    waits_for = _often(window, r)
    if not waits_for:
        return (), None
    hits = window == waits_for[0]
    if not _late_by_own_work(late_ns[cols[hits]], made_ns[cols[hits]]):
        return (), None
    k, n = int(np.sum(hits)), len(window)
    if binomial_tail(k, n, 1 / ranks) >= 0.01 / tests:
        needed = steps_needed(k, n, lambda _: 1 / ranks, lambda m: tests * m / n)
        return (), None if needed is None else (k, needed, waits_for[0])
    return waits_for, None


def _times_of(d: Matrix, who: npt.NDArray[np.int64]) -> Vector:
    """Per step, the time of rank index `who` (NaN where it is -1)."""
    times = np.take_along_axis(d, np.maximum(who, 0)[None, :], axis=0)[0]
    return np.where(who >= 0, times, np.nan)


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


def _often(last: npt.NDArray[np.int64], r: int) -> tuple[int, ...]:
    """Ranks (other than `r`) that arrived last at 30% of these steps or more, most often first."""
    last = last[(last >= 0) & (last != r)]
    if not len(last):
        return ()
    counts = np.bincount(last)
    order = np.argsort(-counts, kind="stable")
    return tuple(order[counts[order] >= 0.3 * len(last)].tolist())
