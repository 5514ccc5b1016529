"""Hosts whose GPUs throttle, for `hosts` (analysis/hosts/_hosts.py): from each attempt's
health samples (read/_health.py), a GPU throttles where a thermal or power reason is set
at THROTTLED_SHARE of its samples or more (analysis/stragglers/_gpu_health.py), slow rank or not."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..._text import format_ranks
from ..read._attempts import Attempts
from ..read._health import read_health, tokens_of
from ..stragglers._gpu_health import THROTTLED_SHARE, holds_of, throttled, throttled_share

__all__ = ["ThrottledGpu", "throttle_sentences", "throttled_gpus"]


@dataclass(frozen=True)
class ThrottledGpu:
    """A rank's GPU that throttled over one attempt of a run."""

    run: str
    attempt: int
    rank: int
    host: str | None
    share: float
    """Of its samples in the attempt, those with a thermal or power reason set."""
    holds: tuple[str, ...]
    """What held its clock back, in words ("thermal throttling")."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "attempt": self.attempt,
            "rank": self.rank,
            "host": self.host,
            "share": round(self.share, 3),
            "holds": list(self.holds),
        }


def throttled_gpus(
    root: Path, run: str, attempt: int, attempts: Attempts, hosts: Mapping[int, str]
) -> tuple[list[ThrottledGpu], list[str]]:
    """The GPUs of `attempt` (read with `attempts`) that throttled, each on its host where
    known; and the health lines the reading skipped."""
    health = read_health(root, tokens_of(attempts))
    out = []
    for rank, samples in sorted(health.ranks.items()):
        share = throttled_share(samples)
        if share is not None and share >= THROTTLED_SHARE:
            holds = holds_of(samples.reasons[throttled(samples)])
            out.append(ThrottledGpu(run, attempt, rank, hosts.get(rank), share, holds))
    return out, health.skipped


def throttle_sentences(gpus: list[ThrottledGpu], attempts_of: Mapping[str, int]) -> list[str]:
    """One sentence per host whose GPUs throttled, the most attempts first (`attempts_of`:
    each run's attempts); ranks whose host is not known together, by rank."""
    by_host: dict[str | None, list[ThrottledGpu]] = {}
    for gpu in gpus:
        by_host.setdefault(gpu.host, []).append(gpu)
    attempts = sum(attempts_of.values())

    def held(host: str | None) -> int:
        return len({(g.run, g.attempt) for g in by_host[host]})

    out = []
    for host in sorted(by_host, key=lambda h: (h is None, -held(h), h or "")):
        mine = by_host[host]
        where: dict[str, list[int]] = {}
        for g in mine:
            key = f"run {g.run}" + (
                f" attempt {g.attempt}" if attempts_of.get(g.run, 1) > 1 else ""
            )
            where.setdefault(key, []).append(g.rank)
        ranks = "; ".join(f"{format_ranks(sorted(set(r)))} in {key}" for key, r in where.items())
        holds = " and ".join(dict.fromkeys(h for g in mine for h in g.holds))
        if host is None:
            out.append(f"GPUs of unknown hosts throttled ({ranks}; {holds})")
            continue
        count = held(host)
        share = f"{count} of {attempts} attempts" if attempts > 1 else "the one attempt"
        out.append(
            f"{host}'s GPUs throttled in {share} ({ranks}; {holds}): a machine to cool or "
            "drain, whether or not its ranks were found slow"
        )
    return out
