"""Anomaly-triggered windows: when a rank's own steps turn slow, decide to capture one.

Pure decision logic, no torch and no clock: the capture feeds it one step time per
step and plans the window it asks for (see TraceCapture).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from ..config._trace import AutoTrigger

__all__ = ["MEDIAN_REFRESH", "SlowSteps", "SlowdownDetector"]

MEDIAN_REFRESH = 8
"""The rolling median is recomputed every this many measurements (and at the end of
warm-up), so most steps pay a few comparisons, not a sort of the history."""


@dataclass(frozen=True, slots=True)
class SlowSteps:
    """Why a capture was asked for: `seconds` of the slow steps that ended at `step`."""

    step: int
    """The step whose measurement completed the slow stretch."""
    seconds: tuple[float, ...]
    """The slow measurements, oldest first (`consecutive` of them)."""
    steps: tuple[int, ...]
    """The step each of `seconds` was measured on."""
    median: float
    """The rolling median the measurements were compared with (seconds)."""
    ratio: float
    """The configured threshold: each slow step took more than ratio x median."""
    capture: int
    """Which capture this is: 1 for the first of the run."""


class SlowdownDetector:
    """The consecutive-slow-steps rule over a rank's own rolling median, bounded.

    A measurement counts as slow when it exceeds `ratio` x the median of the last
    `history_steps` measurements, once `warmup_steps` measurements have been seen.
    `consecutive` slow measurements in a row fire, at most `max_captures` times and
    never within `cooldown_steps` of the step the last one fired at. Every
    measurement joins the history, slow ones too, so a lasting slowdown becomes the
    new normal after about history_steps / 2 steps instead of firing until the cap.
    """

    def __init__(self, config: AutoTrigger) -> None:
        self._ratio = config.ratio
        self._consecutive = config.consecutive
        self._warmup = config.warmup_steps
        self._cooldown = config.cooldown_steps
        self._left = config.max_captures
        self._history: deque[float] = deque(maxlen=config.history_steps)
        self._seen = 0
        self._limit: float | None = None  # ratio x median; None during warm-up
        self._streak: list[tuple[int, float]] = []
        self._median = 0.0
        self._last_fired: int | None = None
        self.fired = 0
        """Captures asked for so far."""

    @property
    def slow_now(self) -> int:
        """The slow measurements in a row that ended the latest one (0: it was not slow)."""
        return len(self._streak)

    @property
    def exhausted(self) -> bool:
        """True once max_captures were asked for: the caller may stop measuring."""
        return self._left == 0

    def observe(self, step: int, seconds: float) -> SlowSteps | None:
        """Take the time of step `step`; a SlowSteps when it completes a slow stretch."""
        limit = self._limit
        fire: SlowSteps | None = None
        if limit is not None and seconds > limit:
            streak = self._streak
            streak.append((step, seconds))
            if len(streak) >= self._consecutive:
                fire = self._fire(step)
        elif self._streak:
            self._streak = []
        self._history.append(seconds)
        self._seen += 1
        if self._seen >= self._warmup and (limit is None or self._seen % MEDIAN_REFRESH == 0):
            self._median = _median(self._history)
            self._limit = self._ratio * self._median
        return fire

    def _fire(self, step: int) -> SlowSteps | None:
        streak, self._streak = self._streak, []
        if self._left == 0:
            return None
        if self._last_fired is not None and step - self._last_fired < self._cooldown:
            return None
        self._left -= 1
        self.fired += 1
        self._last_fired = step
        last = streak[-self._consecutive :]
        return SlowSteps(
            step=step,
            seconds=tuple(seconds for _, seconds in last),
            steps=tuple(at for at, _ in last),
            median=self._median,
            ratio=self._ratio,
            capture=self.fired,
        )


def _median(values: Iterable[float]) -> float:
    """statistics.median, without its per-call overhead (this runs every few steps)."""
    ordered = sorted(values)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2
