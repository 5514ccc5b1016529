"""What a slow rank's GPU and host said of themselves since the finding's onset (the
health samples, read/_health.py), against the other ranks': the figures the causes
(analysis/stragglers/_cause.py) and `hosts` put in words."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ...rundir._health import FIGURES
from ..read._health import RankHealth, RunHealth, reason_bits
from ..read._matrix import quiet

__all__ = ["THROTTLED_SHARE", "GpuHealth", "gpu_health", "holds_of", "throttled"]

Bools = npt.NDArray[np.bool_]
FIGURE = {name: i for i, name in enumerate(FIGURES)}

THROTTLED_SHARE = 0.5
"""A GPU throttles when a thermal or power reason is set at this share of its samples, or more."""

# NVML's reasons (rundir/_health.py's words), by what holds the clock back.
_HOLDS = (
    ("thermal throttling", reason_bits(("sw_thermal", "hw_thermal"))),
    ("power capping", reason_bits(("sw_power_cap", "hw_power_brake"))),
    ("a hardware slowdown", reason_bits(("hw_slowdown",))),
)
_SLOWING = reason_bits(
    ("sw_thermal", "hw_thermal", "sw_power_cap", "hw_power_brake", "hw_slowdown")
)


def throttled(health: RankHealth) -> Bools:
    """Per row: a thermal or power reason (or a hardware slowdown) is set."""
    held: Bools = (health.reasons >= 0) & ((health.reasons & _SLOWING) != 0)
    return held


def throttled_share(health: RankHealth) -> float | None:
    """The share of the rows whose reasons were read that have one set; None where no row's
    were (not read is not "not throttled")."""
    read = health.reasons >= 0
    return float(throttled(health)[read].mean()) if read.any() else None


def holds_of(reasons: npt.NDArray[np.int64]) -> tuple[str, ...]:
    """What held the clock back at rows whose reason bits are `reasons`, in words."""
    union = int(np.bitwise_or.reduce(reasons[reasons >= 0], initial=0))
    return tuple(words for words, bits in _HOLDS if union & bits)


@dataclass(frozen=True)
class GpuHealth:
    """One rank's health since a step, with the other ranks' medians beside it."""

    rank: int
    since: int
    samples: int
    """The rank's samples the figures are taken over."""
    clock: float | None
    others_clock: float | None
    throttled_share: float | None
    """The share of its samples with a throttle reason set, of those whose reasons were read."""
    holds: tuple[str, ...]
    """What holds the clock back, in words ("thermal throttling"), at the samples it does."""
    temp: float | None
    others_temp: float | None
    power: float | None
    limit: float | None
    load: float | None
    others_load: float | None
    ecc: str | None
    """ECC errors that grew on its GPU, in words; None where none did."""

    def slows(self, threshold: float) -> bool:
        """Its SM clock is below the others' by more than `threshold` while a thermal or
        power reason holds it there: the GPU, not the work, makes the rank slow."""
        return (
            self.clock is not None
            and self.others_clock is not None
            and self.clock > 0
            and self.others_clock / self.clock > threshold
            and self.throttled_share is not None
            and self.throttled_share >= THROTTLED_SHARE
        )

    def healthy(self, threshold: float) -> bool:
        """Its SM clock is the others' (within `threshold`) and nothing throttles it."""
        return (
            self.clock is not None
            and self.others_clock is not None
            and self.clock * threshold >= self.others_clock
            and self.throttled_share is not None
            and self.throttled_share < THROTTLED_SHARE
        )

    def clock_words(self, since: bool = True) -> str:
        """ "rank 2's SM clock 1410 MHz against a median of 1980 since step 57"."""
        return (
            f"rank {self.rank}'s SM clock {self.clock:.0f} MHz against a median of "
            f"{self.others_clock:.0f}{f' since step {self.since}' if since else ''}"
        )

    def machine(self) -> str:
        """The machine cause: the clock, what holds it back, and the figures that show it."""
        holds = " and ".join(self.holds)
        said = [f"set at {self.throttled_share or 0:.0%} of its {self.samples} samples"]
        if "thermal throttling" in self.holds and self.temp is not None:
            temp = f"its GPU at {self.temp:.0f} C"
            if self.others_temp is not None:
                temp += f" against a median of {self.others_temp:.0f} C"
            said.append(temp)
        if "power capping" in self.holds and self.power is not None and self.limit is not None:
            said.append(f"drawing {self.power:.0f} W of its {self.limit:.0f} W limit")
        return f"machine: {self.clock_words()}, {holds} ({'; '.join(said)})"

    def ruled_out(self) -> str:
        """Its GPU's clocks, ruled out, in words (where healthy(): its reasons were read)."""
        return (
            f"its GPU's clocks ({self.clock_words()}, no thermal or power throttling at "
            f"{1 - (self.throttled_share or 0.0):.0%} of its samples)"
        )

    def host(self) -> str | None:
        """Its host's load beside the others', where both are known."""
        if self.load is None or self.others_load is None:
            return None
        return f"its host's load average {self.load:.1f} against a median of {self.others_load:.1f}"


def gpu_health(
    health: RunHealth, rank: int, ranks: Sequence[int], since: int, last: int
) -> GpuHealth | None:
    """`rank`'s health over its samples at steps `since`..`last`, against `ranks`' others;
    None where it has no sample there."""
    mine = health.of(rank).between(since, last)
    if not len(mine):
        return None
    others = [health.of(r).between(since, last) for r in ranks if r != rank]
    theirs = np.concatenate([o.figures for o in others]) if others else mine.figures[:0]
    held = throttled(mine)

    def median(rows: npt.NDArray[np.float64], name: str) -> float | None:
        column = rows[:, FIGURE[name]]
        with quiet():
            value = float(np.nanmedian(column)) if len(column) else float("nan")
        return None if np.isnan(value) else value

    return GpuHealth(
        rank=rank,
        since=since,
        samples=len(mine),
        clock=median(mine.figures, "sm_mhz"),
        others_clock=median(theirs, "sm_mhz"),
        throttled_share=throttled_share(mine),
        holds=holds_of(mine.reasons[held]),
        temp=median(mine.figures, "temp_c"),
        others_temp=median(theirs, "temp_c"),
        power=median(mine.figures[held], "power_w"),
        limit=median(mine.figures[held], "power_limit_w"),
        load=median(mine.figures, "load1"),
        others_load=median(theirs, "load1"),
        ecc=_ecc_growth(health.of(rank), since, last),
    )


def _ecc_growth(health: RankHealth, since: int, last: int) -> str | None:
    """ECC errors that grew from the rank's last sample before `since` (else its first
    since) to its last, in words."""
    rows = health.between(-1, last)
    after = np.flatnonzero(rows.steps >= since)
    if not len(after):
        return None
    before = np.flatnonzero(rows.steps < since)
    first = int(before[-1]) if len(before) else int(after[0])
    end = int(after[-1])
    grew = []
    for kind in ("uncorrected", "corrected"):
        column = rows.figure(f"ecc_{kind}")
        a, b = float(column[first]), float(column[end])
        if not (np.isnan(a) or np.isnan(b)) and b > a:
            grew.append(f"{kind} from {a:.0f} to {b:.0f}")
    if not grew:
        return None
    return f"its GPU's ECC errors grew since step {since} ({', '.join(grew)})"
