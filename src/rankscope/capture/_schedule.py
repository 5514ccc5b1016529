"""Pure schedule decisions: which action a step gets and which steps a window covers.

`action_at` gives torch.profiler.schedule's answers exactly (a table test holds it to
that); the rest is derived from it, so windows are named from the same rules that
drive the profiler.
"""

from __future__ import annotations

import enum

from .._config import Schedule

__all__ = ["Action", "action_at", "last_step", "window_start", "windows"]


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
