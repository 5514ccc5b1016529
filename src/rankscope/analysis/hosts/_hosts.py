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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..._errors import ConfigError, TraceError
from ..._text import format_ranks, number_ranges
from ..core._options import HostOptions
from ..read._matrix import PhaseMatrices
from ..read._run import read_run_meta
from ..read._timed import TimedRun, read_timed_run
from ..stragglers._analyse import stragglers_in
from ..stragglers._model import StragglerFinding
from ._host_health import ThrottledGpu, throttle_sentences, throttled_gpus
from ._host_places import Places

__all__ = [
    "FEWEST_PER_WINDOW",
    "HostRecord",
    "HostReport",
    "SlowRank",
    "Unit",
    "find_recurring_hosts",
]

FEWEST_PER_WINDOW = 10
"""Sampled steps a window needs: an attempt with fewer than that per window gets fewer."""
_LISTED = 6
"""Items a sentence lists before "and N more"."""
_NO_DEVICE_TIMES = "no device times (gpu_ms) in the timings"
_HOST_TIME = "--time host compares host times"


@dataclass(frozen=True)
class SlowRank:
    """A rank found slow (role "slow") in one analysis, and where it ran."""

    rank: int
    phase: str
    host: str | None
    """None where its host is not known (`why` says why)."""
    median_ratio: float
    lost_ms: float
    since_step: int
    why: str | None = None


@dataclass(frozen=True)
class Unit:
    """One analysis: an attempt of a run over all its sampled steps (`window` None), or
    one window of it."""

    run: str
    """The run's label (its folder's name, or the path as given where names repeat)."""
    attempt: int
    """1-based."""
    window: int | None
    """0-based; None for the whole attempt."""
    first_step: int
    last_step: int
    ranks: int
    hosts: tuple[str, ...]
    """The known hosts of its ranks, sorted."""
    unknown: int
    """Its ranks whose host is not known."""
    slow: tuple[SlowRank, ...]

    @property
    def comparable(self) -> bool:
        """Hosts can be told apart here: one is known, and not every rank is known to be on it."""
        return bool(self.hosts) and (len(self.hosts) > 1 or self.unknown > 0)

    def place(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "attempt": self.attempt,
            "window": self.window,
            "steps": [self.first_step, self.last_step],
        }


@dataclass
class RunSummary:
    """What was read of one run directory."""

    run: str
    """The path as given."""
    label: str
    attempts: int
    ranks: list[int]
    hosts: list[str]
    notes: list[str] = field(default_factory=list)
    no_device_times: list[int] = field(default_factory=list)
    """The attempts left out for having no device times (with `time="device"` only)."""
    throttled: list[ThrottledGpu] = field(default_factory=list)
    """Its GPUs that throttled, per attempt (its health samples, analysis/hosts/_host_health.py)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "label": self.label,
            "attempts": self.attempts,
            "ranks": number_ranges(self.ranks),
            "hosts": self.hosts,
            "no_device_times": self.no_device_times,
            "throttled_gpus": [g.to_dict() for g in self.throttled],
            "notes": self.notes,
        }


@dataclass
class HostRecord:
    """Where one host held a slow rank: the analyses, and the ranks and phases."""

    host: str
    held: list[tuple[Unit, SlowRank]] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)

    def runs(self) -> list[str]:
        return _distinct(u.run for u, _ in self.whole())

    def whole(self, run: str | None = None) -> list[tuple[Unit, SlowRank]]:
        """Where it held a slow rank over a whole attempt (of `run`)."""
        return [(u, s) for u, s in self.held if u.window is None and run in (None, u.run)]

    def attempts(self, run: str | None = None) -> list[tuple[str, int]]:
        return _distinct(
            (u.run, u.attempt) for u, _ in self.held if u.window is None and run in (None, u.run)
        )

    def windows(self, run: str | None = None, attempt: int | None = None) -> list[int]:
        return _distinct(
            u.window
            for u, _ in self.held
            if u.window is not None and run in (None, u.run) and attempt in (None, u.attempt)
        )

    def to_dict(self) -> dict[str, Any]:
        places = _distinct((u.run, u.attempt, u.window) for u, _ in self.held)
        return {
            "host": self.host,
            "runs": len(self.runs()),
            "attempts": len(self.attempts()),
            "windows": sum(1 for _, _, window in places if window is not None),
            "in_runs": self.runs(),
            "ranks": [
                {"run": run, "attempt": attempt, "rank": rank}
                for run, attempt, rank in _distinct(
                    (u.run, u.attempt, s.rank) for u, s in self.held
                )
            ],
            "phases": _by_count(s.phase for _, s in self.held),
            "held": [
                {
                    **u.place(),
                    "rank": s.rank,
                    "phase": s.phase,
                    "median_ratio": s.median_ratio,
                    "lost_ms": s.lost_ms,
                    "since_step": s.since_step,
                }
                for u, s in self.held
            ],
            "summary": self.summary,
        }


@dataclass
class HostReport:
    """What `find_recurring_hosts` found, and over what."""

    options: dict[str, Any]
    runs: list[RunSummary] = field(default_factory=list)
    units: list[Unit] = field(default_factory=list)
    hosts: list[HostRecord] = field(default_factory=list)
    """Every host that held a slow rank where hosts can be compared: the most runs first."""
    summary: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def counts(self, run: str | None = None, attempt: int | None = None) -> dict[str, int]:
        """The analyses where hosts can be compared: runs, attempts and windows."""
        mine = [
            u
            for u in self.units
            if u.comparable and run in (None, u.run) and attempt in (None, u.attempt)
        ]
        whole = [u for u in mine if u.window is None]
        return {
            "runs": len(_distinct(u.run for u in whole)),
            "attempts": len(whole),
            "windows": sum(1 for u in mine if u.window is not None),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "options": self.options,
            "counts": self.counts(),
            "runs": [r.to_dict() for r in self.runs],
            "hosts": [h.to_dict() for h in self.hosts],
            "unknown_hosts": [
                {**u.place(), "rank": s.rank, "phase": s.phase, "why": s.why}
                for u in self.units
                for s in u.slow
                if s.host is None
            ],
            "single_host": [
                {**u.place(), "host": u.hosts[0], "ranks": _distinct(s.rank for s in u.slow)}
                for u in self.units
                if _one_host(u) and u.slow
            ],
            "summary": self.summary,
            "skipped": self.skipped,
        }


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
        raise TraceError(f"nothing to compare: {_NO_DEVICE_TIMES} of {runs} ({_HOST_TIME})")
    report.hosts = _tally(report.units)
    report.summary = _sentences(report)
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
    skipped = _distinct([*meta.skipped, *read, *meta.say_missing(everyone), *places.ignored()])
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
    where = _where(run.label, n, run.attempts)
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
    if _one_host(units[0]) and not any(u.slow for u in units):  # with slow ranks: a sentence
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


def _sentences(report: HostReport) -> list[str]:
    out: list[str] = []
    told: set[tuple[str, str]] = set()  # (host, run) that a sentence on runs or attempts named

    def say(rec: HostRecord, sentence: str, runs: list[str]) -> None:
        rec.summary.append(sentence)
        out.append(sentence)
        told.update((rec.host, run) for run in runs)

    runs = report.counts()["runs"]
    for rec in report.hosts:
        if runs >= 2 and len(rec.runs()) >= 2:
            share = f"{len(rec.runs())} of {runs} runs"
            say(rec, _recurs(rec, share, rec.whole(), "run"), rec.runs())
    for run in report.runs:
        attempts = report.counts(run.label)["attempts"]
        for rec in report.hosts:
            held = len(rec.attempts(run.label))
            if attempts >= 2 and held >= 2:
                share = f"{held} of {attempts} attempts of run {run.label}"
                say(rec, _recurs(rec, share, rec.whole(run.label), "attempt"), [run.label])
        for n in range(1, run.attempts + 1):
            windows = report.counts(run.label, n)["windows"]
            for rec in report.hosts:
                held = len(rec.windows(run.label, n))
                # Every window of an attempt whose run a sentence named: nothing to add.
                whole = held == windows and (run.label, n) in rec.attempts()
                if windows >= 2 and held >= 2 and not (whole and (rec.host, run.label) in told):
                    say(rec, _windows_sentence(rec, run, n, windows), [])
    if not out:
        out.append(_nothing(report))
    out += _untimed_sentences(report) + _unknown_sentences(report)
    return out + _single_host_sentences(report)


def _recurs(rec: HostRecord, share: str, held: list[tuple[Unit, SlowRank]], by: str) -> str:
    """A host held a slow rank in several runs (or attempts): as which ranks, in which phases."""
    host = rec.host
    phases = _listed(_by_count(s.phase for _, s in held))
    numbers = _distinct(s.rank for _, s in held)
    if len(numbers) == 1:
        rank = numbers[0]
        return (
            f"{host} held a slow rank in {share}, always as rank {rank} (in {phases}): rank "
            f"{rank}'s own work (its data, its place in the pipeline) may be the cause as much "
            "as the host"
        )
    where: dict[str, list[int]] = {}
    for u, s in held:
        key = u.run if by == "run" else f"attempt {u.attempt}"
        where.setdefault(key, []).append(s.rank)
    ranks = _listed([f"{format_ranks(r)} in {key}" for key, r in where.items()])
    return f"{host} held a slow rank in {share} ({ranks}; in {phases}): consider draining it"


def _windows_sentence(rec: HostRecord, run: RunSummary, attempt: int, windows: int) -> str:
    held = [
        (u, s)
        for u, s in rec.held
        if u.window is not None and (u.run, u.attempt) == (run.label, attempt)
    ]
    spans: list[list[int]] = []  # [first window, last window, first step, last step]
    for u in sorted({u.window: u for u, _ in held}.values(), key=lambda u: u.window or 0):
        if spans and spans[-1][1] + 1 == u.window:
            spans[-1][1], spans[-1][3] = u.window, u.last_step
        else:
            spans.append([u.window or 0, u.window or 0, u.first_step, u.last_step])
    steps = ", ".join(f"{a}-{b}" for _, _, a, b in spans)
    ranks = format_ranks(s.rank for _, s in held)
    phases = _listed(_by_count(s.phase for _, s in held))
    count = len(rec.windows(run.label, attempt))
    return (
        f"{rec.host} held a slow rank in {count} of {windows} windows of "
        f"{_where(run.label, attempt, run.attempts)} (steps {steps}; {ranks} in {phases})"
    )


def _nothing(report: HostReport) -> str:
    total = report.counts()
    once = [
        f"{rec.host} ({_listed(_distinct(f'rank {s.rank} of run {u.run} in {s.phase}' for u, s in rec.held))})"
        for rec in report.hosts
    ]
    if once:
        return (
            "nothing recurs: no host held a slow rank in more than one run, attempt or "
            f"window; once: {_listed(once)}"
        )
    if any(u.slow for u in report.units):
        return "nothing recurs: no slow rank ran on a known host of a run with several hosts"
    if max(total.values(), default=0) < 2 and total["windows"] == 0 and len(report.runs) < 2:
        return (
            "nothing recurs: no slow rank, and one analysis alone (give more runs, or longer ones)"
        )
    return "nothing recurs: no slow rank in any run, attempt or window"


def _untimed_sentences(report: HostReport) -> list[str]:
    """The runs (or attempts) `time="device"` left out: their timings hold no device time."""
    out = []
    for run in report.runs:
        left = run.no_device_times
        if left:
            some = "" if len(left) == run.attempts else f" attempt(s) {number_ranges(left)}"
            out.append(f"run {run.label}{some}: {_NO_DEVICE_TIMES}, so left out ({_HOST_TIME})")
    return out


def _unknown_sentences(report: HostReport) -> list[str]:
    """A slow rank whose host is not known: said by its rank, never given a host."""
    attempts_of = {run.label: run.attempts for run in report.runs}
    found: dict[tuple[str, int, str], list[tuple[Unit, SlowRank]]] = {}
    for u in report.units:
        for s in u.slow:
            if s.host is None:
                found.setdefault((u.run, s.rank, s.why or ""), []).append((u, s))
    out = []
    for (run, rank, why), held in found.items():
        phases = _listed(_by_count(s.phase for _, s in held))
        numbers = _distinct(u.attempt for u, _ in held if u.window is None)
        windows = len(_distinct((u.attempt, u.window) for u, _ in held if u.window is not None))
        if not numbers:
            where = f" in {windows} window{'s' if windows > 1 else ''}"
        elif attempts_of[run] > 1:
            where = f" in attempt{'s' if len(numbers) > 1 else ''} {number_ranges(numbers)}"
        else:
            where = ""
        out.append(
            f"run {run}: rank {rank} was slow in {phases}{where}; its host is not known: {why}"
        )
    return out


def _single_host_sentences(report: HostReport) -> list[str]:
    """An attempt whose ranks all ran on one host: its slow ranks name no host."""
    out = []
    for run in report.runs:
        for n in range(1, run.attempts + 1):
            mine = [u for u in report.units if (u.run, u.attempt) == (run.label, n)]
            whole = [u for u in mine if u.window is None]
            slow = [s for u in mine for s in u.slow]
            if not (whole and _one_host(whole[0]) and slow):
                continue
            ranks = format_ranks(s.rank for s in slow)
            phases = _listed(_by_count(s.phase for s in slow))
            out.append(
                f"{_where(run.label, n, run.attempts)}: every rank ran on {whole[0].hosts[0]}, so "
                f"its slow ranks ({ranks} in {phases}) say nothing of one host against another"
            )
    return out


def _one_host(u: Unit) -> bool:
    return len(u.hosts) == 1 and u.unknown == 0


def _where(label: str, attempt: int, attempts: int) -> str:
    return f"run {label}" if attempts == 1 else f"run {label} attempt {attempt}"


def _listed(items: list[str]) -> str:
    """`a, b and c`; past _LISTED items, the rest counted."""
    if len(items) > _LISTED:
        items = [*items[:_LISTED], f"{len(items) - _LISTED} more"]
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _by_count(items: Any) -> list[str]:
    """Distinct items, the most frequent first (then by name)."""
    counts = Counter(items)
    return sorted(counts, key=lambda item: (-counts[item], item))


def _distinct(items: Any) -> list[Any]:
    """Distinct items in the order first seen."""
    return list(dict.fromkeys(items))
