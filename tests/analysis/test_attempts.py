"""Attempts: a job that runs again into one directory is read as attempts, never summed."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rankscope
from rankscope._text import number_ranges
from rankscope.analysis import StragglerOptions, build_report, read_timings
from rankscope.analysis.read._attempts import AttemptMark
from rankscope.analysis.read._engine import read_run_records
from rankscope.cli import main
from rankscope.rundir import _attempt
from rankscope.testing._gloo import GlooRanks

from .._dist_workers import train_attempt
from .._helpers import profiler_steps, read_trace, tiny_model, tiny_step, trace_config

WORLD = 2
STEPS = 12


def _record(rank: int, step: int, phase: str, cpu_ms: float, **extra: Any) -> str:
    record = {
        "v": 1,
        "rank": rank,
        "step": step,
        "phase": phase,
        "kind": "step" if phase == "step" else "compute",
        "start_ns": 1_700_000_000_000_000_000 + step * 1_000_000,
        "cpu_ms": cpu_ms,
        "gpu_ms": None,
        "depth": 0,
        "error": False,
        **extra,
    }
    return json.dumps(record, separators=(",", ":"))


def _opening(rank: int, token: str, started_ns: int, restart: int | None = None) -> str:
    launcher = None if restart is None else "torchelastic"
    attempt = {"attempt": token, "started_ns": started_ns, "launcher": launcher}
    attempt |= {"job": "job1" if restart is not None else None, "restart": restart, "pid": 1}
    return json.dumps({"v": 1, "rank": rank, **attempt}, separators=(",", ":"))


def _write(root: Path, rank: int, lines: list[str]) -> None:
    path = root / "timings" / f"rank-{rank:05d}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write("".join(line + "\n" for line in lines))


def _attempt_lines(rank: int, token: str, steps: range, ms: float, **extra: Any) -> list[str]:
    lines = [_opening(rank, token, 1_700_000_000_000_000_000 + steps.start)]
    for step in steps:
        lines += [_record(rank, step, "forward", ms, **extra), _record(rank, step, "step", ms)]
    return lines


# -- reading attempts ----------------------------------------------------------------


@pytest.mark.parametrize("meta", [False, True], ids=["timer-layout", "line-by-line"])
def test_the_latest_record_of_a_step_wins_and_the_rerun_is_said(tmp_path: Path, meta: bool) -> None:
    # Attempt 1 ran steps 0-9 at 10 ms; attempt 2 resumed at step 6 and ran 6-11 at 30 ms.
    # Meta on a record makes the reader take every line through json: both ways agree.
    extra = {"meta": {"tokens": 3}} if meta else {}
    for rank in range(2):
        _write(tmp_path, rank, _attempt_lines(rank, "aaa", range(10), 10.0, **extra))
        _write(tmp_path, rank, _attempt_lines(rank, "bbb", range(6, 12), 30.0))
    run = read_timings(tmp_path)
    assert run.skipped == []
    for timings in run.ranks.values():
        forward = timings.phase == timings.names.index("forward")
        steps, ms = timings.step[forward], timings.cpu_ms[forward]
        assert sorted(steps.tolist()) == list(range(12))  # each step once
        assert (ms[steps < 6] == 10.0).all() and (ms[steps >= 6] == 30.0).all()
    attempts = run.attempts
    assert (attempts.count, attempts.rerun_steps, attempts.times) == (2, [6, 7, 8, 9], 2)
    assert attempts.dropped == 2 * 4 * 2  # 2 ranks x 4 steps x (forward, step)
    assert attempts.note is not None and "steps 6-9 ran twice; the latest record" in attempts.note
    assert attempts.to_dict()["rerun_steps"] == "6-9"


def test_an_attempt_is_picked_whole(tmp_path: Path) -> None:
    for rank in range(2):
        _write(tmp_path, rank, _attempt_lines(rank, "aaa", range(10), 10.0))
    _write(tmp_path, 0, _attempt_lines(0, "bbb", range(6, 12), 30.0))  # rank 1 did not restart
    first = read_timings(tmp_path, attempt=1)
    assert {len(t) for t in first.ranks.values()} == {20}
    assert all((t.cpu_ms == 10.0).all() for t in first.ranks.values())
    second = read_timings(tmp_path, attempt=2)
    assert list(second.ranks) == [0] and (second.ranks[0].cpu_ms == 30.0).all()
    assert second.attempts.without == [1]
    assert second.attempts.note is not None
    assert "attempt 2 is used (--attempt 2); rank 1 has no records in it" in second.attempts.note
    with pytest.raises(rankscope.ConfigError, match=r"attempt=3 is not valid.*1 to 2"):
        read_timings(tmp_path, attempt=3)


def _starts(root: Path, starts: list[tuple[int, str, int, int | None]]) -> None:
    """Each (rank, token, started_ns offset in s, restart): one start of 3 steps."""
    for rank, token, at, restart in starts:
        lines = _attempt_lines(rank, token, range(3), 10.0 + at)
        lines[0] = _opening(rank, token, 1_700_000_000_000_000_000 + at * 10**9, restart)
        _write(root, rank, lines)


FIRST = [(0, "a", 0, None), (1, "b", 1, None)]  # two ranks that start together


@pytest.mark.parametrize(
    ("starts", "ranks_of"),
    [
        # Rank 1 wrote nothing in the first attempt (killed before its first records).
        ([(0, "a", 0, None), (0, "b", 900, None), (1, "c", 901, None)], ["0", "0-1"]),
        # A job scaled up from 2 ranks to 3.
        ([*FIRST, (0, "c", 900, None), (1, "d", 900, None), (2, "e", 901, None)], ["0-1", "0-2"]),
        # The launcher tells them apart, however close their starts.
        ([(0, "a", 0, 0), (0, "b", 5, 1), (1, "c", 6, 1)], ["0", "0-1"]),
    ],
)
def test_a_ranks_attempts_are_matched_by_start_not_by_position(
    tmp_path: Path, starts: list[tuple[int, str, int, int | None]], ranks_of: list[str]
) -> None:
    _starts(tmp_path, starts)
    run = read_timings(tmp_path)
    assert [a["ranks"] for a in run.attempts.described] == ranks_of
    first = read_timings(tmp_path, attempt=1)
    assert number_ranges(first.ranks) == ranks_of[0]
    for timings in first.ranks.values():  # the records of starts at 0 and 1 s, not 900 s
        assert (timings.cpu_ms <= 11.0).all()


def test_steps_far_apart_are_never_taken_for_one(tmp_path: Path) -> None:
    far = 2**62  # step x phases overflows an int64 key
    for token, step in (("a", 0), ("b", far)):
        lines = [_opening(0, token, 1_700_000_000_000_000_000)]
        lines += [_record(0, step, p, 1.0, start_ns=1) for p in ("forward", "backward", "step")]
        _write(tmp_path, 0, lines)
    run = read_timings(tmp_path)
    assert sorted(set(run.ranks[0].step.tolist())) == [0, far]
    assert len(run.ranks[0]) == 6 and run.attempts.rerun_steps == []


def test_a_record_that_names_its_attempt_is_a_record(tmp_path: Path) -> None:
    lines = [_opening(0, "a", 1)] + [
        _record(0, s, "forward", 1.0).replace('"v":1,"rank":0,', '"v":1,"rank":0,"attempt":"a",')
        for s in range(4)
    ]
    _write(tmp_path, 0, lines)
    assert len(read_timings(tmp_path).ranks[0]) == 4


def test_one_process_starting_twice_is_one_attempt_and_an_old_file_is_one_more(
    tmp_path: Path,
) -> None:
    # Records from before attempts were written (no opening line) are an attempt of their own.
    _write(tmp_path, 0, [_record(0, s, "forward", 5.0) for s in range(3)])
    _write(tmp_path, 0, _attempt_lines(0, "same", range(3), 7.0))
    _write(tmp_path, 0, _attempt_lines(0, "same", range(3, 5), 7.0))  # a second Profiler
    run = read_timings(tmp_path)
    timings = run.ranks[0]
    assert timings.attempts[0] == AttemptMark() and timings.attempts[1].token == "same"
    assert len(timings.attempts) == 2 and run.attempts.count == 2
    assert run.attempts.rerun_steps == [0, 1, 2]
    assert sorted(timings.step.tolist()) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert (timings.cpu_ms == 7.0).all()  # the old records of steps 0-2 are left out
    assert "1: before attempts were recorded" in (run.attempts.note or "")


def test_a_run_of_one_attempt_says_nothing_and_keeps_every_record(tmp_path: Path) -> None:
    _write(tmp_path, 0, _attempt_lines(0, "one", range(4), 5.0))
    run = read_timings(tmp_path)
    assert run.attempts.count == 1 and run.attempts.note is None and len(run.ranks[0]) == 8


def test_a_bad_opening_line_is_said_and_its_records_are_kept(tmp_path: Path) -> None:
    lines = _attempt_lines(0, "one", range(2), 5.0)
    lines.insert(3, '{"v":1,"rank":0,"attempt":7}')
    _write(tmp_path, 0, lines)
    run = read_timings(tmp_path)
    assert len(run.ranks[0]) == 4
    assert run.skipped == [
        f"{tmp_path / 'timings' / 'rank-00000.jsonl'}:4: an attempt line without an attempt token"
    ]


@pytest.mark.parametrize(
    ("host", "problem"),
    [
        ("node-17", None),
        ("", '"", not a host name'),
        (12, "12, not a host name"),
        (["node-17"], '["node-17"], not a host name'),
        ("node\n17", '"node\\n17", not a host name'),
        ("x" * 5000, "a name of 5000 characters, longer than any host's"),
    ],
)
def test_an_attempt_line_s_host_is_kept_where_it_is_a_host_name(
    tmp_path: Path, host: Any, problem: str | None
) -> None:
    """Every reader (the timer layout's, line by line, DuckDB's whole file) takes a bad host
    as none, says why, and keeps the attempt and its records."""
    for rank, extra in enumerate([{}, {"meta": {"tokens": 3}}]):  # the second: line by line
        lines = _attempt_lines(rank, "one", range(2), 5.0, **extra)
        lines[0] = lines[0][:-1] + f',"host":{json.dumps(host)}}}'
        _write(tmp_path, rank, lines)
    run = read_timings(tmp_path)
    records = read_run_records(tmp_path)
    assert run.skipped == [] and records.skipped == []
    assert [len(t) for t in run.ranks.values()] == [4, 4]
    said = AttemptMark(
        token="one",
        started_ns=1_700_000_000_000_000_000,
        host=host if problem is None else None,
        host_problem=problem,
    )
    assert [t.attempts for t in run.ranks.values()] == [[said], [said]]
    assert run.attempts.marks == records.attempts.marks == [{0: said, 1: said}]
    assert run.attempts.count == 1 and run.attempts.note is None


def test_attempt_lines_without_a_host_read_as_before(tmp_path: Path) -> None:
    _write(tmp_path, 0, _attempt_lines(0, "aaa", range(3), 10.0))
    _write(tmp_path, 0, _attempt_lines(0, "bbb", range(3), 20.0))
    lines = _attempt_lines(0, "ccc", range(3), 30.0)
    lines[0] = lines[0][:-1] + ',"host":null}'  # said as null: no host either
    _write(tmp_path, 0, lines)
    run = read_timings(tmp_path)
    assert run.skipped == [] and run.attempts.count == 3
    assert [(m.token, m.host, m.host_problem) for m in run.ranks[0].attempts] == [
        ("aaa", None, None),
        ("bbb", None, None),
        ("ccc", None, None),
    ]


# -- what the capture side writes ------------------------------------------------------


def _run(root: Path, steps: int, rank: int = 0) -> None:
    config = {"output_dir": str(root), "timer": {"enable": True, "every_n_steps": 1}}
    with rankscope.Profiler(config, rank=rank, world_size=1) as prof:
        for _ in range(steps):
            with prof.phase("forward"):
                pass
            prof.step()


@pytest.fixture
def fresh_attempt(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Each call makes this process a new start (as a new process would be)."""

    def start(**env: str) -> None:
        for name in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "SLURM_JOB_ID"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(_attempt, "_current", None)

    return start


def test_meta_and_timings_say_the_attempt_the_launcher_gave(
    tmp_path: Path, fresh_attempt: Any
) -> None:
    fresh_attempt(TORCHELASTIC_RUN_ID="job7", TORCHELASTIC_RESTART_COUNT="2")
    _run(tmp_path, 2)
    meta = json.loads((tmp_path / "meta" / "rank-00000.json").read_text())
    said = meta["attempt"]
    assert (said["launcher"], said["job"], said["restart"]) == ("torchelastic", "job7", 2)
    first = json.loads((tmp_path / "timings" / "rank-00000.jsonl").read_text().splitlines()[0])
    # The line also names the host and world size the meta file names (outside the
    # attempt's identity).
    assert first == {"v": 1, "rank": 0, **said, "host": meta["host"], "world": meta["world_size"]}
    run = read_timings(tmp_path)
    mark = run.ranks[0].attempts[0]
    assert (mark.restart, mark.host, mark.host_problem) == (2, meta["host"], None)


def test_rank_0_warns_once_when_another_job_writes_into_the_directory(
    tmp_path: Path, fresh_attempt: Any, caplog: pytest.LogCaptureFixture
) -> None:
    def warnings_of_a_start(**env: str) -> list[str]:
        fresh_attempt(**env)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rankscope"):
            _run(tmp_path, 2)
        return [r.getMessage() for r in caplog.records if "earlier job" in r.getMessage()]

    assert warnings_of_a_start(TORCHELASTIC_RUN_ID="job1", TORCHELASTIC_RESTART_COUNT="0") == []
    # torchelastic restarting the same job: an attempt, but not another job.
    assert warnings_of_a_start(TORCHELASTIC_RUN_ID="job1", TORCHELASTIC_RESTART_COUNT="1") == []
    said = warnings_of_a_start(TORCHELASTIC_RUN_ID="job2", TORCHELASTIC_RESTART_COUNT="0")
    assert len(said) == 1 and str(tmp_path) in said[0] and "new attempt" in said[0]
    assert len(warnings_of_a_start()) == 1  # a person running the script again
    # torchrun without --rdzv-id: no job id, and its restarts are still restarts.
    assert len(warnings_of_a_start(TORCHELASTIC_RESTART_COUNT="0")) == 1
    assert warnings_of_a_start(TORCHELASTIC_RESTART_COUNT="1") == []
    assert read_timings(tmp_path).attempts.count == 6


# -- a real job, run twice into one directory ---------------------------------------------


@pytest.mark.slow
def test_a_job_run_twice_into_one_directory_has_the_medians_of_one_run(
    tmp_path: Path, gloo_ranks: GlooRanks
) -> None:
    once, twice = tmp_path / "once", tmp_path / "twice"
    gloo_ranks.run(train_attempt, WORLD, once / "run", STEPS)
    for restart in ("0", "1"):
        env = {"TORCHELASTIC_RUN_ID": "j", "TORCHELASTIC_RESTART_COUNT": restart}
        gloo_ranks.run(train_attempt, WORLD, twice / "run", STEPS, env=env)
    one, two = build_report(once / "run"), build_report(twice / "run")
    # Against the latest attempt read alone, in the same run: summed attempts would double
    # its medians (12 ms of sleep in a step becoming 24). Set against the other run, the
    # medians moved by more than a third on a loaded machine.
    latest = build_report(twice / "run", StragglerOptions(attempt=2))  # counted from 1
    medians = {p["name"]: p["median_ms"] for p in latest["phases"]}
    assert set(medians) == {p["name"] for p in one["phases"]}
    for phase in two["phases"]:
        assert phase["median_ms"] == medians[phase["name"]], phase
        assert phase["records"] == WORLD * STEPS
    assert one["attempts"]["count"] == 1 and one["attempts"]["note"] is None
    attempts = two["attempts"]
    assert attempts["count"] == 2 and attempts["rerun_steps"] == f"0-{STEPS - 1}"
    assert [a["restart"] for a in attempts["attempts"]] == [0, 1]
    assert f"steps 0-{STEPS - 1} ran twice; the latest record of each is used" in attempts["note"]
    timings = read_timings(twice / "run")
    for rank in timings.ranks.values():
        pairs = np.stack([rank.step, rank.phase])
        assert np.unique(pairs, axis=1).shape[1] == len(rank)  # no (step, phase) twice


@pytest.mark.slow
def test_a_resumed_job_counts_no_step_twice_and_every_command_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], gloo_ranks: GlooRanks
) -> None:
    run = tmp_path / "run"
    gloo_ranks.run(train_attempt, WORLD, run, STEPS)
    gloo_ranks.run(train_attempt, WORLD, run, STEPS)  # a second start that runs the steps again
    assert main(["stragglers", str(run), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["attempts"]["count"] == 2 and found["attempts"]["used"] == "latest"
    assert main(["report", str(run), "--json", "--no-html"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["attempts"]["records_left_out"] == WORLD * STEPS * 3  # forward, backward, step
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert "attempts: 2 attempts" in " ".join(out.split())
    html = (run / "report.html").read_text()
    assert "ran twice; the latest record of each is used" in html
    assert main(["stragglers", str(run), "--attempt", "1"]) == 0
    assert "attempt 1 is used" in " ".join(capsys.readouterr().out.split())
    assert main(["stragglers", str(run), "--attempt", "3"]) == 2
    assert "--attempt 3 is not valid" in capsys.readouterr().err


# -- a job resumed from a checkpoint keeps its steps' numbers ------------------------------


def test_a_resumed_job_counts_from_its_checkpoint_step(tmp_path: Path, fresh_attempt: Any) -> None:
    config = {"output_dir": str(tmp_path), "timer": {"enable": True, "every_n_steps": 1}}
    for first, steps in ((0, 10), (6, 6)):  # the first attempt died after step 9
        fresh_attempt()
        with rankscope.Profiler(config, rank=0, world_size=1, first_step=first) as prof:
            for _ in range(steps):
                with prof.phase("forward"):
                    pass
                prof.step()
    run = read_timings(tmp_path)
    timings = run.ranks[0]
    forward = timings.phase == timings.names.index("forward")
    assert sorted(timings.step[forward].tolist()) == list(range(12))  # each once
    assert run.attempts.rerun_steps == [6, 7, 8, 9]
    second = timings.attempt[forward] == 1
    assert sorted(timings.step[forward][second].tolist()) == list(range(6, 12))


@pytest.mark.parametrize(
    ("first_step", "windows"),
    [
        (5, {"step-000006-000007": [6, 7], "step-000010-000011": [10, 11]}),
        (6, {"step-000006-000007": [6, 7], "step-000010-000011": [10, 11]}),
        # Resumed inside a window: it holds the steps from the resume on, and says so.
        (7, {"step-000007-000007": [7], "step-000010-000011": [10, 11]}),
    ],
)
def test_a_resumed_capture_keeps_the_schedule_on_global_steps(
    tmp_path: Path, first_step: int, windows: dict[str, list[int]]
) -> None:
    # wait 1, warm-up 1, record 2, again and again: steps 2-3, 6-7, 10-11 are recorded.
    schedule = rankscope.Schedule(wait=1, warmup=1, active=2, repeat=0)
    config = trace_config(tmp_path, schedule=schedule)
    model, opt = tiny_model()
    with rankscope.Profiler(config, rank=0, world_size=1, first_step=first_step) as prof:
        while prof._capture is not None and prof._capture._step < 12:  # through step 11
            tiny_step(model, opt, prof)
            prof.step()
    found = {
        window.name: profiler_steps(read_trace(window / "rank-00000.pt.trace.json.gz"))
        for window in (tmp_path / "traces").iterdir()
    }
    assert found == windows


def test_a_resumed_capture_past_its_schedule_holds_no_profiler(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    schedule = rankscope.Schedule(wait=1, warmup=1, active=1, repeat=1)
    config = trace_config(tmp_path, schedule=schedule)
    model, opt = tiny_model()
    with (
        caplog.at_level(logging.INFO, logger="rankscope"),
        rankscope.Profiler(config, rank=0, world_size=1, first_step=100) as prof,
    ):
        tiny_step(model, opt, prof)
        prof.step()
        assert prof._capture is not None and prof._capture._prof is None
    assert not (tmp_path / "traces").exists()
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert any("resumed at step 100, past the schedule's windows" in m for m in said)
    assert not any("captured nothing" in m for m in said)  # nothing was due


@pytest.mark.parametrize("first_step", [-1, 1.5, True, "3"])
def test_a_first_step_that_is_not_a_step_is_refused(first_step: Any) -> None:
    with pytest.raises(rankscope.ConfigError, match="first_step="):
        rankscope.Profiler({"timer": {"enable": True}}, rank=0, world_size=1, first_step=first_step)


# -- traces: a step captured in two attempts counts once --------------------------------------


def test_a_step_captured_again_under_another_name_counts_once(tmp_path: Path) -> None:
    from rankscope.analysis import kernel_report
    from rankscope.testing._synthetic_traces import write_run_traces

    write_run_traces(tmp_path, "step-000003-000004", [0, 1], world_size=2, size_bytes=40_000)
    old = tmp_path / "traces" / "step-000003-000004" / "rank-00000.pt.trace.json.gz"
    os.utime(old, (1_700_000_000, 1_700_000_000))  # the first attempt's, written earlier
    again = "step-000004-000005-sigusr2"  # after a restart, step 4 was captured again
    write_run_traces(tmp_path, again, [0], world_size=2, size_bytes=40_000, seed=1)
    found = kernel_report([tmp_path])
    used = sorted((t["rank"], t["window"]) for t in found.traces)
    assert used == [(0, again), (1, "step-000003-000004")]
    assert found.skipped == [
        f"{old}: rank 0's steps 3-4 were captured again later, in {again} (a step that ran "
        "again after a restart); that one is used"
    ]
    # Windows that share no step are all summed, as before.
    write_run_traces(tmp_path, "step-000009-000010", [0], world_size=2, size_bytes=40_000)
    assert len(kernel_report([tmp_path]).traces) == 3


def test_the_rerun_of_sampled_steps_is_said_as_step_ranges(tmp_path: Path) -> None:
    # The timer sampled every 2nd step: attempt 1 ran steps 0-98, attempt 2 started again
    # at 0 and ran 0-78 before it stopped. Steps 0, 2, ..., 78 were each recorded twice;
    # the warning says a range, not 40 numbers.
    for rank in range(2):
        _write(tmp_path, rank, _attempt_lines(rank, "aaa", range(0, 100, 2), 10.0))
        _write(tmp_path, rank, _attempt_lines(rank, "bbb", range(0, 80, 2), 30.0))
    attempts = read_timings(tmp_path).attempts
    assert attempts.rerun_steps == list(range(0, 80, 2))
    assert attempts.note is not None
    assert "; steps 0-78 ran twice; the latest record of each is used" in attempts.note
    assert attempts.to_dict()["rerun_steps"] == number_ranges(range(0, 80, 2))  # every step


def test_a_sampled_step_recorded_once_splits_the_ranges(tmp_path: Path) -> None:
    # Steps 12-18 (sampled every 2nd) ran once, between two stretches that ran twice.
    _write(tmp_path, 0, _attempt_lines(0, "aaa", range(0, 40, 2), 10.0))
    _write(tmp_path, 0, _attempt_lines(0, "bbb", range(0, 12, 2), 30.0))
    _write(tmp_path, 0, _attempt_lines(0, "ccc", range(20, 32, 2), 30.0))
    _write(tmp_path, 1, _attempt_lines(1, "aaa", range(0, 40, 2), 10.0))
    note = read_timings(tmp_path).attempts.note
    assert note is not None and "; steps 0-10, 20-30 ran twice;" in note


@pytest.mark.parametrize(
    ("numbers", "among", "said"),
    [
        ([0, 2, 4, 6], range(0, 20, 2), "0-6"),
        ([0, 2, 4, 6], range(20), "0, 2, 4, 6"),
        ([0, 4, 8, 20, 24], [0, 4, 8, 12, 16, 20, 24], "0-8, 20-24"),
        ([5], [1, 5, 9], "5"),
        ([1, 3], [1, 3, 5], "1-3"),  # two in a row fold, as number_ranges folds 1, 2
        ([], [1, 2], ""),
    ],
)
def test_number_ranges_among_the_numbers_that_could_be(
    numbers: list[int], among: list[int], said: str
) -> None:
    assert number_ranges(numbers, among=among) == said


def _elastic_start(
    monkeypatch: pytest.MonkeyPatch, run: Path, restart: int, forward_s: dict[int, float]
) -> None:
    """torchelastic's restart `restart` of one job, its ranks (the keys of `forward_s`)
    taking their steps in turns, each sleeping its time in forward."""
    import contextlib
    import time

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "elastic")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(restart))
    monkeypatch.setattr(_attempt, "_current", None)
    config = {"output_dir": str(run), "timer": {"enable": True, "every_n_steps": 1}}
    world = len(forward_s)
    with contextlib.ExitStack() as started:
        profs = {
            r: started.enter_context(rankscope.Profiler(config, rank=r, world_size=world))
            for r in forward_s
        }
        for _ in range(16):
            for rank, prof in profs.items():
                with prof.phase("forward"):
                    time.sleep(forward_s[rank])
                prof.step()


def test_an_elastic_restart_to_fewer_ranks_leaves_the_earlier_worlds_ranks_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # 4 ranks, all slow (another shape of the job), then a restart on 3 ranks where rank
    # 1 is slow. Mixed in, the old rank 3 was "slow in forward" beside the new ranks, and
    # the report said a world of 4 with none missing.
    run = tmp_path / "run"
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    _elastic_start(monkeypatch, run, 0, {r: 0.02 for r in range(4)})
    _elastic_start(monkeypatch, run, 1, {0: 0.002, 1: 0.012, 2: 0.002})
    assert main(["report", str(run), "--json", "--no-html"]) == 0
    report = json.loads(capsys.readouterr().out)
    slow = {
        (f["rank"], f["phase"]) for f in report["stragglers"]["findings"] if f["role"] == "slow"
    }
    assert slow == {(1, "forward")}
    assert report["ranks"]["present"] == [0, 1, 2]
    assert report["ranks"]["world_size"] == 3 and report["ranks"]["missing"] == []
    attempts = report["attempts"]
    assert attempts["ranks_beyond_the_world"] == [3]
    assert "rank 3 ran only in an earlier attempt's larger world" in attempts["note"]
    # The earlier world is there to be read whole.
    assert main(["stragglers", str(run), "--json", "--attempt", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["ranks"] == [0, 1, 2, 3]


def test_a_stray_process_writing_one_ranks_file_at_once_does_not_hide_the_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A second process appended to rank 0's file while the 4-rank job ran (a stray
    # notebook with the same output_dir). The default view took the stray's one-rank
    # attempt: "No straggler", the job's own finding only in a note.
    from rankscope.testing._synthetic import Slowdown, write_timings
    from rankscope.timing._record import format_attempt

    job = tmp_path / "job"
    write_timings(job, ranks=4, steps=20, slowdowns=[Slowdown(2, "forward", 0.6)])
    started = 1_795_000_000 * 10**9
    mine = {"attempt": "job", "started_ns": started, "launcher": None, "job": None, "restart": None}
    stray = {**mine, "attempt": "stray", "started_ns": started + 10**9}
    run = tmp_path / "run"
    (run / "timings").mkdir(parents=True)
    for rank in range(4):
        lines = (job / "timings" / f"rank-{rank:05d}.jsonl").read_text().splitlines(keepends=True)
        records = [line for line in lines if '"attempt"' not in line]
        half = len(records) // 2
        text = format_attempt(rank, mine) + "".join(records[:half])
        if rank == 0:  # the stray's flush lands between two of the job's
            text += format_attempt(0, stray) + "".join(records[:6])
            text += format_attempt(rank, mine)
        text += "".join(records[half:])
        (run / "timings" / f"rank-{rank:05d}.jsonl").write_text(text)
    assert main(["stragglers", str(run), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["attempts"]["concurrent"] == [1, 2]
    assert data["attempts"]["used"] == 1  # the job's four ranks, not the stray's one
    assert data["ranks"] == [0, 1, 2, 3]
    assert [(f["rank"], f["phase"]) for f in data["findings"] if f["role"] == "slow"] == [
        (2, "forward")
    ]
