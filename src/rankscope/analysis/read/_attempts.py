"""Attempts: a run directory that a job wrote into more than once, told apart.

A rank's timings file holds one attempt per process start (a line with `"attempt"`
opens each; records before the first such line, from older versions, are an attempt
too). The ranks' starts are matched into the run's attempts (`run_attempts`). No
figure sums attempts:
by default the latest record of a (rank, step, phase) wins, so a step that ran again
after a restart counts once, as it ran last; `pick` keeps one attempt instead.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..._text import format_ranks, number_ranges, shown

__all__ = [
    "HOST_MAX",
    "ONE_LAUNCH_NS",
    "AttemptMark",
    "Attempts",
    "host_problem",
    "latest_rows",
    "mark_of",
    "resolve_attempts",
    "run_attempts",
]


@dataclass(frozen=True)
class AttemptMark:
    """What a rank's file says of one of its attempts (all None for records before any mark)."""

    token: str | None = None
    started_ns: int | None = None
    launcher: str | None = None
    job: str | None = None
    restart: int | None = None
    host: str | None = None
    """The host the start ran on; None where the line names none (an older rankscope's) or
    none usable (`host_problem` says why). No part of the attempt's identity."""
    host_problem: str | None = None
    """Why the line's host was ignored ("12, not a host name"); None where it was not."""
    rendezvous: str | None = None
    """MASTER_ADDR:MASTER_PORT of the start's launch, where the line says (rundir/_attempt.py)."""
    world: int | None = None
    """The world size of the start, where the line says (no part of its identity either)."""


_MAX_WORLD = 1 << 24
"""Larger than any job: a world size past it is not believed."""
HOST_MAX = 255
"""Longer than any host name: a file that says more names no host."""


def host_problem(value: object) -> str | None:
    """Why `value`, a host as a file gives it, names no host; None where it names one."""
    if isinstance(value, str) and 0 < len(value) <= HOST_MAX and value.isprintable():
        return None
    if isinstance(value, str) and len(value) > HOST_MAX:
        return f"a name of {len(value)} characters, longer than any host's"
    return f"{shown(value)}, not a host name"


def mark_of(record: dict[str, Any]) -> AttemptMark | str:
    """The attempt a file's attempt line states, or why it cannot be one. A host the line
    names that is no host name is left out, and `host_problem` says why: the attempt
    stands without it."""
    token, started = record.get("attempt"), record.get("started_ns")
    if not isinstance(token, str) or not token:
        return "an attempt line without an attempt token"
    if started is not None and not (_is_int(started) and 0 <= started < 1 << 63):
        return "an attempt line whose started_ns is not an integer >= 0"
    launcher, job, restart = record.get("launcher"), record.get("job"), record.get("restart")
    meeting = record.get("rendezvous")
    host, world = record.get("host"), record.get("world")
    problem = None if host is None else host_problem(host)
    return AttemptMark(
        token=token,
        started_ns=started,
        launcher=launcher if isinstance(launcher, str) else None,
        job=job if isinstance(job, str) else None,
        restart=restart if isinstance(restart, int) and _is_int(restart) and restart >= 0 else None,
        host=host if problem is None else None,
        host_problem=problem,
        rendezvous=meeting if isinstance(meeting, str) and 0 < len(meeting) <= 300 else None,
        world=world
        if isinstance(world, int) and _is_int(world) and 0 < world <= _MAX_WORLD
        else None,
    )


@dataclass
class Attempts:
    """What a run's attempts were, and which records the figures use."""

    count: int = 1
    """Attempts in the run: the most any rank's file holds."""
    used: int | None = None
    """The attempt the figures use (1-based); None: the latest record of each step."""
    described: list[dict[str, Any]] = field(default_factory=list)
    """Per attempt: n, started_ns, launcher, job, restart, ranks."""
    rerun_steps: list[int] = field(default_factory=list)
    """Steps that more than one attempt recorded (on any rank)."""
    recorded_steps: list[int] = field(default_factory=list)
    """The steps recorded by the ranks of more than one attempt: the note folds rerun
    steps that are next to each other here into a range (sampled every 2nd, 0-78 is a
    run). Not in to_dict."""
    times: int = 1
    """The most attempts that recorded one step."""
    dropped: int = 0
    """Records left out because another attempt's record of their step is used."""
    without: list[int] = field(default_factory=list)
    """Ranks with no record in the picked attempt."""
    beyond: list[int] = field(default_factory=list)
    """Ranks past the latest attempt's world (an elastic restart with fewer ranks): their
    records are an earlier world's, left out where no attempt is asked for."""
    world: int | None = None
    """The latest attempt's world size, where its attempt lines say."""
    marks: list[dict[int, AttemptMark]] = field(default_factory=list)
    """Per attempt (0-based), each of its ranks' marks: what its attempt line said (its
    start, its host). Not in to_dict."""
    concurrent: list[int] = field(default_factory=list)
    """Attempts (1-based) whose records interleave in a file with another's: they ran at
    the same time (two jobs with one output_dir). Their records are never mixed: where
    no attempt is asked for, the latest of them is used alone."""

    @property
    def note(self) -> str | None:
        """One sentence for the terminal and the report; None for a run of one attempt."""
        if self.count == 1:
            return None
        head = f"{self.count} attempts ({'; '.join(_label(a) for a in self.described)})"
        if self.concurrent:
            head += (
                f"; attempts {number_ranges(self.concurrent)} ran at the same time (their "
                "records interleave in the files: jobs that shared one output_dir)"
            )
        if self.used is not None:
            tail = f"attempt {self.used} is used (--attempt {self.used})"
            if self.without:
                none = "has" if len(self.without) == 1 else "have"
                tail += f"; {format_ranks(self.without)} {none} no records in it"
            return f"{head}; {tail}"
        if self.beyond:
            past = (
                f"; {format_ranks(self.beyond)} ran only in an earlier attempt's larger world: "
                f"left out, as the latest attempt ran {self.world} ranks (--attempt N reads them)"
            )
            head += past
        if not self.rerun_steps:
            return f"{head}; no step ran in more than one, so every record is used"
        ran = "twice" if self.times == 2 else f"{self.times} times"
        steps = "step" if len(self.rerun_steps) == 1 else "steps"
        rerun = number_ranges(self.rerun_steps, among=self.recorded_steps)
        return (
            f"{head}; {steps} {rerun} ran {ran}; the latest record of each is used "
            f"({self.dropped} earlier records left out; --attempt N picks one)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "used": "latest" if self.used is None else self.used,
            "attempts": self.described,
            "rerun_steps": number_ranges(self.rerun_steps),
            "records_left_out": self.dropped,
            "ranks_without": self.without,
            "ranks_beyond_the_world": self.beyond,
            "concurrent": self.concurrent,
            "note": self.note,
        }


def resolve_attempts(ranks: dict[int, Any], pick: int | None) -> Attempts:
    """Keep, in each rank's columns (RankTimings), the records the figures use; say what was seen.

    Each rank's `attempt` column becomes the run's attempt (0-based, see `run_attempts`).
    Ranks left with no record (none in the picked attempt) are removed from `ranks`. A
    rank of one attempt needs no column per record: all its records stay or all go.
    """
    groups, of_rank = run_attempts(ranks)
    out = Attempts(count=max(len(groups), 1), described=_describe(groups))
    out.marks = [dict(group) for group in groups]  # a rank starts once per attempt
    together = {
        int(of_rank[rank][i]) + 1
        for rank, timings in ranks.items()
        for pair in getattr(timings, "interleaved", ())
        for i in pair
    }
    out.concurrent = sorted(together)
    if pick is None and together:
        # The records of jobs that ran at once are never mixed: the one with the most
        # ranks is read (the latest of those), not a stray process's one-rank start.
        pick = max(together, key=lambda n: (len({r for r, _ in groups[n - 1]}), n))
    worlds = {mark.world for _, mark in groups[-1] if mark.world is not None} if groups else set()
    if pick is None and len(worlds) == 1:
        # An elastic restart with fewer ranks: a rank past its world ran only before, in
        # another shape of the job; mixed in, it read as slow against ranks it never met.
        (out.world,) = worlds
        for rank in sorted(r for r in ranks if r >= out.world):
            out.dropped += len(ranks[rank])
            out.beyond.append(rank)
            del ranks[rank]
    rerun: set[int] = set()
    recorded: set[int] = set()
    for rank, timings in list(ranks.items()):
        if len(timings.attempts) == 1:  # every record is of the rank's one attempt
            ran = int(of_rank[rank][0])
            timings.attempt.fill(ran)
            if pick is not None and ran != pick - 1:
                out.dropped += len(timings)
                del ranks[rank]
                out.without.append(rank)
            continue
        own = timings.attempt  # the rank's own attempts, in the order its file has them
        if pick is not None:
            keep = of_rank[rank][own] == pick - 1
        else:
            keep, steps, times, seen = latest_rows(timings.step, timings.phase, own)
            rerun.update(steps)
            recorded.update(seen)
            out.times = max(out.times, times)
        timings.attempt = of_rank[rank][own].astype(np.int32)
        if not keep.all():
            out.dropped += int((~keep).sum())
            timings.keep(keep)
        if len(timings) == 0:
            del ranks[rank]
            out.without.append(rank)
    out.used = pick
    out.rerun_steps = sorted(rerun)
    out.recorded_steps = sorted(recorded) if rerun else []
    return out


ONE_LAUNCH_NS = 600 * 10**9
"""Ranks of one launch start within this of each other; starts further apart that no
launcher tells apart are two attempts."""


def run_attempts(
    ranks: dict[int, Any],
) -> tuple[list[list[tuple[int, AttemptMark]]], dict[int, np.ndarray[Any, Any]]]:
    """The run's attempts, in the order they started, each as its (rank, mark)s; and per
    rank, the run's attempt (0-based) of each of the rank's own.

    Ranks start together but not all of them write in every attempt (a rank killed
    before its first records, a job scaled up), so the n-th attempt of a rank's file is
    not the run's n-th. A rank's start joins the latest attempt that has the same
    launcher job and restart (or rendezvous and restart), or, where neither is known, the latest attempt started
    less than ten minutes before it; never one that already holds that rank.
    """
    marks = [(rank, i, mark) for rank, t in ranks.items() for i, mark in enumerate(t.attempts)]
    # Records from before attempts were written come first; then by start.
    marks.sort(key=lambda m: (m[2].started_ns is not None, m[2].started_ns or 0, m[1], m[0]))
    groups: list[list[tuple[int, AttemptMark]]] = []
    members: list[set[int]] = []  # each group's ranks
    hosts: list[dict[str, int | None]] = []  # each group's hosts, and each one's first start
    first: list[int | None] = []  # each group's earliest start
    latest: dict[object, int] = {}  # a launcher's (job, restart), or None: its latest group
    of_rank = {rank: np.zeros(len(t.attempts), np.int64) for rank, t in ranks.items()}
    for rank, own, mark in marks:
        key = _launch_key(mark)
        index = latest.get(key)
        if index is not None and (
            rank in members[index]  # a rank starts once per attempt
            or not (
                key is not None
                or _near(hosts[index].get(mark.host or "", first[index]), mark.started_ns)
                or _another_clock(first[index], mark, hosts[index])
            )
        ):
            index = None
        if index is None:
            index = len(groups)
            groups.append([])
            members.append(set())
            hosts.append({})
            first.append(mark.started_ns)
            latest[key] = index
        groups[index].append((rank, mark))
        members[index].add(rank)
        if mark.host is not None:
            hosts[index].setdefault(mark.host, mark.started_ns)
        of_rank[rank][own] = index
    return groups, of_rank


def _launch_key(mark: AttemptMark) -> object:
    """What the ranks of one launch share: the launcher's job id and restart, else the
    rendezvous (MASTER_ADDR:MASTER_PORT) and restart; None where neither is known."""
    if mark.job is not None:
        return (mark.launcher, mark.job, mark.restart)
    if mark.rendezvous is not None:
        return ("rendezvous", mark.rendezvous, mark.restart)
    return None


CLOCK_APART_NS = 3600 * 10**9
"""Hosts' clocks a misconfigured NTP leaves this far apart at most (an hour)."""


def _another_clock(first: int | None, mark: AttemptMark, hosts: Mapping[str, int | None]) -> bool:
    """A start on a host the group does not hold yet, within an hour of it: the same launch
    read on another host's clock (15 minutes off made one launch two attempts); the
    host's later starts are then near its own first. A second start of a rank the group
    holds is a new attempt whatever its clock (checked apart)."""
    if first is None or mark.started_ns is None or mark.host is None or not hosts:
        return False
    return mark.host not in hosts and abs(mark.started_ns - first) < CLOCK_APART_NS


def _near(first: int | None, started: int | None) -> bool:
    """A start joins a group started less than ONE_LAUNCH_NS before it (marks sort by start,
    so a group's first start is its earliest); records without a start (an older
    rankscope's) join only each other."""
    if first is None or started is None:
        return first is None and started is None
    return started - first < ONE_LAUNCH_NS


def latest_rows(
    step: np.ndarray[Any, Any], phase: np.ndarray[Any, Any], attempt: np.ndarray[Any, Any]
) -> tuple[np.ndarray[Any, Any], list[int], int, list[int]]:
    """(rows to keep: those of the latest attempt of their (step, phase); the steps more
    than one attempt recorded; the most attempts one step had; every step recorded)."""
    _, where = np.unique(np.stack([step, phase.astype(np.int64)]), axis=1, return_inverse=True)
    where = where.reshape(-1)
    latest = np.full(int(where.max(initial=-1)) + 1, -1, np.int64)
    np.maximum.at(latest, where, attempt)
    keep = attempt == latest[where]
    # Steps per attempt, once each: a step is re-run when two attempts have it.
    pairs = np.unique(np.stack([step, attempt.astype(np.int64)]), axis=1)
    steps, counts = np.unique(pairs[0], return_counts=True)
    rerun = steps[counts > 1]
    return keep, rerun.tolist(), int(counts.max(initial=1)), steps.tolist()


def _describe(groups: list[list[tuple[int, AttemptMark]]]) -> list[dict[str, Any]]:
    described = []
    for n, group in enumerate(groups):
        starts = [m.started_ns for _, m in group if m.started_ns is not None]
        first = next((m for _, m in group if m.token is not None), AttemptMark())
        described.append(
            {
                "n": n + 1,
                "started_ns": min(starts) if starts else None,
                "launcher": first.launcher,
                "job": first.job,
                "restart": first.restart,
                "ranks": number_ranges(r for r, _ in group),
            }
        )
    return described


def _label(attempt: dict[str, Any]) -> str:
    parts = [f"{attempt['n']}:"]
    if attempt["launcher"] is not None and attempt["restart"] is not None:
        parts.append(f"{attempt['launcher']} restart {attempt['restart']},")
    started = attempt["started_ns"]
    if started is None:
        parts.append("before attempts were recorded")
    else:
        parts.append(time.strftime("started %Y-%m-%d %H:%M:%S", time.localtime(started / 1e9)))
    return " ".join(parts)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
