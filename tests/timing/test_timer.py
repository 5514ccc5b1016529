"""The phase timer: sampling, records, nesting, threads, device events, decorators, faults."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch

import rankscope
from rankscope import ConfigError, Profiler, TimerConfig
from rankscope.config._ranks import RankInfo
from rankscope.testing._clock import CountingClock
from rankscope.timing import (
    CudaEventClock,
    DeviceClock,
    PhaseTimer,
    is_sampled,
    sampled_steps,
)

RECORD_KEYS = {
    "v",
    "rank",
    "step",
    "phase",
    "kind",
    "start_ns",
    "cpu_ms",
    "gpu_ms",
    "depth",
    "error",
    "oncpu_ms",
    "runq_ms",  # Linux: this machine's kernel counts each thread's wait for a CPU
}
PHASES = ("data", "forward", "backward", "allreduce", "optimizer")


def timer_config(run_dir: Path, **timer: Any) -> rankscope.ProfileConfig:
    return rankscope.ProfileConfig(output_dir=run_dir, timer=TimerConfig(enable=True, **timer))


def read_records(run_dir: Path, rank: int = 0) -> list[dict[str, Any]]:
    """The records in a rank's file, without the lines that open an attempt."""
    path = run_dir / "timings" / f"rank-{rank:05d}.jsonl"
    return records_of(path.read_text())


def records_of(text: str) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, text.splitlines()) if "attempt" not in r]


def by_step(records: list[dict[str, Any]]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for rec in records:
        out.setdefault(rec["step"], []).append(rec["phase"])
    return out


def run_loop(prof: Profiler, steps: int) -> None:
    with prof:
        for _ in range(steps):
            for name in PHASES:
                with prof.phase(name, kind="comm" if name == "allreduce" else "compute"):
                    pass
            prof.step()


# -- which steps are sampled ----------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "stop_step", "expected"),
    [
        ({}, 35, [0, 10, 20, 30]),
        ({"every_n_steps": 1}, 4, [0, 1, 2, 3]),
        ({"every_n_steps": 3, "start_step": 2}, 12, [2, 5, 8, 11]),
        ({"every_n_steps": 2, "start_step": 1, "end_step": 6}, 20, [1, 3, 5]),
        ({"every_n_steps": 5, "end_step": 5}, 20, [0]),
        ({"start_step": 50}, 20, []),
        ({"every_n_steps": 7}, 0, []),
    ],
)
def test_sampled_steps_table(fields: dict[str, int], stop_step: int, expected: list[int]) -> None:
    config = TimerConfig(enable=True, **fields)
    assert sampled_steps(config, stop_step) == expected
    assert [s for s in range(stop_step) if is_sampled(config, s)] == expected


@pytest.mark.parametrize(
    ("fields", "steps"),
    [
        ({"every_n_steps": 10}, 35),
        ({"every_n_steps": 1}, 7),
        ({"every_n_steps": 4, "start_step": 3, "end_step": 20}, 30),
        ({"every_n_steps": 2, "flush_every_n_steps": 3}, 11),
    ],
)
def test_record_counts_follow_the_config(
    tmp_path: Path, fields: dict[str, int], steps: int
) -> None:
    prof = Profiler(timer_config(tmp_path, **fields), rank=0, world_size=1)
    run_loop(prof, steps)
    records = read_records(tmp_path)
    expected_steps = sampled_steps(prof.config.timer, steps)
    grouped = by_step(records)
    assert sorted(grouped) == expected_steps
    for step in expected_steps:
        assert sorted(grouped[step]) == sorted([*PHASES, "step"])
    assert len(records) == len(expected_steps) * (len(PHASES) + 1)


def test_a_nested_phase_ends_inside_its_parent_when_the_wall_clock_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The wall clock steps 5 s forward between a phase's start and a nested phase's
    # (NTP, a VM resumed). Each start read off the wall clock put the nested phase's end
    # 5 s after its parent's (a flake of the HF tests, on a machine whose VM is paused).
    import time as clock

    prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)
    real = clock.time_ns
    with prof:
        with prof.phase("outer"):
            monkeypatch.setattr(clock, "time_ns", lambda: real() + 5 * 10**9)
            with prof.phase("inner"):
                clock.sleep(0.01)
        prof.step()
    got = {r["phase"]: r for r in read_records(tmp_path)}
    outer, inner = got["outer"], got["inner"]
    assert outer["start_ns"] <= inner["start_ns"]
    assert inner["start_ns"] + inner["cpu_ms"] * 1e6 <= outer["start_ns"] + outer["cpu_ms"] * 1e6
    assert abs(outer["start_ns"] - real()) < 60 * 10**9  # still the wall clock, as read at start


def test_records_follow_schema_v1(tmp_path: Path) -> None:
    prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)
    run_loop(prof, 3)
    records = read_records(tmp_path)
    assert records
    for rec in records:
        assert set(rec) == RECORD_KEYS
        assert rec["v"] == 1
        assert rec["rank"] == 0
        assert rec["gpu_ms"] is None  # no GPU here
        assert rec["error"] is False
        assert rec["depth"] == 0
        assert isinstance(rec["start_ns"], int) and rec["start_ns"] > 1_600_000_000 * 10**9
        assert isinstance(rec["cpu_ms"], float) and rec["cpu_ms"] >= 0
    kinds = {rec["phase"]: rec["kind"] for rec in records}
    assert kinds["allreduce"] == "comm"
    assert kinds["forward"] == "compute"
    assert kinds["step"] == "step"


def test_a_phase_says_how_long_its_thread_ran_on_a_cpu(tmp_path: Path) -> None:
    # A sleep is off the CPU; work that ran 10 ms of CPU time holds them, however busy
    # the machine (the loop counts the thread's CPU time, not the wall clock).
    import time

    prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)
    with prof:
        with prof.phase("sleep"):
            time.sleep(0.02)
        with prof.phase("work"):
            began = time.thread_time_ns()
            while time.thread_time_ns() - began < 10_000_000:
                pass
        prof.step()
    got = {r["phase"]: r for r in read_records(tmp_path)}
    assert got["sleep"]["cpu_ms"] >= 20 and got["sleep"]["oncpu_ms"] < 5
    assert 10 <= got["work"]["oncpu_ms"] <= got["work"]["cpu_ms"] + 0.5
    assert got["step"]["oncpu_ms"] >= got["work"]["oncpu_ms"]


@pytest.mark.skipif(
    not Path("/proc/thread-self/schedstat").exists() or not hasattr(os, "sched_setaffinity"),
    reason="needs Linux's per-thread scheduler counts",
)
def test_a_phase_says_how_long_its_thread_waited_for_a_cpu(tmp_path: Path) -> None:
    # This process and a busy one on one core: the phase's thread is ready to run for
    # its whole loop, and waits for the core about as long as it runs on it. A sleep is
    # off the CPU without waiting for one.
    import time

    core = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    busy = subprocess.Popen(
        [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass"]
    )
    try:
        os.sched_setaffinity(0, {core})
        prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)
        with prof:
            with prof.phase("sleep"):
                time.sleep(0.05)
            with prof.phase("work"):
                began = time.thread_time_ns()
                while time.thread_time_ns() - began < 100_000_000:
                    pass
            prof.step()
    finally:
        os.sched_setaffinity(0, before)
        busy.kill()
        busy.wait()
    got = {r["phase"]: r for r in read_records(tmp_path)}
    work, sleep = got["work"], got["sleep"]
    assert work["runq_ms"] > 20  # its share of the core: about 100 ms
    # What it did not run, it waited for; never more than its time off the CPU.
    assert work["oncpu_ms"] + work["runq_ms"] <= work["cpu_ms"] + 0.01
    assert work["oncpu_ms"] + work["runq_ms"] >= 0.9 * work["cpu_ms"]
    assert sleep["runq_ms"] < 0.5 * sleep["cpu_ms"]
    assert got["step"]["runq_ms"] >= work["runq_ms"]


def test_a_span_left_on_another_thread_says_no_time_on_cpu(tmp_path: Path) -> None:
    config = TimerConfig(enable=True, every_n_steps=1)
    info = RankInfo(rank=0, local_rank=0, world_size=1, local_world_size=1, host="h")
    timer = PhaseTimer(config, str(tmp_path), info, clock=None)
    assert timer.start() is True
    here = timer.enter("here", "compute", None, ranged=False)
    away = timer.enter("away", "compute", None, ranged=False)
    assert here is not None and away is not None
    elsewhere = threading.Thread(target=timer.exit, args=(away, False))
    elsewhere.start()
    elsewhere.join()
    timer.exit(here, False)
    timer.stop()
    got = {r["phase"]: r for r in read_records(tmp_path)}
    assert "oncpu_ms" in got["here"] and "oncpu_ms" not in got["away"]  # a thread's own clock
    assert "runq_ms" not in got["away"]


def test_step_record_spans_the_phases_of_its_step(tmp_path: Path) -> None:
    prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)
    run_loop(prof, 4)
    records = read_records(tmp_path)
    for step in range(4):
        mine = [r for r in records if r["step"] == step]
        whole = next(r for r in mine if r["phase"] == "step")
        for rec in mine:
            assert rec["start_ns"] >= whole["start_ns"]
        assert whole["cpu_ms"] >= sum(r["cpu_ms"] for r in mine if r["phase"] != "step")


def test_a_phase_that_raises_is_flagged_and_the_exception_passes_unchanged(tmp_path: Path) -> None:
    prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)
    mine = KeyError("user's own")
    with prof:
        with pytest.raises(KeyError) as info, prof.phase("outer"), prof.phase("inner"):
            raise mine
        assert info.value is mine
        with prof.phase("after"):
            pass
        prof.step()
    errors = {r["phase"]: r["error"] for r in read_records(tmp_path)}
    assert errors == {"outer": True, "inner": True, "after": False, "step": False}


def test_user_meta_is_kept(tmp_path: Path) -> None:
    prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)
    with prof:
        with prof.phase("rollout", kind="data", role="actor", batch=4, ratio=float("nan")):
            pass
        with prof.phase("odd", obj=object()):
            pass
        prof.step()
    recs = {r["phase"]: r for r in read_records(tmp_path)}
    assert recs["rollout"]["kind"] == "data"
    assert recs["rollout"]["meta"] == {"role": "actor", "batch": 4, "ratio": "nan"}
    assert recs["odd"]["meta"]["obj"].startswith("<object object")
    assert "meta" not in recs["step"]


def test_nesting_depth(tmp_path: Path) -> None:
    prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)
    with prof:
        with prof.phase("a"):
            with prof.phase("b"), prof.phase("c"):
                pass
            with prof.phase("b2"):
                pass
        with prof.phase("d"):
            pass
        prof.step()
    depths = {r["phase"]: r["depth"] for r in read_records(tmp_path)}
    assert depths == {"a": 0, "b": 1, "c": 2, "b2": 1, "d": 0, "step": 0}


def test_phases_on_another_thread_keep_their_own_nesting(tmp_path: Path) -> None:
    prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)
    inside, release = threading.Event(), threading.Event()

    def loader() -> None:
        with prof.phase("load", kind="data"):
            inside.set()
            release.wait(10)
            with prof.phase("decode", kind="data"):
                pass

    with prof:
        with prof.phase("forward"):
            thread = threading.Thread(target=loader, name="loader-0")
            thread.start()
            assert inside.wait(10)
            with prof.phase("matmul"):
                release.set()
                thread.join(10)
        with prof.phase("backward"):
            pass
        prof.step()
    recs = {r["phase"]: r for r in read_records(tmp_path)}
    assert {k: v["depth"] for k, v in recs.items()} == {
        "load": 0,
        "decode": 1,
        "forward": 0,
        "matmul": 1,
        "backward": 0,
        "step": 0,
    }
    assert recs["load"]["thread"] == "loader-0"
    assert recs["decode"]["thread"] == "loader-0"
    assert "thread" not in recs["forward"]


def test_many_threads_at_once(tmp_path: Path) -> None:
    prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)

    def work(i: int) -> None:
        for _ in range(50):
            with prof.phase(f"t{i}"), prof.phase(f"t{i}-inner"):
                pass

    with prof:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        prof.step()
    records = read_records(tmp_path)
    assert len(records) == 4 * 50 * 2 + 1
    for rec in records:
        assert rec["depth"] == (1 if rec["phase"].endswith("-inner") else 0)


def test_an_unsampled_step_writes_nothing_and_costs_no_phase_object(tmp_path: Path) -> None:
    prof = Profiler(timer_config(tmp_path, every_n_steps=2), rank=0, world_size=1)
    with prof:
        prof.step()  # step 1 is not sampled
        phase = prof.phase("forward")
        with phase:
            pass
        assert phase._open is None
        prof.step()
    assert by_step(read_records(tmp_path)) == {0: ["step"]}


def test_unselected_ranks_hold_no_timer(tmp_path: Path) -> None:
    prof = Profiler(timer_config(tmp_path, ranks="1"), rank=0, world_size=2)
    assert prof._timer is None
    assert type(prof.phase("x")).__name__ == "_NoPhase"
    run_loop(prof, 3)
    assert not (tmp_path / "timings").exists()


def test_records_are_on_disk_at_each_flush_point(tmp_path: Path) -> None:
    prof = Profiler(
        timer_config(tmp_path, every_n_steps=1, flush_every_n_steps=4), rank=0, world_size=1
    )
    prof.start()
    try:
        for step in range(1, 10):
            with prof.phase("forward"):
                pass
            prof.step()
            written = len(read_records(tmp_path))
            # records of steps 0..(last multiple of 4 below `step`) are on disk, none after
            last_flush = step - step % 4
            assert written == 2 * last_flush, step
    finally:
        prof.stop()
    assert len(read_records(tmp_path)) == 2 * 9


def test_stop_with_no_steps_writes_nothing_but_a_file(tmp_path: Path) -> None:
    prof = Profiler(timer_config(tmp_path), rank=0, world_size=1)
    with prof:
        pass
    assert read_records(tmp_path) == []


def test_a_restart_appends(tmp_path: Path) -> None:
    for _ in range(2):
        prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)
        run_loop(prof, 1)
    assert len(read_records(tmp_path)) == 2 * (len(PHASES) + 1)
    # One process: both starts are one attempt, and each says it ahead of its records.
    path = tmp_path / "timings" / "rank-00000.jsonl"
    opened = [json.loads(line) for line in path.read_text().splitlines() if '"attempt"' in line]
    assert len(opened) == 2 and opened[0]["attempt"] == opened[1]["attempt"]
    assert opened[0]["pid"] == os.getpid() and opened[0]["started_ns"] > 0


# -- device events, with a clock the test drives -----------------------------------------


class FakeClock:
    """A device whose progress the test sets: mark n is done once `position` > n; marks are 1 ms apart."""

    def __init__(self) -> None:
        self.issued = 0
        self.position = 0
        self.synchronized = 0
        self.released: list[int] = []

    def mark(self) -> int:
        self.issued += 1
        return self.issued - 1

    def done(self, mark: int) -> bool:
        return mark < self.position

    def elapsed_ms(self, start: int, end: int) -> float:
        return float(end - start)

    def release(self, mark: int) -> None:
        self.released.append(mark)

    def synchronize(self) -> None:
        self.synchronized += 1
        self.position = self.issued

    def catch_up(self) -> None:
        self.position = self.issued


def fake_timer(tmp_path: Path, clock: DeviceClock, **fields: Any) -> PhaseTimer:
    config = TimerConfig(**{"enable": True, "every_n_steps": 1, "flush_every_n_steps": 1, **fields})
    info = RankInfo(rank=0, local_rank=0, world_size=1, local_world_size=1, host="h")
    return PhaseTimer(config, str(tmp_path), info, clock=clock)


def timed(timer: PhaseTimer, name: str, inner: int = 0) -> None:
    span = timer.enter(name, "compute", None, ranged=False)
    assert span is not None
    for i in range(inner):
        timed(timer, f"{name}.{i}")
    timer.exit(span, error=False)


def test_device_times_are_read_only_once_the_device_passed_them(tmp_path: Path) -> None:
    clock = FakeClock()
    timer = fake_timer(tmp_path, clock)
    timer.start()  # mark 0: step 0 begins
    timed(timer, "fwd", inner=1)  # marks 1 (fwd), 2 (fwd.0), 3 (fwd.0 end), 4 (fwd end)
    timer.step()  # mark 5: step 0 ends; flush with the device still at 0
    assert timer.wait_written()  # the flush is done by the timer's background writer
    assert timer.pending == 3
    assert timer.path.read_text() == ""
    clock.position = 4  # past fwd.0 (2..3), not past fwd's end (4)
    timer.step()  # flush again: fwd.0 resolves
    assert timer.wait_written()
    lines = records_of(timer.path.read_text())
    assert [(r["phase"], r["gpu_ms"]) for r in lines] == [("fwd.0", 1.0)]
    assert timer.pending >= 2
    assert clock.synchronized == 0  # the training thread never waited for the device
    timer.stop()
    assert clock.synchronized == 1
    records = {(r["step"], r["phase"]): r["gpu_ms"] for r in read_records(tmp_path)}
    assert records[(0, "fwd")] == 3.0
    assert records[(0, "step")] == 5.0
    assert timer.pending == 0


def test_resolved_marks_go_back_to_the_clock(tmp_path: Path) -> None:
    clock = FakeClock()
    timer = fake_timer(tmp_path, clock)
    timer.start()
    for _ in range(5):
        timed(timer, "a")
        clock.catch_up()
        timer.step()
    timer.stop()
    # every mark but the step stop() cut short is released once resolved; that one at stop
    assert sorted(clock.released) == list(range(clock.issued))


def test_the_pending_bound_drops_the_oldest_and_reports_it(tmp_path: Path) -> None:
    clock = FakeClock()
    timer = fake_timer(tmp_path, clock, max_pending_events=6)  # at most 3 spans pending
    timer.start()
    for name in ("p0", "p1", "p2", "p3", "p4"):
        timed(timer, name)  # the device never moves
    assert timer.wait_written()  # the background writer enforces the bound
    assert timer.pending == 3
    clock.catch_up()
    timer.step()
    timer.stop()
    records = read_records(tmp_path)
    gpu = {r["phase"]: r["gpu_ms"] for r in records}
    assert gpu["p0"] is None and gpu["p1"] is None  # dropped to keep the bound
    assert gpu["p2"] == gpu["p3"] == gpu["p4"] == 1.0
    assert records[0]["dropped"] == 2
    assert all("dropped" not in r for r in records[1:])


def test_marks_the_device_already_passed_are_not_dropped(tmp_path: Path) -> None:
    clock = FakeClock()
    timer = fake_timer(tmp_path, clock, max_pending_events=4)
    timer.start()
    for name in ("p0", "p1", "p2", "p3"):
        timed(timer, name)
        clock.catch_up()  # a device that keeps up
    timer.step()
    timer.stop()
    records = read_records(tmp_path)
    assert all(r["gpu_ms"] is not None for r in records)
    assert all("dropped" not in r for r in records)


class _FakeEvent:
    created = 0

    def __init__(self, enable_timing: bool) -> None:
        assert enable_timing
        _FakeEvent.created += 1
        self.recorded = 0

    def record(self, stream: object) -> None:
        assert stream is _FakeStream.made[_FakeStream.current], "recorded on the current stream"
        self.recorded += 1

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: _FakeEvent) -> float:
        return 0.5


class _FakeStream:
    current = (0, 0, 1)
    made: ClassVar[dict[tuple[int, int, int], _FakeStream]] = {}

    def __init__(self, stream_id: int, device_index: int, device_type: int) -> None:
        key = (stream_id, device_index, device_type)
        assert key not in _FakeStream.made, "a Stream object is made once per stream"
        _FakeStream.made[key] = self


def _fake_cuda_torch() -> SimpleNamespace:
    return SimpleNamespace(
        cuda=SimpleNamespace(Event=_FakeEvent, Stream=_FakeStream, synchronize=lambda: None),
        _C=SimpleNamespace(
            _cuda_getDevice=lambda: _FakeStream.current[1],
            _cuda_getCurrentStream=lambda device: _FakeStream.current,
        ),
    )


def test_cuda_events_come_from_a_reused_pool(tmp_path: Path) -> None:
    clock = CudaEventClock(_fake_cuda_torch())  # type: ignore[arg-type]
    timer = fake_timer(tmp_path, clock)  # type: ignore[arg-type]
    _FakeEvent.created = 0
    _FakeStream.made.clear()
    timer.start()
    for i in range(100):
        # the user switches streams now and then: marks follow the current one
        _FakeStream.current = (i % 3, 0, 1)
        for name in PHASES:
            timed(timer, name)
        timer.step()
        # A step's worth of time for the background writer to give the events back, as a
        # real step's kernels give it.
        assert timer.wait_written()
    timer.stop()
    assert sorted(_FakeStream.made) == [(0, 0, 1), (1, 0, 1), (2, 0, 1)]
    # one step's worth of events (5 phases + the step, 2 marks each) serves all 100 steps
    assert _FakeEvent.created <= 2 * (len(PHASES) + 1) + 2
    assert clock.pooled == _FakeEvent.created
    assert len(read_records(tmp_path)) == 100 * (len(PHASES) + 1)
    assert {r["gpu_ms"] for r in read_records(tmp_path)} == {0.5}


# -- the training thread makes two device calls a phase (issue 26) -----------------------


def _timer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "rankscope-timer"]


def test_a_sampled_phase_makes_two_device_calls_on_the_training_thread(tmp_path: Path) -> None:
    """On a GPU each device call costs the training thread microseconds (a query, an
    elapsed time); the phase's two event records are the only ones that must be made there."""
    clock = CountingClock()
    timer = fake_timer(tmp_path, clock)  # every step sampled and flushed
    me = threading.get_ident()
    timer.start()
    for _ in range(5):
        for name in PHASES:
            before = clock.on(me).get("mark", 0)
            timed(timer, name)
            assert clock.on(me) == {"mark": before + 2}, name
        timer.step()
    timer.stop()
    on_thread = {k: n for k, n in clock.on(me).items() if k != "synchronize"}  # stop() may wait
    # 25 phases and 5 steps, 2 marks each, and step 5's start, which stop() cut short
    assert on_thread == {"mark": 2 * 25 + 2 * 5 + 1}
    assert clock.off(me) == {"done": 2 * 30, "elapsed_ms": 30, "release": 2 * 30 + 1}
    assert all(r["gpu_ms"] is not None for r in read_records(tmp_path))
    assert len(read_records(tmp_path)) == 30


def test_stop_ends_the_background_writer(tmp_path: Path) -> None:
    timer = fake_timer(tmp_path, CountingClock(), flush_every_n_steps=100)
    timer.start()
    timed(timer, "a")
    assert [t.daemon for t in _timer_threads()] == [True]  # never keeps a process alive
    timer.step()
    timer.stop()  # no flush point came: stop() resolves and writes it all
    assert _timer_threads() == []
    assert sorted(r["phase"] for r in read_records(tmp_path)) == ["a", "step"]


def test_a_device_clock_that_fails_in_the_background_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class FailingQuery(CountingClock):
        def done(self, mark: int) -> bool:
            raise RuntimeError("CUDA error: unspecified launch failure")

    timer = fake_timer(tmp_path, FailingQuery())
    warnings = _three_steps_warned(timer, caplog, wait=True)
    assert len(warnings) == 1
    assert "unspecified launch failure" in warnings[0]
    assert not timer.enabled
    assert _timer_threads() == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_lets_go_of_the_parents_background_writer(tmp_path: Path) -> None:
    timer = fake_timer(tmp_path, CountingClock(), flush_every_n_steps=100)
    timer.start()
    timed(timer, "parent")
    pid = os.fork()
    if pid == 0:  # the writer thread was not forked: the child must neither wait for it nor write
        code = 0
        try:
            timer.forget_after_fork()  # as Profiler's fork hook does
            timer.step()
            timer.stop()
            code = 0 if timer.pending == 0 and not timer.enabled else 3
        except BaseException:
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    timer.step()
    timer.stop()
    assert sorted(r["phase"] for r in read_records(tmp_path)) == ["parent", "step"]
    assert _timer_threads() == []


# -- the decorator forms -------------------------------------------------------------


def test_profiler_phase_as_a_decorator_times_every_sampled_call(tmp_path: Path) -> None:
    prof = Profiler(timer_config(tmp_path, every_n_steps=2), rank=0, world_size=1)

    @prof.phase("work", kind="io", part=1)
    def work(x: int) -> int:
        return x + 1

    with prof:
        for i in range(4):
            assert work(i) == i + 1
            prof.step()
    recs = [r for r in read_records(tmp_path) if r["phase"] == "work"]
    assert [r["step"] for r in recs] == [0, 2]
    assert recs[0]["kind"] == "io"
    assert recs[0]["meta"] == {"part": 1}


class Model:
    def __init__(self) -> None:
        self.calls = 0

    @rankscope.annotate("method")
    def method(self, x: int) -> int:
        self.calls += 1
        return x * 2

    @staticmethod
    @rankscope.annotate("static")
    def static(x: int) -> int:
        return x * 3

    @rankscope.annotate("static_outer")
    @staticmethod
    def static_outer(x: int) -> int:
        return x * 5

    @classmethod
    @rankscope.annotate("klass")
    def klass(cls, x: int) -> str:
        return f"{cls.__name__}{x}"

    @rankscope.annotate("klass_outer")
    @classmethod
    def klass_outer(cls, x: int) -> str:
        return f"{cls.__name__}:{x}"


@rankscope.annotate("plain", role="actor", color="red")
def plain(x: int) -> int:
    """Doubles x."""
    return 2 * x


@rankscope.annotate("coro", kind="comm")
async def coro(x: int) -> int:
    await asyncio.sleep(0)
    return x - 1


def test_annotate_without_an_active_profiler_is_a_no_op() -> None:
    assert rankscope.current() is None
    assert plain(2) == 4
    assert plain.__name__ == "plain" and plain.__doc__ == "Doubles x."
    assert Model().method(3) == 6
    assert asyncio.run(coro(1)) == 0


def test_annotate_uses_the_active_profiler_in_every_form(tmp_path: Path) -> None:
    prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)
    model = Model()
    with prof:
        assert rankscope.current() is prof
        assert plain(1) == 2
        assert model.method(2) == 4
        assert Model.static(2) == 6
        assert model.static_outer(2) == 10
        assert Model.klass(1) == "Model1"
        assert model.klass_outer(2) == "Model:2"
        assert asyncio.run(coro(5)) == 4
        prof.step()
    assert rankscope.current() is None
    recs = {r["phase"]: r for r in read_records(tmp_path)}
    assert set(recs) == {
        "plain",
        "method",
        "static",
        "static_outer",
        "klass",
        "klass_outer",
        "coro",
        "step",
    }
    assert recs["plain"]["meta"] == {"role": "actor", "color": "red"}
    assert recs["coro"]["kind"] == "comm"
    assert model.calls == 1


def test_annotate_rejects_a_bad_name() -> None:
    with pytest.raises(ConfigError, match=r"^name="):
        rankscope.annotate("")


def test_a_second_profiler_started_becomes_current(tmp_path: Path) -> None:
    first = Profiler(timer_config(tmp_path / "a"), rank=0, world_size=1)
    second = Profiler(timer_config(tmp_path / "b"), rank=0, world_size=1)
    with first:
        with second:
            assert rankscope.current() is second
        assert rankscope.current() is None


# -- ranges in traces --------------------------------------------------------------------


def test_timer_phases_show_in_a_users_own_torch_profiler(tmp_path: Path) -> None:
    prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as tp, prof:
        with prof.phase("timed_and_traced"):
            torch.ones(4).sum()
        prof.step()
    names = [e.name for e in tp.events()]
    assert names.count("timed_and_traced") == 1


def test_a_phase_traced_by_capture_is_ranged_once(tmp_path: Path) -> None:
    config = rankscope.ProfileConfig(
        output_dir=tmp_path,
        trace=rankscope.TraceConfig(enable=True, schedule=rankscope.Schedule(warmup=0, active=1)),
        timer=TimerConfig(enable=True, every_n_steps=1),
    )
    prof = Profiler(config, rank=0, world_size=1)
    with prof:
        with prof.phase("both"):
            torch.ones(4).sum()
        prof.step()
        prof.step()
    from .._helpers import read_trace

    trace = read_trace(tmp_path / "traces" / "step-000000-000000" / "rank-00000.pt.trace.json.gz")
    spans = [e for e in trace["traceEvents"] if e.get("name") == "both" and e.get("ph") == "X"]
    assert len(spans) == 1
    assert {r["phase"] for r in read_records(tmp_path)} == {"both", "step"}


def test_phases_inside_torch_compile_do_not_break_the_graph(tmp_path: Path) -> None:
    prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)

    @torch.compile(fullgraph=True, backend="eager")
    def f(x: torch.Tensor) -> torch.Tensor:
        with prof.phase("compiled"):
            return x * 2

    with prof:
        with prof.phase("outside"):
            assert torch.equal(f(torch.ones(2)), torch.full((2,), 2.0))
        prof.step()
    assert {r["phase"] for r in read_records(tmp_path)} == {"outside", "step"}


@rankscope.annotate("annotated_in_compile")
def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@pytest.mark.parametrize("active", [False, True])
def test_annotated_functions_inside_torch_compile(tmp_path: Path, active: bool) -> None:
    prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)
    compiled = torch.compile(lambda x: _double(x) + 1, fullgraph=True, backend="eager")
    with contextlib.ExitStack() as stack:
        if active:
            stack.enter_context(prof)
        assert torch.equal(compiled(torch.ones(2)), torch.full((2,), 3.0))


# -- faults ----------------------------------------------------------------------------


def test_an_unwritable_run_dir_warns_once_and_training_goes_on(
    read_only_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    prof = Profiler(timer_config(read_only_dir / "run", every_n_steps=1), rank=0, world_size=1)
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        run_loop(prof, 5)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "phase timer off" in warnings[0].getMessage()
    assert not (read_only_dir / "run").exists()


def test_a_full_disk_mid_run_warns_once_and_training_goes_on(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    prof = Profiler(
        timer_config(small_disk, every_n_steps=1, flush_every_n_steps=1), rank=0, world_size=1
    )
    steps = 0
    with caplog.at_level(logging.WARNING, logger="rankscope"), prof:
        for _ in range(400):  # ~6 records of ~200 bytes a step: 64 KiB fills in ~50 steps
            with prof.phase("forward", pad="x" * 100):
                pass
            prof.step()
            steps += 1
    assert steps == 400
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    timer = [r for r in warnings if r.name.startswith("rankscope.timing")]
    assert len(timer) == 1
    assert "No space left" in timer[0].getMessage()
    # The heartbeat shares the disk: its watchdog may say so too, once, and goes on.
    assert len(warnings) - len(timer) <= 1
    assert not prof._timer.enabled  # type: ignore[union-attr]
    lines = (small_disk / "timings" / "rank-00000.jsonl").read_text().splitlines()
    assert lines
    for line in lines[:-1]:
        json.loads(line)  # whole lines, except perhaps a torn last one


def test_a_device_clock_that_raises_turns_the_timer_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class BrokenClock(FakeClock):
        def mark(self) -> int:
            if self.issued >= 3:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return super().mark()

    timer = fake_timer(tmp_path, BrokenClock())
    warnings = _three_steps_warned(timer, caplog, wait=False)
    assert len(warnings) == 1
    assert "illegal memory access" in warnings[0]
    assert not timer.enabled


@pytest.mark.gpu
def test_cuda_device_times(tmp_path: Path) -> None:
    prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)
    a = torch.randn(2048, 2048, device="cuda")
    with prof:
        for _ in range(3):
            with prof.phase("matmul"):
                for _ in range(10):
                    a = (a @ a).tanh_()
            prof.step()
    records = read_records(tmp_path)
    matmul = [r for r in records if r["phase"] == "matmul"]
    assert len(matmul) == 3
    assert all(r["gpu_ms"] is not None and r["gpu_ms"] > 0 for r in matmul)


@pytest.mark.gpu
def test_cuda_device_time_is_taken_on_the_current_stream(tmp_path: Path) -> None:
    prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)
    side = torch.cuda.Stream()
    with prof:
        for _ in range(2):
            with torch.cuda.stream(side), prof.phase("sleep_on_side_stream"):
                torch.cuda._sleep(50_000_000)  # tens of ms of GPU time on `side` alone
            prof.step()
    sleeps = [r for r in read_records(tmp_path) if r["phase"] == "sleep_on_side_stream"]
    assert len(sleeps) == 2
    # marks on the default stream would bracket nothing and read about 0 ms
    assert all(r["gpu_ms"] > 5 for r in sleeps), sleeps


@pytest.mark.gpu
def test_nvtx_ranges_open_and_close_in_pairs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every range a phase opens is closed, phases that raise and nested ones included: an
    NVTX range left open would swallow the rest of the run in Nsight Systems."""
    # NVTX gives every range the id 0 where no tool (nsys) listens, so nested ranges
    # cannot be told apart by the ids it returns: each range gets a token of its own here,
    # and the real range is opened and closed on its way.
    opened: dict[int, tuple[str, int]] = {}
    unmatched: list[int] = []
    tokens = itertools.count(1)
    start, end = torch.cuda.nvtx.range_start, torch.cuda.nvtx.range_end

    def range_start(name: str) -> int:
        token = next(tokens)
        opened[token] = (name, start(name))
        return token

    def range_end(token: int) -> None:
        if token not in opened:
            unmatched.append(token)
            return
        end(opened.pop(token)[1])

    monkeypatch.setattr(torch.cuda.nvtx, "range_start", range_start)
    monkeypatch.setattr(torch.cuda.nvtx, "range_end", range_end)
    prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)
    a = torch.randn(256, 256, device="cuda")
    with prof:
        for step in range(4):
            with contextlib.suppress(ValueError), prof.phase("outer"), prof.phase("inner"):
                a = (a @ a).tanh_()
                if step % 2:
                    raise ValueError("a phase that raises")
            prof.step()
    assert opened == {} and unmatched == []
    assert next(tokens) >= 9, "4 steps of two phases, each with its range"
    errors = [(r["phase"], r["step"]) for r in read_records(tmp_path) if r["error"]]
    assert errors == [("inner", 1), ("outer", 1), ("inner", 3), ("outer", 3)]


# -- found in review -----------------------------------------------------------------


def test_interleaved_coroutines_keep_their_own_depth(tmp_path: Path) -> None:
    @rankscope.annotate("a")
    async def a() -> None:
        await asyncio.sleep(0.01)

    @rankscope.annotate("b")
    async def b() -> None:
        await asyncio.sleep(0.02)

    async def both() -> None:
        await asyncio.gather(a(), b())

    prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)
    with prof:
        asyncio.run(both())
        with prof.phase("after"):
            pass
        prof.step()
        with prof.phase("next"):
            pass
        prof.step()
    assert {r["phase"]: r["depth"] for r in read_records(tmp_path)} == {
        "a": 0,
        "b": 0,
        "after": 0,
        "next": 0,
        "step": 0,
    }


def test_names_and_meta_that_are_not_valid_unicode_are_written(tmp_path: Path) -> None:
    odd = os.fsdecode(b"shard-\xff.bin")  # a lone surrogate, as file names decode
    prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)
    with prof:
        with prof.phase(odd, file=odd):
            pass
        with prof.phase("fine"):
            pass
        prof.step()
    recs = {r["phase"]: r for r in read_records(tmp_path)}
    assert set(recs) == {odd, "fine", "step"}
    assert recs[odd]["meta"] == {"file": odd}


class _NoStr:
    def __str__(self) -> str:
        raise RuntimeError("no str for you")

    __repr__ = __str__


def test_a_name_or_meta_whose_str_raises_does_not_stop_the_timer(tmp_path: Path) -> None:
    prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)
    with prof:
        with prof.phase(_NoStr()):  # type: ignore[arg-type]
            pass
        with prof.phase("m", bad=_NoStr(), nan=float("nan")):
            pass
        prof.step()
    assert prof._timer is not None and prof._timer._warned is False
    recs = {r["phase"]: r for r in read_records(tmp_path)}
    assert "<unprintable _NoStr>" in recs
    assert recs["m"]["meta"]["bad"] == "<unprintable _NoStr>"


def test_meta_is_taken_when_the_phase_ends(tmp_path: Path) -> None:
    prof = Profiler(
        timer_config(tmp_path, every_n_steps=1, flush_every_n_steps=100), rank=0, world_size=1
    )
    seen: list[int] = []
    with prof:
        for i in range(3):
            seen.append(i)
            with prof.phase("p", seen=seen):
                pass
            prof.step()
    assert [r["meta"]["seen"] for r in read_records(tmp_path) if r["phase"] == "p"] == [
        [0],
        [0, 1],
        [0, 1, 2],
    ]


def test_meta_never_reads_a_tensor(tmp_path: Path) -> None:
    prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)
    with prof:
        with prof.phase("p", t=torch.zeros(2, 3)):
            pass
        prof.step()
    meta = next(r["meta"] for r in read_records(tmp_path) if r["phase"] == "p")
    assert meta == {"t": "<Tensor shape=[2, 3] dtype=torch.float32 device=cpu>"}


def test_a_long_step_is_written_once_enough_records_wait(tmp_path: Path) -> None:
    from rankscope.timing import _timer

    prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)
    with prof:
        for _ in range(_timer._FLUSH_RECORDS + 10):  # one step that never ends
            with prof.phase("item"):
                pass
        assert len(read_records(tmp_path)) == _timer._FLUSH_RECORDS
        assert prof._timer is not None and len(prof._timer._ready) == 10


def test_a_restart_after_a_torn_line_starts_on_a_new_line(tmp_path: Path) -> None:
    path = tmp_path / "timings" / "rank-00000.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text('{"v":1,"rank":0,"step":3,"phase":"forw')  # a crash mid-line
    prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)
    run_loop(prof, 1)
    lines = path.read_text().splitlines()
    assert lines[0] == '{"v":1,"rank":0,"step":3,"phase":"forw'
    assert [r["phase"] for r in records_of("\n".join(lines[1:]))] == [*PHASES, "step"]


def test_a_phase_never_takes_a_step_that_is_not_sampled(tmp_path: Path) -> None:
    config = TimerConfig(enable=True, every_n_steps=2)
    info = RankInfo(rank=0, local_rank=0, world_size=1, local_world_size=1, host="h")
    timer = PhaseTimer(config, str(tmp_path), info, clock=None)
    assert timer.start() is True
    assert timer.enter("a", "compute", None, ranged=False) is not None
    assert timer.step() is False  # step 1: a phase entered now, even by a thread that
    assert timer.enter("b", "compute", None, ranged=False) is None  # saw step 0, is not timed
    timer.stop()


def test_generators_cannot_be_decorated() -> None:
    def gen() -> Any:
        yield 1

    async def agen() -> Any:
        yield 1

    for fn in (gen, agen):
        with pytest.raises(ConfigError, match=r"^fn=.*generator"):
            rankscope.annotate("g")(fn)


def test_a_phase_object_entered_twice_records_both(tmp_path: Path) -> None:
    prof = Profiler(timer_config(tmp_path, every_n_steps=1), rank=0, world_size=1)
    with prof:
        again = prof.phase("again")
        with again, again:
            pass
        with prof.phase("later"):
            pass
        prof.step()
    recs = read_records(tmp_path)
    assert sorted((r["phase"], r["depth"]) for r in recs) == [
        ("again", 0),
        ("again", 1),
        ("later", 0),
        ("step", 0),
    ]


def test_a_timings_file_removed_mid_run_is_written_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    prof = Profiler(
        timer_config(tmp_path, every_n_steps=1, flush_every_n_steps=1), rank=0, world_size=1
    )
    path = tmp_path / "timings" / "rank-00000.jsonl"
    with caplog.at_level(logging.WARNING, logger="rankscope"), prof:
        with prof.phase("before"):
            pass
        prof.step()
        path.unlink()
        with prof.phase("after"):
            pass
        prof.step()
    assert [r["phase"] for r in records_of(path.read_text())] == ["after", "step"]
    assert any("was removed" in r.getMessage() for r in caplog.records)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_writes_nothing_for_its_parent(tmp_path: Path) -> None:
    prof = Profiler(
        timer_config(tmp_path, every_n_steps=1, flush_every_n_steps=100), rank=0, world_size=1
    )
    with prof:
        with prof.phase("parent"):
            pass
        pid = os.fork()
        if pid == 0:  # the child: a data-loader worker that exits through atexit
            code = 0
            try:
                if rankscope.current() is not None:
                    code = 3
                with prof.phase("child"):
                    pass
                prof.step()
                atexit._run_exitfuncs()
            except BaseException:
                code = 4
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        prof.step()
    assert sorted(r["phase"] for r in read_records(tmp_path)) == ["parent", "step"]


def _three_steps_warned(
    timer: PhaseTimer, caplog: pytest.LogCaptureFixture, *, wait: bool
) -> list[str]:
    """Three steps of one phase and stop(); the warnings logged. `wait`: each step's
    records are written (by the background writer) before the next."""
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        timer.start()
        for _ in range(3):
            span = timer.enter("forward", "compute", None, ranged=False)
            if span is not None:
                timer.exit(span, error=False)
            timer.step()
            if wait:
                timer.wait_written()
        timer.stop()
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
