"""Host recurrence as data: a slow rank placed on its host, each analysed unit (an
attempt's window), each run, each host's record and the report (_hosts.py finds them,
_host_words.py says them)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..._text import number_ranges
from ._host_health import ThrottledGpu

__all__ = [
    "HostRecord",
    "HostReport",
    "RunSummary",
    "SlowRank",
    "Unit",
    "by_count",
    "distinct",
    "one_host",
]


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
        return distinct(u.run for u, _ in self.whole())

    def whole(self, run: str | None = None) -> list[tuple[Unit, SlowRank]]:
        """Where it held a slow rank over a whole attempt (of `run`)."""
        return [(u, s) for u, s in self.held if u.window is None and run in (None, u.run)]

    def attempts(self, run: str | None = None) -> list[tuple[str, int]]:
        return distinct(
            (u.run, u.attempt) for u, _ in self.held if u.window is None and run in (None, u.run)
        )

    def windows(self, run: str | None = None, attempt: int | None = None) -> list[int]:
        return distinct(
            u.window
            for u, _ in self.held
            if u.window is not None and run in (None, u.run) and attempt in (None, u.attempt)
        )

    def to_dict(self) -> dict[str, Any]:
        places = distinct((u.run, u.attempt, u.window) for u, _ in self.held)
        return {
            "host": self.host,
            "runs": len(self.runs()),
            "attempts": len(self.attempts()),
            "windows": sum(1 for _, _, window in places if window is not None),
            "in_runs": self.runs(),
            "ranks": [
                {"run": run, "attempt": attempt, "rank": rank}
                for run, attempt, rank in distinct((u.run, u.attempt, s.rank) for u, s in self.held)
            ],
            "phases": by_count(s.phase for _, s in self.held),
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
            "runs": len(distinct(u.run for u in whole)),
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
                {**u.place(), "host": u.hosts[0], "ranks": distinct(s.rank for s in u.slow)}
                for u in self.units
                if one_host(u) and u.slow
            ],
            "summary": self.summary,
            "skipped": self.skipped,
        }


def one_host(u: Unit) -> bool:
    return len(u.hosts) == 1 and u.unknown == 0


def by_count(items: Any) -> list[str]:
    """Distinct items, the most frequent first (then by name)."""
    counts = Counter(items)
    return sorted(counts, key=lambda item: (-counts[item], item))


def distinct(items: Any) -> list[Any]:
    """Distinct items in the order first seen."""
    return list(dict.fromkeys(items))
