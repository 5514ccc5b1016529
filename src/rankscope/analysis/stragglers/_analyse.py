"""The straggler analysis's one entry: read -> matrices -> findings, written once.

`analyse_stragglers` is what `rankscope stragglers`, the report and the integrations call;
`hosts` reads each attempt with `read_timed_run` and judges its windows with
`stragglers_in`; `diff` and `collectives` take the same read for the phases that end in
a collective and the hosts' clock offsets. Every caller so gets the same rules, the same
defaults (analysis/core/_options.py) and the same inputs to the causes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..._errors import TraceError
from ..._text import format_ranks
from ..core._options import StragglerOptions
from ..read._engine import RunRecords, read_run_records
from ..read._health import read_health, tokens_of
from ..read._matrix import PhaseMatrices, matrices_of, shared_steps
from ..read._run import RunMeta, read_run_meta
from ..read._values import read_cpu_times, read_phase_values
from ._evidence import evidence_for
from ._findings import StragglerReport
from ._stragglers import find_stragglers

__all__ = ["StragglerAnalysis", "TimedRun", "analyse_stragglers", "read_timed_run", "stragglers_in"]

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class TimedRun:
    """A run's timings read and shaped for the analyses: its meta, records and matrices."""

    meta: RunMeta
    records: RunRecords
    matrices: PhaseMatrices
    apart: list[str] = field(default_factory=list)
    """The sampled steps left out for not every rank having them, said (_matrix.shared_steps)."""

    @property
    def notes(self) -> list[str]:
        """What the run's files say that bears on every answer: ranks configured apart,
        and ranks whose records end before the others'."""
        every = {rank: self.meta.sampling(rank) for rank in self.records.last_step}
        return [*self.meta.config_differences(), *ended_early(self.records.last_step, every)]

    @property
    def root(self) -> Path:
        return self.meta.root.resolve()

    @property
    def skipped(self) -> list[str]:
        """What the reading left out: bad meta and timings, and ranks without timings."""
        return [
            *self.meta.skipped,
            *self.records.skipped,
            *self.meta.say_missing(sorted(self.records.ranks)),
            *self.apart,
        ]


def ended_early(last_step: Mapping[int, int], every: Mapping[int, int]) -> list[str]:
    """A line per group of ranks whose records end before the latest rank's by more than
    their sampling interval (`every`): killed, crashed, or stopped apart."""
    if len(last_step) < 2:
        return []
    latest = max(last_step.values())
    early: dict[int, list[int]] = {}
    for rank, step in sorted(last_step.items()):
        if step + every.get(rank, 1) <= latest:
            early.setdefault(step, []).append(rank)
    return [
        f"{format_ranks(ranks)}: {'its' if len(ranks) == 1 else 'their'} records end at step "
        f"{step}, the others' go on to step {latest}: ended early (killed, crashed, or "
        "stopped apart; `rankscope hang` says which where the watch was on)"
        for step, ranks in sorted(early.items())
    ]


def read_timed_run(
    run_dir: str | os.PathLike[str] | RunMeta,
    options: StragglerOptions | None = None,
    *,
    progress: Progress | None = None,
    workers: int | None = None,
) -> TimedRun:
    """Read a run's meta and timings (the options' `time` and `attempt`) into matrices.

    A TraceError where the run has no usable timings (read/_engine.py says why)."""
    options = StragglerOptions() if options is None else options
    meta = run_dir if isinstance(run_dir, RunMeta) else read_run_meta(run_dir)
    records = read_run_records(
        meta.root,
        time=options.time,
        attempt=options.attempt,
        progress=progress,
        workers=workers,
    )
    matrices, apart = shared_steps(matrices_of(records))
    return TimedRun(meta=meta, records=records, matrices=matrices, apart=apart)


def stragglers_in(
    run: TimedRun,
    options: StragglerOptions | None = None,
    *,
    m: PhaseMatrices | None = None,
    hosts: Mapping[int, str] | None = None,
    values: bool = True,
    evidence: bool = True,
) -> StragglerReport:
    """The findings over the run, or over `m` (a window of its matrices), with the hosts
    and parallel groups its meta names (or `hosts`, where a caller knows them better) and
    the phases' recorded values for the causes (not read where `values` is False: a
    caller that says no cause, `hosts`, need not read the timings again per window).

    Over the whole run (no `m`), and unless `evidence` is False, each slow finding carries
    the ops that grew against a healthy peer in a trace window holding both
    (analysis/stragglers/_evidence.py)."""
    judged = run.matrices if m is None else m

    def read_values(phases: set[str]) -> Any:
        known = read_phase_values(run.root, judged.ranks, judged.steps, phases & run.records.valued)
        known.health = read_health(run.root, tokens_of(run.records.attempts))
        known.notes += known.health.skipped
        return known

    report = find_stragglers(
        judged,
        options,
        hosts=run.meta.hosts if hosts is None else hosts,
        groups=run.meta.groups,
        values=read_values if values else None,
        gpus=run.meta.gpus,
        shared_cores=run.meta.shared_cores,
        cpu_times=(
            (lambda phases, of: read_cpu_times(run.root, judged.ranks, judged.steps, phases, of))
            if values
            else None
        ),
    )
    report.notes[:0] = run.notes
    if m is None and evidence and report.findings:
        found = evidence_for(run.root, report.findings, judged.ranks)
        report.findings = [
            replace(f, evidence=found[f.rank, f.phase]) if (f.rank, f.phase) in found else f
            for f in report.findings
        ]
    return report


@dataclass(frozen=True)
class StragglerAnalysis:
    """A run read and judged: the straggler report and what the reading left out."""

    run: TimedRun
    report: StragglerReport

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.report.to_dict(),
            "attempts": self.run.records.attempts.to_dict(),
            "skipped": self.run.skipped,
        }


def analyse_stragglers(
    run_dir: str | os.PathLike[str] | RunMeta,
    options: StragglerOptions | None = None,
    *,
    progress: Progress | None = None,
    workers: int | None = None,
) -> StragglerAnalysis:
    """Which rank is slow in which phase, who waits for it, what it costs and why."""
    run = read_timed_run(run_dir, options, progress=progress, workers=workers)
    report = stragglers_in(run, options)
    report.notes[:0] = concurrent_notes(run, options, workers=workers)
    return StragglerAnalysis(run=run, report=report)


def concurrent_notes(
    run: TimedRun, options: StragglerOptions | None = None, *, workers: int | None = None
) -> list[str]:
    """Where jobs that ran at the same time share the run directory and none was asked
    for, the latest is analysed alone (read/_attempts.py); each other's headline, so that
    every job's slow rank is named."""
    options = StragglerOptions() if options is None else options
    attempts = run.records.attempts
    if options.attempt is not None or len(attempts.concurrent) < 2:
        return []
    notes = []
    for n in attempts.concurrent:
        if n == attempts.used:
            continue
        other = replace(options, attempt=n)
        try:
            other_run = read_timed_run(run.meta, other, workers=workers)
            found = stragglers_in(other_run, other, evidence=False)  # its headline alone
        except TraceError as exc:
            notes.append(f"attempt {n}, which ran at the same time, cannot be analysed: {exc}")
            continue
        said = found.summary[0] if found.summary else "no straggler"
        notes.append(
            f"attempt {n}, which ran at the same time: {said} (--attempt {n} for its whole answer)"
        )
    return notes
