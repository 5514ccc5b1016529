"""The anomaly detector (capture/_anomaly.py): it returns slow stretches and plans nothing."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from rankscope.capture._anomaly import AnomalyDetector
from rankscope.config._trace import AutoTrigger

AUTO = AutoTrigger(enable=True, warmup_steps=5, consecutive=2, ratio=2.0, max_captures=1)


def _feed(
    detector: AnomalyDetector, times: list[float], profiled: set[int] = frozenset()
) -> list[int]:  # type: ignore[assignment]
    """Feed step times in order; the steps whose measurement completed a slow stretch."""
    now = 0.0
    detector.step_began = now
    fired = []
    for step, seconds in enumerate(times):
        now += seconds
        for slow in detector.observe(step, now, step in profiled, enabled=True):
            fired.append(slow.step)
        detector.step_began = now
    return fired


def test_two_slow_steps_in_a_row_fire_once_then_the_detector_is_done() -> None:
    detector = AnomalyDetector(AUTO, rank=0)
    assert _feed(detector, [1.0] * 8 + [3.0, 3.0] + [3.0] * 4) == [9]
    assert not detector.detecting  # max_captures reached: nothing left to measure


def test_steps_a_window_recorded_in_are_not_fed() -> None:
    detector = AnomalyDetector(AUTO, rank=0)
    assert _feed(detector, [1.0] * 8 + [3.0, 3.0], profiled={8, 9}) == []
    assert detector.detecting


def test_nothing_is_fed_once_capture_is_off() -> None:
    detector = AnomalyDetector(AUTO, rank=0)
    now = 0.0
    for step in range(12):
        now += 3.0 if step >= 8 else 1.0
        assert not detector.observe(step, now, profiled=False, enabled=False)
        detector.step_began = now


class _Timer:
    """What the detector reads of a PhaseTimer: the followed phase's (step, seconds) records."""

    def __init__(self, records: list[tuple[int, float]]) -> None:
        self.records = records
        self.followed: str | None = None

    def follow(self, phase: str | None) -> None:
        self.followed = phase

    def take_followed(self) -> list[tuple[int, float]]:
        out, self.records = self.records, []
        return out


def test_a_phase_is_summed_per_step_and_fed_when_the_next_step_arrives() -> None:
    detector = AnomalyDetector(dataclasses.replace(AUTO, phase="forward"), rank=1)
    assert detector.measured == "phase forward"
    # two invocations a step: 0.5 + 0.5 normally, 1.5 + 1.5 from step 8
    records = [(s, 1.5 if s >= 8 else 0.5) for s in range(12) for _ in range(2)]
    timer = _Timer(records)
    detector.attach_timer(timer)  # type: ignore[arg-type]
    assert timer.followed == "forward"
    found = detector.observe(12, 0.0, profiled=False, enabled=True)
    assert [(s.steps, s.seconds) for s in found] == [((8, 9), (3.0, 3.0))]
    assert not detector.detecting and timer.followed is None  # done: the timer stops keeping them


def test_a_phase_without_the_timer_is_said_and_not_followed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    detector = AnomalyDetector(AutoTrigger(enable=True, phase="forward"), rank=2)
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        detector.attach_timer(None)
    assert not detector.detecting
    assert "does not run on rank 2" in caplog.text


def test_a_fault_inside_the_detector_turns_it_off_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    detector = AnomalyDetector(AUTO, rank=0)
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        assert not detector.observe(0, "not a time", profiled=False, enabled=True)  # type: ignore[arg-type]
    assert not detector.detecting
    assert "following step times failed" in caplog.text
