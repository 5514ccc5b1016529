"""What a slow rank's GPU and host said of themselves since the finding's onset (the
health samples, read/_health.py), against the other ranks': the figures the causes
(analysis/_cause.py) and `hosts` put in words."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .read._health import HealthSample, RunHealth

__all__ = ["THROTTLED_SHARE", "GpuHealth", "gpu_health", "holds_of", "throttled"]

THROTTLED_SHARE = 0.5
"""A GPU throttles when a thermal or power reason is set at this share of its samples, or more."""

# NVML's reasons (timing/_health.py's words), by what holds the clock back.
_HOLDS = (
    ("thermal throttling", frozenset({"sw_thermal", "hw_thermal"})),
    ("power capping", frozenset({"sw_power_cap", "hw_power_brake"})),
    ("a hardware slowdown", frozenset({"hw_slowdown"})),
)
_SLOWING = frozenset().union(*(words for _, words in _HOLDS))


def throttled(sample: HealthSample) -> bool:
    """A thermal or power reason (or a hardware slowdown) is set in `sample`."""
    return bool(sample.throttle and sample.throttle & _SLOWING)


def holds_of(samples: Iterable[HealthSample]) -> tuple[str, ...]:
    """What held the clock back at `samples`, in words ("thermal throttling")."""
    reasons = frozenset().union(*(s.throttle or frozenset() for s in samples))
    return tuple(words for words, bits in _HOLDS if reasons & bits)


@dataclass(frozen=True)
class GpuHealth:
    """One rank's health since a step, with the other ranks' medians beside it."""

    rank: int
    since: int
    samples: int
    """The rank's samples the figures are taken over."""
    clock: float | None
    others_clock: float | None
    throttled_share: float
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
            and self.throttled_share >= THROTTLED_SHARE
        )

    def healthy(self, threshold: float) -> bool:
        """Its SM clock is the others' (within `threshold`) and nothing throttles it."""
        return (
            self.clock is not None
            and self.others_clock is not None
            and self.clock * threshold >= self.others_clock
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
        said = [f"set at {self.throttled_share:.0%} of its {self.samples} samples"]
        if "thermal throttling" in self.holds and self.temp is not None:
            temp = f"its GPU at {self.temp:.0f} C"
            if self.others_temp is not None:
                temp += f" against a median of {self.others_temp:.0f} C"
            said.append(temp)
        if "power capping" in self.holds and self.power is not None and self.limit is not None:
            said.append(f"drawing {self.power:.0f} W of its {self.limit:.0f} W limit")
        return f"machine: {self.clock_words()}, {holds} ({'; '.join(said)})"

    def ruled_out(self) -> str:
        """Its GPU's clocks, ruled out, in words."""
        return (
            f"its GPU's clocks ({self.clock_words()}, no thermal or power throttling at "
            f"{1 - self.throttled_share:.0%} of its samples)"
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
    mine = {s: v for s, v in health.of(rank).items() if since <= s <= last}
    if not mine:
        return None
    theirs = [
        v
        for other in ranks
        if other != rank
        for s, v in health.of(other).items()
        if since <= s <= last
    ]
    held = [v for v in mine.values() if throttled(v)]
    return GpuHealth(
        rank=rank,
        since=since,
        samples=len(mine),
        clock=_median(v.get("sm_mhz") for v in mine.values()),
        others_clock=_median(v.get("sm_mhz") for v in theirs),
        throttled_share=len(held) / len(mine),
        holds=holds_of(held),
        temp=_median(v.get("temp_c") for v in mine.values()),
        others_temp=_median(v.get("temp_c") for v in theirs),
        power=_median(v.get("power_w") for v in held),
        limit=_median(v.get("power_limit_w") for v in held),
        load=_median(v.get("load1") for v in mine.values()),
        others_load=_median(v.get("load1") for v in theirs),
        ecc=_ecc_growth(health.of(rank), since, last),
    )


def _ecc_growth(samples: dict[int, HealthSample], since: int, last: int) -> str | None:
    """ECC errors that grew from the rank's last sample before `since` (else its first
    since) to its last, in words."""
    steps = sorted(s for s in samples if s <= last)
    before = [s for s in steps if s < since]
    after = [s for s in steps if s >= since]
    if not after:
        return None
    first, end = samples[(before or after)[-1 if before else 0]], samples[after[-1]]
    grew = []
    for kind in ("uncorrected", "corrected"):
        a, b = first.get(f"ecc_{kind}"), end.get(f"ecc_{kind}")
        if a is not None and b is not None and b > a:
            grew.append(f"{kind} from {a:.0f} to {b:.0f}")
    if not grew:
        return None
    return f"its GPU's ECC errors grew since step {since} ({', '.join(grew)})"


def _median(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None
