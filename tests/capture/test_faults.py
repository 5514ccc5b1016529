"""Faults inside rankscope's machinery: the loop runs every step, one warning, no partial final files."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from rankscope import Profiler, Schedule

from .._helpers import (
    final_files,
    rankscope_warnings,
    temp_files,
    tiny_model,
    tiny_step,
    trace_config,
)

STEPS = 8


def _loop(prof: Profiler) -> int:
    model, opt = tiny_model()
    done = 0
    with prof:
        for _ in range(STEPS):
            tiny_step(model, opt, prof)
            prof.step()
            done += 1
    return done


def _raiser(name: str) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"injected fault in {name}")

    return fail


@pytest.mark.parametrize(
    "method",
    ["start", "step", "stop", "export_chrome_trace", "stop_trace", "start_trace", "prepare_trace"],
)
def test_torch_profiler_raising_turns_capture_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, method: str
) -> None:
    monkeypatch.setattr(torch.profiler.profile, method, _raiser(method))
    sched = Schedule(wait=1, warmup=1, active=2, repeat=2)
    prof = Profiler(trace_config(tmp_path, schedule=sched), rank=0, world_size=1)
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        assert _loop(prof) == STEPS
    warned = rankscope_warnings(caplog)
    assert len(warned) == 1, warned
    assert f"injected fault in {method}" in warned[0]
    assert "training goes on" in warned[0]
    assert not torch.autograd._profiler_enabled(), "a faulty profiler must not keep collecting"
    traces = [f for f in final_files(tmp_path) if "traces/" in f]
    if method in ("export_chrome_trace", "start", "prepare_trace", "start_trace"):
        assert traces == []
    for name in traces:  # anything under a final name is complete
        assert (tmp_path / name).stat().st_size > 0


def test_phase_target_fault_in_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(torch.profiler.profile, "start", _raiser("start"))
    prof = Profiler(
        trace_config(tmp_path, target="phase:update", schedule=Schedule(warmup=0)),
        rank=0,
        world_size=1,
    )
    ran = 0
    with caplog.at_level(logging.WARNING, logger="rankscope"), prof:
        for _ in range(3):
            with prof.phase("update"):
                ran += 1
            prof.step()
    assert ran == 3
    assert len(rankscope_warnings(caplog)) == 1
    assert not torch.autograd._profiler_enabled()


def test_read_only_output_dir(read_only_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    prof = Profiler(trace_config(read_only_dir / "run"), rank=0, world_size=1)
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        assert _loop(prof) == STEPS
    warned = rankscope_warnings(caplog)
    assert len(warned) == 1, warned
    assert "cannot write" in warned[0]
    assert not (read_only_dir / "run").exists()
    (fault,) = prof.faults  # what a caller running many workers reads instead of the log
    assert fault.startswith(f"trace capture: cannot write to {read_only_dir / 'run'} (")


@pytest.mark.parametrize("planted", ["window", "trace"])
def test_a_link_where_a_window_is_saved_is_a_fault_like_a_full_disk(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, planted: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    window = tmp_path / "run" / "traces" / "step-000002-000003"
    if planted == "window":
        window.parent.mkdir(parents=True)
        window.symlink_to(outside, target_is_directory=True)
    else:
        window.mkdir(parents=True)
        (window / "rank-00000.pt.trace.json.gz").symlink_to(outside / "trace.gz")
    sched = Schedule(wait=1, warmup=1, active=2)
    prof = Profiler(trace_config(tmp_path / "run", schedule=sched), rank=0, world_size=1)
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        assert _loop(prof) == STEPS
    assert len(rankscope_warnings(caplog)) == 1
    (fault,) = prof.faults
    assert "refusing to write through a symbolic link" in fault, fault
    assert os.listdir(outside) == []
    assert temp_files(tmp_path / "run") == []


def test_a_healthy_run_has_no_faults(tmp_path: Path) -> None:
    prof = Profiler(trace_config(tmp_path / "run"), rank=0, world_size=1)
    assert _loop(prof) == STEPS
    assert prof.faults == []


def test_disk_full_while_writing_a_trace(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Windows of many ops: the raw export, or its compressed copy, does not fit in 64 KiB.
    sched = Schedule(wait=1, warmup=1, active=2, repeat=3)
    prof = Profiler(trace_config(small_disk, schedule=sched, gzip=True), rank=0, world_size=1)
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        model, opt = tiny_model()
        done = 0
        with prof:
            for _ in range(14):
                for _ in range(30):
                    tiny_step(model, opt, prof)
                prof.step()
                done += 1
    assert done == 14
    warned = rankscope_warnings(caplog)
    assert len(warned) == 1, warned
    assert "disk full" in warned[0] or "No space left" in warned[0]
    assert [f for f in final_files(small_disk) if f.startswith("traces/")] == []


def test_finaliser_failure_in_the_background_stops_later_windows(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The child process finalising a window exits with an error: the next step turns capture off.
    from rankscope.capture import _worker

    monkeypatch.setattr(_worker, "_PACKAGE_ROOT", str(tmp_path / "nowhere"))
    monkeypatch.setattr(_worker.sys, "executable", "/bin/false")
    sched = Schedule(wait=0, warmup=1, active=1, repeat=0)
    prof = Profiler(trace_config(tmp_path, schedule=sched), rank=0, world_size=1)
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        assert _loop(prof) == STEPS
    warned = rankscope_warnings(caplog)
    failed = [w for w in warned if "writing a trace failed" in w]
    assert len(failed) == 1, warned
    # Windows may also have outrun the failing worker before its first failure came back:
    # that is its own warning, given once.
    others = [w for w in warned if w not in failed]
    assert len(others) <= 1 and all("still being compressed" in w for w in others), warned
    assert [f for f in final_files(tmp_path) if f.startswith("traces/")] == []
    assert prof._capture.enabled is False


@pytest.mark.parametrize("repeat", [0, 2])
def test_export_fault_between_back_to_back_cycles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, repeat: int
) -> None:
    # wait=0: torch goes straight from saving one window to warming up the next; a fault
    # raised into that sequence used to leave a profiler that crashed when stopped.
    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", _raiser("export"))
    sched = Schedule(wait=0, warmup=1, active=1, repeat=repeat)
    prof = Profiler(trace_config(tmp_path, schedule=sched), rank=0, world_size=1)
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        assert _loop(prof) == STEPS
    assert len(rankscope_warnings(caplog)) == 1
    assert not torch.autograd._profiler_enabled()


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_at_a_window_end_reaches_the_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interrupt: type[BaseException]
) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise interrupt()

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", interrupted)
    prof = Profiler(
        trace_config(tmp_path, schedule=Schedule(warmup=1, active=1, repeat=0)),
        rank=0,
        world_size=1,
    )
    with pytest.raises(interrupt), prof:
        for _ in range(STEPS):
            prof.step()
    assert not torch.autograd._profiler_enabled()
    assert [f for f in final_files(tmp_path) if f.startswith("traces/")] == []


def test_a_user_profiler_already_running_is_left_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with torch.profiler.profile() as theirs, caplog.at_level(logging.WARNING, logger="rankscope"):
        assert _loop(Profiler(trace_config(tmp_path), rank=0, world_size=1)) == STEPS
        torch.ones(4).cumsum(0)
    assert any(e.name == "aten::cumsum" for e in theirs.events())
    warned = rankscope_warnings(caplog)
    assert len(warned) == 1
    assert "another torch.profiler" in warned[0]


def test_no_worker_thread_means_one_warning_and_no_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import threading

    def cannot_start(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", cannot_start)
    prof = Profiler(trace_config(tmp_path), rank=0, world_size=1)
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        assert _loop(prof) == STEPS  # would wait STOP_TIMEOUT_S in stop() if the job hung
    warned = rankscope_warnings(caplog)
    assert len(warned) == 2  # one for each part that needed a thread
    assert "trace capture failed" in warned[1] and "can't start new thread" in warned[1]
    assert warned[0] == "rankscope: no hang watchdog on rank 0 (can't start new thread)"


def test_phases_from_another_thread_never_drive_the_profiler(tmp_path: Path) -> None:
    import threading

    sched = Schedule(warmup=0, active=1, repeat=0)
    prof = Profiler(
        trace_config(tmp_path, target="phase:update", schedule=sched), rank=0, world_size=1
    )
    with prof:
        worker = threading.Thread(
            target=lambda: prof.phase("update").__enter__().__exit__(None, None, None)
        )
        worker.start()
        worker.join()
        assert not torch.autograd._profiler_enabled()
        with prof.phase("update"):
            torch.ones(2).sum()
    windows = sorted(p.name for p in (tmp_path / "traces").iterdir())
    assert windows == ["phase-update-000000"]  # the main thread's invocation; the other was skipped


def test_phase_inside_torch_compile_fullgraph(tmp_path: Path) -> None:
    for trace_rank in (0, 1):
        prof = Profiler(trace_config(tmp_path, ranks=str(trace_rank)), rank=0, world_size=2)

        @torch.compile(fullgraph=True, backend="eager")
        def fwd(x: torch.Tensor, prof: Profiler = prof) -> torch.Tensor:
            with prof.phase("inside"):
                return x * 2

        with prof:
            assert torch.equal(fwd(torch.ones(3)), torch.full((3,), 2.0))
            prof.step()


def test_windows_that_outrun_the_worker_are_skipped_not_queued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import threading

    from rankscope.capture import _capture, _worker

    release = threading.Event()
    real = _worker.TraceFinalizer._finalize

    def slow(job: Any) -> str | None:
        release.wait(60)  # a worker far behind the loop
        return real(job)

    monkeypatch.setattr(_worker.TraceFinalizer, "_finalize", staticmethod(slow))
    # repeat=0 with one-step cycles: a window ends every other step, forever
    sched = Schedule(wait=0, warmup=1, active=1, repeat=0)
    prof = Profiler(trace_config(tmp_path, schedule=sched), rank=0, world_size=1)
    model, opt = tiny_model()
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        prof.start()
        for _ in range(20):
            tiny_step(model, opt, prof)
            prof.step()
        capture = prof._capture
        assert capture is not None
        assert capture._exporter.backlog == _capture.MAX_BACKLOG
        release.set()
        prof.stop()
    traces = [f for f in final_files(tmp_path) if f.endswith(".pt.trace.json.gz")]
    assert len(traces) == _capture.MAX_BACKLOG  # the rest were skipped, not queued
    assert not [p for p in tmp_path.rglob("*raw*")]  # and left no raw exports behind
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "still being compressed" in warnings[0]
