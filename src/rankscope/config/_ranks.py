"""Which process this is (`RankInfo`) and which ranks a config selects (`RankSet`)."""

from __future__ import annotations

import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .._errors import ConfigError
from . import _env

__all__ = ["RankInfo", "RankSet", "RankSpec", "detect_rank_info", "parse_ranks"]

RankSpec = int | str | Sequence[int]
"""What users write to select ranks: 0, "0", "0,8,16", "0-7", "0-7,16", "all", [0, 8]."""

# Larger than any job; a bound so that a typo ("0-1000000000000") cannot exhaust memory.
_MAX_RANGE = 1 << 20

_ACCEPTED = 'a rank (0), a comma list ("0,8,16"), ranges ("0-7,16"), "all", or a list of ints'


@dataclass(frozen=True, slots=True)
class RankSet:
    """A parsed rank selection: every rank, or an explicit set."""

    everything: bool
    ranks: frozenset[int] = frozenset()

    def __contains__(self, rank: object) -> bool:
        return self.everything or rank in self.ranks

    def spec(self) -> str:
        """The canonical spelling: "all", or sorted ranks with runs folded ("0-3,8")."""
        if self.everything:
            return "all"
        parts: list[str] = []
        ordered = sorted(self.ranks)
        i = 0
        while i < len(ordered):
            j = i
            while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
                j += 1
            parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
            i = j + 1
        return ",".join(parts)

    def check_world_size(self, world_size: int, field: str) -> None:
        """Raise ConfigError naming `field` if a selected rank does not exist in this job."""
        too_big = sorted(r for r in self.ranks if r >= world_size)
        if too_big:
            raise ConfigError(
                field,
                self.spec(),
                f"ranks below the world size {world_size}",
                f"rank {too_big[0]} does not exist in a job of {world_size} ranks",
            )


def parse_ranks(value: object, field: str) -> RankSet:
    """Parse a rank spec; errors name `field`."""
    if isinstance(value, bool):
        raise ConfigError(field, value, _ACCEPTED, "a bool is not a rank")
    if isinstance(value, int):
        return _from_items([value], field, value)
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise ConfigError(field, value, _ACCEPTED, "empty")
        return _from_items([t.strip() for t in text.split(",")], field, value)
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return _from_items(list(value), field, value)
    raise ConfigError(field, value, _ACCEPTED, f"a {type(value).__name__} is not a rank spec")


def _from_items(items: list[object], field: str, original: object) -> RankSet:
    if not items:
        raise ConfigError(field, original, _ACCEPTED, "empty")
    if any(isinstance(i, str) and i.lower() == "all" for i in items):
        if len(items) > 1:
            raise ConfigError(field, original, _ACCEPTED, '"all" cannot be combined with ranks')
        return RankSet(everything=True)
    ranks: list[int] = []
    for item in items:
        ranks.extend(_expand(item, field, original))
    seen: set[int] = set()
    for r in ranks:
        if r in seen:
            raise ConfigError(field, original, _ACCEPTED, f"rank {r} is given twice")
        seen.add(r)
    return RankSet(everything=False, ranks=frozenset(ranks))


def _expand(item: object, field: str, original: object) -> list[int]:
    if isinstance(item, bool) or not isinstance(item, (int, str)):
        raise ConfigError(field, original, _ACCEPTED, f"{item!r} is not a rank")
    if isinstance(item, int):
        if item < 0:
            raise ConfigError(field, original, _ACCEPTED, f"rank {item} is negative")
        return [item]
    if not item:
        raise ConfigError(field, original, _ACCEPTED, "an empty item between commas")
    lo, sep, hi = item.partition("-")
    if sep and not lo:
        raise ConfigError(field, original, _ACCEPTED, f"rank {item} is negative")
    if not (_is_number(lo) and (not sep or _is_number(hi))):
        raise ConfigError(field, original, _ACCEPTED, f"{item!r} is not a rank or a range")
    first, last = int(lo), int(hi) if sep else int(lo)
    if last < first:
        raise ConfigError(field, original, _ACCEPTED, f"range {item!r} runs backwards")
    if last - first >= _MAX_RANGE:
        raise ConfigError(
            field, original, _ACCEPTED, f"range {item!r} spans more than {_MAX_RANGE} ranks"
        )
    return list(range(first, last + 1))


def _is_number(text: str) -> bool:
    # isdigit() alone admits "²" and full-width digits, which int() rejects or misreads.
    return text.isascii() and text.isdigit()


@dataclass(frozen=True, slots=True)
class RankInfo:
    """Where this process sits in the job. Detected once and passed down."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    host: str

    def __post_init__(self) -> None:
        for name in ("rank", "local_rank", "world_size", "local_world_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(name, value, "an int >= 0")
        if self.world_size < 1:
            raise ConfigError("world_size", self.world_size, "an int >= 1")
        if self.rank >= self.world_size:
            raise ConfigError("rank", self.rank, f"a rank below world_size={self.world_size}")


def detect_rank_info(
    rank: int | None = None,
    world_size: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> RankInfo:
    """This process's place in the job.

    Sources, first match wins: an initialised torch.distributed, torchrun's variables,
    SLURM's, else a single process. Explicit `rank`/`world_size` override what is
    detected (Ray workers and tests pass them).
    """
    detected = _from_torch_distributed(environ) or _env.launcher_ranks(environ)
    d_rank, d_local, d_world, d_local_world = detected or (0, 0, 1, 1)
    final_rank = d_rank if rank is None else rank
    final_world = d_world if world_size is None else world_size
    if rank is not None and detected is None:
        # An explicit rank with nothing detected: assume one process per host slot.
        d_local = rank
    if world_size is not None and detected is None:
        d_local_world = world_size
    return RankInfo(
        rank=final_rank,
        local_rank=d_local,
        world_size=final_world,
        local_world_size=max(d_local_world, 1),
        host=socket.gethostname(),
    )


def _from_torch_distributed(
    environ: Mapping[str, str] | None,
) -> tuple[int, int, int, int] | None:
    # Only a process that imported torch can have initialised torch.distributed; looking
    # in sys.modules keeps this cheap and keeps torch out of processes that never use it.
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    rank = dist.get_rank()
    world = dist.get_world_size()
    local = _env.launcher_ranks(environ)
    local_rank, local_world = (local[1], local[3]) if local else (rank, world)
    return rank, local_rank, world, local_world
