"""Host recurrence: which host keeps holding a slow rank, across the windows of a run, its
attempts, and several runs.

Each attempt of each run is analysed on its own (`find_stragglers` over that attempt's
timings), and so is each window of it: a consecutive stretch of its sampled steps. Only
findings of role "slow" count (the cause, never the ranks that wait for it), each placed
on the host its rank ran on in that attempt. Rank numbers differ between runs; hosts recur.

A rank's host in an attempt is the one its timings file's attempt line names. Lines
written before they named a host leave the meta file, which is written at each start of
the job over the one before: it names the host of the rank's latest start, so only in
the attempt that wrote it (matched by its attempt token); in the others the rank's host
is not known and is said so (`same_hosts` takes it for every attempt, where restarts
kept each rank on its host). An analysis whose ranks all ran on one host says nothing
of one host against another: it is said, and left out of the counts.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..._errors import ConfigError, TraceError
from ..._text import format_ranks
from ..core._options import HostOptions
from ..read._matrix import PhaseMatrices
from ..read._run import read_run_meta
from ..read._timed import TimedRun, read_timed_run
from ..stragglers._analyse import stragglers_in
from ..stragglers._model import StragglerFinding
from ._host_health import throttle_sentences, throttled_gpus
from ._host_model import HostRecord, HostReport, RunSummary, SlowRank, Unit, distinct, one_host
from ._host_places import Places
from ._host_words import HOST_TIME, NO_DEVICE_TIMES, attempt_label, host_sentences

__all__ = ["FEWEST_PER_WINDOW", "find_recurring_hosts"]

FEWEST_PER_WINDOW = 10
"""Sampled steps a window needs: an attempt with fewer than that per window gets fewer."""


def find_recurring_hosts(
    run_dirs: Sequence[str | os.PathLike[str]],
    options: HostOptions | None = None,
    *,
    workers: int | None = None,
) -> HostReport:
    """Which hosts held a slow rank in several runs, attempts of a run, or windows of one.

    `windows`: the windows each attempt's sampled steps are split into (fewer where an
    attempt has fewer than FEWEST_PER_WINDOW sampled steps per window). A directory that
    cannot be read is named in `skipped` and left out; none readable is a TraceError.
    `workers` caps the readers' threads and processes (read_run_records).
    """
    options = HostOptions() if options is None else options
    if not run_dirs:
        raise ConfigError("run_dirs", list(run_dirs), "one run directory or more")
    rules = options.stragglers
    report = HostReport(
        options={
            **rules.rules(),
            "time": rules.time,
            "windows": options.windows,
            "same_hosts": options.same_hosts,
        }
    )
    settings = _Settings(options, workers)
    seen: dict[str, str] = {}
    given: list[str | os.PathLike[str]] = []
    for path in run_dirs:
        key = os.path.realpath(path)
        if key in seen:
            report.skipped.append(f"{path}: given twice (as {seen[key]}); read once")
        else:
            seen[key] = str(path)
            given.append(path)
    for path, label in zip(given, _labels(given), strict=True):
        try:
            run, units, skipped = _analyse_run(Path(path), label, settings)
        except (TraceError, OSError) as exc:  # not a run: said, and the others go on
            report.skipped.append(_reason(path, exc))
        else:
            report.runs.append(run)
            report.units.extend(units)
            report.skipped.extend(skipped)
    if not report.runs:
        raise TraceError(f"no run directory to read: {'; '.join(report.skipped)}")
    if all(len(run.no_device_times) == run.attempts for run in report.runs):
        runs = ", ".join(run.run for run in report.runs)
        raise TraceError(f"nothing to compare: {NO_DEVICE_TIMES} of {runs} ({HOST_TIME})")
    report.hosts = _tally(report.units)
    report.summary = host_sentences(report)
    throttled = [g for run in report.runs for g in run.throttled]
    report.summary += throttle_sentences(throttled, {r.label: r.attempts for r in report.runs})
    return report


@dataclass(frozen=True)
class _Settings:
    options: HostOptions
    workers: int | None

    def find(
        self, run: TimedRun, m: PhaseMatrices, hosts: dict[int, str]
    ) -> list[StragglerFinding]:
        """The findings of role "slow" (the cause) in `m`, a window of `run`."""
        found = stragglers_in(run, self.options.stragglers, m=m, hosts=hosts, values=False)
        return [f for f in found.findings if f.role == "slow"]


def _reason(given: str | os.PathLike[str], exc: Exception) -> str:
    if isinstance(exc, OSError) and not isinstance(exc, TraceError):
        return f"{exc.filename or given}: {exc.strerror or exc}"
    text = " ".join(str(exc).split())  # one line
    return text if text.startswith(str(given)) else f"{given}: {text}"


def _labels(run_dirs: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Each run's folder name, or the path as given where two runs share a name."""
    names = [Path(r).name or str(r) for r in run_dirs]
    count = Counter(names)
    return [name if count[name] == 1 else str(r) for name, r in zip(names, run_dirs, strict=True)]


def _analyse_run(
    root: Path, label: str, settings: _Settings
) -> tuple[RunSummary, list[Unit], list[str]]:
    meta = read_run_meta(root)
    rules, workers = settings.options.stragglers, settings.workers

    def attempt(n: int) -> TimedRun:
        return read_timed_run(meta, replace(rules, attempt=n), workers=workers)

    first = attempt(1)
    count = first.records.attempts.count
    attempts = [first] + [attempt(n) for n in range(2, count + 1)]
    everyone = sorted(set().union(*(run.records.ranks for run in attempts)))
    places = Places(meta, first.records.attempts.marks, settings.options.same_hosts)
    read = [line for run in attempts for line in run.records.skipped]
    skipped = distinct([*meta.skipped, *read, *meta.say_missing(everyone), *places.ignored()])
    run = RunSummary(run=str(root), label=label, attempts=count, ranks=everyone, hosts=[])
    units: list[Unit] = []
    for n, timed in enumerate(attempts, start=1):
        units.extend(_analyse_attempt(run, n, timed, places, settings))
        hosts, _ = places.hosts(n, sorted(timed.records.ranks))
        gpus, bad = throttled_gpus(root, label, n, timed.records.attempts, hosts)
        run.throttled += gpus
        skipped += [line for line in bad if line not in skipped]
    run.hosts = sorted({h for u in units for h in u.hosts})
    if count > 1:
        run.notes.insert(0, f"{count} attempts, each analysed on its own")
    return run, units, skipped


def _analyse_attempt(
    run: RunSummary, n: int, timed: TimedRun, places: Places, settings: _Settings
) -> list[Unit]:
    where = attempt_label(run.label, n, run.attempts)
    hosts, unknown = places.hosts(n, sorted(timed.records.ranks))
    m = timed.matrices
    if m.time == "device" and not any(np.isfinite(d).any() for d in m.ms):
        run.no_device_times.append(n)  # a CPU-only job: said in the summary
        return []
    if len(m.ranks) < 2 or not m.steps:
        ranks = format_ranks(m.ranks) if m.ranks else "no rank"
        run.notes.append(f"{where}: {ranks} with records: nothing to compare")
        return []
    analysis = _Analysis(run.label, n, settings, timed, hosts, unknown)
    units = [analysis.unit(m, None)]
    count = min(settings.options.windows, len(m.steps) // FEWEST_PER_WINDOW)
    if count >= 2:
        edges = [round(i * len(m.steps) / count) for i in range(count + 1)]
        units += [analysis.unit(_window(m, slice(edges[w], edges[w + 1])), w) for w in range(count)]
    elif settings.options.windows > 1:
        run.notes.append(
            f"{where}: {len(m.steps)} sampled steps, too few to split into windows "
            f"(two windows need {2 * FEWEST_PER_WINDOW})"
        )
    if one_host(units[0]) and not any(u.slow for u in units):  # with slow ranks: a sentence
        run.notes.append(f"{where}: every rank ran on {units[0].hosts[0]}: no hosts to compare")
    return units


@dataclass(frozen=True)
class _Analysis:
    """What the analyses of one attempt share: where it ran, and the settings."""

    run: str
    attempt: int
    settings: _Settings
    timed: TimedRun
    hosts: dict[int, str]
    unknown: dict[int, str]
    """Rank -> why its host is not known."""

    def unit(self, m: PhaseMatrices, window: int | None) -> Unit:
        """The slow ranks of `m` (the attempt, or its window `window`), placed on their hosts."""
        hosts = {r: self.hosts[r] for r in m.ranks if r in self.hosts}
        slow = tuple(
            SlowRank(
                rank=f.rank,
                phase=f.phase,
                host=hosts.get(f.rank),
                median_ratio=f.median_ratio,
                lost_ms=f.lost_ms,
                since_step=f.since_step,
                why=None if f.rank in hosts else self.unknown.get(f.rank, "not known"),
            )
            for f in self.settings.find(self.timed, m, hosts)
        )
        return Unit(
            run=self.run,
            attempt=self.attempt,
            window=window,
            first_step=m.steps[0],
            last_step=m.steps[-1],
            ranks=len(m.ranks),
            hosts=tuple(sorted(set(hosts.values()))),
            unknown=len(m.ranks) - len(hosts),
            slow=slow,
        )


def _window(m: PhaseMatrices, cols: slice) -> PhaseMatrices:
    """The matrices of the steps `cols`, without the ranks that have no record there."""
    ms = [d[:, cols] for d in m.ms]
    present = np.flatnonzero(np.any([np.isfinite(d).any(axis=1) for d in ms], axis=0))
    return PhaseMatrices(
        ranks=[m.ranks[i] for i in present.tolist()],
        steps=m.steps[cols],
        phases=m.phases,
        kinds=m.kinds,
        depths=m.depths,
        time=m.time,
        clocks=m.clocks,
        ms=[d[present] for d in ms],
        timeline_ms=None if m.timeline_ms is None else [d[present][:, cols] for d in m.timeline_ms],
        start_ns=[d[present][:, cols] for d in m.start_ns],
        end_ns=[d[present][:, cols] for d in m.end_ns],
        origin_ns=m.origin_ns,
        runs=m.runs,
        issued=m.issued,
    )


# -- counting and saying ----------------------------------------------------------------


def _tally(units: list[Unit]) -> list[HostRecord]:
    records: dict[str, HostRecord] = {}
    for u in units:
        if not u.comparable:
            continue
        for s in u.slow:
            if s.host is not None:
                records.setdefault(s.host, HostRecord(s.host)).held.append((u, s))
    return sorted(
        records.values(),
        key=lambda r: (-len(r.runs()), -len(r.attempts()), -len(r.windows()), r.host),
    )
