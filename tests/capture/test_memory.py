"""CUDA memory snapshots: the CPU-only path, the atomic writer, the incompatibility checks,
and (with a GPU) recording, dumping and the out-of-memory dump."""

from __future__ import annotations

import json
import logging
import pickle
import threading
from pathlib import Path

import pytest
import torch

from rankscope import ConfigError, MemoryConfig, ProfileConfig, Profiler, TimerConfig, TraceConfig
from rankscope.capture._compat import incompatibilities
from rankscope.capture._faults import OneFault
from rankscope.capture._memory import (
    MemorySnapshots,
    SnapshotWriter,
    _Write,
    oom_window_name,
    write_atomic,
)
from rankscope.config._ranks import RankInfo
from rankscope.rundir._layout import memory_path

LOGGER = "rankscope"


def _rank(rank: int = 0, world_size: int = 1) -> RankInfo:
    return RankInfo(
        rank=rank, local_rank=rank, world_size=world_size, local_world_size=world_size, host="h"
    )


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _records(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


# -- layout ------------------------------------------------------------------------


def test_memory_path_sits_under_run_dir_memory_window(tmp_path: Path) -> None:
    path = memory_path(tmp_path, "step-000020-000021", 3)
    assert path == tmp_path / "memory" / "step-000020-000021" / "rank-00003.pickle"
    assert memory_path(str(tmp_path), oom_window_name(12), 0).parent.name == "oom-step-000012"
    # Zero-padded, so a listing sorts by step.
    names = [oom_window_name(s) for s in (9, 10, 100)]
    assert names == sorted(names)


def test_the_fault_warning_agrees_with_the_part_in_number(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The gpu tests match "memory snapshots are off"; this says it without a GPU."""
    snaps = MemorySnapshots(MemoryConfig(enable=True), str(tmp_path), _rank())

    class Capture(OneFault):
        def __init__(self) -> None:
            super().__init__()
            self._part, self._rank, self.enabled = "trace capture", 0, True

    capture = Capture()
    snaps.enabled = True  # as CUDA would have left it; the CPU path starts off
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        snaps.fault("writing a snapshot failed")
        capture._switch_off("writing a trace failed")
    assert _records(caplog, logging.WARNING) == [
        "rankscope: writing a snapshot failed; memory snapshots are off for the rest of "
        "this run (rank 0), training goes on",
        "rankscope: writing a trace failed; trace capture is off for the rest of this run "
        "(rank 0), training goes on",
    ]


# -- without CUDA ------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only path")
def test_cpu_only_logs_one_info_line_and_does_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        snaps = MemorySnapshots(MemoryConfig(enable=True, ranks="2"), str(tmp_path), _rank(2, 4))
        snaps.start()
        for _ in range(3):
            snaps.step()
        snaps.dump("step-000001-000002")
        snaps.stop()
        snaps.stop()
    assert len(caplog.records) == 1
    record = caplog.records[0]
    assert record.levelno == logging.INFO
    assert "need CUDA" in record.getMessage() and "rank 2" in record.getMessage()
    assert not snaps.enabled
    assert snaps.fault_reason is None  # no CUDA is not a fault
    assert snaps.dumps == 0
    assert _files(tmp_path) == []
    assert not any(t.name == "rankscope-memory" for t in threading.enumerate())


# -- the atomic writer ---------------------------------------------------------------


def _snapshot_like() -> dict[str, object]:
    """A real object of the snapshot's shape, with the types torch puts in one."""
    frames = [{"filename": __file__, "line": 1, "name": "f"}]
    return {
        "segments": [{"address": 1 << 40, "total_size": 2 << 20, "blocks": []}],
        "device_traces": [[{"action": "alloc", "addr": 1 << 40, "size": 512, "frames": frames}]],
        "shape": torch.Size([2, 3]),
    }


def test_write_atomic_leaves_the_complete_file_and_no_temp(tmp_path: Path) -> None:
    obj = _snapshot_like()
    final = memory_path(tmp_path, "step-000001-000002", 0)
    write_atomic(pickle.dumps(obj), final, "t1", tmp_path)
    with open(final, "rb") as fh:
        assert pickle.load(fh) == obj
    assert _files(tmp_path) == [final]  # the hidden temporary is gone


def test_write_atomic_failure_raises_and_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "memory").write_text("a file where the directory should be")
    final = memory_path(tmp_path, "step-000001-000002", 0)
    with pytest.raises(OSError):
        write_atomic(b"data", final, "t1", tmp_path)
    assert _files(tmp_path) == [tmp_path / "memory"]


def test_write_atomic_replaces_an_older_file_whole(tmp_path: Path) -> None:
    final = tmp_path / "memory" / "w" / "rank-00000.pickle"
    write_atomic(pickle.dumps(list(range(1000))), final, "a", tmp_path)
    write_atomic(pickle.dumps("short"), final, "b", tmp_path)
    with open(final, "rb") as fh:
        assert pickle.load(fh) == "short"
    assert _files(tmp_path) == [final]


def test_snapshot_writer_writes_in_background_and_reports_a_failure_once(
    tmp_path: Path,
) -> None:
    errors: list[str] = []
    writer = SnapshotWriter(errors.append)
    good = memory_path(tmp_path / "ok", "step-000001-000002", 0)
    ok = str(tmp_path / "ok")
    writer.submit(_Write(pickle.dumps(_snapshot_like()), good, "step-000001-000002", ok))
    bad_root = tmp_path / "bad"
    bad_root.mkdir()
    (bad_root / "memory").write_text("not a directory")
    bad = memory_path(bad_root, "step-000003-000004", 0)
    writer.submit(_Write(b"lost", bad, "step-000003-000004", str(bad_root)))
    later = memory_path(tmp_path / "ok", "step-000005-000006", 0)
    writer.submit(_Write(pickle.dumps({"n": 5}), later, "step-000005-000006", ok))
    assert writer.drain(timeout=30)
    assert writer.backlog == 0
    assert len(errors) == 1
    assert str(bad) in errors[0]
    with open(good, "rb") as fh:
        assert pickle.load(fh) == _snapshot_like()
    with open(later, "rb") as fh:  # the thread outlived the failed write
        assert pickle.load(fh) == {"n": 5}
    assert _files(bad_root) == [bad_root / "memory"]


def test_snapshot_writer_refuses_a_link_below_the_run_directory(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    run = tmp_path / "run"
    (run / "memory").mkdir(parents=True)
    (run / "memory" / "step-000001-000002").symlink_to(outside, target_is_directory=True)
    errors: list[str] = []
    writer = SnapshotWriter(errors.append)
    path = memory_path(run, "step-000001-000002", 0)
    writer.submit(_Write(pickle.dumps(_snapshot_like()), path, "step-000001-000002", str(run)))
    assert writer.drain(timeout=30)
    (error,) = errors
    assert "refusing to write through a symbolic link" in error and str(path) in error
    assert list(outside.iterdir()) == []


def test_snapshot_writer_drain_without_writes_returns_at_once() -> None:
    writer = SnapshotWriter(lambda cause: None)
    assert writer.drain(timeout=0)
    assert writer.backlog == 0


def _traced(tmp_path: Path, **options: bool) -> ProfileConfig:
    return ProfileConfig(output_dir=tmp_path, trace=TraceConfig(enable=True, **options))


def test_memory_that_can_never_dump_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        ProfileConfig(output_dir=tmp_path, memory=MemoryConfig(enable=True, on_oom=False))
    assert info.value.field == "memory.on_oom"
    assert "recorded and never written" in str(info.value)
    oom_only = ProfileConfig(output_dir=tmp_path, memory=MemoryConfig(enable=True))
    assert incompatibilities(oom_only, torch) == []
    windows = ProfileConfig(
        output_dir=tmp_path,
        trace=TraceConfig(enable=True),
        memory=MemoryConfig(enable=True, on_oom=False),
    )
    assert incompatibilities(windows, torch) == []


# -- with a GPU ----------------------------------------------------------------------


def _load(path: Path) -> dict[str, object]:
    with open(path, "rb") as fh:
        data = pickle.load(fh)
    assert isinstance(data, dict)
    return data


def _actions(snapshot: dict[str, object]) -> set[str]:
    traces = snapshot["device_traces"]
    assert isinstance(traces, list)
    return {entry["action"] for device in traces for entry in device}


@pytest.mark.gpu
def test_gpu_dump_writes_a_snapshot_memory_viz_reads(tmp_path: Path) -> None:
    from torch.cuda import _memory_viz

    snaps = MemorySnapshots(MemoryConfig(enable=True, max_entries=10000), str(tmp_path), _rank())
    snaps.start()
    try:
        kept = torch.randn(1024, 1024, device="cuda")
        freed = torch.randn(256, 256, device="cuda")
        del freed
        snaps.step()
        snaps.dump("step-000001-000001")
    finally:
        snaps.stop()
    assert snaps.enabled and snaps.fault_reason is None
    assert snaps.dumps == 1
    path = memory_path(tmp_path, "step-000001-000001", 0)
    assert _files(tmp_path) == [path]
    data = _load(path)
    assert {"segments", "device_traces"} <= set(data)
    assert {"alloc", "free_requested"} <= _actions(data)
    segments = data["segments"]
    assert isinstance(segments, list)
    allocated = [b for seg in segments for b in seg["blocks"] if b["state"] == "active_allocated"]
    assert any(b["size"] >= kept.numel() * kept.element_size() for b in allocated)
    html = _memory_viz.trace_plot(data)
    assert isinstance(html, str) and "MemoryViz" in html
    del kept


@pytest.mark.gpu
def test_gpu_out_of_memory_dumps_before_the_error_reaches_the_loop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    snaps = MemorySnapshots(MemoryConfig(enable=True, max_entries=10000), str(tmp_path), _rank())
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        snaps.start()
        try:
            for _ in range(3):
                snaps.step()
            with pytest.raises(torch.cuda.OutOfMemoryError):
                torch.empty(total * 2, dtype=torch.uint8, device="cuda")
        finally:
            snaps.stop()
    path = memory_path(tmp_path, oom_window_name(3), 0)
    assert path.is_file()
    assert "oom" in _actions(_load(path))
    assert snaps.fault_reason is None
    (warned,) = _records(caplog, logging.WARNING)
    assert "out of memory" in warned and str(path) in warned
    # Stopped: a later OOM in this process writes nothing more.
    with pytest.raises(torch.cuda.OutOfMemoryError):
        torch.empty(total * 2, dtype=torch.uint8, device="cuda")
    assert _files(tmp_path) == [path]


@pytest.mark.gpu
def test_gpu_out_of_memory_through_the_profiler_in_a_loop_that_goes_on(tmp_path: Path) -> None:
    """The loop catches the error and goes on, as a loop that skips a too-large batch does:
    the snapshot is on disk and the steps after it run and are timed."""
    config = ProfileConfig(
        output_dir=tmp_path,
        memory=MemoryConfig(enable=True, max_entries=10000),
        timer=TimerConfig(enable=True, every_n_steps=1),
    )
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    a = torch.randn(256, 256, device="cuda")
    caught = []
    with Profiler(config, rank=0, world_size=1) as prof:
        for step in range(5):
            try:
                with prof.phase("forward"):
                    if step == 2:
                        torch.empty(total * 2, dtype=torch.uint8, device="cuda")
                    a = (a @ a).tanh_()
            except torch.cuda.OutOfMemoryError:
                caught.append(step)
            prof.step()
    assert caught == [2]
    path = memory_path(tmp_path, oom_window_name(2), 0)
    assert path.is_file() and "oom" in _actions(_load(path))
    assert prof.faults == []
    timings = (tmp_path / "timings" / "rank-00000.jsonl").read_text().splitlines()
    forward = [json.loads(line) for line in timings if '"phase":"forward"' in line]
    assert [(r["step"], r["error"]) for r in forward] == [(s, s == 2) for s in range(5)]


@pytest.mark.gpu
def test_gpu_failed_write_warns_once_and_turns_snapshots_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "memory").write_text("a file where the directory should be")
    snaps = MemorySnapshots(MemoryConfig(enable=True, max_entries=1000), str(tmp_path), _rank())
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        snaps.start()
        keep = torch.ones(1024, device="cuda")
        snaps.dump("step-000001-000001")
        snaps.stop()  # waits for the write, then acts on its failure
        snaps.dump("step-000002-000002")
        snaps.step()
    (warned,) = _records(caplog, logging.WARNING)
    assert "memory snapshots are off" in warned
    assert not snaps.enabled
    assert snaps.fault_reason is not None and "rank-00000.pickle" in snaps.fault_reason
    assert snaps.dumps == 1
    assert _files(tmp_path) == [tmp_path / "memory"]
    del keep


# -- through the Profiler ----------------------------------------------------------------


def test_profiler_without_cuda_says_so_once_and_writes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from rankscope import Profiler

    config = ProfileConfig(output_dir=tmp_path / "run", memory=MemoryConfig(enable=True))
    with (
        caplog.at_level(logging.DEBUG, logger=LOGGER),
        Profiler(config, rank=0, world_size=1) as prof,
    ):
        for _ in range(3):
            prof.step()
    said = [r for r in caplog.records if "effective config" not in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO]
    assert "memory snapshots need CUDA" in said[0].getMessage()
    assert "rank 0" in said[0].getMessage()
    assert not (tmp_path / "run").exists()
    assert prof.faults == []


def test_profiler_warns_once_about_trace_options_that_break_swap_tensors(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from rankscope import Profiler

    config = _traced(tmp_path, record_shapes=True)
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            Profiler(config, rank=0, world_size=2)
            Profiler(config, rank=1, world_size=2)  # said once, by rank 0
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)
    (warned,) = [r.getMessage() for r in caplog.records]
    assert "trace.record_shapes=True" in warned and "swap_tensors" in warned


def test_memory_that_no_window_could_ever_dump_on_this_rank_is_turned_off_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from rankscope import Profiler

    config = ProfileConfig(
        output_dir=tmp_path,
        trace=TraceConfig(enable=True, ranks="0", trigger_check_every_n_steps=0),
        memory=MemoryConfig(enable=True, ranks="0-1", on_oom=False),
    )
    with caplog.at_level(logging.INFO, logger=LOGGER):
        outside = Profiler(config, rank=1, world_size=2)
    assert outside._memory is None and outside._capture is None
    (warned,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "memory.on_oom is False and rank 1 can be asked for no trace window" in warned
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        Profiler(config, rank=0, world_size=2)  # windows there: no warning (CPU: one info line)
    assert [r.levelno for r in caplog.records if "effective config" not in r.getMessage()] == [
        logging.INFO
    ]
