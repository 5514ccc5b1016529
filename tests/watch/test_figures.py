"""The figures' rules (watch/_figures.py), table-tested on steps built by hand."""

from __future__ import annotations

import pytest

from rankscope.watch._figures import (
    FINDING_SHARE,
    STALE_NS,
    across_figures,
    health_figures,
    own_figures,
)
from rankscope.watch._tails import StepTimes


def _steps(
    step_ms: float, phases: dict[str, tuple[str, float]], steps: range
) -> dict[int, StepTimes]:
    out = {}
    for s in steps:
        t = StepTimes()
        t.step_ms = step_ms
        t.phases = dict(phases)
        out[s] = t
    return out


def _job(slow_rank: int, slow_ms: float, world: int = 4, steps: range = range(10)) -> dict:
    """Every rank computes 10 ms and all-reduces; `slow_rank` computes `slow_ms` and the
    others wait for it in the all-reduce, so every step takes as long on every rank."""
    step = max(10.0, slow_ms) + 1.0
    return {
        r: _steps(
            step,
            {
                "compute": ("compute", slow_ms if r == slow_rank else 10.0),
                "all_reduce": ("comm", step - (slow_ms if r == slow_rank else 10.0)),
            },
            steps,
        )
        for r in range(world)
    }


def test_the_slow_rank_is_told_by_its_busy_time_though_every_step_takes_as_long() -> None:
    got = across_figures(_job(slow_rank=2, slow_ms=40.0))
    assert got["rankscope/ranks/compared"] == 4
    assert got["rankscope/ranks/left_out"] == 0
    assert got["rankscope/ranks/step_ms"] == 41.0
    assert got["rankscope/ranks/slowest_rank"] == 2
    assert got["rankscope/ranks/slowest_busy_ms"] == 40.0
    assert got["rankscope/ranks/median_busy_ms"] == 10.0
    assert got["rankscope/ranks/slowest_ratio"] == 4.0
    # The finding: rank 2's compute, 30 ms a step above the ranks' median; the waits
    # in the all-reduce (kind "comm") are never a finding.
    assert got["rankscope/straggler/rank"] == 2
    assert got["rankscope/straggler/ms"] == 30.0
    assert got["rankscope/straggler/phase/compute"] == 1.0
    assert "rankscope/straggler/phase/all_reduce" not in got


def test_an_excess_under_the_share_of_a_step_is_no_finding() -> None:
    # 10.3 ms against 10: 0.3 ms, under FINDING_SHARE of an 11.3 ms step.
    assert FINDING_SHARE * 11.3 > 0.3
    got = across_figures(_job(slow_rank=1, slow_ms=10.3))
    assert got["rankscope/straggler/rank"] == -1
    assert got["rankscope/straggler/ms"] == 0.0
    assert got["rankscope/straggler/phase/compute"] == 0.0
    assert got["rankscope/ranks/slowest_rank"] == 1  # still the slowest, by a little


def test_ranks_are_compared_on_the_latest_steps_all_have_and_a_rank_behind_is_left_out() -> None:
    ranks = _job(slow_rank=0, slow_ms=10.0, world=3, steps=range(20))
    ranks[3] = _job(slow_rank=3, slow_ms=50.0, world=4, steps=range(4))[3]  # stopped at step 3
    for r in (0, 1):  # two ranks wrote steps 20-21 already; rank 2 has not yet
        ranks[r].update(_job(slow_rank=r, slow_ms=90.0, world=2, steps=range(20, 22))[r])
    got = across_figures(ranks)
    # Steps 12..19: held by ranks 0-2; rank 3 is behind, and the new steps wait.
    assert (got["rankscope/ranks/compared"], got["rankscope/ranks/left_out"]) == (3, 1)
    assert got["rankscope/ranks/slowest_busy_ms"] == 10.0
    assert got["rankscope/straggler/rank"] == -1


def test_one_rank_says_how_many_it_compared_and_nothing_across() -> None:
    assert across_figures(_job(0, 10.0, world=1)) == {
        "rankscope/ranks/compared": 1.0,
        "rankscope/ranks/left_out": 0.0,
    }
    assert across_figures({}) == {}


def test_this_ranks_figures_cover_the_steps_after_the_last_log() -> None:
    steps = _steps(20.0, {"forward": ("compute", 12.0)}, range(0, 30, 10))
    steps[40] = StepTimes()  # phases written, its step record not yet: not counted
    steps[40].phases = {"forward": ("compute", 99.0)}
    steps[20].phases = {"forward": ("compute", 15.0), "odd name/é": ("io", 1.0)}
    assert own_figures(steps, after=-1) == (
        {
            "rankscope/step_ms": 20.0,
            "rankscope/sampled_steps": 3.0,
            "rankscope/phase_ms/forward": 12.0,
            "rankscope/phase_ms/odd_name__": 1.0,
        },
        20,
    )
    assert own_figures(steps, after=10)[0]["rankscope/phase_ms/forward"] == 15.0
    assert own_figures(steps, after=20) == ({}, 20)


@pytest.mark.parametrize(
    ("beat", "counted"),
    [
        ({"written_ns": 10**12, "state": "running", "hang": None}, "ok"),
        ({"written_ns": 10**12, "state": "running", "hang": "step-000003-ab"}, "hung"),
        ({"written_ns": 10**12 - STALE_NS - 1, "state": "running", "hang": None}, "stale"),
        ({"written_ns": 10**12 - STALE_NS - 1, "state": "stopped", "hang": None}, "ok"),
        ({"written_ns": 10, "state": "running", "hang": None}, "earlier start"),
        ({"written_ns": "soon", "state": "running"}, "earlier start"),
        ({"written_ns": True, "state": "running"}, "earlier start"),
    ],
)
def test_a_heartbeat_counts_as_hung_stale_or_neither(beat: dict, counted: str) -> None:
    got = health_figures([beat], now_ns=10**12, since_ns=10**9)
    if counted == "earlier start":  # no heartbeat of this launch read: no figures, not 0
        assert got == {}
        return
    assert got == {
        "rankscope/ranks/heartbeats": 1.0,
        "rankscope/ranks/hung": float(counted == "hung"),
        "rankscope/ranks/stale": float(counted == "stale"),
    }


def test_ranks_with_no_step_in_common_are_compared_on_none() -> None:
    ranks = {0: _steps(5.0, {}, range(0, 3)), 1: _steps(5.0, {}, range(3, 6))}
    assert across_figures(ranks) == {
        "rankscope/ranks/compared": 0.0,
        "rankscope/ranks/left_out": 2.0,
    }
