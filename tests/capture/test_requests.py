"""The one door for windows asked for at run time (capture/_requests.py), without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rankscope.capture._requests import Asked, WindowRequests
from rankscope.capture._schedule import Action, StepPlan
from rankscope.config._trace import Schedule, TraceConfig

SIGNAL = Asked("SIGUSR2", "sigusr2")
SLOW = Asked("slow steps", "slow-steps", {"by": "auto"})


def _door(scheduled: bool = True, **trace: object) -> WindowRequests:
    schedule = trace.pop("schedule", Schedule(wait=4, warmup=1, active=2))  # window 5-6
    config = TraceConfig(enable=True, schedule=schedule, **trace)  # type: ignore[arg-type]
    return WindowRequests(config, StepPlan(config.schedule if scheduled else None))


@pytest.mark.parametrize(
    ("first", "steps", "step", "answer"),
    [
        (10, 2, 3, (10, 11, 9)),  # granted, after a warm-up step
        (7, 1, 3, (7, 7, None)),  # step 6 ends the schedule's window: no warm-up there
        (10, 9, 3, "it asks for 9 steps; trace.trigger_max_steps is 8"),
        (10, 2, 10, "seen at step 10, too late for its start step 10"),
        (10, 2, 12, "seen at step 12, too late for its start step 10"),
        (6, 2, 1, "step 6 already belongs to the schedule"),
        (4, 1, 3, "step 4 already belongs to the schedule"),  # its warm-up step
        (3, 1, 1, (3, 3, 2)),
        (3, 1, 2, (3, 3, None)),  # its warm-up step 2 is not ahead of step 2: starts cold
        (8, 1, 3, (8, 8, 7)),  # the schedule's window ended at 6: 7 is free to warm up
    ],
)
def test_a_request_gets_a_window_or_a_reason(
    first: int, steps: int, step: int, answer: tuple[int, int, int | None] | str
) -> None:
    door = _door(trigger_max_steps=8)
    got = door.ask(SIGNAL, first, steps, step)
    if isinstance(answer, str):
        assert got == answer
        assert door.plan.added == ()
    else:
        assert not isinstance(got, str)
        assert (got.first, got.last, got.warmup) == answer
        assert door.plan.action(got.last) is Action.RECORD_AND_SAVE


def test_windows_never_overlap_whoever_asks() -> None:
    door = _door(scheduled=False)
    first = door.ask(Asked("trigger t-1", "trigger-t-1"), 10, 2, 3)
    assert not isinstance(first, str)
    assert door.ask(SIGNAL, 11, 2, 3) == "step 11 already belongs to an earlier trigger's window"
    assert door.ask_next(SLOW, 2, 8) == "step 10 already belongs to an earlier trigger's window"


def test_the_next_steps_follow_a_warm_up_step_where_the_schedule_has_one() -> None:
    warm = _door(scheduled=False)
    window = warm.ask_next(SLOW, 3, 20)
    assert not isinstance(window, str)
    assert (window.warmup, window.first, window.last) == (21, 22, 24)
    cold = _door(scheduled=False, schedule=Schedule(wait=4, warmup=0, active=2))
    window = cold.ask_next(SLOW, 3, 20)
    assert not isinstance(window, str)
    assert (window.warmup, window.first, window.last) == (None, 21, 23)


def test_a_signal_window_is_the_schedules_length_within_the_cap() -> None:
    assert _door(schedule=Schedule(active=3)).signal_steps == 3
    assert _door(schedule=Schedule(active=12), trigger_max_steps=4).signal_steps == 4


def test_who_asked_names_the_window_and_is_found_by_its_first_step() -> None:
    door = _door(scheduled=False)
    window = door.ask_next(SLOW, 2, 20)
    assert not isinstance(window, str)
    assert door.name(window) == "step-000022-000023-slow-steps"
    assert door.by_first(22) is SLOW
    assert door.by_first(5) is None  # the schedule's windows: nobody asked
    assert door.open_for("slow steps", 23) == window
    assert door.open_for("slow steps", 24) is None
    assert door.open_for("SIGUSR2", 20) is None


def test_dropped_and_missed_windows_say_who_asked() -> None:
    door = _door(scheduled=False)
    early = door.ask(SIGNAL, 10, 2, 3)
    late = door.ask(SLOW, 30, 2, 3)
    assert not isinstance(early, str) and not isinstance(late, str)
    assert door.not_begun(20) == [(late, SLOW)]
    assert door.drop_next(8) == [(early, SIGNAL)]  # 9 warms up for 10
    assert door.plan.added == (late,)
    assert door.not_begun(3) == [(late, SLOW)]


def test_the_door_imports_no_torch() -> None:
    code = "import sys, rankscope.capture._requests; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
