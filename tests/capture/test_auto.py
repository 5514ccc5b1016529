"""Anomaly-triggered windows (trace.auto): a rank whose steps turn slow captures the next ones."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import rankscope
from rankscope import AutoTrigger, ConfigError, Schedule
from rankscope.analysis import build_report, find_traces
from rankscope.capture._auto import MEDIAN_REFRESH, SlowdownDetector, SlowSteps
from rankscope.testing._gloo import GlooRanks

from .._helpers import profiler_steps, read_trace, tiny_model, tiny_step

# -- the decision, table-tested ------------------------------------------------------


def _fires(times: list[float], **auto: Any) -> list[SlowSteps]:
    """Feed step times 0, 1, 2, ... to a detector; the SlowSteps it returned."""
    detector = SlowdownDetector(AutoTrigger(enable=True, **auto))
    return [s for i, t in enumerate(times) if (s := detector.observe(i, t)) is not None]


SMALL = {"warmup_steps": 5, "history_steps": 10, "consecutive": 3, "ratio": 2.0}


@pytest.mark.parametrize(
    ("times", "auto", "fired_at"),
    [
        # steady: nothing
        ([1.0] * 40, SMALL, []),
        # three slow steps in a row fire on the third
        ([1.0] * 10 + [3.0] * 3 + [1.0] * 10, SMALL, [12]),
        # two slow, one normal, two slow: never three in a row
        ([1.0] * 10 + [3.0, 3.0, 1.0, 3.0, 3.0] + [1.0] * 10, SMALL, []),
        # exactly ratio x median is not slow
        ([1.0] * 10 + [2.0] * 3 + [1.0] * 10, SMALL, []),
        # slow during warm-up does not count
        ([1.0, 1.0, 9.0, 9.0, 9.0] + [1.0] * 10, SMALL, []),
        # a long slow stretch fires once per `consecutive` steps without a cool-down...
        ([1.0] * 10 + [3.0] * 6 + [1.0] * 10, {**SMALL, "cooldown_steps": 0}, [12, 15]),
        # ...and once with one
        ([1.0] * 10 + [3.0] * 6 + [1.0] * 10, {**SMALL, "cooldown_steps": 50}, [12]),
        # a second stretch inside the cool-down is ignored, one after it fires
        (
            [1.0] * 10 + [3.0] * 3 + [1.0] * 7 + [3.0] * 3 + [1.0] * 20 + [3.0] * 3,
            {**SMALL, "cooldown_steps": 20},
            [12, 45],
        ),
        # max_captures bounds them
        (
            ([1.0] * 10 + [3.0] * 3) * 5,
            {**SMALL, "cooldown_steps": 0, "max_captures": 2},
            [12, 25],
        ),
        # consecutive=1: a single slow step fires
        ([1.0] * 10 + [3.0] + [1.0] * 5, {**SMALL, "consecutive": 1}, [10]),
    ],
)
def test_the_rule_fires_at_the_step_that_completes_a_slow_stretch(
    times: list[float], auto: dict[str, Any], fired_at: list[int]
) -> None:
    assert [s.step for s in _fires(times, **auto)] == fired_at


def test_the_figures_are_the_slow_steps_and_the_median_they_were_compared_with() -> None:
    times = [1.0, 1.2, 0.8, 1.0, 1.1, 0.9, 1.0, 1.0, 1.0, 1.0, 2.5, 3.0, 2.6]
    (slow,) = _fires(times, **SMALL)
    assert slow == SlowSteps(
        step=12, seconds=(2.5, 3.0, 2.6), steps=(10, 11, 12), median=1.0, ratio=2.0, capture=1
    )


def test_a_job_slow_from_the_start_never_fires() -> None:
    assert _fires([5.0] * 1000, **SMALL, cooldown_steps=0, max_captures=100) == []


def test_a_lasting_slowdown_becomes_the_new_normal_and_stops_firing() -> None:
    """Slow steps join the history, so a job that turned slow for good stops looking slow."""
    times = [1.0] * 20 + [3.0] * 500
    fired = _fires(times, **SMALL, cooldown_steps=0, max_captures=100)
    assert fired, "the step-up itself is an anomaly"
    # within history_steps (+ the median's refresh interval) of the change
    assert max(s.step for s in fired) < 20 + 10 + MEDIAN_REFRESH


def test_after_max_captures_the_detector_says_it_is_done() -> None:
    detector = SlowdownDetector(AutoTrigger(enable=True, **SMALL, max_captures=1))
    for i, t in enumerate([1.0] * 10 + [3.0] * 3):
        detector.observe(i, t)
    assert detector.exhausted and detector.fired == 1


@pytest.mark.parametrize(
    ("auto", "field"),
    [
        ({"ratio": 1.0}, "trace.auto.ratio"),
        ({"ratio": float("nan")}, "trace.auto.ratio"),
        ({"ratio": True}, "trace.auto.ratio"),
        ({"ratio": "2"}, "trace.auto.ratio"),
        ({"consecutive": 0}, "trace.auto.consecutive"),
        ({"window_steps": 0}, "trace.auto.window_steps"),
        ({"history_steps": 2}, "trace.auto.history_steps"),
        ({"warmup_steps": 1}, "trace.auto.warmup_steps"),
        ({"max_captures": 0}, "trace.auto.max_captures"),
        ({"cooldown_steps": -1}, "trace.auto.cooldown_steps"),
        ({"enable": "yes"}, "trace.auto.enable"),
        ({"colour": 1}, "trace.auto.colour"),
        ({"enable": True, "window_steps": 9}, "trace.auto.window_steps"),  # > trigger_max_steps
    ],
)
def test_a_bad_auto_value_is_refused_naming_the_field(auto: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        rankscope.ProfileConfig.from_dict({"trace": {"auto": auto}})
    assert err.value.field == field, str(err.value)


def test_auto_needs_the_step_target() -> None:
    with pytest.raises(ConfigError, match=r"trace\.auto\.enable"):
        rankscope.TraceConfig(target="phase:forward", auto=AutoTrigger(enable=True))
    with pytest.raises(ConfigError, match=r"trace\.auto="):
        rankscope.TraceConfig(auto={"enable": True})  # type: ignore[arg-type]


def test_auto_reads_back_from_a_dict() -> None:
    config = rankscope.ProfileConfig.from_dict(
        {"trace": {"enable": True, "auto": {"enable": True, "ratio": 2, "max_captures": 1}}}
    )
    assert config.trace.auto == AutoTrigger(enable=True, ratio=2.0, max_captures=1)
    assert rankscope.ProfileConfig.from_dict(config.to_dict()) == config


# -- a real loop on one process ----------------------------------------------------------

# Every step sleeps BASE_S, so scheduler jitter is small beside it: at 4 ms, a step of a
# full test run on a loaded 2-core machine took 3x the median by itself and fired.
BASE_S = 0.01
SLOW_S = 0.08  # injected slow steps: 8x, far past any ratio used here
LOOP_AUTO = {"enable": True, "ratio": 3.0, "warmup_steps": 8, "history_steps": 20}


def _run(run_dir: Path, steps: int, slow: set[int], **auto: Any) -> Path:
    """A tiny training loop; steps in `slow` sleep SLOW_S, the others BASE_S."""
    config = rankscope.ProfileConfig(
        output_dir=run_dir,
        trace=rankscope.TraceConfig(
            enable=True,
            schedule=Schedule(warmup=1, active=1),
            auto=AutoTrigger(**{**LOOP_AUTO, **auto}),
            trigger_check_every_n_steps=0,
        ),
    )
    model, opt = tiny_model()
    with rankscope.Profiler(config, rank=0, world_size=1) as prof:
        for i in range(steps):
            time.sleep(SLOW_S if i in slow else BASE_S)
            tiny_step(model, opt, prof)
            prof.step()
    return run_dir


def _auto_lines(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "auto" / "rank-00000.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _windows(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "traces").iterdir())


@pytest.mark.slow
def test_slow_steps_capture_the_next_window_once_with_the_figures(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rankscope")
    run_dir = _run(tmp_path, 45, slow={20, 21, 22})
    (line,) = _auto_lines(run_dir)
    # Step 22 completes the stretch; the window starts after a warm-up step, as SIGUSR2's does.
    assert line["status"] == "accepted" and line["slow_steps"] == [20, 21, 22]
    assert (line["first"], line["last"]) == (25, 26)
    # The folder says why it was captured; the window's summary keeps the figures.
    window = "step-000025-000026-slow-steps"
    assert line["window"] == window and line["measured"] == "step"
    assert all(s >= SLOW_S for s in line["step_s"])
    assert BASE_S <= line["median_s"] < SLOW_S and line["ratio"] == 3.0
    assert _windows(run_dir) == ["step-000001-000001", window]
    trace = read_trace(run_dir / "traces" / window / "rank-00000.pt.trace.json.gz")
    assert profiler_steps(trace) == [25, 26]
    summary = json.loads((run_dir / "traces" / window / "rank-00000.summary.json").read_text())
    because = summary["captured_because"]
    assert because["by"] == "auto" and because["slow_steps"] == [20, 21, 22]
    assert because["step_s"] == line["step_s"] and because["median_s"] == line["median_s"]
    assert any("were slow on rank 0" in r.getMessage() for r in caplog.records)
    # The analysis finds the window like any other.
    found = find_traces([run_dir])
    assert {p.parent.name for p in found} == {"step-000001-000001", window}
    listed = {w["window"] for w in build_report(run_dir)["kernels"]["windows"]}
    assert window in listed


@pytest.mark.slow
def test_a_clean_loop_stays_quiet(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, 60, slow=set())
    assert _auto_lines(run_dir) == []
    assert _windows(run_dir) == ["step-000001-000001"]


@pytest.mark.slow
def test_a_loop_slow_at_every_step_captures_nothing(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, 40, slow=set(range(40)))
    assert _auto_lines(run_dir) == []
    assert _windows(run_dir) == ["step-000001-000001"]


@pytest.mark.serial
@pytest.mark.slow
def test_repeated_slow_stretches_respect_cooldown_and_max_captures(tmp_path: Path) -> None:
    stretches = (15, 25, 45, 75)  # the one at 25 falls inside the cool-down after 15
    slow = {s + k for s in stretches for k in range(3)}
    run_dir = _run(tmp_path, 90, slow=slow, cooldown_steps=20, max_captures=2, warmup_steps=5)
    lines = _auto_lines(run_dir)
    assert [line["slow_steps"][-1] for line in lines] == [17, 47]
    assert [line["status"] for line in lines] == ["accepted", "accepted"]
    assert _windows(run_dir) == [
        "step-000001-000001",
        "step-000020-000021-slow-steps",
        "step-000050-000051-slow-steps",
    ]


@pytest.mark.slow
def test_an_anomaly_overlapping_the_schedule_is_declined_and_recorded(tmp_path: Path) -> None:
    config = rankscope.ProfileConfig(
        output_dir=tmp_path,
        trace=rankscope.TraceConfig(
            enable=True,
            schedule=Schedule(wait=30, warmup=1, active=2),  # records steps 31-32
            auto=AutoTrigger(**LOOP_AUTO),
            trigger_check_every_n_steps=0,
        ),
    )
    model, opt = tiny_model()
    with rankscope.Profiler(config, rank=0, world_size=1) as prof:
        for i in range(40):
            time.sleep(SLOW_S if i in (26, 27, 28) else BASE_S)  # would plan 30-32 (warm-up 30)
            tiny_step(model, opt, prof)
            prof.step()
    (line,) = _auto_lines(tmp_path)
    assert line["status"] == "declined" and "the schedule" in line["reason"]
    assert _windows(tmp_path) == ["step-000031-000032"]


# -- a named phase as the measurement (trace.auto.phase) ---------------------------------


def _phase_run(run_dir: Path, steps: int, slow_phase: set[int], slow_elsewhere: set[int]) -> Path:
    """Forward sleeps SLOW_S on `slow_phase` steps; the step (outside any phase) on
    `slow_elsewhere` steps, as a rank waiting for a straggler would."""
    config = rankscope.ProfileConfig(
        output_dir=run_dir,
        trace=rankscope.TraceConfig(
            enable=True,
            schedule=Schedule(warmup=1, active=1),
            auto=AutoTrigger(**LOOP_AUTO, phase="forward"),
            trigger_check_every_n_steps=0,
        ),
        timer=rankscope.TimerConfig(enable=True, every_n_steps=1, flush_every_n_steps=1),
    )
    model, opt = tiny_model()
    with rankscope.Profiler(config, rank=0, world_size=1) as prof:
        for i in range(steps):
            with prof.phase("forward"):
                time.sleep(SLOW_S if i in slow_phase else BASE_S)
                loss = model(torch.randn(4, 8)).sum()
            with prof.phase("backward"):
                loss.backward()
            opt.step()
            opt.zero_grad()
            time.sleep(SLOW_S if i in slow_elsewhere else 0)
            prof.step()
    return run_dir


@pytest.mark.slow
def test_a_slow_phase_fires_and_slow_steps_elsewhere_do_not(tmp_path: Path) -> None:
    # Steps 16-18 are slow outside forward (waiting, say); steps 30-32 are slow in forward.
    run_dir = _phase_run(tmp_path, 50, slow_phase={30, 31, 32}, slow_elsewhere={16, 17, 18})
    (line,) = _auto_lines(run_dir)
    assert line["status"] == "accepted" and line["measured"] == "phase forward"
    assert line["slow_steps"] == [30, 31, 32]
    assert all(s >= SLOW_S for s in line["step_s"]) and line["median_s"] < SLOW_S
    # The timer's records arrive a step or two late; the window starts after them.
    assert 32 < line["seen_at_step"] < line["first"] <= line["seen_at_step"] + 2
    window = f"step-{line['first']:06d}-{line['last']:06d}-slow-forward"
    assert line["window"] == window
    assert _windows(run_dir) == ["step-000001-000001", window]
    summary = json.loads((run_dir / "traces" / window / "rank-00000.summary.json").read_text())
    assert summary["captured_because"]["measured"] == "phase forward"
    (listed,) = [w for w in build_report(run_dir)["kernels"]["windows"] if w["window"] == window]
    (why,) = listed["why"]
    assert why.startswith("rank 0 asked for it: its phase forward on steps 30-32 took up to")


@pytest.mark.slow
def test_a_phase_watch_on_a_rank_without_the_timer_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = rankscope.ProfileConfig(
        output_dir=tmp_path,
        trace=rankscope.TraceConfig(enable=True, auto=AutoTrigger(enable=True, phase="forward")),
        timer=rankscope.TimerConfig(enable=True, ranks="1"),
    )
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        rankscope.Profiler(config, rank=0, world_size=2)
        rankscope.Profiler(config, rank=1, world_size=2)  # has the timer: no warning
    (warned,) = [r.getMessage() for r in caplog.records]
    assert "trace.auto.phase is 'forward' but the phase timer does not run on rank 0" in warned


def test_auto_ranks_widen_the_watch_beyond_trace_ranks(tmp_path: Path) -> None:
    auto = AutoTrigger(enable=True, ranks="all")
    config = rankscope.ProfileConfig(
        output_dir=tmp_path,
        trace=rankscope.TraceConfig(
            enable=True, ranks="0", auto=auto, trigger_check_every_n_steps=0
        ),
    )
    watching = rankscope.Profiler(config, rank=3, world_size=4)
    assert watching._capture is not None and watching._capture._anomaly is not None
    narrow = rankscope.ProfileConfig(
        output_dir=tmp_path,
        trace=rankscope.TraceConfig(
            enable=True, ranks="0", auto=AutoTrigger(enable=True), trigger_check_every_n_steps=0
        ),
    )
    assert rankscope.Profiler(narrow, rank=3, world_size=4)._capture is None


def test_a_watched_phase_that_never_ran_is_said_at_stop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = rankscope.ProfileConfig(
        output_dir=tmp_path,
        trace=rankscope.TraceConfig(
            enable=True,
            auto=AutoTrigger(enable=True, phase="forwrad"),
            trigger_check_every_n_steps=0,
        ),
        timer=rankscope.TimerConfig(enable=True, every_n_steps=1, flush_every_n_steps=1),
    )
    model, opt = tiny_model()
    profiler = rankscope.Profiler(config, rank=0, world_size=1)
    with caplog.at_level(logging.WARNING, logger="rankscope"), profiler as prof:
        for _ in range(6):
            tiny_step(model, opt, prof)  # forward, backward, optimizer: no "forwrad"
            prof.step()
    (warned,) = [r.getMessage() for r in caplog.records]
    assert (
        "trace.auto.phase is 'forwrad' but the phase timer recorded no phase of that name" in warned
    )
    assert "rank 0 in 6 steps" in warned


# -- spawned ranks over gloo: the straggler captures itself, the ranks waiting for it do not --

WORLD = 3
STRAGGLER = 2
SLOW_FROM = 30  # the straggler's forward sleeps SLOW_S from this step on
RUN_STEPS = 40


def _straggling_rank(rank: int, world_size: int, run_dir: str, phase: str) -> None:

    import torch.distributed as dist

    auto = AutoTrigger(**LOOP_AUTO, ranks="all", phase=phase or None)
    config = rankscope.ProfileConfig(
        output_dir=run_dir,
        trace=rankscope.TraceConfig(
            enable=True, ranks="0", auto=auto, trigger_check_every_n_steps=0
        ),
        timer=rankscope.TimerConfig(enable=True, every_n_steps=1, flush_every_n_steps=1),
    )
    model, opt = tiny_model()
    with rankscope.Profiler(config) as prof:
        for i in range(RUN_STEPS):
            with prof.phase("forward"):
                slow = rank == STRAGGLER and i >= SLOW_FROM
                time.sleep(SLOW_S if slow else BASE_S)
                loss = model(torch.randn(4, 8)).sum()
            with prof.phase("backward"):
                loss.backward()
            with prof.phase("loss_allreduce", kind="comm"):
                dist.all_reduce(loss.detach())  # every rank waits here for the straggler
            opt.step()
            opt.zero_grad()
            prof.step()
    dist.barrier()


def _spawn_straggler(gloo_ranks: GlooRanks, root: Path, phase: str) -> Path:
    gloo_ranks.run(_straggling_rank, WORLD, root, phase)
    return root


def _watched(
    gloo_ranks: GlooRanks, tmp_path: Path, phase: str
) -> tuple[Path, dict[int, list[dict[str, Any]]]]:
    """The straggler job run with every rank watching `phase` (the step: ""), and what
    each rank's watch fired."""
    run_dir = _spawn_straggler(gloo_ranks, tmp_path, phase)
    return run_dir, _fired(run_dir)


def _fired(run_dir: Path) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for path in sorted((run_dir / "auto").glob("rank-*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        out[int(path.stem[5:])] = lines
    return out


@pytest.mark.slow
def test_watching_a_phase_on_every_rank_captures_the_straggler_alone(
    tmp_path: Path, gloo_ranks: GlooRanks
) -> None:
    run_dir, fired = _watched(gloo_ranks, tmp_path, "forward")
    assert list(fired) == [STRAGGLER]
    (line,) = fired[STRAGGLER]
    assert line["status"] == "accepted" and line["slow_steps"] == [30, 31, 32]
    window = line["window"]
    assert window.endswith("-slow-forward")
    traced = sorted(p.name for p in (run_dir / "traces" / window).glob("*.pt.trace.json.gz"))
    assert traced == [f"rank-{STRAGGLER:05d}.pt.trace.json.gz"]


@pytest.mark.slow
def test_watching_the_step_on_every_rank_captures_the_waiting_ranks_too(
    tmp_path: Path, gloo_ranks: GlooRanks
) -> None:
    """Why `phase` exists: the ranks waiting for the straggler got slow steps as well."""
    _, fired = _watched(gloo_ranks, tmp_path, "")
    assert sorted(fired) == list(range(WORLD))
    assert all(lines[0]["measured"] == "step" for lines in fired.values())


@pytest.mark.slow
def test_a_fault_while_asking_for_a_slow_window_turns_the_detector_off_and_the_loop_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rankscope.capture._ondemand import OnDemand

    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("asking failed")

    monkeypatch.setattr(OnDemand, "on_slow", broken)
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        run_dir = _run(tmp_path, 45, slow={20, 21, 22})  # all 45 steps run: nothing raised
    warned = [r.getMessage() for r in caplog.records if "following" in r.getMessage()]
    assert len(warned) == 1
    assert "following step times failed (RuntimeError: asking failed)" in warned[0]
    assert _auto_lines(run_dir) == []
    assert _windows(run_dir) == ["step-000001-000001"]  # the schedule's window is kept
