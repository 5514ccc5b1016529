"""SIGUSR2 windows (trace.on_signal): planned like a trigger's, on the process's next steps."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import torch

import rankscope
from rankscope import ConfigError, Schedule
from rankscope.analysis import build_report
from rankscope.capture._trigger import SignalHook, install_signal_hook
from rankscope.rundir._trigger import Trigger, write_trigger

from .._helpers import final_files, profiler_steps, read_trace, tiny_model, tiny_step

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGUSR2"), reason="no SIGUSR2 here")


class Witness:
    """A handler of the test's own, installed before rankscope's: counts the signals that reach it."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.calls += 1


@pytest.fixture
def witness() -> Iterator[Witness]:
    """The test's own SIGUSR2 handler, so a signal never takes the default action (ending pytest)."""
    before = signal.getsignal(signal.SIGUSR2)
    handler = Witness()
    signal.signal(signal.SIGUSR2, handler)
    try:
        yield handler
    finally:
        signal.signal(signal.SIGUSR2, before)


def _send(witness: Witness) -> Callable[[], None]:
    """A callable that sends this process SIGUSR2 and returns once a handler has run."""

    def send() -> None:
        calls = witness.calls
        os.kill(os.getpid(), signal.SIGUSR2)
        deadline = time.monotonic() + 10
        while witness.calls == calls and time.monotonic() < deadline:
            time.sleep(0.001)  # Python runs handlers on the main thread between bytecodes
        assert witness.calls == calls + 1, "the signal did not reach the handler chain"

    return send


def _config(run: Path, **trace: Any) -> rankscope.ProfileConfig:
    trace.setdefault("enable", True)
    trace.setdefault("on_signal", True)
    trace.setdefault("trigger_check_every_n_steps", 0)  # the signal alone
    return rankscope.ProfileConfig(output_dir=run, trace=rankscope.TraceConfig(**trace))


def _train(run: Path, steps: int, config: rankscope.ProfileConfig, **at: Any) -> None:
    """Train `steps` steps; at[f"s{i}"] is called during step i (before its step() call)."""
    model, opt = tiny_model()
    with rankscope.Profiler(config, rank=0, world_size=1) as prof:
        for i in range(steps):
            tiny_step(model, opt, prof)
            if f"s{i}" in at:
                at[f"s{i}"]()
            prof.step()


def _windows(run: Path) -> list[str]:
    return sorted({f.split("/")[1] for f in final_files(run) if f.startswith("traces/")})


def _messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


# (schedule, trace.trigger_max_steps, the window, its steps)
_CASES = [
    # Seen at step() before step 6: warm up during step 7, record 8-9.
    (Schedule(warmup=1, active=2), 5, "step-000008-000009-sigusr2", [8, 9]),
    # No warm-up in the schedule: record from step 7.
    (Schedule(warmup=0, active=2), 5, "step-000007-000008-sigusr2", [7, 8]),
    # schedule.active is 4, trace.trigger_max_steps bounds the window to 2 steps.
    (Schedule(warmup=1, active=4), 2, "step-000008-000009-sigusr2", [8, 9]),
]


@pytest.mark.parametrize("case", _CASES, ids=["warmup", "cold", "bounded"])
def test_a_signal_records_the_next_steps_the_capture_can_start(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    witness: Witness,
    case: tuple[Schedule, int, str, list[int]],
) -> None:
    schedule, max_steps, window, steps = case
    config = _config(tmp_path, schedule=schedule, trigger_max_steps=max_steps)
    with caplog.at_level(logging.INFO, logger="rankscope"):
        _train(tmp_path, 13, config, s5=_send(witness))
    scheduled = f"step-{schedule.warmup:06d}-{schedule.warmup + schedule.active - 1:06d}"
    assert _windows(tmp_path) == sorted([scheduled, window])
    trace = read_trace(tmp_path / "traces" / window / "rank-00000.pt.trace.json.gz")
    assert profiler_steps(trace) == steps
    assert {"forward", "backward", "optimizer"} <= {ev.get("name") for ev in trace["traceEvents"]}
    said = [m for m in _messages(caplog, logging.INFO) if "SIGUSR2" in m]
    assert said == [
        f"rankscope: SIGUSR2 received before step 6: rank 0 records steps {steps[0]}-{steps[-1]} "
        f"into traces/{window}"
    ]
    assert _messages(caplog, logging.WARNING) == []
    assert witness.calls == 1  # the handler installed before rankscope's was called too
    (listed,) = [w for w in build_report(tmp_path)["kernels"]["windows"] if w["window"] == window]
    assert listed["why"] == ["SIGUSR2 asked for it (rank 0)"]
    assert signal.getsignal(signal.SIGUSR2) is witness  # and put back by stop()


def test_signals_while_a_window_is_pending_give_one_window_and_later_ones_another(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, witness: Witness
) -> None:
    send = _send(witness)

    def twice() -> None:
        send()
        send()

    with caplog.at_level(logging.INFO, logger="rankscope"):
        # Step 8 is asked for before step 6 (two signals, one request); the signals seen
        # before steps 7 and 8 fall while that window is ahead or recording. The one seen
        # before step 12 is a new request.
        _train(tmp_path, 16, _config(tmp_path), s5=twice, s6=send, s7=send, s11=send)
    assert _windows(tmp_path) == [
        "step-000001-000001",
        "step-000008-000008-sigusr2",
        "step-000014-000014-sigusr2",
    ]
    said = [m for m in _messages(caplog, logging.INFO) if "SIGUSR2" in m]
    assert len(said) == 4, said
    assert said[0].endswith(
        "before step 6: rank 0 records steps 8-8 into traces/step-000008-000008-sigusr2"
    )
    assert "before step 7 on rank 0; the window it asked for (steps 8-8) is not over" in said[1]
    assert "before step 8 on rank 0; the window it asked for (steps 8-8) is not over" in said[2]
    assert said[3].endswith(
        "before step 12: rank 0 records steps 14-14 into traces/step-000014-000014-sigusr2"
    )
    assert _messages(caplog, logging.WARNING) == []


def test_with_the_option_off_no_handler_is_installed_and_nothing_is_recorded(
    tmp_path: Path, witness: Witness
) -> None:
    seen: list[object] = []
    config = _config(tmp_path, on_signal=False)
    _train(
        tmp_path,
        12,
        config,
        s4=lambda: seen.append(signal.getsignal(signal.SIGUSR2)),
        s5=_send(witness),
    )
    assert seen == [witness]
    assert _windows(tmp_path) == ["step-000001-000001"]
    assert witness.calls == 1


def test_the_previous_handler_is_put_back_at_stop_even_the_default(
    tmp_path: Path, witness: Witness
) -> None:
    installed: list[object] = []
    prof = rankscope.Profiler(_config(tmp_path), rank=0, world_size=1)
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    prof.start()
    installed.append(signal.getsignal(signal.SIGUSR2))
    prof.step()
    prof.stop()
    assert isinstance(installed[0], SignalHook)
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL
    prof.stop()  # twice: still the default
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL


def test_hooks_released_in_any_order_leave_the_first_handler_in_place(witness: Witness) -> None:
    first = install_signal_hook(0)
    second = install_signal_hook(0)
    assert first is not None and second is not None and second.previous is first
    assert first.release() is False  # the second one is installed over it
    _send(witness)()
    assert (first.pending, second.pending) == (False, True)  # released: it only passes on
    assert second.release() is True
    assert signal.getsignal(signal.SIGUSR2) is witness


def test_a_signal_overlapping_a_scheduled_window_is_declined_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, witness: Witness
) -> None:
    config = _config(tmp_path, schedule=Schedule(wait=5, warmup=1, active=2))  # records 6-7
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        _train(tmp_path, 10, config, s3=_send(witness))
    assert _messages(caplog, logging.WARNING) == [
        "rankscope: SIGUSR2 received before step 4; no window on rank 0: "
        "step 6 already belongs to the schedule"
    ]
    assert _windows(tmp_path) == ["step-000006-000007"]


def test_a_signal_and_a_trigger_file_share_the_plan(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, witness: Witness
) -> None:
    config = _config(tmp_path, trigger_check_every_n_steps=1)

    def both() -> None:
        write_trigger(tmp_path, Trigger("first", 8, 1, "0"))
        _send(witness)()

    with caplog.at_level(logging.WARNING, logger="rankscope"):
        _train(tmp_path, 12, config, s5=both)  # both seen at step() before step 6
    assert _messages(caplog, logging.WARNING) == [
        "rankscope: SIGUSR2 received before step 6; no window on rank 0: "
        "step 8 already belongs to an earlier trigger's window"
    ]
    assert _windows(tmp_path) == ["step-000001-000001", "step-000008-000008-trigger-first"]


def test_a_user_profiler_running_when_the_window_begins_is_left_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, witness: Witness
) -> None:
    theirs = torch.profiler.profile()
    send = _send(witness)

    def signal_and_profile() -> None:
        send()
        theirs.start()

    with caplog.at_level(logging.WARNING, logger="rankscope"):
        _train(tmp_path, 10, _config(tmp_path), s5=signal_and_profile)
        theirs.stop()
    assert _messages(caplog, logging.WARNING) == [
        "rankscope: the SIGUSR2 window (steps 8-8) not captured on rank 0: "
        "another torch.profiler was running in this process"
    ]
    assert _windows(tmp_path) == ["step-000001-000001"]


def test_a_run_that_stops_before_the_window_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, witness: Witness
) -> None:
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        _train(tmp_path, 7, _config(tmp_path), s5=_send(witness))  # asks for step 8
    assert _messages(caplog, logging.WARNING) == [
        "rankscope: SIGUSR2 asked rank 0 for steps 8-8; the run stopped at step 7"
    ]
    assert _windows(tmp_path) == ["step-000001-000001"]


def test_off_the_main_thread_one_warning_and_the_rest_works(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, witness: Witness
) -> None:
    seen: list[object] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            _train(
                tmp_path,
                4,
                _config(tmp_path),
                s2=lambda: seen.append(signal.getsignal(signal.SIGUSR2)),
            )
        except BaseException as exc:  # surfaced below, on the test's thread
            errors.append(exc)

    with caplog.at_level(logging.WARNING, logger="rankscope"):
        thread = threading.Thread(target=run, name="trainer")
        thread.start()
        thread.join()
    assert errors == []
    assert seen == [witness]  # nothing installed
    (warned,) = _messages(caplog, logging.WARNING)
    assert "trace.on_signal is set but the profiler was started on thread 'trainer'" in warned
    assert "SIGUSR2 starts no window on rank 0" in warned
    assert signal.getsignal(signal.SIGUSR2) is witness
    assert _windows(tmp_path) == ["step-000001-000001"]


def test_on_a_platform_without_sigusr2_one_warning_and_the_rest_works(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(signal, "SIGUSR2")
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        _train(tmp_path, 4, _config(tmp_path))
    (warned,) = _messages(caplog, logging.WARNING)
    assert "trace.on_signal is set but this platform has no SIGUSR2" in warned
    assert _windows(tmp_path) == ["step-000001-000001"]


@pytest.mark.parametrize(
    ("trace", "message"),
    [
        ({"on_signal": 1}, "trace.on_signal=1 is not valid; accepted: True or False"),
        (
            {"on_signal": True, "target": "phase:forward"},
            "trace.on_signal=True is not valid: a SIGUSR2 window records steps, and "
            "trace.target is 'phase:forward'",
        ),
    ],
)
def test_a_bad_on_signal_is_refused_at_construction(trace: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        rankscope.TraceConfig(**trace)
    assert str(caught.value).startswith(message)


def test_a_signal_that_lands_inside_step_on_an_idle_rank_is_not_lost(
    tmp_path: Path, witness: Witness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trigger checks off, the schedule's window over: step() has nothing to do until a
    signal. One that arrives while step() runs (here: from inside it) still plans a window."""
    from rankscope.capture._schedule import StepPlan

    send = _send(witness)
    real = StepPlan.forget_before
    sent: list[int] = []

    def forget_before(plan: StepPlan, step: int) -> None:
        if step == 2 and not sent:
            sent.append(step)
            send()  # between reading the signal flag and deciding when to look again
        real(plan, step)

    monkeypatch.setattr(StepPlan, "forget_before", forget_before)
    _train(tmp_path, 12, _config(tmp_path))
    assert sent == [2]
    assert _windows(tmp_path) == ["step-000001-000001", "step-000005-000005-sigusr2"]
