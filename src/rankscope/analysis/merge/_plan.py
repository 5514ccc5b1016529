"""Deciding each input's rank and clock shift, and the output's base time."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..._errors import TraceError
from ..._text import shown
from ...rundir._layout import rank_name, rank_of_file
from ._header import _MISSING, _Header, _is_int

__all__ = ["base_of"]

_RANK_LIMIT = 1 << 20
_BASE_LIMIT = 1 << 63


@dataclass(frozen=True)
class _Job:
    """One input as a worker reads it."""

    index: int
    source: str
    rank: int
    rank_from: str
    base: int | None
    shift_ns: int
    """Added to every ts (in ns); 0 leaves ts as written."""


def _plan(
    sources: list[str], headers: list[_Header], ranks: Sequence[int] | None
) -> tuple[list[_Job], int | None]:
    """Each input's rank and clock shift, and the output's base time."""
    bases = [base_of(source, header.base) for source, header in zip(sources, headers, strict=True)]
    known = [base for base in bases if base is not None]
    out_base = min(known) if known else None
    jobs = []
    holder: dict[int, str] = {}
    for index, (source, header) in enumerate(zip(sources, headers, strict=True)):
        rank, rank_from = _rank_of(source, header, None if ranks is None else ranks[index])
        if rank in holder:
            raise TraceError(f"{source}: rank {rank} is also the rank of {holder[rank]}")
        holder[rank] = source
        base = bases[index]
        shift = 0 if out_base is None else (base or 0) - out_base
        jobs.append(_Job(index, source, rank, rank_from, base, shift))
    return jobs, out_base


def base_of(source: str, raw: Any) -> int | None:
    """A trace's baseTimeNanoseconds (None where it has none), or a TraceError naming
    `source` where it is no time in ns."""
    if raw is _MISSING or raw is None:
        return None
    # Kineto writes an int64 of ns; past that, shifting every ts by it overflows a float.
    if _is_int(raw) and 0 <= raw < _BASE_LIMIT:
        return int(raw)
    if isinstance(raw, float) and raw.is_integer() and 0 <= raw < _BASE_LIMIT:
        return int(raw)
    raise TraceError(
        f"{source}: baseTimeNanoseconds is {shown(raw)}, not a time in nanoseconds (0 to 2**63 - 1)"
    )


def _rank_of(source: str, header: _Header, given: int | None) -> tuple[int, str]:
    if given is not None:
        return given, "given"
    if header.info_rank is not _MISSING:
        rank = header.info_rank
        if not _is_int(rank) or not 0 <= rank < _RANK_LIMIT:
            raise TraceError(
                f"{source}: distributedInfo.rank is {shown(rank)}, not a rank in "
                f"0..{_RANK_LIMIT - 1}"
            )
        return int(rank), "distributedInfo"
    rank = rank_of_file(Path(source).name)
    if rank is not None:
        if rank >= _RANK_LIMIT:
            raise TraceError(
                f"{source}: rank {rank} (from the file name) is over {_RANK_LIMIT - 1}"
            )
        return rank, "file name"
    raise TraceError(
        f"{source}: cannot tell its rank: no distributedInfo.rank in the trace and no "
        f"rank in the file name (as in {rank_name(3)}); give the ranks explicitly"
    )
