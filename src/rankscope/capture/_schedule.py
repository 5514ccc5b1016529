"""Pure schedule decisions: which action a step gets and which steps a window covers.

`action_at` gives torch.profiler.schedule's answers exactly (a table test holds it to
that); the rest is derived from it, so windows are named from the same rules that
drive the profiler. `StepPlan` adds the windows that triggers ask for on top of the
schedule, under the same rules.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass

from ..config._trace import Schedule

__all__ = ["Action", "AddedWindow", "StepPlan", "action_at", "last_step", "window_start", "windows"]


class Action(enum.Enum):
    """The profiler's state for one step; mirrors torch.profiler.ProfilerAction."""

    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


def action_at(schedule: Schedule, step: int) -> Action:
    """The action for global step `step` (counting from 0)."""
    if step < schedule.skip_first:
        return Action.NONE
    step -= schedule.skip_first
    cycle = schedule.wait + schedule.warmup + schedule.active
    if schedule.repeat > 0 and step >= schedule.repeat * cycle:
        return Action.NONE
    pos = step % cycle
    if pos < schedule.wait:
        return Action.NONE
    if pos < schedule.wait + schedule.warmup:
        return Action.WARMUP
    return Action.RECORD if pos < cycle - 1 else Action.RECORD_AND_SAVE


def last_step(schedule: Schedule) -> int | None:
    """The last step the profiler is needed for; None when cycles repeat until stop."""
    if schedule.repeat == 0:
        return None
    cycle = schedule.wait + schedule.warmup + schedule.active
    return schedule.skip_first + schedule.repeat * cycle - 1


def window_start(schedule: Schedule, step: int) -> int:
    """The first recorded step of the window that `step` (a recorded step) belongs to."""
    first = step
    while first > 0 and action_at(schedule, first - 1) is Action.RECORD:
        first -= 1
    return first


def windows(schedule: Schedule, stop_step: int) -> list[tuple[int, int]]:
    """The (first, last) steps of every window saved when the profiler stops during `stop_step`.

    A loop that calls step() n times and then stop() stops during step n. A window
    still recording then is saved too, cut short at `stop_step`.
    """
    out = []
    for step in range(stop_step + 1):
        action = action_at(schedule, step)
        if action is Action.RECORD_AND_SAVE or (step == stop_step and action is Action.RECORD):
            out.append((window_start(schedule, step), step))
    return out


@dataclass(frozen=True, slots=True)
class AddedWindow:
    """A window added to a StepPlan: steps first..last recorded, after an optional warm-up step."""

    first: int
    last: int
    warmup: int | None
    """The warm-up step (first - 1), or None where the window starts cold."""


class StepPlan:
    """The action for every global step: the schedule's windows plus windows added on demand.

    `schedule` is None on a rank with no scheduled windows. Added windows never overlap
    another window (`conflict` says why one would), end with RECORD_AND_SAVE like every
    scheduled window, and so keep torch.profiler's transitions the ones its own
    schedule produces.
    """

    def __init__(self, schedule: Schedule | None) -> None:
        self._schedule = schedule
        self._schedule_last = -1 if schedule is None else last_step(schedule)
        self._added: list[AddedWindow] = []
        self.next_added: int | None = None
        """The first step (warm-up included) of the earliest added window not yet begun."""

    @property
    def added(self) -> tuple[AddedWindow, ...]:
        return tuple(self._added)

    def action(self, step: int) -> Action:
        for w in self._added:
            if w.first <= step <= w.last:
                return Action.RECORD_AND_SAVE if step == w.last else Action.RECORD
            if step == w.warmup:
                return Action.WARMUP
        if self._schedule is None:
            return Action.NONE
        return action_at(self._schedule, step)

    def records_invocation(self, call: int) -> bool:
        """True when invocation `call` (counting from 0) of a "phase:NAME" target records:
        the schedule counted in invocations instead of steps. Never without a schedule."""
        schedule = self._schedule
        if schedule is None:
            return False
        return action_at(schedule, call) in (Action.RECORD, Action.RECORD_AND_SAVE)

    def window_start(self, step: int) -> int:
        """The first recorded step of the window that `step` (a recorded step) belongs to."""
        first = step
        while first > 0 and self.action(first - 1) is Action.RECORD:
            first -= 1
        return first

    def schedule_over(self, step: int) -> bool:
        """True once `step` is past the schedule's last window (never for repeat=0)."""
        return self._schedule_last is not None and step > self._schedule_last

    def conflict(self, first: int, last: int) -> str | None:
        """Why steps first..last cannot be a new window (another window holds one of them), or None."""
        for step in range(first, last + 1):
            if self.action(step) is not Action.NONE:
                taken = "an earlier trigger's window" if self._in_added(step) else "the schedule"
                return f"step {step} already belongs to {taken}"
        return None

    def add(self, first: int, last: int, *, warmup: bool, after: int) -> AddedWindow:
        """Add the window first..last, decided during step `after`; raises ValueError on a conflict.

        With `warmup`, step first - 1 warms the profiler up when it is still ahead
        (> after) and free.
        """
        if not after < first <= last:
            raise ValueError(f"window {first}-{last} does not lie ahead of step {after}")
        problem = self.conflict(first, last)
        if problem is not None:
            raise ValueError(problem)
        warm = first - 1
        use_warmup = warmup and warm > after and self.action(warm) is Action.NONE
        window = AddedWindow(first, last, warm if use_warmup else None)
        self._added.append(window)
        self._added.sort(key=lambda w: w.first)
        self._update_next(after)
        return window

    def drop(self, window: AddedWindow, step: int) -> None:
        """Remove a window that will not be captured after all."""
        self._added = [w for w in self._added if w is not window]
        self._update_next(step)

    def forget_before(self, step: int) -> None:
        """Forget added windows that ended before `step - 1` (the last one's name is still needed)."""
        if not self._added:
            return
        if self._added[0].last < step - 1:
            self._added = [w for w in self._added if w.last >= step - 1]
        self._update_next(step)

    def idle(self, step: int) -> bool:
        """True when no window needs the profiler during `step` or the next one."""
        return (
            self.schedule_over(step)
            and self.action(step) is Action.NONE
            and self.action(step + 1) is Action.NONE
        )

    def next_work(self, step: int, check_every: int) -> int:
        """The next step at which a capture that holds no profiler and watches nothing
        each step has work: its next trigger check (every `check_every` steps; 0: never)
        or the warm-up of the next added window; 0 while the schedule still runs."""
        if not self.schedule_over(step):
            return 0
        wake = sys.maxsize
        if check_every:
            wake = (step // check_every + 1) * check_every
        if self.next_added is not None:
            wake = min(wake, self.next_added - 1)
        return wake

    def _in_added(self, step: int) -> bool:
        return any(step == w.warmup or w.first <= step <= w.last for w in self._added)

    def _update_next(self, step: int) -> None:
        starts = [w.first if w.warmup is None else w.warmup for w in self._added]
        ahead = [s for s in starts if s > step]
        self.next_added = min(ahead) if ahead else None
