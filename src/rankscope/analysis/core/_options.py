"""The options of each analysis: one frozen dataclass per analysis, validated at construction.

Each default is written here once. The CLI derives its flags from these fields
(cli/_options.py: `--min-persistence` for `min_persistence`, the help text from the
docstring under the field), the report and `hosts` take the same objects, and a bad value
is a ConfigError naming the field, the value and what is accepted, as ProfileConfig's are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..._errors import ConfigError

__all__ = [
    "ANALYSIS_OPTIONS",
    "BY",
    "TIME",
    "TIME_BASES",
    "CollectiveOptions",
    "DiffOptions",
    "HangOptions",
    "HostOptions",
    "KernelOptions",
    "StragglerOptions",
]

TIME_BASES = ("auto", "host", "device")
"""What a phase's duration is read from. "auto": each phase on the clock that measures its
work (analysis/core/_clocks.py): device time (gpu_ms) where the phase's work runs on the GPU,
host time (cpu_ms) where the host is the work; "host" or "device": every phase on one."""
TIME = "auto"
"""The time basis every analysis and reader takes by default (written here alone)."""

BY = ("name", "category")
"""How kernels are grouped."""


def _choices(default: str, choices: tuple[str, ...]) -> Any:
    return field(default=default, metadata={"choices": choices})


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(name, value, "a finite number")
    return float(value)


def _count(name: str, value: object, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(name, value, f"an int >= {minimum}")


def _one_of(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(name, value, " or ".join(choices))


@dataclass(frozen=True, kw_only=True, slots=True)
class StragglerOptions:
    """The straggler rules: what counts as a slow rank, and which records are compared."""

    threshold: float = 1.10
    """A rank's time over the reference (the cross-rank median) that counts as slow."""
    min_persistence: float = 0.5
    """Share of sampled steps above the threshold to report."""
    min_share: float = 0.01
    """Ignore an excess below this share of the step time."""
    min_saving: float = 0.02
    """Leave out a finding whose fix would save less than this share of the step time: a
    busy machine moves a clean run's ranks by about that much, and a finding that costs
    nothing is not one."""
    time: str = _choices(TIME, TIME_BASES)
    """Read each phase on the clock of its work: device time (gpu_ms) where the GPU does
    it, host time (cpu_ms) where the host does (auto); or every phase on host or device
    time."""
    attempt: int | None = None
    """Use only attempt N of a run that restarted into one directory (default: the latest
    record of each step)."""

    def __post_init__(self) -> None:
        threshold = _number("threshold", self.threshold)
        if threshold <= 1:
            raise ConfigError(
                "threshold", threshold, "a number > 1 (1.10: 10% above the reference)"
            )
        persistence = _number("min_persistence", self.min_persistence)
        if not 0 < persistence <= 1:
            raise ConfigError("min_persistence", persistence, "a share of steps in (0, 1]")
        share = _number("min_share", self.min_share)
        if not 0 <= share < 1:
            raise ConfigError("min_share", share, "a share of the step time in [0, 1)")
        saving = _number("min_saving", self.min_saving)
        if not 0 <= saving < 1:
            raise ConfigError("min_saving", saving, "a share of the step time in [0, 1)")
        _one_of("time", self.time, TIME_BASES)
        if self.attempt is not None:
            _count("attempt", self.attempt)

    def rules(self) -> dict[str, float]:
        """The three rules, as the reports echo them."""
        return {
            "threshold": self.threshold,
            "min_persistence": self.min_persistence,
            "min_share": self.min_share,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class HostOptions:
    """Which hosts keep holding the slow rank: the straggler rules, and how runs are split."""

    stragglers: StragglerOptions = field(default_factory=StragglerOptions)
    """The straggler rules each window is judged by (attempts are analysed each on their own)."""
    windows: int = 8
    """Split each attempt's sampled steps into this many windows, to see whether a slow
    host stays slow (fewer where a window would have too few sampled steps; 1: none)."""
    same_hosts: bool = False
    """For attempts whose timings name no host (an older rankscope's), take each rank's
    host from its meta file (which holds the rank's latest start: use this where restarts
    kept every rank on its host)."""

    def __post_init__(self) -> None:
        if not isinstance(self.stragglers, StragglerOptions):
            raise ConfigError("stragglers", self.stragglers, "a StragglerOptions")
        if self.stragglers.attempt is not None:
            raise ConfigError(
                "attempt", self.stragglers.attempt, "no attempt: hosts analyses each attempt"
            )
        _count("windows", self.windows)
        if not isinstance(self.same_hosts, bool):
            raise ConfigError("same_hosts", self.same_hosts, "True or False")


@dataclass(frozen=True, kw_only=True, slots=True)
class DiffOptions:
    """What `diff` compares and what it counts as a change."""

    time: str = _choices(TIME, TIME_BASES)
    """Read each phase on the clock of its work: device time (gpu_ms) where the GPU does
    it, host time (cpu_ms) where the host does (auto); or every phase on host or device
    time."""
    noise: float = 1.0
    """Scale the noise estimate: 2 lists only changes twice as clear."""
    min_share: float = 0.01
    """Leave out changes below this share of the shorter step time, A's or B's."""

    def __post_init__(self) -> None:
        _one_of("time", self.time, TIME_BASES)
        noise = _number("noise", self.noise)
        if noise <= 0:
            raise ConfigError("noise", noise, "a number > 0 (1: the noise as estimated)")
        share = _number("min_share", self.min_share)
        if not 0 <= share < 1:
            raise ConfigError("min_share", share, "a share of the step time in [0, 1)")


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelOptions:
    """How the top kernels (or CPU ops) of traces are grouped and which traces are read."""

    by: str = _choices("name", BY)
    """Group kernels by name or by category."""
    window: str | None = None
    """Only the traces of this window (step-000003-000004)."""
    top: int = 20
    """Rows listed."""

    def __post_init__(self) -> None:
        _one_of("by", self.by, BY)
        if self.window is not None and (not isinstance(self.window, str) or not self.window):
            raise ConfigError("window", self.window, "a window's folder name")
        _count("top", self.top)


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveOptions:
    """How much of the collectives' matching is listed."""

    rows: int = 20
    """Ranks and collectives listed."""

    def __post_init__(self) -> None:
        _count("rows", self.rows)


@dataclass(frozen=True, kw_only=True, slots=True)
class HangOptions:
    """How a hang is judged where the run's own files do not say (a rank's meta file gives
    its hang.factor and hang.after_s; the defaults of HangConfig apply without one)."""

    grace_s: float = 60.0
    """How long past its threshold a stall may go before a missing hang file is news."""

    def __post_init__(self) -> None:
        grace = _number("grace_s", self.grace_s)
        if grace < 0:
            raise ConfigError("grace_s", grace, "seconds >= 0")


ANALYSIS_OPTIONS = (
    StragglerOptions,
    HostOptions,
    DiffOptions,
    KernelOptions,
    CollectiveOptions,
    HangOptions,
)
"""Every analysis's options class (the CLI names a flag from a ConfigError on any field)."""
