"""On-demand windows: trigger files, the ranks' answers, and `rankscope trigger`."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import rankscope
from rankscope import Schedule
from rankscope._errors import ConfigError, TraceError
from rankscope.analysis import build_report, read_timings
from rankscope.capture._schedule import Action, StepPlan
from rankscope.capture._trigger import TriggerPoller
from rankscope.cli._trigger_client import ask_for_window, latest_step, trigger_status
from rankscope.config._ranks import RankInfo
from rankscope.rundir._layout import trace_path
from rankscope.rundir._meta import write_meta
from rankscope.rundir._trigger import (
    Trigger,
    parse_trigger,
    read_acks,
    read_trigger,
    trigger_dir,
    write_ack,
    write_trigger,
)
from rankscope.testing._gloo import GlooRanks

from .._helpers import (
    final_files,
    profiler_steps,
    read_trace,
    run_cli,
    temp_files,
    tiny_model,
    tiny_step,
)

WORLD = 3
STEPS = 16
TRIGGER_AT = 6  # rank 0 runs `rankscope trigger` during this step
CHECK_EVERY = 2

N, W, R, S = Action.NONE, Action.WARMUP, Action.RECORD, Action.RECORD_AND_SAVE


# -- the plan: scheduled windows plus triggered ones ------------------------------------


def test_a_triggered_window_records_its_steps_after_one_warmup_step() -> None:
    plan = StepPlan(Schedule(warmup=1, active=1))  # the schedule's window: step 1
    window = plan.add(6, 8, warmup=True, after=2)
    assert (window.first, window.last, window.warmup) == (6, 8, 5)
    assert [plan.action(s) for s in range(10)] == [W, S, N, N, N, W, R, R, S, N]
    assert plan.window_start(8) == 6 and plan.window_start(1) == 1
    assert plan.next_added == 5


def test_a_window_starts_cold_where_its_warmup_step_is_taken_or_already_past() -> None:
    plan = StepPlan(Schedule(warmup=1, active=2))  # the schedule's window: steps 1-2
    assert plan.add(3, 3, warmup=True, after=0).warmup is None  # step 2 records
    assert [plan.action(s) for s in range(5)] == [W, R, S, S, N]
    assert plan.window_start(3) == 3
    assert plan.add(5, 5, warmup=True, after=4).warmup is None  # step 4 has begun
    assert plan.add(7, 7, warmup=False, after=4).warmup is None  # the schedule has no warm-up


def test_windows_that_would_overlap_are_refused_with_the_reason() -> None:
    plan = StepPlan(Schedule(wait=4, warmup=1, active=2, repeat=0))  # 5-6, 12-13, ...
    assert plan.conflict(2, 3) is None
    assert plan.conflict(3, 4) == "step 4 already belongs to the schedule"
    plan.add(2, 3, warmup=True, after=0)
    assert plan.conflict(3, 3) == "step 3 already belongs to an earlier trigger's window"
    with pytest.raises(ValueError, match="does not lie ahead of step 9"):
        plan.add(9, 9, warmup=False, after=9)


def test_the_plan_says_when_no_profiler_is_needed() -> None:
    plan = StepPlan(None)  # a rank with no scheduled windows
    assert plan.idle(0) and plan.next_added is None
    window = plan.add(10, 11, warmup=True, after=3)
    assert not plan.idle(8) and plan.idle(7)  # step 9 warms up
    plan.forget_before(12)
    assert plan.added == (window,)  # its name is still needed during step 12
    plan.forget_before(13)
    assert plan.added == () and plan.idle(13)
    forever = StepPlan(Schedule(wait=1, warmup=0, active=1, repeat=0))
    assert not forever.idle(1000)


# -- the trigger file ---------------------------------------------------------------------


def _trigger_data(**change: Any) -> dict[str, Any]:
    data = {"v": 1, "id": "t1", "start": 20, "steps": 2, "ranks": "0,1", "created": None}
    data.update(change)
    return {k: v for k, v in data.items() if v is not ...}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"v": 2}, '"v" is 2; expected 1'),
        ({"id": "../x"}, "\"id\" is '../x'"),
        ({"id": "t2"}, "\"id\" is 't2' but the file is named t1.json"),
        ({"start": 0}, '"start" is 0; expected an int >= 1'),
        ({"start": "20"}, "\"start\" is '20'"),
        ({"steps": True}, '"steps" is True'),
        ({"steps": ...}, '"steps" is None'),
        ({"ranks": "0-x"}, "\"ranks\": ranks='0-x' is not valid"),
    ],
)
def test_a_bad_trigger_is_refused_naming_what_is_wrong(
    change: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(problem)):
        parse_trigger(_trigger_data(**change), "t1")


def test_a_trigger_reads_back_as_written(tmp_path: Path) -> None:
    trigger = parse_trigger(_trigger_data(ranks=[3, 1, 2]), "t1")
    assert (trigger.ranks, trigger.last) == ("1-3", 21)
    assert trigger.window == "step-000020-000021-trigger-t1"  # the folder says who asked
    path = write_trigger(tmp_path, trigger)
    assert path == tmp_path / "triggers" / "t1.json"
    assert parse_trigger(json.loads(path.read_text()), "t1") == trigger
    assert [p.name for p in path.parent.iterdir()] == ["t1.json"]  # no temporary left


def test_the_poller_lists_the_folder_only_when_it_changed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    watcher = TriggerPoller(str(tmp_path), rank=1)
    assert watcher.poll() == []  # no folder yet
    folder = trigger_dir(tmp_path)
    write_trigger(tmp_path, Trigger("for-1", 9, 1, "0-1"))
    write_trigger(tmp_path, Trigger("for-2", 9, 1, "2"))
    (folder / "bad.json").write_text("[]")
    old = time.time() - 3600  # well past the filesystem's timestamp granularity
    os.utime(folder, (old, old))
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        assert [t.id for t in watcher.poll()] == ["for-1"]
        write_trigger(tmp_path, Trigger("unseen", 9, 1, "all"))
        os.utime(folder, (old, old))  # the same mtime: one stat, no listing
        assert watcher.poll() == []
        os.utime(folder, (old + 1, old + 1))
        assert [t.id for t in watcher.poll()] == ["unseen"]  # each id once
        (folder / ".bad.tmp").write_text('{"v": 1}')
        os.replace(folder / ".bad.tmp", folder / "bad.json")  # changed: read, warned about again
        assert watcher.poll() == []
    warned = _warnings(caplog)
    assert len(warned) == 2
    assert "not a JSON object but a list" in warned[0] and '"id" is None' in warned[1]
    write_trigger(tmp_path, Trigger("answered", 9, 1, "1"))
    write_ack(tmp_path, Trigger("answered", 9, 1, "1"), 1, {"status": "accepted"})
    assert TriggerPoller(str(tmp_path), rank=1).poll() == [
        Trigger("for-1", 9, 1, "0-1"),
        Trigger("unseen", 9, 1, "all"),
    ]


# -- one process: answers, once, and faults -------------------------------------------------


def _config(run: Path, **trace: Any) -> rankscope.ProfileConfig:
    trace.setdefault("enable", True)
    trace.setdefault("trigger_check_every_n_steps", CHECK_EVERY)
    return rankscope.ProfileConfig(
        output_dir=run,
        trace=rankscope.TraceConfig(**trace),
        timer=rankscope.TimerConfig(enable=True, every_n_steps=1, flush_every_n_steps=1),
    )


def _train(run: Path, steps: int, config: rankscope.ProfileConfig | None = None, **at: Any) -> None:
    """Train `steps` steps; at[f"s{i}"] is called during step i."""
    model, opt = tiny_model()
    with rankscope.Profiler(config or _config(run), rank=0, world_size=1) as prof:
        for i in range(steps):
            tiny_step(model, opt, prof)
            if f"s{i}" in at:
                at[f"s{i}"]()
            prof.step()


def _windows(run: Path) -> list[str]:
    return sorted({f.split("/")[1] for f in final_files(run) if f.startswith("traces/")})


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_each_trigger_is_honoured_once_even_by_a_later_run_in_the_same_directory(
    tmp_path: Path,
) -> None:
    trigger = Trigger("again", 8, 1, "0")
    _train(tmp_path, 12, s3=lambda: write_trigger(tmp_path, trigger))
    assert _windows(tmp_path) == ["step-000001-000001", "step-000008-000008-trigger-again"]
    (answer,) = read_acks(tmp_path, "again").values()
    assert (answer["status"], answer["window"], answer["seen_at_step"]) == (
        "accepted",
        "step-000008-000008-trigger-again",
        4,
    )
    summary = tmp_path / "traces" / answer["window"] / "rank-00000.summary.json"
    assert json.loads(summary.read_text())["captured_because"] == {
        "by": "trigger",
        "trigger": "again",
        "seen_at_step": 4,
    }
    # A resumed job counts steps from 0 again: step 8 lies ahead, but the trigger was answered.
    for path in (tmp_path / "traces").rglob("*"):
        if path.is_file():
            path.unlink()
    _train(tmp_path, 12)
    assert _windows(tmp_path) == ["step-000001-000001"]
    assert read_acks(tmp_path, "again") == {0: answer}


def test_late_long_and_overlapping_triggers_are_declined_with_one_warning_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def write() -> None:
        write_trigger(tmp_path, Trigger("late", 3, 1, "0"))
        write_trigger(tmp_path, Trigger("long", 20, 6, "all"))
        write_trigger(tmp_path, Trigger("ok", 9, 2, "0"))
        write_trigger(tmp_path, Trigger("overlap", 10, 1, "0"))
        write_trigger(tmp_path, Trigger("other", 12, 1, "1-3"))  # not for rank 0

    with caplog.at_level(logging.WARNING, logger="rankscope"):
        _train(tmp_path, 14, s5=write)
    answers = {t: read_acks(tmp_path, t).get(0) for t in ("late", "long", "ok", "overlap", "other")}
    assert answers["other"] is None
    assert {t: a["status"] for t, a in answers.items() if a} == {
        "late": "declined",
        "long": "declined",
        "ok": "accepted",
        "overlap": "declined",
    }
    assert answers["late"]["reason"] == "seen at step 6, too late for its start step 3"
    assert answers["long"]["reason"] == "it asks for 6 steps; trace.trigger_max_steps is 5"
    assert answers["overlap"]["reason"] == "step 10 already belongs to an earlier trigger's window"
    assert _windows(tmp_path) == ["step-000001-000001", "step-000009-000010-trigger-ok"]
    warned = _warnings(caplog)
    assert len(warned) == 3 and all("declined on rank 0" in w for w in warned)
    window = tmp_path / "traces" / "step-000009-000010-trigger-ok"
    trace = read_trace(window / "rank-00000.pt.trace.json.gz")
    assert profiler_steps(trace) == [9, 10]


def test_a_user_profiler_running_when_the_window_begins_is_left_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    theirs = torch.profiler.profile()

    def write() -> None:
        write_trigger(tmp_path, Trigger("busy", 9, 1, "0"))
        theirs.start()

    with caplog.at_level(logging.WARNING, logger="rankscope"):
        _train(tmp_path, 12, s5=write)
        torch.ones(4).cumsum(0)
        theirs.stop()
    assert any(e.name == "aten::cumsum" for e in theirs.events())
    assert _windows(tmp_path) == ["step-000001-000001"]
    (answer,) = read_acks(tmp_path, "busy").values()
    assert answer["status"] == "declined"
    assert answer["reason"] == "another torch.profiler was running in this process"
    assert len(_warnings(caplog)) == 1


@pytest.mark.parametrize(
    "method", ["__init__", "start", "prepare_trace", "start_trace", "step", "export_chrome_trace"]
)
def test_torch_profiler_failing_in_a_triggered_window_turns_capture_off_not_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, method: str
) -> None:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"injected fault in {method}")

    def write() -> None:  # after the schedule's window, whose profiler worked
        write_trigger(tmp_path, Trigger("doomed", 9, 2, "0"))
        monkeypatch.setattr(torch.profiler.profile, method, fail)

    with caplog.at_level(logging.WARNING, logger="rankscope"):
        _train(tmp_path, 14, s5=write)
    warned = _warnings(caplog)
    assert len(warned) == 1 and f"injected fault in {method}" in warned[0], warned
    assert "training goes on" in warned[0]
    assert not torch.autograd._profiler_enabled(), "a faulty profiler must not keep collecting"
    assert _windows(tmp_path) == ["step-000001-000001"]
    assert temp_files(tmp_path) == []


def test_a_bad_trigger_file_is_ignored_with_one_warning_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def write() -> None:
        folder = trigger_dir(tmp_path)
        folder.mkdir()
        (folder / "bad.json").write_text("{not json")
        write_trigger(tmp_path, Trigger("good", 8, 1, "0"))

    with caplog.at_level(logging.WARNING, logger="rankscope"):
        _train(
            tmp_path, 14, s1=write, s9=lambda: write_trigger(tmp_path, Trigger("more", 12, 1, "0"))
        )
    warned = _warnings(caplog)
    assert len(warned) == 1 and "bad.json" in warned[0] and "not valid JSON" in warned[0]
    assert _windows(tmp_path) == [
        "step-000001-000001",
        "step-000008-000008-trigger-good",
        "step-000012-000012-trigger-more",
    ]


def test_a_run_directory_that_breaks_turns_trigger_checks_off_not_training(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "triggers").write_text("a file where the folder should be")
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        _train(tmp_path, 8)
    warned = _warnings(caplog)
    assert len(warned) == 1 and "trigger checks are off" in warned[0]
    assert _windows(tmp_path) == ["step-000001-000001"]


def test_no_checks_when_turned_off(tmp_path: Path) -> None:
    write_trigger(tmp_path, Trigger("ignored", 5, 1, "0"))
    _train(tmp_path, 8, _config(tmp_path, trigger_check_every_n_steps=0))
    assert read_acks(tmp_path, "ignored") == {}
    assert _windows(tmp_path) == ["step-000001-000001"]


# -- the CLI ------------------------------------------------------------------------------


def _run(root: Path, world: int = 4, timings: bool = True, **trace: Any) -> Path:
    """A run directory as a job leaves it: meta with each rank's config, and timings."""
    from rankscope.testing._synthetic import write_timings

    trace.setdefault("ranks", "all")
    config = _config(root, **trace).to_dict()
    for rank in range(world):
        info = RankInfo(
            rank=rank, local_rank=rank, world_size=world, local_world_size=world, host="h"
        )
        write_meta(str(root), info, config, {})
    if timings:
        write_timings(root, ranks=world, steps=20, write_meta=False)  # steps 0-19
    return root


def test_trigger_starts_far_enough_ahead_and_reports_who_will_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run(tmp_path, ranks="0-1")  # rank 2 is not in trace.ranks: it listens all the same
    (run / "meta" / "rank-00003.json").unlink()  # rank 3 has not started
    code, out, err = run_cli(["trigger", str(run), "--ranks", "1-3", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    # latest step 19 + timer lag (1 + 1) + check interval 2 + warm-up and margin 2
    assert (data["start"], data["last"], data["steps"]) == (25, 26, 2)
    assert data["window"] == f"step-000025-000026-trigger-{data['id']}"
    assert data["listening"] == [1, 2]
    assert data["not_listening"] == {
        "3": "no meta file (the rank neither traces nor times, or has not started)"
    }
    assert data["note"] is None
    written = parse_trigger(json.loads(Path(data["path"]).read_text()), data["id"])
    assert (written.start, written.steps, written.ranks) == (25, 2, "1-3")
    code, out, err = run_cli(["trigger", str(run), "--in", "3", "--steps", "1"], capsys)
    assert code == 0, err
    assert "step-000022-000022-trigger-" in out and "ranks 0, 1 will record it" in out
    assert "note: ranks may first see this trigger as late as step 23" in out
    code, out, err = run_cli(["trigger", str(run), "--status", "--json"], capsys)
    assert code == 0, err
    first = next(t for t in json.loads(out)["triggers"] if t["id"] == data["id"])
    assert first["ranks_by_state"] == {
        "saved": [],
        "accepted": [],
        "declined": [],
        "waiting": [1, 2],
        "not_listening": [3],
    }


@pytest.mark.parametrize(
    ("argv", "run_kwargs", "message"),
    [
        (["--at", "19"], {}, "--at=19 is not valid: the run's timings have reached step 19"),
        (["--in", "2", "--at", "30"], {}, "not allowed with argument"),
        (["--ranks", "4"], {}, "rank 4 does not exist in a job of 4 ranks"),
        (["--ranks", "1-"], {}, "--ranks='1-' is not valid"),
        (["--steps", "6"], {}, "--steps=6 is not valid: the run's trace.trigger_max_steps is 5"),
        (
            [],
            {"enable": False},
            "no selected rank checks for triggers (rank 0: trace.enable is false)",
        ),
        ([], {"target": "phase:fwd"}, "trace.target is 'phase:fwd'"),
        ([], {"tool": "nsys"}, "trace.tool is 'nsys' and the rank has no CUDA device (cpu)"),
        ([], {"timings": False}, "no heartbeat or timings to tell which step the run has reached"),
        (["--status", "--at", "30"], {}, "cannot be combined with --at"),
        (["--run-is-no-run"], {}, "unrecognized arguments"),
    ],
)
def test_bad_requests_are_one_line_exit_2_and_write_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    run_kwargs: dict[str, Any],
    message: str,
) -> None:
    run = _run(tmp_path, **run_kwargs)
    code, out, err = run_cli(["trigger", str(run), *argv], capsys)
    assert (code, out) == (2, "")
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert not trigger_dir(run).exists()


def test_a_directory_that_is_not_a_run_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["trigger", str(tmp_path), "--at", "5"], capsys)
    assert (code, out) == (2, "")
    assert (
        err.strip()
        == f"rankscope trigger: {tmp_path}: not a run directory (no meta/rank-*.json in it)"
    )
    assert list(tmp_path.iterdir()) == []


# -- the same from Python, without the CLI ------------------------------------------------


def test_a_python_caller_asks_for_a_window_and_sees_who_answered(tmp_path: Path) -> None:
    run = _run(tmp_path, ranks="0-1")
    (run / "meta" / "rank-00003.json").unlink()  # rank 3 has not started
    asked = ask_for_window(run, ranks="1-3", steps=1)
    # latest step 19 + timer lag (1 + 1) + check interval 2 + warm-up and margin 2
    assert latest_step(run) == 19
    assert (asked["start"], asked["last"], asked["listening"]) == (25, 25, [1, 2])
    trigger = read_trigger(Path(asked["path"]))
    assert (trigger.start, trigger.steps, trigger.ranks) == (25, 1, "1-3")
    assert asked["traces"] == str(run / "traces" / trigger.window)
    write_ack(run, trigger, 1, {"status": "accepted", "window": trigger.window})
    write_ack(run, trigger, 2, {"status": "declined", "reason": "too late"})
    saved = trace_path(run, trigger.window, 1, gzip=True)
    saved.parent.mkdir(parents=True)
    saved.write_bytes(b"")
    (status,) = trigger_status(run)["triggers"]
    assert status["ranks_by_state"] == {
        "saved": [1],
        "accepted": [],
        "declined": [2],
        "waiting": [],
        "not_listening": [3],
    }
    assert status["saved"] == {"1": str(saved)}
    assert status["reasons"]["2"] == "too late"


def test_a_python_caller_gets_the_cli_errors_and_nothing_is_written(tmp_path: Path) -> None:
    run = _run(tmp_path)
    with pytest.raises(ConfigError, match="the run's timings have reached step 19"):
        ask_for_window(run, at=19)
    with pytest.raises(ConfigError, match="--at or --in, not both"):
        ask_for_window(run, at=30, in_steps=2)
    with pytest.raises(ConfigError, match="--steps=0 is not valid"):
        ask_for_window(run, steps=0)
    assert not trigger_dir(run).exists()
    with pytest.raises(TraceError, match="lies inside the run directory"):
        trigger_status(tmp_path / "meta")


def test_a_config_field_a_meta_file_leaves_out_reads_as_the_configs_default(
    tmp_path: Path,
) -> None:
    """The job built its config through TraceConfig and TimerConfig: where a meta file has
    no value, the job ran with their default, and the trigger's start and length follow it."""
    run = _run(tmp_path)
    for path in (run / "meta").glob("rank-*.json"):
        meta = json.loads(path.read_text())
        del meta["config"]["timer"]["every_n_steps"], meta["config"]["timer"]["flush_every_n_steps"]
        del meta["config"]["trace"]["trigger_max_steps"]
        path.write_text(json.dumps(meta))
    timer, trace = rankscope.TimerConfig(), rankscope.TraceConfig()
    asked = ask_for_window(run)
    # latest step 19 + timer lag (sampling + flush interval) + check interval + warm-up and margin 2
    lead = timer.every_n_steps + timer.flush_every_n_steps + CHECK_EVERY + 2
    assert (asked["start"], asked["steps"]) == (19 + lead, 2)
    longest = ask_for_window(run, steps=trace.trigger_max_steps)
    assert longest["steps"] == trace.trigger_max_steps
    with pytest.raises(ConfigError, match=f"1 to {trace.trigger_max_steps}"):
        ask_for_window(run, steps=trace.trigger_max_steps + 1)


def test_a_meta_file_without_the_trigger_fields_listens_as_the_default_config_does(
    tmp_path: Path,
) -> None:
    """A rank whose meta file leaves out trace.target and the check interval ran with
    TraceConfig's defaults: a rank that checks for triggers, at the default interval."""
    run = _run(tmp_path, timings=False)
    for path in (run / "meta").glob("rank-*.json"):
        meta = json.loads(path.read_text())
        del meta["config"]["trace"]["target"]
        del meta["config"]["trace"]["trigger_check_every_n_steps"]
        path.write_text(json.dumps(meta))
    asked = ask_for_window(run, at=50)
    assert asked["listening"] == [0, 1, 2, 3] and asked["not_listening"] == {}
    assert asked["check_every"] == rankscope.TraceConfig().trigger_check_every_n_steps


# -- spawned ranks over gloo: the same window at the same step on exactly the chosen ranks --


def train_and_trigger(rank: int, world_size: int, run_dir: str) -> None:
    """Train with DDP; during step TRIGGER_AT rank 0 runs `rankscope trigger` for ranks 1-2."""
    run = Path(run_dir)
    log = logging.FileHandler(run / f"log-{rank}.txt")
    log.setLevel(logging.WARNING)
    logging.getLogger("rankscope").addHandler(log)
    try:
        _train_and_trigger(rank, run)
        dist.barrier()
    finally:
        logging.getLogger("rankscope").removeHandler(log)
        log.close()


def _train_and_trigger(rank: int, run: Path) -> None:
    model = nn.parallel.DistributedDataParallel(nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    config = _config(run, ranks="0")
    with rankscope.Profiler(config) as prof:
        for step in range(STEPS):
            with prof.phase("forward"):
                loss = model(torch.randn(8, 16)).sum()
            with prof.phase("backward"):
                loss.backward()
            opt.step()
            opt.zero_grad()
            if step == TRIGGER_AT:
                dist.barrier()  # every rank has flushed the timings of the steps before
                if rank == 0:
                    _cli_in_a_process(run)
                dist.barrier()
            prof.step()


def _cli_in_a_process(run: Path) -> None:
    command = [sys.executable, "-m", "rankscope.cli", "trigger", str(run), "--ranks", "1,2"]
    done = subprocess.run([*command, "--json"], capture_output=True, text=True, check=False)
    (run / "trigger-out.json").write_text(done.stdout)
    (run / "trigger-err.txt").write_text(done.stderr)
    (run / "triggers" / "by-hand.json").write_text('{"v": 1, "id": "by-hand", "start": ')


@pytest.fixture(scope="module")
def dist_run(tmp_path_factory: pytest.TempPathFactory, gloo_ranks: GlooRanks) -> Path:
    root = tmp_path_factory.mktemp("trigger")
    gloo_ranks.run(train_and_trigger, WORLD, root)
    return root


@pytest.mark.serial
@pytest.mark.slow
def test_a_trigger_starts_the_window_at_the_same_step_on_exactly_the_chosen_ranks(
    dist_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    written = json.loads((dist_run / "trigger-out.json").read_text())
    # The timings held steps up to TRIGGER_AT - 1; ranks look every 2 steps, first at step 8.
    assert (written["start"], written["last"], written["listening"]) == (11, 12, [1, 2])
    window = dist_run / "traces" / written["window"]
    assert written["window"] == f"step-000011-000012-trigger-{written['id']}"
    assert sorted(p.name for p in window.iterdir()) == [
        "rank-00001.pt.trace.json.gz",
        "rank-00001.summary.json",
        "rank-00002.pt.trace.json.gz",
        "rank-00002.summary.json",
    ]
    for rank in (1, 2):
        trace = read_trace(window / f"rank-{rank:05d}.pt.trace.json.gz")
        assert trace["distributedInfo"]["rank"] == rank
        assert profiler_steps(trace) == [11, 12]
        assert {"forward", "backward"} <= {ev.get("name") for ev in trace["traceEvents"]}
    answers = read_acks(dist_run, written["id"])
    assert sorted(answers) == [1, 2]
    for answer in answers.values():
        assert (answer["status"], answer["window"], answer["seen_at_step"]) == (
            "accepted",
            written["window"],
            8,
        )
    # The schedule's window ran on rank 0 alone (trace.ranks); ranks 1 and 2 are outside it
    # and recorded only the triggered window. Every rank trained every step.
    assert sorted(p.name for p in (dist_run / "traces").iterdir()) == [
        "step-000001-000001",
        written["window"],
    ]
    assert [p.name for p in (dist_run / "traces" / "step-000001-000001").glob("*.gz")] == [
        "rank-00000.pt.trace.json.gz"
    ]
    timings = read_timings(dist_run)
    assert {r: int(t.step.max()) for r, t in timings.ranks.items()} == {0: 15, 1: 15, 2: 15}


@pytest.mark.serial
@pytest.mark.slow
def test_the_file_dropped_by_hand_got_one_warning_per_rank_and_status_says_who_answered(
    dist_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for rank in range(WORLD):
        lines = (dist_run / f"log-{rank}.txt").read_text().splitlines()
        assert len(lines) == 1 and "by-hand.json" in lines[0], lines
    code, out, err = run_cli(["trigger", str(dist_run), "--status", "--json"], capsys)
    assert code == 0, err
    status = json.loads(out)
    (trigger,) = status["triggers"]
    assert trigger["ranks_by_state"]["saved"] == [1, 2]
    assert status["skipped"] and "by-hand.json" in status["skipped"][0]
    code, out, err = run_cli(["trigger", str(dist_run), "--status"], capsys)
    assert code == 0, err
    assert "saved: ranks 1, 2 ->" in out and "step-000011-000012-trigger-" in out


def test_the_poller_finds_a_folder_that_appears_goes_away_and_comes_back(tmp_path: Path) -> None:
    watcher = TriggerPoller(str(tmp_path), rank=0)
    assert watcher.poll() == [] and watcher.poll() == []  # no folder: an access() check each
    write_trigger(tmp_path, Trigger("first", 9, 1, "0"))
    assert [t.id for t in watcher.poll()] == ["first"]
    (trigger_dir(tmp_path) / "first.json").unlink()
    trigger_dir(tmp_path).rmdir()
    assert watcher.poll() == []
    write_trigger(tmp_path, Trigger("second", 9, 1, "0"))
    assert [t.id for t in watcher.poll()] == ["second"]
    watcher.close()
    watcher.close()  # twice: nothing left to close


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
def test_a_run_leaves_no_descriptor_of_the_triggers_folder_open(tmp_path: Path) -> None:
    def open_here() -> list[str]:
        return [
            target
            for fd in os.listdir("/proc/self/fd")
            if (target := _link(f"/proc/self/fd/{fd}")).startswith(str(tmp_path))
        ]

    _train(tmp_path, 6, s1=lambda: write_trigger(tmp_path, Trigger("t", 4, 1, "0")))
    assert _windows(tmp_path) == ["step-000001-000001", "step-000004-000004-trigger-t"]
    assert open_here() == []


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:  # closed since the listing
        return ""


def test_a_window_cut_short_by_stop_still_counts_as_saved_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Steps 5-7 asked for; the run stops during step 6, so the trace ends at step 6.
    _train(tmp_path, 6, s1=lambda: write_trigger(tmp_path, Trigger("t1", 5, 3, "0")))
    assert _windows(tmp_path) == ["step-000001-000001", "step-000005-000006-trigger-t1"]
    (answer,) = read_acks(tmp_path, "t1").values()
    assert answer["window"] == "step-000005-000007-trigger-t1"  # as announced
    code, out, err = run_cli(["trigger", str(tmp_path), "--status", "--json"], capsys)
    assert code == 0, err
    (trigger,) = json.loads(out)["triggers"]
    assert trigger["ranks_by_state"]["saved"] == [0]
    windows = {w["window"]: w["why"] for w in build_report(tmp_path)["kernels"]["windows"]}
    assert windows["step-000005-000006-trigger-t1"] == [
        "rankscope trigger t1 asked for it (rank 0)"
    ]


def test_an_nsys_run_on_gpus_is_told_where_its_range_records_go(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run(tmp_path, tool="nsys")
    for path in (run / "meta").glob("rank-*.json"):
        meta = json.loads(path.read_text())
        path.write_text(json.dumps({**meta, "device": "cuda:0 NVIDIA H100 80GB HBM3"}))
    code, out, err = run_cli(["trigger", str(run), "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["traces"] == str(run / "nsys" / data["window"])
    assert data["listening"] == [0, 1, 2, 3]


def test_the_latest_step_is_the_same_with_duckdb_and_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run(tmp_path, ranks="0-1")
    with_duckdb = latest_step(run)
    real = importlib.util.find_spec

    def no_duckdb(name: str, *args: Any) -> Any:
        return None if name == "duckdb" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", no_duckdb)
    assert latest_step(run) == with_duckdb == 19
