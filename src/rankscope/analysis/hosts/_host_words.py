"""Host recurrence in words: the report's sentences, from its data (_host_model.py)."""

from __future__ import annotations

from ..._text import format_ranks, number_ranges
from ._host_model import (
    HostRecord,
    HostReport,
    RunSummary,
    SlowRank,
    Unit,
    by_count,
    distinct,
    one_host,
)

__all__ = ["HOST_TIME", "NO_DEVICE_TIMES", "attempt_label", "host_sentences"]

_LISTED = 6
"""Items a sentence lists before "and N more"."""
NO_DEVICE_TIMES = "no device times (gpu_ms) in the timings"
HOST_TIME = "--time host compares host times"


def host_sentences(report: HostReport) -> list[str]:
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
    phases = _listed(by_count(s.phase for _, s in held))
    numbers = distinct(s.rank for _, s in held)
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
    phases = _listed(by_count(s.phase for _, s in held))
    count = len(rec.windows(run.label, attempt))
    return (
        f"{rec.host} held a slow rank in {count} of {windows} windows of "
        f"{attempt_label(run.label, attempt, run.attempts)} (steps {steps}; {ranks} in {phases})"
    )


def _nothing(report: HostReport) -> str:
    total = report.counts()
    once = [
        f"{rec.host} ({_listed(distinct(f'rank {s.rank} of run {u.run} in {s.phase}' for u, s in rec.held))})"
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
            out.append(f"run {run.label}{some}: {NO_DEVICE_TIMES}, so left out ({HOST_TIME})")
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
        phases = _listed(by_count(s.phase for _, s in held))
        numbers = distinct(u.attempt for u, _ in held if u.window is None)
        windows = len(distinct((u.attempt, u.window) for u, _ in held if u.window is not None))
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
            if not (whole and one_host(whole[0]) and slow):
                continue
            ranks = format_ranks(s.rank for s in slow)
            phases = _listed(by_count(s.phase for s in slow))
            out.append(
                f"{attempt_label(run.label, n, run.attempts)}: every rank ran on {whole[0].hosts[0]}, so "
                f"its slow ranks ({ranks} in {phases}) say nothing of one host against another"
            )
    return out


def attempt_label(label: str, attempt: int, attempts: int) -> str:
    return f"run {label}" if attempts == 1 else f"run {label} attempt {attempt}"


def _listed(items: list[str]) -> str:
    """`a, b and c`; past _LISTED items, the rest counted."""
    if len(items) > _LISTED:
        items = [*items[:_LISTED], f"{len(items) - _LISTED} more"]
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"
