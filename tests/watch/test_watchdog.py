"""The heartbeat and the hang watchdog, on real Profilers (and real spawned gloo ranks)."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

import rankscope
from rankscope import HangConfig
from rankscope.testing._gloo import GlooRanks

from .._helpers import final_files, rankscope_warnings

FAST = {"after_s": 1.0, "heartbeat_s": 0.3}  # a stall after 1 s, polled every 0.25 s


def _config(run: Path, **hang: Any) -> rankscope.ProfileConfig:
    return rankscope.ProfileConfig(
        output_dir=run,
        timer=rankscope.TimerConfig(enable=True, every_n_steps=10),
        hang=HangConfig(**{**FAST, **hang}),
    )


def _run(run: Path, stall: Callable[[int], float], steps: int = 6, **hang: Any) -> None:
    """`steps` steps of 50 ms; step i also sleeps stall(i) seconds in a data phase."""
    with rankscope.Profiler(_config(run, **hang), rank=0, world_size=1) as prof:
        for i in range(steps):
            with prof.phase("forward"):
                time.sleep(0.05)
            with prof.phase("data_loading", kind="data"), prof.phase("read", kind="io"):
                time.sleep(stall(i))
            prof.step()


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def test_a_stall_writes_one_hang_file_with_phases_and_stacks_then_its_end(tmp_path: Path) -> None:
    _run(tmp_path, lambda i: 2.5 if i == 4 else 0.0)
    (hang,) = sorted((tmp_path / "hangs").rglob("*.json"))
    token = _json(tmp_path / "meta" / "rank-00000.json")["attempt"]["attempt"]
    assert hang.relative_to(tmp_path).as_posix() == f"hangs/step-000004-{token}/rank-00000.json"
    data = _json(hang)
    assert (data["step"], data["last_completed_step"], data["threshold_s"]) == (4, 3, 1.0)
    assert [(p["phase"], p["kind"], p["depth"]) for p in data["open"]] == [
        ("data_loading", "data", 0),
        ("read", "io", 1),
    ]
    assert all(0.5 < p["open_s"] < 2.5 for p in data["open"])
    training = data["threads"][0]
    assert training["training"] and training["name"] == "MainThread"
    assert training["stack"][-1]["code"] == "time.sleep(stall(i))"
    assert data["flight_recorder"] == {"skipped": "torch.distributed is not initialized"}
    assert data["ended_ns"] is not None and 2.0 < data["stalled_s"] < 4.0  # the rank moved on
    beat = _json(tmp_path / "live" / "rank-00000.json")
    assert (beat["state"], beat["step"], beat["open"], beat["hang"]) == ("stopped", 6, [], None)
    assert beat["attempt"] == _json(tmp_path / "meta" / "rank-00000.json")["attempt"]["attempt"]


def test_a_wall_clock_step_during_a_stall_moves_no_interval_the_hang_file_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The wall clock steps 10 min forward once the stalled phase is open (NTP catching
    # up after a VM was paused): how long the phase was open and how long the stall
    # lasted are the monotonic clock's, not 10 min more.
    real = time.time_ns

    def stall(i: int) -> float:
        if i == 4:
            monkeypatch.setattr(time, "time_ns", lambda: real() + 600 * 10**9)
        return 2.5 if i == 4 else 0.0

    _run(tmp_path, stall)
    (hang,) = sorted((tmp_path / "hangs").rglob("*.json"))
    data = _json(hang)
    assert all(0.5 < p["open_s"] < 2.5 for p in data["open"]), data["open"]
    assert 2.0 < data["stalled_s"] < 4.0


def test_a_live_heartbeat_says_the_step_and_the_open_phases(tmp_path: Path) -> None:
    config = _config(tmp_path)
    with rankscope.Profiler(config, rank=0, world_size=1) as prof:
        for _ in range(3):
            prof.step()
        with prof.phase("backward"), prof.phase("all_reduce", kind="comm"):
            time.sleep(1.0)
            beat = _json(tmp_path / "live" / "rank-00000.json")
    assert (beat["state"], beat["step"], beat["stopped_ns"]) == ("running", 3, None)
    assert [(p["phase"], p["kind"]) for p in beat["open"]] == [
        ("backward", "compute"),
        ("all_reduce", "comm"),
    ]
    assert beat["written_ns"] >= beat["moved_ns"] >= beat["step_started_ns"] > 0


def test_a_merely_slow_step_under_the_threshold_is_no_hang(tmp_path: Path) -> None:
    _run(tmp_path, lambda i: 0.6 if i == 3 else 0.0, after_s=2.0)
    assert not (tmp_path / "hangs").exists()


def test_phases_of_other_threads_are_not_the_training_threads(tmp_path: Path) -> None:
    import threading

    with rankscope.Profiler(_config(tmp_path), rank=0, world_size=1) as prof:
        gate = threading.Event()

        def background() -> None:
            with prof.phase("checkpoint", kind="io"):
                gate.wait(5)

        worker = threading.Thread(target=background)
        worker.start()
        with prof.phase("all_reduce", kind="comm"):
            time.sleep(0.8)
            beat = _json(tmp_path / "live" / "rank-00000.json")
        gate.set()
        worker.join()
    assert [p["phase"] for p in beat["open"]] == ["all_reduce"]


def test_an_unwritable_directory_is_one_warning_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "live").write_text("a file where the folder goes")
    (tmp_path / "hangs").write_text("and here")
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        _run(tmp_path, lambda i: 2.5 if i == 2 else 0.0)
    said = [w for w in rankscope_warnings(caplog) if "watchdog" in w]
    assert len(said) == 1 and "keeps watching, and training goes on" in said[0]
    assert (tmp_path / "timings" / "rank-00000.jsonl").exists()  # the rest of the run went on


def test_heartbeats_follow_no_link(tmp_path: Path) -> None:
    run, outside = tmp_path / "run", tmp_path / "outside"
    run.mkdir()
    outside.mkdir()
    (run / "live").symlink_to(outside, target_is_directory=True)
    (run / "hangs").symlink_to(outside, target_is_directory=True)
    _run(run, lambda i: 2.5 if i == 2 else 0.0)
    assert list(outside.iterdir()) == []


def test_off_writes_no_heartbeat(tmp_path: Path) -> None:
    _run(tmp_path, lambda i: 0.0, enable=False)
    assert final_files(tmp_path, heartbeats=True) == [
        "meta/rank-00000.json",
        "timings/rank-00000.jsonl",
    ]


def test_the_watchdog_calls_no_collective(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    called: list[str] = []
    for name in (
        "all_reduce",
        "all_gather",
        "all_gather_object",
        "broadcast",
        "broadcast_object_list",
        "barrier",
        "gather",
        "scatter",
        "reduce",
        "monitored_barrier",
    ):
        monkeypatch.setattr(dist, name, lambda *a, _name=name, **k: called.append(_name))
    # A real process group (one rank, gloo), as in a distributed job.
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1
    )
    try:
        _run(tmp_path / "run", lambda i: 2.5 if i == 2 else 0.0)
    finally:
        dist.destroy_process_group()
    assert called == []
    tmp_path = tmp_path / "run"
    hang = _json(next((tmp_path / "hangs").glob("step-000002-*/rank-00000.json")))
    # gloo's Flight Recorder buffer, dumped from this process without a collective.
    assert hang["flight_recorder"] == {"path": "rank-00000.flight-recorder.pickle"}
    assert hang["process_groups"] == [
        {"name": "0", "desc": "default_pg", "ranks": [0], "backend": "gloo"}
    ]
    assert os.path.exists(tmp_path / "live" / "rank-00000.json")


@pytest.mark.parametrize("fault", ["raises", "too large"])
def test_a_flight_recorder_dump_that_fails_is_a_reason_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    import torch

    from rankscope.watch import _flight

    if fault == "raises":

        def dump(**_: Any) -> bytes:
            raise RuntimeError("the buffer is locked")

        monkeypatch.setattr(torch._C._distributed_c10d, "_dump_fr_trace", dump)
    else:
        monkeypatch.setattr(_flight, "DUMP_LIMIT", 10)
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1
    )
    try:
        _run(tmp_path / "run", lambda i: 2.5 if i == 2 else 0.0)  # all 6 steps run
    finally:
        dist.destroy_process_group()
    hang = _json(next((tmp_path / "run" / "hangs").glob("step-000002-*/rank-00000.json")))
    skipped = hang["flight_recorder"]["skipped"]
    if fault == "raises":
        assert skipped == "the dump failed (RuntimeError: the buffer is locked)"
    else:
        assert skipped.startswith("the dump is ") and skipped.endswith(
            "bytes, over 10: not written"
        )
    assert not list((tmp_path / "run" / "hangs").glob("*/*.flight-recorder.pickle"))
    assert hang["ended_ns"] is not None  # the stall ended: the job went on


# -- the trigger, answered by the heartbeat -------------------------------------------------


def test_a_trigger_works_from_the_first_step_and_not_on_a_finished_run(tmp_path: Path) -> None:
    from rankscope.cli._trigger_client import ask_for_window, trigger_status

    config = rankscope.ProfileConfig(
        output_dir=tmp_path,
        trace=rankscope.TraceConfig(
            enable=True, ranks="0", schedule=rankscope.Schedule(wait=10**6)
        ),
        hang=HangConfig(**FAST),
    )
    with rankscope.Profiler(config, rank=0, world_size=1) as prof:  # no timer: no timings
        prof.step()
        time.sleep(0.6)  # one heartbeat
        asked = ask_for_window(tmp_path)
        assert asked["latest_step"] == 1 and asked["run"]["source"] == "heartbeat"
        assert asked["start"] > 1 and asked["run"]["state"] == "running"
    with pytest.raises(rankscope.TraceError, match="the run looks finished: every rank's stop"):
        ask_for_window(tmp_path)
    status = trigger_status(tmp_path)
    assert status["run"]["state"] == "finished" and "looks finished" in status["run"]["note"]
    from rankscope.cli import main

    assert main(["trigger", str(tmp_path)]) == 2  # nothing is written for a finished run
    assert not list((tmp_path / "triggers").glob("*.json"))[1:]  # only the first trigger
    assert main(["trigger", str(tmp_path), "--status"]) == 0


def test_a_run_whose_heartbeats_stopped_moving_is_said_to_look_over(tmp_path: Path) -> None:
    from rankscope.cli._trigger_client import run_progress

    _run(tmp_path, lambda i: 0.0)
    beat = _json(tmp_path / "live" / "rank-00000.json")
    beat.update(state="running", stopped_ns=None)  # killed: no stop() recorded an end
    (tmp_path / "live" / "rank-00000.json").write_text(json.dumps(beat))
    later = beat["moved_ns"] + 20 * 60 * 10**9
    progress = run_progress(tmp_path, now_ns=later)
    assert progress.state == "stale" and "no heartbeat has moved for 20 min" in (
        progress.note or ""
    )


def _hang_files(run: Path, pattern: str, world: int) -> list[Path]:
    """The hang files under RUN_DIR/hangs matching `pattern`, once every rank wrote one (or
    after 90 s, whatever is there: the test's assertion says what is missing)."""
    deadline = time.monotonic() + 90
    while True:
        hangs = sorted((run / "hangs").glob(pattern))
        if len(hangs) == world or time.monotonic() > deadline:
            return hangs
        time.sleep(0.5)


# -- a real hang: four spawned gloo ranks, one stuck outside any collective ------------------


@pytest.mark.slow
def test_one_rank_stuck_in_data_loading_is_named_and_the_others_wait(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], gloo_ranks: GlooRanks
) -> None:
    from rankscope.cli import main

    from .._dist_workers import hang_one_rank

    world, stuck, run = 4, 2, tmp_path / "run"
    ranks = gloo_ranks.start(hang_one_rank, world, run, stuck)
    try:
        hangs = _hang_files(run, "*/rank-*.json", world)
        assert sorted((h.parent.name[:11], h.name) for h in hangs) == [
            ("step-000003", f"rank-{r:05d}.json") for r in range(world)
        ]
        time.sleep(1.0)  # the heartbeats that say the stall
        assert main(["hang", str(run), "--json"]) == 0
        found = json.loads(capsys.readouterr().out)
    finally:
        ranks.kill()
    by_rank = {f["rank"]: f for f in found["findings"]}
    assert sorted(by_rank) == list(range(world))
    assert (by_rank[stuck]["role"], by_rank[stuck]["phase"], by_rank[stuck]["step"]) == (
        "stuck",
        "data_loading",
        3,
    )
    for rank in set(range(world)) - {stuck}:
        assert (by_rank[rank]["role"], by_rank[rank]["phase"]) == ("waits", "all_reduce"), rank
    stack = json.loads(
        next((run / "hangs").glob(f"step-000003-*/rank-{stuck:05d}.json")).read_text()
    )
    assert stack["threads"][0]["stack"][-1]["function"] == "wait"  # Event.wait, where it sits


def ddp_hang_in_forward(rank: int, world_size: int, run_dir: str, stuck: int) -> None:
    """Plain DDP on gloo, forward and backward timed as compute phases (the gradient
    all-reduce hides inside backward); rank `stuck` blocks for good in forward at step
    30, so the others wait for it inside backward (the test kills them). Spawned ranks
    import it by module path."""
    import threading

    import torch
    from torch import nn

    model = nn.parallel.DistributedDataParallel(nn.Linear(16, 4))
    config = rankscope.ProfileConfig(
        output_dir=run_dir,
        timer=rankscope.TimerConfig(enable=True, every_n_steps=1, flush_every_n_steps=1),
        hang=HangConfig(after_s=2.0, heartbeat_s=0.5),
    )
    with rankscope.Profiler(config) as prof:
        for step in range(10_000):
            with prof.phase("forward"):
                if rank == stuck and step == DDP_STUCK_STEP:
                    threading.Event().wait()  # a dead data-loader worker: forever
                # Ranks reach backward apart and leave it together: its all-reduce.
                time.sleep(0.005 * (rank + 1))
                loss = model(torch.randn(8, 16)).sum()
            with prof.phase("backward"):
                loss.backward()
            prof.step()


DDP_STUCK_STEP = 30


@pytest.mark.slow
def test_plain_ddp_names_the_rank_stuck_in_forward_and_the_others_wait_in_backward(
    tmp_path: Path, gloo_ranks: GlooRanks, capsys: pytest.CaptureFixture[str]
) -> None:
    from rankscope.cli import main

    world, stuck, run = 4, 1, tmp_path / "run"
    ranks = gloo_ranks.start(ddp_hang_in_forward, world, run, stuck)
    try:
        # Of that step alone: a busy machine may have made an earlier step a stall too.
        hangs = _hang_files(run, f"step-{DDP_STUCK_STEP:06d}-*/rank-*.json", world)
        assert sorted(h.name for h in hangs) == [f"rank-{r:05d}.json" for r in range(world)]
        time.sleep(1.0)  # the heartbeats that say the stall
        assert main(["hang", str(run), "--json"]) == 0
        found = json.loads(capsys.readouterr().out)
        assert main(["hang", str(run)]) == 0
        terminal = capsys.readouterr().out
    finally:
        ranks.kill()
    by_rank = {f["rank"]: f for f in found["findings"]}
    assert sorted(by_rank) == list(range(world))
    assert (found["ranks"]["stuck"], found["ranks"]["waiting"]) == ([stuck], [0, 2, 3])
    assert (by_rank[stuck]["phase"], by_rank[stuck]["step"]) == ("forward", DDP_STUCK_STEP)
    for rank in (0, 2, 3):
        assert (by_rank[rank]["phase"], by_rank[rank]["step"]) == ("backward", DDP_STUCK_STEP)
    # The Flight Recorder dumps show the all-reduce inside backward that rank 1 never
    # entered: the heartbeats' guess from the phase order, confirmed by the collectives.
    assert found["summary"].startswith(
        f"rank {stuck}, stuck in forward (compute) at step {DDP_STUCK_STEP} for "
    ), found["summary"]
    assert "never entered all_reduce #" in found["summary"]
    assert "in which ranks 0, 2, 3 wait" in found["summary"]
    for rank in (0, 2, 3):
        assert by_rank[rank]["why"] == "in a collective that a rank of its group never entered"
    for f in by_rank.values():
        assert f["flight_recorder"].endswith(".flight-recorder.pickle")
    assert "Collectives by process group (4 Flight Recorder dumps)" in " ".join(terminal.split())


def test_a_run_that_ends_inside_a_stall_ends_the_stall(tmp_path: Path) -> None:
    with rankscope.Profiler(_config(tmp_path, factor=1.0), rank=0, world_size=1) as prof:
        prof.step()
        with prof.phase("evaluate"):
            time.sleep(2.5)  # after the last step(): an eval, a checkpoint
    (hang,) = (tmp_path / "hangs").rglob("rank-00000.json")
    assert _json(hang)["ended_ns"] is not None
    assert _json(tmp_path / "live" / "rank-00000.json")["hang"] is None


def test_a_restart_that_stalls_at_the_same_step_keeps_the_earlier_hang_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rankscope.rundir import _attempt

    for _ in range(2):
        monkeypatch.setattr(_attempt, "_current", None)  # as a new process would be
        _run(tmp_path, lambda i: 2.5 if i == 2 else 0.0, steps=3)
    tokens = {_json(h)["attempt"] for h in (tmp_path / "hangs").rglob("rank-00000.json")}
    assert len(tokens) == 2
