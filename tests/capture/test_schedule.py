from __future__ import annotations

import itertools

import pytest
import torch.profiler

from rankscope import Schedule
from rankscope.capture import Action, action_at, last_step, window_start, windows

GRID = [
    dict(skip_first=s, wait=w, warmup=u, active=a, repeat=r)
    for s, w, u, a, r in itertools.product([0, 1, 3], [0, 2], [0, 1, 2], [1, 3], [0, 1, 2])
]


@pytest.mark.parametrize("params", GRID, ids=lambda p: "-".join(str(v) for v in p.values()))
def test_action_matches_torch_schedule(params: dict[str, int]) -> None:
    ours = Schedule(**params)
    theirs = torch.profiler.schedule(**params)
    for step in range(40):
        assert action_at(ours, step).name == theirs(step).name, step


def test_default_schedule_records_step_one() -> None:
    assert [action_at(Schedule(), s) for s in range(3)] == [
        Action.WARMUP,
        Action.RECORD_AND_SAVE,
        Action.NONE,
    ]


def test_windows_of_a_repeating_schedule() -> None:
    sched = Schedule(skip_first=2, wait=1, warmup=1, active=2, repeat=2)
    # skip 0-1; wait 2, warmup 3, record 4-5; wait 6, warmup 7, record 8-9
    assert windows(sched, stop_step=20) == [(4, 5), (8, 9)]
    assert last_step(sched) == 9


def test_window_cut_short_by_stop_is_kept() -> None:
    sched = Schedule(wait=0, warmup=1, active=4, repeat=1)
    assert windows(sched, stop_step=3) == [(1, 3)]
    assert windows(sched, stop_step=1) == [(1, 1)]
    assert windows(sched, stop_step=0) == []


def test_repeat_zero_cycles_until_stop() -> None:
    sched = Schedule(wait=1, warmup=0, active=1, repeat=0)
    assert last_step(sched) is None
    assert windows(sched, stop_step=7) == [(1, 1), (3, 3), (5, 5), (7, 7)]


def test_window_start_walks_back_over_recorded_steps() -> None:
    sched = Schedule(wait=2, warmup=1, active=3)
    assert window_start(sched, 5) == 3
    assert window_start(sched, 4) == 3


def test_an_idle_capture_wakes_at_its_next_check_or_added_window() -> None:
    """StepPlan.next_work: the step a capture holding no profiler next has work at."""
    from rankscope.capture._schedule import StepPlan

    plan = StepPlan(Schedule(wait=0, warmup=1, active=2, repeat=1))  # steps 0-2
    assert plan.next_work(1, check_every=10) == 0  # the schedule still runs
    assert plan.next_work(13, check_every=10) == 20  # its next trigger check
    assert plan.next_work(13, check_every=0) > 10**9  # never: nothing to check
    plan.add(16, 17, warmup=True, after=13)  # warm-up at 15: the profiler starts in step 14
    assert plan.next_work(13, check_every=10) == 14
    assert plan.next_work(13, check_every=0) == 14
