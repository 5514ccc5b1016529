"""How many collectives this process issued: what a phase's record says of the collectives in it.

A DDP or FSDP job's collectives run inside its own phases (the gradient all-reduce in
backward, the all-gathers in forward), issued from C++ where no Python hook sees them.
Every process group counts the collectives issued on it (its sequence number, which
Flight Recorder and the desync debugger read too): the sum over this process's groups,
read at a phase's entry and exit, says whether the phase issued one. The analysis then
knows that ranks wait for each other there, instead of guessing it from how they leave
the phase (analysis/stragglers/_arrivals.py).

Reading it costs one C++ call per process group (about 0.14 us on gloo), only on
sampled steps. A group that cannot say (a backend without sequence numbers) is left
out; with none left, records carry no count and the analysis guesses as before.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

__all__ = ["CollectiveCount"]

_MAX_GROUPS = 64
"""Groups read at most: a job with more (one per pair of ranks) is counted on its first 64,
so a sampled phase never pays for hundreds of calls."""


class CollectiveCount:
    """The collectives issued so far on this process's groups; `now()` is None where
    torch.distributed is not started or no group can say."""

    def __init__(self, torch: ModuleType) -> None:
        self._dist = getattr(torch, "distributed", None)
        self._groups: tuple[Any, ...] = ()
        self._seen = -1  # how many groups the world had when `_groups` was made

    def now(self) -> int | None:
        dist = self._dist
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        try:
            return self._count(dist)
        except Exception:  # private torch API moved: count no more, time on
            self._dist = None
            return None

    def _count(self, dist: Any) -> int | None:
        pg_map = dist.distributed_c10d._world.pg_map
        if len(pg_map) != self._seen:
            self._seen = len(pg_map)
            self._groups = tuple(g for g in list(pg_map)[:_MAX_GROUPS] if _counts(g))
        if not self._groups:
            return None
        return int(sum(g._get_sequence_number_for_group() for g in self._groups))


def _counts(group: Any) -> bool:
    """The group says how many collectives were issued on it."""
    try:
        return isinstance(group._get_sequence_number_for_group(), int)
    except Exception:  # a backend without sequence numbers (fake, mpi, a custom one)
        return False
