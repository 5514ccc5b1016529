"""The straggler analysis's one entry: read -> matrices -> findings, written once.

`analyse_stragglers` is what `rankscope stragglers` calls: the run's one read
(`read_timed_run`, analysis/read/_timed.py), then `stragglers_in`. The report and `hosts`
take the same read and call `stragglers_in` (hosts per window); `diff` and `collectives`
take the read for the phases that end in a collective and the hosts' clock offsets. Every caller so gets the same rules, the same
defaults (analysis/core/_options.py) and the same inputs to the causes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..._errors import TraceError
from ..core._options import StragglerOptions
from ..read._health import read_health, tokens_of
from ..read._matrix import PhaseMatrices
from ..read._run import RunMeta
from ..read._timed import TimedRun, read_timed_run
from ..read._values import read_cpu_times, read_phase_values
from ._evidence import evidence_for
from ._model import StragglerReport
from ._stragglers import find_stragglers

__all__ = ["StragglerAnalysis", "analyse_stragglers", "stragglers_in"]

Progress = Callable[[int, int], None]


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
    run_dir: str | os.PathLike[str] | RunMeta | TimedRun,
    options: StragglerOptions | None = None,
    *,
    progress: Progress | None = None,
    workers: int | None = None,
) -> StragglerAnalysis:
    """Which rank is slow in which phase, who waits for it, what it costs and why. A run
    read already (`read_timed_run`, with the same options) is not read again: the report
    passes its own read."""
    if isinstance(run_dir, TimedRun):
        run = run_dir
    else:
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
