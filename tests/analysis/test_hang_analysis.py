"""Who is stuck and where: heartbeats and hang files written by hand, read back by
`find_hangs` and `rankscope hang`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from rankscope.analysis import find_hangs
from rankscope.cli import main
from rankscope.rundir._layout import hang_path, live_path, meta_path, stall_name
from rankscope.testing._synthetic import write_timings

from .._helpers import run_cli

NOW = 1_764_000_000 * 10**9
"""The time every test judges against (epoch ns)."""
S = 10**9
STEP = 120


# -- writing the files by hand ------------------------------------------------------------


def phase(name: str, kind: str, ago: float, depth: int = 0) -> dict[str, Any]:
    """An open phase entered `ago` seconds before NOW."""
    return {"phase": name, "kind": kind, "since_ns": NOW - int(ago * S), "depth": depth}


def heartbeat(
    rank: int,
    *,
    step: int = STEP,
    moved_ago: float = 0.5,
    written_ago: float = 1.0,
    open_phases: list[dict[str, Any]] | None = None,
    state: str = "running",
    attempt: str | None = None,
    median: float | None = 0.5,
    **extra: Any,
) -> dict[str, Any]:
    data = {
        "v": 1,
        "rank": rank,
        "host": f"node{rank // 8:03d}",
        "pid": 1000 + rank,
        "attempt": attempt or f"attempt-{rank}",
        "written_ns": NOW - int(written_ago * S),
        "moved_ns": NOW - int(moved_ago * S),
        "step": step,
        "step_started_ns": NOW - int(moved_ago * S) - S,
        "median_step_s": median,
        "open": open_phases or [],
        "state": state,
        "stopped_ns": NOW - int(written_ago * S) if state == "stopped" else None,
        "hang": None,
    }
    data.update(extra)
    return data


def hang_file(
    rank: int,
    *,
    step: int = STEP,
    detected_ago: float,
    open_phases: list[dict[str, Any]],
    attempt: str | None = None,
    ended_ago: float | None = None,
    stack: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    training = {
        "name": "MainThread",
        "ident": 140001,
        "daemon": False,
        "training": True,
        "stack": stack
        or [
            {"file": "train.py", "line": 40, "function": "<module>", "code": "main()"},
            {"file": "train.py", "line": 12, "function": "step", "code": "x = next(it)"},
        ],
    }
    other = {
        "name": "thread 140002",
        "ident": 140002,
        "daemon": None,  # a thread the threading module does not know
        "training": False,
        "stack": [{"file": "queue.py", "line": 171, "function": "get", "code": None}],
    }
    data = {
        "v": 1,
        "rank": rank,
        "host": f"node{rank // 8:03d}",
        "pid": 1000 + rank,
        "attempt": attempt or f"attempt-{rank}",
        "step": step,
        "last_completed_step": step - 1,
        "step_started_ns": NOW - 500 * S,
        "detected_ns": NOW - int(detected_ago * S),
        "threshold_s": 300.0,
        "median_step_s": 0.5,
        "open": [{**p, "open_s": 240.1} for p in open_phases],
        "threads": [other, training],
        "flight_recorder": {"skipped": "NCCL is not in use (gloo)"},
        "ended_ns": None if ended_ago is None else NOW - int(ended_ago * S),
        "stalled_s": None if ended_ago is None else 412.5,
    }
    data.update(extra)
    return data


def write_heartbeat(run: Path, data: dict[str, Any]) -> Path:
    path = live_path(run, data["rank"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def write_hang(run: Path, data: dict[str, Any], step: int | None = None) -> Path:
    path = hang_path(run, data["step"] if step is None else step, data["rank"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def write_meta(
    run: Path, rank: int, world: int, attempt: str | None = None, started_ago: float = 3600
) -> None:
    path = meta_path(run, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    token = attempt or f"attempt-{rank}"
    started = {"attempt": token, "started_ns": NOW - int(started_ago * S), "pid": 1000 + rank}
    data = {"v": 1, "rank": rank, "world_size": world, "host": "h", "attempt": started}
    path.write_text(json.dumps(data), encoding="utf-8")


def data_stuck_run(
    run: Path,
    *,
    dead: bool = False,
    world: int = 4,
    stuck: int = 2,
    stuck_phase: str = "data_loading",
    stack: list[dict[str, Any]] | None = None,
) -> Path:
    """Rank `stuck` in data_loading for 230 s; the others in all_reduce since a second later.

    Live: heartbeats only (no watchdog has fired yet), each last written when its rank
    last moved. Dead: that happened two hours ago; each rank's watchdog wrote its hang
    file 190 s into the stall (`stack`: the stuck rank's training thread), and the job
    was killed later."""
    for rank in range(world):
        write_meta(run, rank, world)
    gone = 7200 if dead else 0
    for rank in range(world):
        ago = gone + (230 if rank == stuck else 229)
        if rank == stuck:
            phases = [phase(stuck_phase, "data", ago)]
        else:
            phases = [phase("train", "compute", ago + 2), phase("all_reduce", "comm", ago, 1)]
        beat = heartbeat(rank, moved_ago=ago, written_ago=ago, open_phases=phases)
        if dead:
            detected = ago - 190
            beat["hang"], beat["written_ns"] = stall_name(STEP), NOW - detected * S
            own = stack if rank == stuck else None
            write_hang(run, hang_file(rank, detected_ago=detected, open_phases=phases, stack=own))
        write_heartbeat(run, beat)
    return run


def strict(text: str) -> Any:
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in --json")

    return json.loads(text, parse_constant=refuse)


# -- who is stuck, who waits --------------------------------------------------------------


def test_a_live_run_names_the_stuck_rank_and_those_waiting(tmp_path: Path) -> None:
    found = find_hangs(data_stuck_run(tmp_path), now_ns=NOW)
    assert found.state == "hung"
    assert found.summary == (
        "rank 2 has been stuck in data_loading (data) at step 120 for 4 min; "
        "ranks 0, 1, 3 wait in all_reduce (comm) at step 120"
    )
    data = strict(json.dumps(found.to_dict(), allow_nan=False))
    assert data["ranks"]["stuck"] == [2] and data["ranks"]["waiting"] == [0, 1, 3]
    (stuck,) = [f for f in data["findings"] if f["role"] == "stuck"]
    assert stuck["phase"] == "data_loading" and stuck["kind"] == "data" and stuck["step"] == STEP
    assert stuck["since"] == pytest.approx((NOW - 230 * S) / S)
    assert stuck["for_s"] == pytest.approx(230)
    assert stuck["heartbeat_age_s"] == pytest.approx(230)
    assert stuck["moved_ago_s"] == pytest.approx(230)
    assert stuck["threshold_s"] == 180.0  # max(10 x 0.5 s, hang.after_s)
    assert stuck["hang_file"] is None and stuck["frames"] == []
    waiting = [f for f in data["findings"] if f["role"] == "waits"]
    assert {f["phase"] for f in waiting} == {"all_reduce"} and "frames" not in waiting[0]
    assert [(g["role"], g["ranks"]) for g in data["groups"]] == [
        ("stuck", [2]),
        ("waits", [0, 1, 3]),
    ]
    assert data["ranks"]["missing"] == [] and data["skipped"] == [] and data["notes"] == []


def test_a_dead_run_is_read_from_its_hang_files(tmp_path: Path) -> None:
    run = data_stuck_run(tmp_path, dead=True)
    found = find_hangs(run, now_ns=NOW)
    assert found.state == "hung"
    # Judged against now: the files cannot tell a job that is stuck still from one killed.
    assert found.summary == (
        "rank 2 has been stuck in data_loading (data) at step 120 for 2.1 h; "
        "ranks 0, 1, 3 wait in all_reduce (comm) at step 120"
    )
    assert found.notes == []
    data = found.to_dict()
    (stuck,) = [f for f in data["findings"] if f["role"] == "stuck"]
    assert stuck["hang_file"] == str(hang_path(run, STEP, 2))
    assert stuck["thread"] == "MainThread"
    assert [(f["file"], f["line"], f["function"]) for f in stuck["frames"]] == [
        ("train.py", 40, "<module>"),
        ("train.py", 12, "step"),
    ]
    assert stuck["frames"][-1]["code"] == "x = next(it)"
    assert stuck["flight_recorder_skipped"] == "NCCL is not in use (gloo)"
    assert stuck["threshold_s"] == 300.0  # the hang file's
    assert stuck["detected"] == pytest.approx((NOW - (7200 + 40) * S) / S)
    assert stuck["heartbeat_age_s"] == pytest.approx(7240)

    # Hang files alone (no heartbeat survived): the same answer.
    for path in (run / "live").iterdir():
        path.unlink()
    alone = find_hangs(run, now_ns=NOW)
    assert alone.state == "hung"
    assert [f.rank for f in alone.findings if f.role == "stuck"] == [2]
    assert {f.phase for f in alone.findings if f.role == "waits"} == {"all_reduce"}


def test_the_flight_recorder_dump_is_named_beside_the_hang_file(tmp_path: Path) -> None:
    run = data_stuck_run(tmp_path, dead=True)
    hang = json.loads(hang_path(run, STEP, 2).read_text())
    hang["flight_recorder"] = {"path": "rank-00002.fr.pickle"}
    write_hang(run, hang)
    (stuck,) = [f for f in find_hangs(run, now_ns=NOW).to_dict()["findings"] if f["rank"] == 2]
    assert stuck["flight_recorder"] == str(
        hang_path(run, STEP, 2).with_name("rank-00002.fr.pickle")
    )
    hang["flight_recorder"] = {"path": "../../../etc/passwd"}  # never a path elsewhere
    write_hang(run, hang)
    found = find_hangs(run, now_ns=NOW)
    assert any("flight_recorder.path" in s for s in found.skipped)


def test_a_rank_in_no_phase_is_stuck_outside_any_phase(tmp_path: Path) -> None:
    write_heartbeat(tmp_path, heartbeat(0, moved_ago=600))
    write_heartbeat(
        tmp_path, heartbeat(1, moved_ago=599, open_phases=[phase("barrier", "comm", 599)])
    )
    found = find_hangs(tmp_path, now_ns=NOW)
    assert found.summary == (
        "rank 0 has been stuck outside any phase at step 120 for 10 min; "
        "rank 1 waits in barrier (comm) at step 120"
    )


def test_the_lowest_step_is_stuck_and_later_steps_wait(tmp_path: Path) -> None:
    write_heartbeat(
        tmp_path, heartbeat(0, step=7, moved_ago=900, open_phases=[phase("load", "io", 900)])
    )
    write_heartbeat(
        tmp_path,
        heartbeat(1, step=8, moved_ago=900, open_phases=[phase("forward", "compute", 900)]),
    )
    found = find_hangs(tmp_path, now_ns=NOW)
    assert [(f.rank, f.role) for f in found.findings] == [(0, "stuck"), (1, "waits")]
    assert [f.why for f in found.findings] == ["earliest", "at a later step"]


def test_when_every_stalled_rank_waits_the_ranks_not_there_are_named(tmp_path: Path) -> None:
    for rank in range(3):
        write_heartbeat(
            tmp_path,
            heartbeat(rank, moved_ago=700, open_phases=[phase("all_reduce", "comm", 700)]),
        )
    # Rank 3 ran out of data and left the loop: its stop() ran.
    write_heartbeat(tmp_path, heartbeat(3, step=STEP - 1, state="stopped", written_ago=700))
    found = find_hangs(tmp_path, now_ns=NOW)
    assert found.state == "hung" and found.stopped == [3]
    assert found.summary == (
        "no stalled rank is outside a collective; ranks 0-2 wait in all_reduce (comm) at "
        "step 120; rank 3 stopped at step 119 (stop() ran: it left the loop early?)"
    )


def test_a_rank_killed_mid_step_is_stuck_where_it_died(tmp_path: Path) -> None:
    for rank in range(3):
        write_heartbeat(
            tmp_path,
            heartbeat(rank, moved_ago=700, open_phases=[phase("all_reduce", "comm", 700)]),
        )
    # Rank 3's process was killed in forward: no watchdog was left to write a hang file.
    write_heartbeat(
        tmp_path,
        heartbeat(
            3, moved_ago=702, written_ago=702, open_phases=[phase("forward", "compute", 702)]
        ),
    )
    found = find_hangs(tmp_path, now_ns=NOW)
    assert found.summary == (
        "rank 3 has been stuck in forward (compute) at step 120 for 12 min; "
        "ranks 0-2 wait in all_reduce (comm) at step 120"
    )
    assert found.notes == [
        "ranks 0-3: stalled past their threshold with no hang file, so the watchdog did not "
        "write one: it is off (hang.enable), or the process is gone (killed, crashed without "
        "stop(), or its host down) and this is where it was when it went"
    ]


# -- plain DDP: the collective hides inside backward --------------------------------------


def ddp_run(run: Path, where: dict[int, str], *, timings: bool = True) -> Path:
    """A 4-rank DDP job stalled at step 120, rank r in phase where[r] (compute phases:
    the gradient all-reduce runs inside backward) for 230 s (its watchdog's hang file not
    yet due); with the timings of its
    earlier steps (_synthetic's DDP step, whose backward ends in the all-reduce), or none."""
    if timings:
        write_timings(run, ranks=4, steps=30, seed=1)
    for rank, name in where.items():
        write_heartbeat(
            run, heartbeat(rank, moved_ago=230, open_phases=[phase(name, "compute", 230)])
        )
    return run


def test_plain_ddp_the_rank_behind_in_the_step_is_stuck_and_the_ones_ahead_wait(
    tmp_path: Path,
) -> None:
    from rankscope.analysis.hangs._top import top_rows

    run = ddp_run(tmp_path, {0: "backward", 1: "forward", 2: "backward", 3: "backward"})
    found = find_hangs(run, now_ns=NOW)
    assert found.summary == (
        "rank 1 has been stuck in forward (compute) at step 120 for 4 min; "
        "ranks 0, 2, 3 wait in backward (compute) at step 120"
    )
    data = strict(json.dumps(found.to_dict(), allow_nan=False))
    assert (data["ranks"]["stuck"], data["ranks"]["waiting"]) == ([1], [0, 2, 3])
    assert [(f["rank"], f["why"]) for f in data["findings"]] == [
        (0, "at a later phase of the step"),
        (1, "earliest"),
        (2, "at a later phase of the step"),
        (3, "at a later phase of the step"),
    ]
    assert data["phases"] == {
        "order": ["host_to_device", "forward", "backward", "optimizer", "loss_allreduce"],
        "end_in_collective": ["backward", "loss_allreduce"],
    }
    assert data["notes"] == [
        "no stalled rank is in a comm phase: ranks 0, 2, 3 are taken to wait in backward as "
        "further along than rank 1 and the run's timings show backward to end in a "
        "collective (its ranks leave it together though they enter it apart); where a "
        "collective runs inside a phase (DDP's gradient all-reduce inside backward), time "
        'the collective as its own phase (kind="comm") to see where each rank waits'
    ]
    _, rows = top_rows(run, now_ns=NOW)
    assert [(r["rank"], r["role"]) for r in rows] == [
        (1, "stuck"),
        (0, "waits"),
        (2, "waits"),
        (3, "waits"),
    ]

    # Without timings the order within the step is unknown: every rank at the lowest
    # step is stuck, and the note says why they cannot be told apart.
    for path in (run / "timings").iterdir():
        path.unlink()
    found = find_hangs(run, now_ns=NOW)
    assert found.order is None and [f.role for f in found.findings] == ["stuck"] * 4
    assert found.notes == [
        "every stalled rank is in backward, forward, not a comm phase, and without the "
        "run's timings their order in the step is not known: where a collective runs inside "
        "(DDP's gradient all-reduce inside backward), time the collective as its own phase "
        '(kind="comm") to see where each rank waits and to tell the stuck rank from its '
        "waiters"
    ]


def test_plain_ddp_ranks_left_in_backward_wait_for_the_rank_that_left_the_loop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Uneven data: rank 3 ran out of batches and its stop() ran; the others wait in the
    # gradient all-reduce inside backward, which the timings show to end in a collective.
    run = ddp_run(tmp_path, {0: "backward", 1: "backward", 2: "backward"})
    write_heartbeat(run, heartbeat(3, step=STEP - 1, state="stopped", written_ago=230))
    found = find_hangs(run, now_ns=NOW)
    assert found.summary == (
        "no stalled rank is outside a collective; ranks 0-2 wait in backward (compute) at "
        "step 120; rank 3 stopped at step 119 (stop() ran: it left the loop early?)"
    )
    assert {f.why for f in found.findings} == {"in a phase that ends in a collective"}
    assert found.notes == [
        "no stalled rank is in a comm phase: ranks 0-2 are taken to wait in backward as the "
        "run's timings show backward to end in a collective (its ranks leave it together "
        "though they enter it apart); where a collective runs inside a phase (DDP's "
        'gradient all-reduce inside backward), time the collective as its own phase (kind="comm") '
        "to see where each rank waits"
    ]
    code, out, err = run_cli(["hang", str(run)], capsys)
    assert code == 0, err
    assert "note: no stalled rank is in a comm phase: ranks 0-2 are taken to wait" in " ".join(
        out.split()
    )
    # One rank left in backward: it waits there too (for the ranks that are not stalled).
    for rank in (1, 2):
        live_path(run, rank).unlink()
    found = find_hangs(run, now_ns=NOW)
    assert found.summary == (
        "no stalled rank is outside a collective; rank 0 waits in backward (compute) at "
        "step 120; rank 3 stopped at step 119 (stop() ran: it left the loop early?); "
        "ranks 1, 2 wrote no heartbeat"
    )


def test_a_rank_still_in_backward_when_the_others_are_past_it_is_stuck(tmp_path: Path) -> None:
    # The others left backward's all-reduce: rank 0 is not waiting in it.
    run = ddp_run(tmp_path, {0: "backward", 1: "optimizer", 2: "optimizer", 3: "optimizer"})
    found = find_hangs(run, now_ns=NOW)
    assert [(f.rank, f.role, f.why) for f in found.findings] == [
        (0, "stuck", "earliest"),
        (1, "waits", "at a later phase of the step"),
        (2, "waits", "at a later phase of the step"),
        (3, "waits", "at a later phase of the step"),
    ]


# -- no hang ------------------------------------------------------------------------------


def test_a_finished_run_reports_no_hang(tmp_path: Path) -> None:
    for rank in range(4):
        write_meta(tmp_path, rank, 4)
        write_heartbeat(
            tmp_path,
            heartbeat(rank, step=5000, state="stopped", written_ago=86400, moved_ago=86400),
        )
    found = find_hangs(tmp_path, now_ns=NOW)
    assert found.state == "finished" and found.findings == []
    assert found.summary == "the run finished: every rank's stop() ran (4 ranks: 0-3)"
    assert found.notes == []  # stopped long ago is no news


def test_a_fast_job_s_heartbeat_age_is_no_time_in_a_phase_and_no_pause(tmp_path: Path) -> None:
    # 30 steps a second, a heartbeat every 4 s: each was written as the rank moved, inside
    # a backward that had begun 10 ms before. 4 s later it has done 120 more steps.
    from rankscope.analysis.hangs._top import top_rows

    for rank in range(2):
        opened = [phase("backward", "compute", 4.01)]
        write_heartbeat(
            tmp_path, heartbeat(rank, moved_ago=4.0, written_ago=4.0, open_phases=opened)
        )
    found, rows = top_rows(tmp_path, now_ns=NOW)
    assert found.state == "running"
    assert found.summary.endswith("without moving at its last heartbeat is 0 s (rank 0)")
    assert [(row["phase"], row["for_s"], row["heartbeat_age_s"]) for row in rows] == [
        ("backward", 0.0, 4.0),
        ("backward", 0.0, 4.0),
    ]


def test_a_slow_rank_under_its_threshold_is_no_hang(tmp_path: Path) -> None:
    for rank in range(4):
        write_heartbeat(tmp_path, heartbeat(rank, moved_ago=100 if rank == 1 else 0.3))
    found = find_hangs(tmp_path, now_ns=NOW)
    assert found.state == "running" and found.findings == []
    assert found.summary == (
        "no rank is stalled: 4 ranks running (0-3); the longest any had gone without moving "
        "at its last heartbeat is 99 s (rank 1)"  # moved 100 s ago, its heartbeat 1 s ago
    )
    # A job of long steps gets a longer threshold: 10 x its median step time...
    write_heartbeat(tmp_path, heartbeat(1, moved_ago=900, median=120.0))
    assert find_hangs(tmp_path, now_ns=NOW).state == "running"
    write_heartbeat(tmp_path, heartbeat(1, moved_ago=1300, median=120.0))
    assert find_hangs(tmp_path, now_ns=NOW).state == "hung"
    # ...and a rank's own config (its meta file) sets the watchdog's rule.
    write_meta(tmp_path, 1, 4)
    meta = json.loads(meta_path(tmp_path, 1).read_text())
    meta["config"] = {"hang": {"enable": True, "after_s": 3600.0, "factor": 10.0}}
    meta_path(tmp_path, 1).write_text(json.dumps(meta))
    assert find_hangs(tmp_path, now_ns=NOW).state == "running"
    write_heartbeat(tmp_path, heartbeat(1, moved_ago=1300, median=0.5))
    assert find_hangs(tmp_path, now_ns=NOW).state == "running"
    write_heartbeat(tmp_path, heartbeat(1, moved_ago=3700, median=0.5))
    assert find_hangs(tmp_path, now_ns=NOW).state == "hung"


def test_missing_ranks_are_listed(tmp_path: Path) -> None:
    for rank in range(8):
        write_meta(tmp_path, rank, 8)
    for rank in range(6):
        write_heartbeat(tmp_path, heartbeat(rank))
    found = find_hangs(tmp_path, now_ns=NOW)
    assert found.missing == [6, 7] and found.world_size == 8
    assert "ranks 6, 7: no heartbeat" in found.notes


def test_an_earlier_attempts_hang_file_is_left_out(tmp_path: Path) -> None:
    for rank in range(2):
        write_heartbeat(tmp_path, heartbeat(rank, attempt=f"new-{rank}"))
    # The rank stalled in an earlier start, which was killed before the stall ended.
    write_hang(
        tmp_path,
        hang_file(
            1,
            step=40,
            detected_ago=9000,
            attempt="old-1",
            open_phases=[phase("data_loading", "data", 9400)],
        ),
    )
    found = find_hangs(tmp_path, now_ns=NOW)
    assert found.state == "running" and found.older_hang_files == 1
    assert "1 hang file of an earlier attempt left out" in found.notes


def test_a_stall_that_ended_is_history_not_a_hang(tmp_path: Path) -> None:
    write_heartbeat(tmp_path, heartbeat(0, step=STEP + 5))
    write_hang(
        tmp_path,
        hang_file(0, detected_ago=900, ended_ago=600, open_phases=[phase("save", "io", 1200)]),
    )
    found = find_hangs(tmp_path, now_ns=NOW)
    assert found.state == "running"
    assert found.stalls_ended == [
        {"stall": stall_name(STEP), "steps": [STEP], "ranks": [0], "longest_s": 412.5}
    ]
    assert "a stall that ended: rank 0 at step 120, the longest for 7 min" in found.notes


def test_heartbeats_of_an_earlier_launch_are_left_out(tmp_path: Path) -> None:
    # Eight ranks ran a day ago and were killed; the job came back with four.
    for rank in range(4, 8):
        write_meta(tmp_path, rank, 8, started_ago=86400)
        write_heartbeat(tmp_path, heartbeat(rank, moved_ago=80000, written_ago=80000))
    for rank in range(4):
        write_meta(tmp_path, rank, 4)
        write_heartbeat(tmp_path, heartbeat(rank))
    found = find_hangs(tmp_path, now_ns=NOW)
    assert found.state == "running" and found.earlier_launch == [4, 5, 6, 7]
    assert found.world_size == 4 and found.missing == []
    assert found.running == [0, 1, 2, 3]


# -- bad files ----------------------------------------------------------------------------


def test_bad_files_are_named_and_skipped(tmp_path: Path) -> None:
    run = data_stuck_run(tmp_path, world=8)
    bad = {
        4: {**heartbeat(4), "step": "120"},
        5: heartbeat(5, moved_ns=10**30),
        6: heartbeat(6, state="sleeping"),
    }
    for data in bad.values():
        write_heartbeat(run, data)
    live_path(run, 7).write_text(
        json.dumps(heartbeat(7)).replace('"median_step_s": 0.5', '"median_step_s": NaN')
    )
    (run / "live" / "rank-0000012.json").write_text('{"v": 1, "rank": ' + "9" * 5000 + "}")
    os.mkfifo(run / "live" / "rank-00013.json")
    (run / "live" / "rank-00014.json").write_text(json.dumps(heartbeat(15)))  # another's
    (run / "live" / "rank-00016.json").write_text(json.dumps({**heartbeat(16), "v": 7}))
    (run / "live" / "rank-00017.json").write_text(
        json.dumps(heartbeat(17, open_phases=[{"phase": "x", "kind": "data", "since_ns": -1}]))
    )
    write_hang(
        run,
        hang_file(
            3,
            detected_ago=10,
            open_phases=[],
            stack=[{"file": "t.py", "line": "twelve", "function": "f"}],
        ),
    )
    hang_path(run, STEP, 1).write_text(
        json.dumps(hang_file(1, detected_ago=10, open_phases=[])).replace(
            '"threshold_s": 300.0', '"threshold_s": 1e400'
        )
    )
    (run / "live" / "rank-00002.json").rename(run / "live" / "rank-2.json")  # and claimed twice
    write_heartbeat(run, heartbeat(2))

    found = find_hangs(run, now_ns=NOW)
    text = "\n".join(found.skipped)
    assert 'rank-00004.json: not a heartbeat (step is "120", expected an integer' in text
    assert f"rank-00005.json: not a heartbeat (moved_ns is {10**30}, expected an integer" in text
    assert 'rank-00006.json: not a heartbeat (state is "sleeping"' in text
    assert "rank-00007.json: not a heartbeat (NaN is not a JSON number)" in text
    assert "rank-0000012.json: not a readable heartbeat (ValueError" in text
    assert "rank-00013.json: not a regular file (a FIFO)" in text
    assert "rank-00014.json: not a heartbeat (rank is 15 in a file named for rank 14)" in text
    assert "rank-00016.json: heartbeat schema version 7 left out" in text
    assert "rank-00017.json: not a heartbeat (open[0]: since_ns is -1" in text
    assert 'rank-00003.json: not a hang file (threads[1]: stack[0]: line is "twelve"' in text
    assert "rank-00001.json: not a hang file (threshold_s is Infinity" in text
    assert "rank 2 is claimed by 2 files; none is used" in text
    assert len(found.skipped) == 12
    # What is left still reads: ranks 0, 1, 3 wait; the stuck rank's files were not usable.
    assert found.state == "hung" and sorted(found.missing) == [2, 4, 5, 6, 7]
    json.dumps(found.to_dict(), allow_nan=False)


# -- scale --------------------------------------------------------------------------------


def test_4096_ranks_read_as_one_sentence(tmp_path: Path) -> None:
    world = 4096
    for rank in range(world):
        if rank == 517:
            phases = [phase("data_loading", "data", 230)]
        else:
            phases = [phase("all_reduce", "comm", 229)]
        write_heartbeat(
            tmp_path,
            heartbeat(
                rank, step=12034, moved_ago=(NOW - phases[-1]["since_ns"]) / S, open_phases=phases
            ),
        )
    found = find_hangs(tmp_path, now_ns=NOW)
    assert found.summary == (
        "rank 517 has been stuck in data_loading (data) at step 12034 for 4 min; "
        "ranks 0-516, 518-4095 wait in all_reduce (comm) at step 12034"
    )
    groups = found.groups()
    assert [g["count"] for g in groups] == [1, 4095]


# -- the command --------------------------------------------------------------------------


def test_the_command_prints_json_and_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = data_stuck_run(tmp_path, dead=True)
    code, out, err = run_cli(["hang", str(run), "--json"], capsys)
    assert code == 0, err
    assert out.count("\n") == 1
    data = strict(out)
    assert data["state"] == "hung" and data["v"] == 1
    assert data["summary"].startswith("rank 2 has been stuck in data_loading (data) at step 120")

    code, out, err = run_cli(["hang", str(run)], capsys)
    assert code == 0, err
    assert "hung: rank 2 has been stuck in data_loading (data) at step 120" in out
    assert "stuck rank 2 on node000, step 120: data_loading" in out
    assert "train.py:12 in step" in out and "x = next(it)" in out
    assert "no Flight Recorder dump: NCCL is not in use (gloo)" in out
    assert "Stalled ranks" in out and "ranks 0, 1, 3" in out


def test_the_command_on_a_run_without_heartbeats_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "timings").mkdir()
    code, out, err = run_cli(["hang", str(tmp_path), "--json"], capsys)
    assert (code, out) == (2, "")
    assert len(err.strip().splitlines()) == 1
    assert "no heartbeats (live/) or hang files (hangs/) to read" in err
    code, _, err = run_cli(["hang", str(tmp_path / "absent")], capsys)
    assert code == 2 and "no such directory" in err

    live = tmp_path / "live"
    live.mkdir()
    (live / "rank-00000.json").write_text("{nope")
    code, out, err = run_cli(["hang", str(tmp_path)], capsys)
    assert (code, out) == (2, "") and "1 skipped, first" in err and "rank-00000.json" in err


def test_a_finished_run_exits_0_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_heartbeat(tmp_path, heartbeat(0, state="stopped"))
    code, out, err = run_cli(["hang", str(tmp_path)], capsys)
    assert code == 0, err
    assert "finished: the run finished" in out


# -- rankscope top ------------------------------------------------------------------------


def test_top_lists_the_stuck_rank_first_then_those_waiting_then_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rankscope.analysis.hangs._top import top_rows

    run = data_stuck_run(tmp_path, world=6, stuck=4)
    (tmp_path / "live" / "rank-00005.json").unlink()  # rank 5 never wrote one: missing
    _, rows = top_rows(run, now_ns=NOW)
    assert [(r["rank"], r["role"]) for r in rows] == [
        (4, "stuck"),
        (0, "waits"),
        (1, "waits"),
        (2, "waits"),
        (3, "waits"),
        (5, "missing"),
    ]
    assert (rows[0]["phase"], rows[0]["kind"], rows[0]["for_s"]) == ("data_loading", "data", 230.0)
    assert main(["top", str(run), "--json"]) == 0
    shown = strict(capsys.readouterr().out)
    assert shown["ranks"][0]["rank"] == 4 and shown["state"] == "hung"
    assert main(["top", str(run), "--once", "--rows", "3"]) == 0
    out = capsys.readouterr().out
    assert "data_loading" in out and "... and 3 more ranks" in out


def test_top_on_a_run_without_heartbeats_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "meta").mkdir()
    assert main(["top", str(tmp_path), "--once"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "no heartbeats" in err


def test_a_step_orders_reader_reads_the_timings_again_only_when_they_change(
    tmp_path: Path,
) -> None:
    # `rankscope top` asks every second; each holder of a reader keeps its own last read
    # (no module-level cache shared by every caller of the process).
    from rankscope.analysis.hangs._step_order import StepOrders
    from rankscope.analysis.read._run import read_run_meta

    write_timings(tmp_path, ranks=2, steps=10)
    meta = read_run_meta(tmp_path)
    orders = StepOrders()
    first = orders(meta, [])
    assert first is not None and {"forward", "backward"} <= set(first.places)
    assert orders(meta, []) is first  # nothing changed: not read again
    assert StepOrders()(meta, []) is not first  # another holder reads for itself
    path = next((tmp_path / "timings").glob("*.jsonl"))
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join(lines[:-3]), encoding="utf-8")  # the file changed
    again = orders(meta, [])
    assert again is not None and again is not first
