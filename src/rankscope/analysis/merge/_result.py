"""What `merge_traces` returns: the output and what it did with each input."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["MergeResult", "MergedInput"]


@dataclass(frozen=True)
class MergedInput:
    """What the merge did with one input trace."""

    source: str
    """The path as given."""
    rank: int
    rank_from: str
    """Where the rank came from: "given", "distributedInfo" or "file name"."""
    pid: int
    """The pid of the rank's process group in the output."""
    base_time_ns: int | None
    """The input's baseTimeNanoseconds (None: its ts are absolute)."""
    events: int
    """Events read from the input."""
    bytes_read: int
    """Size of the file as stored (compressed or not)."""
    json_bytes: int
    """Size of its JSON text, uncompressed."""
    not_finite: int = 0
    """Events holding a NaN or an infinity, written with null there (JSON has neither)."""


@dataclass(frozen=True)
class MergeResult:
    """What `merge_traces` wrote."""

    output: Path
    ranks: tuple[int, ...]
    """The inputs' ranks, in input order."""
    events_written: int
    """Events in the output: the inputs' less their absorbed metadata, plus the new metadata."""
    bytes_read: int
    """Input bytes as stored; the total that `progress` counts up to."""
    json_bytes: int
    """Input JSON bytes, uncompressed."""
    base_time_ns: int | None
    inputs: tuple[MergedInput, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe data (what `rankscope merge --json` prints)."""
        data = asdict(self)
        data["output"] = str(self.output)
        data["ranks"] = list(self.ranks)
        data["inputs"] = list(data["inputs"])
        return data
