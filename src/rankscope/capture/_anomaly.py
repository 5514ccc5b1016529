"""The anomaly detector (trace.auto): a rank's step times, or one phase's, fed to the
slow-step rule. It returns the slow stretches it sees and plans nothing: the capture
asks for their windows through its one door. (Not the hang watchdog: that is `watch/`.)"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._log import get_logger
from ..config._trace import AutoTrigger
from ._auto import SlowdownDetector, SlowSteps

if TYPE_CHECKING:
    from ..timing import PhaseTimer

__all__ = ["AnomalyDetector"]

logger = get_logger(__name__)

_NOTHING: tuple[SlowSteps, ...] = ()


class AnomalyDetector:
    """Follows the step time (one perf_counter a step, taken by the caller) or, with
    `auto.phase`, that phase's times from the phase timer's records.

    A step a window recorded or warmed up in is slow because it is profiled, not the
    job's own time: it is never fed. A fault inside the detector turns it off with one
    warning; windows already asked for are kept.
    """

    def __init__(self, auto: AutoTrigger, rank: int) -> None:
        self._auto = auto
        self._rank = rank
        self.steps: SlowdownDetector | None = SlowdownDetector(auto) if auto.phase is None else None
        """The step-time rule; None when a phase is followed, or once it is done or failed."""
        self._phase: SlowdownDetector | None = SlowdownDetector(auto) if auto.phase else None
        self.detecting = True
        """False once nothing is left to follow: step() may drop the detector altogether. An
        attribute, not a property: it is read every step."""
        self.step_began = 0.0
        """perf_counter when the current step began (the step-time rule only)."""
        self._timer: PhaseTimer | None = None
        self._phase_step: int | None = None  # the step whose phase times are being summed
        self._phase_sum = 0.0
        self._profiled: deque[int] = deque(maxlen=256)  # recent steps a profiler ran in

    @property
    def measured(self) -> str:
        """What is followed, as the auto records say it: "step" or "phase NAME"."""
        phase = self._auto.phase
        return "step" if phase is None else f"phase {phase}"

    def slow_itself(self) -> str | None:
        """Why this rank is slow itself by its own detector (a slow stretch under way, or a
        window it asked for): a peer asked by another slow rank declines then (see _pair)."""
        for detector in (self.steps, self._phase):
            if detector is None:
                continue
            if detector.fired:
                return f"its own {self.measured} time fired the anomaly detector this run"
            if detector.slow_now:
                return f"its last {detector.slow_now} {self.measured} times were slow"
        return None

    def attach_timer(self, timer: PhaseTimer | None) -> None:
        """The phase timer of this rank, whose records of auto.phase feed the detector."""
        if self._phase is None:
            return
        if timer is None:
            self._phase = None
            self.detecting = self.steps is not None
            logger.warning(
                "rankscope: trace.auto.phase is %r but the phase timer does not run on rank %d "
                "(not in timer.ranks, or timer off); this rank does not follow its phase times",
                self._auto.phase,
                self._rank,
            )
            return
        self._timer = timer
        timer.follow(self._auto.phase)

    def observe(self, step: int, now: float, profiled: bool, enabled: bool) -> Sequence[SlowSteps]:
        """Take what step `step` (just ended at perf_counter `now`) measured; the slow
        stretches it completes. `profiled`: a window ran in that step; `enabled`: capture
        can still record (nothing is fed once it cannot)."""
        slow = None
        detector = self.steps
        if detector is not None:
            # Inline, not a method of its own: this runs every step of a detecting rank.
            if profiled or not enabled:
                self.step_began = now  # a profiled step is slow because it is profiled
            else:
                try:
                    slow = detector.observe(step, now - self.step_began)
                    if slow is None and detector.exhausted:
                        self.steps = None  # nothing more to ask for: stop measuring
                        self.detecting = self._phase is not None
                except Exception as exc:
                    self.steps = None
                    self.detecting = self._phase is not None
                    self.failed("step times", exc)
        if self._phase is None:
            return _NOTHING if slow is None else (slow,)  # most steps: no list to make
        found = [] if slow is None else [slow]
        try:
            self._observe_phase(self._phase, step, profiled, enabled, found)
        except Exception as exc:
            self._stop_phase()
            self.failed(f"phase {self._auto.phase!r}", exc)
        return found

    def _observe_phase(
        self,
        detector: SlowdownDetector,
        step: int,
        profiled: bool,
        enabled: bool,
        found: list[SlowSteps],
    ) -> None:
        """Feed the followed phase's times that the timer wrote since the last step.

        The timer writes a sampled step's records some steps later (at its flush, once
        the device has passed them); the times of one step are summed (a phase may run
        several times a step) and fed once a later step's arrive.
        """
        if profiled:
            self._profiled.append(step)
        timer = self._timer
        if timer is None:
            return
        for sampled, seconds in timer.take_followed():
            if sampled == self._phase_step:
                self._phase_sum += seconds
                continue
            done, total = self._phase_step, self._phase_sum
            self._phase_step, self._phase_sum = sampled, seconds
            if done is None or done in self._profiled or not enabled:
                continue
            slow = detector.observe(done, total)
            if slow is not None:
                found.append(slow)
            if detector.exhausted:
                self._stop_phase()
                return

    def stop(self, steps: int) -> None:
        """At the end of the run: a followed phase that never got a timing record is config
        that did nothing (a misspelt name, a phase never entered, a timer past its end_step)."""
        timer = self._timer
        if self._phase is None or timer is None:
            return
        if self._phase_step is None and not timer.take_followed():
            logger.warning(
                "rankscope: trace.auto.phase is %r but the phase timer recorded no phase of "
                "that name on rank %d in %d steps (is it entered, and spelt so?); its time "
                "was never followed",
                self._auto.phase,
                self._rank,
                steps,
            )

    def _stop_phase(self) -> None:
        self._phase = None
        self.detecting = self.steps is not None
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.follow(None)

    def give_up(self, exc: Exception) -> None:
        """Asking for a window of what it found failed: follow nothing more, and say so once."""
        self.steps = None
        self._stop_phase()  # and so detecting is False
        self.failed(
            "step times" if self._auto.phase is None else f"phase {self._auto.phase!r}", exc
        )

    def failed(self, what: str, exc: Exception) -> None:
        """Say once that following `what` failed and anomaly windows are off."""
        logger.warning(
            "rankscope: following %s failed (%s: %s); anomaly windows are off for the rest of "
            "this run (rank %d), training goes on",
            what,
            type(exc).__name__,
            exc,
            self._rank,
        )
