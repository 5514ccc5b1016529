"""Finding the rank that holds a job back, and telling it from the ranks that wait for it.

For every (rank, phase) and sampled step: the ratio of the rank's time to the cross-rank
median (with two ranks, to the faster one). A pair is a finding when it is above
`threshold` at `min_persistence` of its sampled steps (from the step where that began,
when it began part-way), far more often than the other ranks are, and the time lost is
not negligible against the step. An excess must also hold at the rank's fast steps (a
rank that is slower is slower every time); one that comes and goes, as a busy machine's
does, stands only where other ranks are found waiting for that rank.

This module runs the rules and turns their rows into a report: each phase's rows are
judged in _judge.py, who waits for whom, from when the ranks arrive, in _arrivals.py;
then the groups, the uneven phases, the prices and the causes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from ..._text import format_ranks
from ..collectives._collective_clocks import unmeasured_clocks
from ..core._options import StragglerOptions
from ..pipeline._replay import Replay
from ..pipeline._replay_build import build_replay
from ..read._matrix import STEP, PhaseMatrices
from ..read._values import CpuTimes, PhaseValues
from ._arrivals import (
    ends_in_collective,
)
from ._cause import causes_of
from ._cheap import drop_the_cheap
from ._cost import estimate_costs
from ._findings import left_out_note, ratio_text, sentences
from ._groups import slow_groups, waiting_for_groups
from ._imbalance import find_imbalance
from ._judge import PhaseJudge, step_ms
from ._model import StragglerFinding, StragglerReport, Undecided
from ._pipeline_waits import waiting_in_pipeline
from ._rows import Row, prime
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
    rows = PhaseJudge(m, report, options, hosts)
    for p in range(len(m.phases)):
        if m.phases[p] != STEP:
            rows.judge_phase(p)
    reads = CpuReads(cpu_times, frozenset({STEP}) if shared_cores else frozenset())
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
            _Context(
                hosts=hosts,
                groups=groups,
                values=values,
                gpus=gpus,
                reads=reads,
                shared_cores=shared_cores,
            ),
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
    shared_cores: bool

    def cpu_waits(self, report: StragglerReport) -> Matrix | None:
        """Where ranks share cores, each rank's wait for a CPU over its steps (the step
        records' "runq_ms"), read with the slow findings' phases (the causes read those
        again, from the same read): the costs take back its change at a fault's onset."""
        if not self.shared_cores:
            return None
        slow = [f for f in report.findings if f.role == "slow"]
        times = self.reads({STEP, *(f.phase for f in slow)}, {f.rank for f in slow})
        return None if times is None else times.runq.get(STEP)


def _price_and_explain(  # noqa: PLR0917 - the report and what pricing it reads
    report: StragglerReport,
    m: PhaseMatrices,
    rows: PhaseJudge,
    options: StragglerOptions,
    pipeline: Replay | str | None,
    run: _Context,
) -> str | None:
    """Each finding's, group's and uneven phase's cost (the cheap ones dropped) and each
    slow finding's cause, into `report`; what was dropped as cheap, said, or None."""
    waits = run.cpu_waits(report)
    costs = estimate_costs(rows.timeline, report, run.hosts, run.gpus, pipeline, cpu_waits=waits)
    top = [p for p, d in zip(m.phases, m.depths, strict=True) if d == 0 and p != STEP]
    said = bool(top) and all(p in m.issued for p in top)
    floor_ms = options.min_saving * step_ms(m)
    told = len(report.findings) + len(report.imbalance) + len(report.groups)
    left_out = None
    if drop_the_cheap(report, costs, floor_ms, collectives_said=said):
        left = told - len(report.findings) - len(report.imbalance) - len(report.groups)
        left_out = left_out_note(left, floor_ms, options.min_saving)
        if not (report.findings or report.imbalance):
            return left_out
        costs = estimate_costs(
            rows.timeline, report, run.hosts, run.gpus, pipeline, cpu_waits=waits
        )
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
