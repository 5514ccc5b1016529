"""Profiler.metrics() and the reader behind it (watch/_peers.py, watch/_tails.py), on real
Profilers, real files and real spawned gloo ranks."""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import rankscope
from rankscope.rundir._layout import timing_path
from rankscope.testing._gloo import GlooRanks
from rankscope.watch._tails import PHASES_KEPT, TAIL_BYTES, TimingTail

OFF = "figures for the trainer's logs are off"


def _config(run: Path | str, **timer: Any) -> rankscope.ProfileConfig:
    return rankscope.ProfileConfig(
        output_dir=run,
        timer=rankscope.TimerConfig(
            enable=True, **{"every_n_steps": 1, "flush_every_n_steps": 1, **timer}
        ),
    )


def _steps(prof: rankscope.Profiler, n: int, forward_s: float = 0.002) -> None:
    for _ in range(n):
        with prof.phase("forward"):
            time.sleep(forward_s)
        with prof.phase("all_reduce", kind="comm"):
            pass
        prof.step()


def _fresh(prof: rankscope.Profiler) -> None:
    peers = prof._peers
    assert peers is not None and peers.wait_fresh()


def test_metrics_give_this_ranks_medians_once_and_the_view_across_ranks(tmp_path: Path) -> None:
    prof = rankscope.Profiler(_config(tmp_path / "run"), rank=0, world_size=1)
    assert prof.metrics() == {}  # before start()
    with prof:
        first = prof.metrics()  # starts the reader; no step is written yet
        assert not any(k.startswith(("rankscope/step", "rankscope/phase")) for k in first)
        _steps(prof, 4, forward_s=0.02)
        _fresh(prof)
        got = prof.metrics()
        assert got["rankscope/sampled_steps"] == 4
        assert 20 <= got["rankscope/phase_ms/forward"] < got["rankscope/step_ms"]
        assert got["rankscope/ranks/compared"] == 1
        assert all(k.startswith("rankscope/") and type(v) is float for k, v in got.items())
        again = prof.metrics()  # no new step read since: this rank's medians are not repeated
        assert "rankscope/step_ms" not in again and again["rankscope/ranks/compared"] == 1
        _steps(prof, 2)
        _fresh(prof)
        assert prof.metrics()["rankscope/sampled_steps"] == 2  # the steps since the last call
    assert prof.metrics() == {}  # after stop()
    assert prof._peers is None


def test_metrics_are_empty_where_the_timer_is_off(tmp_path: Path) -> None:
    with rankscope.Profiler({"output_dir": str(tmp_path)}, rank=0, world_size=1) as prof:
        assert prof.metrics() == {}
        assert prof._peers is None


def test_a_run_directory_removed_under_the_job_turns_the_figures_off_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = tmp_path / "run"
    with (
        caplog.at_level(logging.WARNING, "rankscope"),
        rankscope.Profiler(_config(run), rank=0, world_size=1) as prof,
    ):
        prof.metrics()
        _steps(prof, 2)
        _fresh(prof)
        assert prof.metrics()["rankscope/ranks/compared"] == 1
        shutil.rmtree(run)  # another process cleans up
        _fresh(prof)
        _steps(prof, 3)  # training goes on
        _fresh(prof)
        assert prof.metrics() == {}
    said = [r.getMessage() for r in caplog.records if OFF in r.getMessage()]
    assert len(said) == 1, said
    assert "timings is gone" in said[0]


def test_a_rank_in_a_stall_is_counted_as_hung(tmp_path: Path) -> None:
    """Two ranks in one process: rank 1, on a thread of its own, stalls in a phase; its
    watchdog says so in its heartbeat, and rank 0's figures count it."""
    config = rankscope.ProfileConfig(
        output_dir=tmp_path / "run",
        timer=rankscope.TimerConfig(enable=True, every_n_steps=1, flush_every_n_steps=1),
        hang=rankscope.HangConfig(after_s=0.5, heartbeat_s=0.1),
    )
    stalled, release = threading.Event(), threading.Event()

    def rank_1() -> None:
        with rankscope.Profiler(config, rank=1, world_size=2) as prof:
            _steps(prof, 2)
            with prof.phase("data_loading", kind="data"):
                stalled.set()
                release.wait(60)
            prof.step()

    thread = threading.Thread(target=rank_1)
    thread.start()
    got: dict[str, float] = {}
    try:
        with rankscope.Profiler(config, rank=0, world_size=2) as prof:
            prof.metrics()
            assert stalled.wait(30)
            deadline = time.monotonic() + 30  # the watchdog's threshold, then its heartbeat
            while got.get("rankscope/ranks/hung") != 1 and time.monotonic() < deadline:
                _fresh(prof)
                got = prof.metrics()
    finally:
        release.set()
        thread.join(30)
    assert got["rankscope/ranks/hung"] == 1
    assert got["rankscope/ranks/heartbeats"] == 2
    assert got["rankscope/ranks/stale"] == 0


def test_a_torn_line_in_another_ranks_timings_is_said_once_and_passed_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = tmp_path / "run"
    with rankscope.Profiler(_config(run), rank=1, world_size=2) as other:
        _steps(other, 3)
    with timing_path(run, 1).open("ab") as file:  # a crash mid-write, then a restart's "\n"
        file.write(b'{"v":1,"rank":1,"step":3,"phase":"forw\n')
    with (
        caplog.at_level(logging.WARNING, "rankscope"),
        rankscope.Profiler(_config(run), rank=0, world_size=2) as prof,
    ):
        prof.metrics()
        _steps(prof, 3)
        for _ in range(2):
            _fresh(prof)
        got = prof.metrics()
    said = [r.getMessage() for r in caplog.records if "not whole timing records" in r.getMessage()]
    assert len(said) == 1, said
    assert str(timing_path(run, 1)) in said[0]
    assert got["rankscope/ranks/compared"] == 2  # the rank's whole records still count


# -- the tail of a timings file: untrusted, written while it is read ---------------------


def _written(run: Path, steps: int) -> Path:
    with rankscope.Profiler(_config(run), rank=0, world_size=1) as prof:
        _steps(prof, steps)
    return timing_path(run, 0)


def test_torn_and_foreign_lines_are_passed_over_and_a_half_written_line_waits(
    tmp_path: Path,
) -> None:
    path = _written(tmp_path, 3)
    with path.open("ab") as file:
        file.write(b'{"v":1,"rank":0,"step":1,"pha\n[1,2]\n{"v":2}\n\xff\xfe\n')
    tail = TimingTail(since_ns=0)
    assert tail.read(path)
    assert sorted(tail.steps) == [0, 1, 2]
    assert tail.skipped == 4
    forward = tail.steps[1].phases["forward"]
    with path.open("ab") as file:  # a record being written: its first half, then the rest
        file.write(b'{"v":1,"rank":0,"step":3,"phase":"forward","kind":"compute",')
    assert tail.read(path) and 3 not in tail.steps
    with path.open("ab") as file:
        file.write(b'"start_ns":1,"cpu_ms":5.0,"gpu_ms":7.5,"depth":0,"error":false}\n')
    assert tail.read(path)
    assert tail.steps[3].phases == {"forward": ("compute", 7.5)}  # the longer clock
    assert tail.steps[1].phases["forward"] == forward


def test_a_tail_reads_a_bounded_end_and_forgets_a_file_that_vanished_or_was_replaced(
    tmp_path: Path,
) -> None:
    path = _written(tmp_path / "a", 2)
    tail = TimingTail(since_ns=0)
    assert tail.read(path)
    with path.open("ab") as file:  # far more than a read takes: only the end is read
        file.write(b"x" * (4 * TAIL_BYTES) + b"\n")
    assert tail.read(path)
    # The read began inside the long line: a fragment, passed over; what was read stays.
    assert tail.skipped == 0 and sorted(tail.steps) == [0, 1]
    replaced = _written(tmp_path / "b", 5)
    os.replace(replaced, path)
    assert tail.read(path)
    assert sorted(tail.steps) == list(range(5))
    path.unlink()
    assert not tail.read(path)
    path.mkdir()
    assert not tail.read(path)


def test_a_file_that_makes_up_phase_names_cannot_grow_a_step_without_bound(
    tmp_path: Path,
) -> None:
    path = _written(tmp_path, 1)
    tail = TimingTail(since_ns=0)
    line = '{{"v":1,"rank":0,"step":0,"phase":"p{}","kind":"compute","start_ns":1,"cpu_ms":1.0,"gpu_ms":null,"depth":0,"error":false}}\n'
    for batch in range(3):  # over several reads, as a rank would append them
        with path.open("a") as file:
            file.write("".join(line.format(batch * 1000 + i) for i in range(1000)))
        assert tail.read(path)
    assert len(tail.steps[0].phases) == PHASES_KEPT
    assert "forward" in tail.steps[0].phases  # the rank's own, read first, stay


def test_records_from_before_this_process_started_and_an_earlier_attempt_are_not_read(
    tmp_path: Path,
) -> None:
    path = _written(tmp_path, 3)
    tail = TimingTail(since_ns=time.time_ns())
    assert tail.read(path) and tail.steps == {}
    tail = TimingTail(since_ns=0)
    assert tail.read(path) and sorted(tail.steps) == [0, 1, 2]
    with path.open("ab") as file:  # the rank's process started again
        file.write(b'{"v":1,"rank":0,"attempt":"another","started_ns":5}\n')
    assert tail.read(path) and tail.steps == {}


# -- four real ranks: the logging rank names the slow one --------------------------------

SLOW_RANK = 2


def slow_rank_job(rank: int, world_size: int, run_dir: str, out: str) -> None:
    """Every rank computes 5 ms and all-reduces; rank SLOW_RANK computes 60 ms, so the
    others wait for it in the all-reduce. Rank 0 writes what metrics() said to `out`.
    The ranks start apart, as the ranks of a launch may: rank 3 has begun its first step
    before rank 0 begins its attempt, and ranks 1 and 2 begin theirs after."""
    x = torch.ones(4)
    time.sleep({0: 0.5, 1: 0.8, 2: 0.8, 3: 0.0}[rank])
    with rankscope.Profiler(_config(run_dir)) as prof:
        if rank == 0:
            prof.metrics()
        for _ in range(8):
            with prof.phase("compute"):
                time.sleep(0.06 if rank == SLOW_RANK else 0.005)
            with prof.phase("all_reduce", kind="comm"):
                dist.all_reduce(x)
            prof.step()
        dist.barrier()  # every rank's records of the 8 steps are written by now
        if rank == 0:
            _fresh(prof)
            Path(out).write_text(json.dumps(prof.metrics()))
        dist.barrier()


@pytest.mark.slow
def test_the_logging_rank_names_the_slow_rank_of_four(
    tmp_path: Path, gloo_ranks: GlooRanks
) -> None:
    out = tmp_path / "metrics.json"
    gloo_ranks.run(slow_rank_job, 4, tmp_path / "run", str(out))
    got = json.loads(out.read_text())
    assert got["rankscope/ranks/compared"] == 4
    assert got["rankscope/ranks/slowest_rank"] == SLOW_RANK
    assert got["rankscope/ranks/slowest_ratio"] > 3
    assert got["rankscope/straggler/rank"] == SLOW_RANK
    assert got["rankscope/straggler/phase/compute"] == 1.0
    assert 40 < got["rankscope/straggler/ms"] < 200
    # Rank 0's own medians: its compute is the fast one; it waits in the all-reduce.
    assert got["rankscope/phase_ms/compute"] < 40 < got["rankscope/phase_ms/all_reduce"]
