"""A running rank writes only under RUN_DIR and follows no symbolic link there.

Each test plants a link at a path a rank writes (a folder or a file's final name) that
points outside a temporary RUN_DIR, runs a real job through the Profiler, and checks
that nothing arrived outside, that every step ran, and that one warning says why.
Also: trigger ids that are not plain names, the temporaries an earlier process of a
rank left, and the modes of what rankscope makes.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import rankscope
from rankscope import AutoTrigger, ConfigError, Profiler, Schedule
from rankscope.capture._export import WindowExporter
from rankscope.capture._memory import write_atomic as write_snapshot
from rankscope.capture._nsys import NsysWindows
from rankscope.capture._trigger import TriggerPoller
from rankscope.rundir._files import append, open_folder, remove_stale_temps, write_atomic
from rankscope.rundir._layout import memory_path
from rankscope.rundir._trigger import (
    Trigger,
    check_trigger_id,
    new_trigger_id,
    parse_trigger,
    read_acks,
    read_trigger,
    trigger_dir,
    write_ack,
    write_trigger,
)

from .._helpers import final_files, rankscope_warnings, tiny_model, tiny_step
from ..capture.test_nsys import cuda  # noqa: F401 - the CUDA stand-in the nsys job runs with

STEPS = 8
WINDOW = "step-000002-000003"  # what SCHEDULE records
SCHEDULE = Schedule(wait=1, warmup=1, active=2)
PID = os.getpid()


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[Path]:
    """A folder beside RUN_DIR that must stay empty."""
    folder = tmp_path / "outside"
    folder.mkdir()
    yield folder
    assert sorted(p.name for p in folder.rglob("*")) == [], "something was written outside RUN_DIR"


@pytest.fixture
def run(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    return folder


def _config(run: Path, **trace: Any) -> rankscope.ProfileConfig:
    trace.setdefault("schedule", SCHEDULE)
    return rankscope.ProfileConfig(
        output_dir=run, trace=rankscope.TraceConfig(enable=True, **trace)
    )


def _train(config: rankscope.ProfileConfig, steps: int = STEPS, sleep: Any = None) -> int:
    """Run `steps` steps of a tiny model; `sleep(i)` seconds before step i. Steps done."""
    model, opt = tiny_model()
    done = 0
    with Profiler(config, rank=0, world_size=1) as prof:
        for i in range(steps):
            if sleep is not None:
                time.sleep(sleep(i))
            tiny_step(model, opt, prof)
            prof.step()
            done += 1
    return done


def _one_warning_about_a_link(caplog: pytest.LogCaptureFixture) -> str:
    warned = rankscope_warnings(caplog)
    assert len(warned) == 1, warned
    assert "refusing to write through a symbolic link" in warned[0], warned[0]
    assert "training goes on" in warned[0] or "the window is kept" in warned[0], warned[0]
    return warned[0]


# -- trigger answers ---------------------------------------------------------------------


@pytest.mark.parametrize("planted", ["folder", "answer"])
def test_a_link_where_a_trigger_answer_goes_is_not_followed(
    run: Path, outside: Path, caplog: pytest.LogCaptureFixture, planted: str
) -> None:
    write_trigger(run, Trigger("t1", 6, 1, "0"))
    answers = run / "triggers" / "t1"
    if planted == "folder":
        answers.symlink_to(outside, target_is_directory=True)
    else:
        answers.mkdir()
        (answers / "rank-00000.json").symlink_to(outside / "rank-00000.json")
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        assert _train(_config(run, trigger_check_every_n_steps=1)) == STEPS
    warned = _one_warning_about_a_link(caplog)
    assert "answering trigger t1 failed" in warned and "trigger checks are off" in warned
    assert str(answers) in warned
    assert read_acks(run, "t1") == {}
    # The window it asked for was planned before the answer was refused, and is saved.
    assert "traces/step-000006-000006-trigger-t1/rank-00000.pt.trace.json.gz" in final_files(run)


def test_a_linked_triggers_folder_is_not_read_nor_written(
    run: Path, outside: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_trigger(outside.parent, Trigger("t1", 6, 1, "0"))  # beside the run: tmp/triggers
    (run / "triggers").symlink_to(outside.parent / "triggers", target_is_directory=True)
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        assert _train(_config(run, trigger_check_every_n_steps=1)) == STEPS
    warned = _one_warning_about_a_link(caplog)
    assert "trigger checks are off" in warned
    assert sorted(p.name for p in (outside.parent / "triggers").iterdir()) == ["t1.json"]
    assert not any(f.startswith("traces/step-000006") for f in final_files(run))


# -- trigger files ----------------------------------------------------------------------


def test_a_trigger_file_that_is_a_link_is_refused_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    write_trigger(elsewhere, Trigger("linked", 9, 1, "0"))
    run = tmp_path / "run"
    trigger_dir(run).mkdir(parents=True)
    (trigger_dir(run) / "linked.json").symlink_to(trigger_dir(elsewhere) / "linked.json")
    (trigger_dir(run) / "dangling.json").symlink_to(tmp_path / "missing.json")
    watcher = TriggerPoller(str(run), 0)
    try:
        with caplog.at_level(logging.WARNING, logger="rankscope"):
            assert watcher.poll() == []
            watcher._mtime = None  # as if the folder changed: listed again, not warned again
            assert watcher.poll() == []
    finally:
        watcher.close()
    warned = sorted(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert len(warned) == 2, warned
    assert "dangling.json" in warned[0] and "linked.json" in warned[1]
    assert all("not a valid trigger file" in w for w in warned)
    with pytest.raises(OSError):
        read_trigger(trigger_dir(run) / "linked.json")


def test_an_answer_behind_a_link_does_not_count_as_answered(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    write_ack(elsewhere, Trigger("t1", 9, 1, "0"), 0, {"status": "accepted"})
    run = tmp_path / "run"
    write_trigger(run, Trigger("t1", 9, 1, "0"))
    (trigger_dir(run) / "t1").symlink_to(trigger_dir(elsewhere) / "t1", target_is_directory=True)
    watcher = TriggerPoller(str(run), 0)
    try:
        assert [t.id for t in watcher.poll()] == ["t1"]  # found, and its answer will be refused
    finally:
        watcher.close()
    with pytest.raises(OSError, match="symbolic link"):
        write_ack(run, Trigger("t1", 9, 1, "0"), 0, {"status": "accepted"})
    assert sorted(os.listdir(trigger_dir(elsewhere) / "t1")) == ["rank-00000.json"]


# -- traces ------------------------------------------------------------------------------


def test_a_linked_window_folder_is_not_followed(
    run: Path, outside: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (run / "traces").mkdir()
    (run / "traces" / WINDOW).symlink_to(outside, target_is_directory=True)
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        assert _train(_config(run)) == STEPS
    warned = _one_warning_about_a_link(caplog)
    assert "trace capture" in warned and str(run / "traces" / WINDOW) in warned
    assert not torch.autograd._profiler_enabled()


def test_a_linked_traces_folder_is_not_followed(
    run: Path, outside: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (run / "traces").symlink_to(outside, target_is_directory=True)
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        assert _train(_config(run)) == STEPS
    assert str(run / "traces") in _one_warning_about_a_link(caplog)


@pytest.mark.parametrize("name", ["rank-00000.pt.trace.json.gz", "rank-00000.summary.json"])
def test_a_link_under_a_trace_files_final_name_is_not_replaced_nor_followed(
    run: Path, outside: Path, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    window = run / "traces" / WINDOW
    window.mkdir(parents=True)
    (window / name).symlink_to(outside / name)
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        assert _train(_config(run)) == STEPS
    warned = _one_warning_about_a_link(caplog)
    assert "writing a trace failed" in warned
    assert sorted(os.listdir(window)) == [name]  # the link, as it was; no temporary left
    assert (window / name).is_symlink()


def test_a_link_under_the_exports_temporary_name_is_removed_not_followed(
    run: Path, outside: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """torch.profiler writes by path: the folder it writes into is made for it alone."""
    window = run / "traces" / WINDOW
    window.mkdir(parents=True)
    work = window / f".rank-00000.pt.trace.json.raw-{PID}.tmp"
    work.symlink_to(outside, target_is_directory=True)
    (window / f"{work.name}.tmp").symlink_to(outside / "kineto-partial")
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        assert _train(_config(run, gzip=False)) == STEPS
    assert rankscope_warnings(caplog) == []
    assert sorted(os.listdir(window)) == [
        f"{work.name}.tmp",  # a name nothing writes any more: left alone
        "rank-00000.pt.trace.json",
        "rank-00000.summary.json",
    ]


# -- auto records ------------------------------------------------------------------------

BASE_S, SLOW_S = 0.004, 0.06
SLOW = {20, 21, 22}


@pytest.mark.serial
@pytest.mark.parametrize("planted", ["folder", "file"])
def test_a_link_where_auto_records_go_is_not_followed(
    run: Path, outside: Path, caplog: pytest.LogCaptureFixture, planted: str
) -> None:
    if planted == "folder":
        (run / "auto").symlink_to(outside, target_is_directory=True)
    else:
        (run / "auto").mkdir()
        (run / "auto" / "rank-00000.jsonl").symlink_to(outside / "rank-00000.jsonl")
    auto = AutoTrigger(enable=True, ratio=3.0, warmup_steps=8, history_steps=20)
    config = _config(
        run, schedule=Schedule(warmup=1, active=1), auto=auto, trigger_check_every_n_steps=0
    )
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        assert _train(config, 30, sleep=lambda i: SLOW_S if i in SLOW else BASE_S) == 30
    warned = _one_warning_about_a_link(caplog)
    assert str(run / "auto") in warned
    # The window the slow steps asked for is kept.
    assert "traces/step-000025-000026-slow-steps/rank-00000.summary.json" in final_files(run)


def test_appending_neither_reaches_a_hard_linked_file_nor_waits_on_a_fifo(
    run: Path, outside: Path
) -> None:
    records = run / "auto" / "rank-00000.jsonl"
    records.parent.mkdir()
    victim = outside / "victim.jsonl"
    victim.write_text("")
    os.link(victim, records)  # the same file inside and outside: appending would land there
    with pytest.raises(OSError, match="a file with another link"):
        append(run, records, b"{}\n")
    assert victim.read_text() == ""
    victim.unlink()
    records.unlink()
    os.mkfifo(records)  # no reader: a blocking open would wait for ever
    with pytest.raises(OSError):
        append(run, records, b"{}\n")


# -- nsys notes --------------------------------------------------------------------------


@pytest.mark.usefixtures("cuda")
def test_a_linked_nsys_window_folder_is_not_followed(
    run: Path, outside: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (run / "nsys").mkdir()
    (run / "nsys" / WINDOW).symlink_to(outside, target_is_directory=True)
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        assert _train(_config(run, tool="nsys")) == STEPS
    assert str(run / "nsys" / WINDOW) in _one_warning_about_a_link(caplog)


def test_an_nsys_note_under_a_linked_name_is_refused(run: Path, outside: Path) -> None:
    note = run / "nsys" / WINDOW / "rank-00000.json"
    note.parent.mkdir(parents=True)
    note.symlink_to(outside / "note.json")
    exporter = WindowExporter(str(run), 0, True, lambda _cause: None)
    windows = NsysWindows(torch, None, None)
    with pytest.raises(OSError, match="symbolic link"):
        exporter.note_nsys_range(windows, WINDOW, 3, None)
    assert exporter.saved == 0
    assert os.listdir(note.parent) == ["rank-00000.json"]


# -- memory snapshots --------------------------------------------------------------------


@pytest.mark.parametrize("planted", ["memory", "window", "file"])
def test_a_snapshot_is_not_written_through_a_link(run: Path, outside: Path, planted: str) -> None:
    """What the snapshot writer thread and the out-of-memory dump call (a CPU-only check;
    tests/capture/test_memory.py runs it on the writer thread, the gpu test below end to end)."""
    path = memory_path(run, WINDOW, 0)
    if planted == "memory":
        (run / "memory").symlink_to(outside, target_is_directory=True)
    elif planted == "window":
        path.parent.parent.mkdir()
        path.parent.symlink_to(outside, target_is_directory=True)
    else:
        path.parent.mkdir(parents=True)
        path.symlink_to(outside / path.name)
    with pytest.raises(OSError, match="refusing to write through a symbolic link") as info:
        write_snapshot(pickle.dumps({"segments": []}), path, f"w{PID}", run)
    assert info.value.filename in (str(path), str(path.parent), str(run / "memory"))


@pytest.mark.gpu
def test_gpu_a_linked_memory_window_is_not_followed(
    run: Path, outside: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (run / "memory").mkdir()
    (run / "memory" / WINDOW).symlink_to(outside, target_is_directory=True)
    config = _config(run)
    config = rankscope.ProfileConfig(
        output_dir=run, trace=config.trace, memory=rankscope.MemoryConfig(enable=True)
    )
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        assert _train(config) == STEPS
    assert "memory snapshots are off" in _one_warning_about_a_link(caplog)


# -- the names themselves ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("trigger_id", "why"),
    [
        ("a/b", 'holds a "/"'),
        ("../up", 'holds a "/"'),
        ("..", 'holds ".."'),
        ("/etc/cron.d/x", 'holds a "/"'),
        (".hidden", 'starts with "."'),
        ("nul\0byte", "holds a NUL"),
        ("", "is empty"),
    ],
)
def test_a_trigger_id_that_is_not_a_plain_name_is_refused(trigger_id: str, why: str) -> None:
    with pytest.raises(ConfigError, match="trigger id=") as info:
        Trigger(trigger_id, 5, 1, "0")
    assert why in str(info.value) and "a plain name" in str(info.value)
    data = {"v": 1, "id": trigger_id, "start": 5, "steps": 1, "ranks": "0"}
    with pytest.raises(ValueError, match='"id" is') as read:
        parse_trigger(data)
    assert why in str(read.value)


def test_a_trigger_file_naming_a_path_is_skipped_with_one_warning(
    run: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = run / "triggers"
    folder.mkdir()
    data = {"v": 1, "id": "../escape", "start": 5, "steps": 1, "ranks": "0"}
    (folder / "escape.json").write_text(json.dumps(data))
    watcher = TriggerPoller(str(run), 0)
    try:
        with caplog.at_level(logging.WARNING, logger="rankscope"):
            assert watcher.poll() == []
    finally:
        watcher.close()
    (warned,) = rankscope_warnings(caplog)
    assert "escape.json" in warned and "not a valid trigger file" in warned and '"/"' in warned


def test_the_ids_the_cli_makes_are_plain_names() -> None:
    assert check_trigger_id(new_trigger_id()) is None


@pytest.mark.parametrize("folder", ["triggers/..", "triggers/../..", "/elsewhere"])
def test_a_folder_that_is_not_below_the_run_directory_is_refused(run: Path, folder: str) -> None:
    target = Path(folder) if folder.startswith("/") else run / folder
    with pytest.raises(OSError, match="refusing"):
        write_atomic(run, target / "x.json", b"{}", "t")
    assert not (run.parent / "x.json").exists()


# -- temporaries an earlier process left -----------------------------------------------------

OTHER_PID = 2**22 + 7  # above Linux's pid_max: no process of this host has it


def _plant(run: Path, outside: Path) -> dict[str, Path]:
    """Temporaries of rank 0 from an earlier process, of this process, and of rank 1."""
    window = run / "traces" / "step-000009-000009"
    window.mkdir(parents=True)
    stale = {
        "kineto partial": window / f".rank-00000.pt.trace.json.raw-{OTHER_PID}.tmp.tmp",
        "summary": window / f".rank-00000.summary.json.{OTHER_PID}.tmp",
        "nsys": run / "nsys" / "w" / f".rank-00000.json.{OTHER_PID}.tmp",
        "memory": run / "memory" / "w" / f".rank-00000.pickle.w{OTHER_PID}.tmp",
        "oom": run / "memory" / "w" / f".rank-00000.pickle.oom{OTHER_PID}.tmp",
        "answer": run / "triggers" / "t1" / f".rank-00000.json.{OTHER_PID}.tmp",
        "meta": run / "meta" / f".rank-00000.json.{OTHER_PID}.tmp",
    }
    for path in stale.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("half written")
    export = window / f".rank-00000.pt.trace.json.raw-{OTHER_PID}.tmp"
    export.mkdir(mode=0o700)
    (export / ".trace.json.tmp").write_text("{")
    stale["export folder"] = export
    link = window / f".rank-00000.pt.trace.json.raw-{OTHER_PID + 1}.tmp"
    (outside / "kept").write_text("not rankscope's")
    link.symlink_to(outside, target_is_directory=True)
    stale["link"] = link
    hour_ago = time.time() - 3600  # left by a process killed an hour ago
    for path in stale.values():
        os.utime(path, (hour_ago, hour_ago), follow_symlinks=False)
    return stale


def test_a_ranks_stale_temporaries_are_removed_when_it_starts(
    run: Path, outside: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stale = _plant(run, outside)
    window = run / "traces" / "step-000009-000009"
    kept = [
        window / f".rank-00000.pt.trace.json.gz.{PID}.tmp",  # this process's: being written
        window / f".rank-00001.pt.trace.json.raw-{OTHER_PID}.tmp.tmp",  # another rank's
        window / ".rank-00000.pt.trace.json.gz",  # not a temporary name
        run / "triggers" / f".t2.json.{OTHER_PID}.tmp",  # the CLI's, not a rank's
        # Changed just now: another job writing into the directory may be writing it.
        window / f".rank-00000.summary.json.{OTHER_PID + 2}.tmp",
    ]
    for path in kept:
        path.write_text("keep")
    linked = run / "traces" / "linked"  # a window folder that is a link: not looked into
    linked.symlink_to(outside, target_is_directory=True)
    (outside / f".rank-00000.json.{OTHER_PID}.tmp").write_text("not rankscope's")
    with caplog.at_level(logging.INFO, logger="rankscope"):
        prof = Profiler(_config(run), rank=0, world_size=1)
        prof.start()
        prof.stop()
    left = {name: path for name, path in stale.items() if os.path.lexists(path)}
    assert left == {}
    assert all(path.exists() for path in kept)
    assert sorted(os.listdir(outside)) == [f".rank-00000.json.{OTHER_PID}.tmp", "kept"]
    (outside / "kept").unlink()
    (outside / f".rank-00000.json.{OTHER_PID}.tmp").unlink()
    said = [r.getMessage() for r in caplog.records if "temporary file(s)" in r.getMessage()]
    assert len(said) == 1 and f"removed {len(stale)} temporary file(s)" in said[0]


def test_removing_stale_temporaries_looks_once_per_process(run: Path) -> None:
    first = run / "meta" / f".rank-00004.json.{OTHER_PID}.tmp"
    first.parent.mkdir()
    first.write_text("{")
    os.utime(first, (time.time() - 3600, time.time() - 3600))
    assert remove_stale_temps(run, 4) == [str(first)]
    first.write_text("{")
    assert remove_stale_temps(run, 4) == []  # an earlier process's are gone already
    assert remove_stale_temps(run / "missing", 4) == []


# -- modes -------------------------------------------------------------------------------------


@pytest.fixture
def strict_umask() -> Iterator[int]:
    mask = 0o077
    before = os.umask(mask)
    try:
        yield mask
    finally:
        os.umask(before)


def test_what_rankscope_makes_follows_the_umask(run: Path, strict_umask: int) -> None:
    write_trigger(run, Trigger("t1", 5, 1, "0"))
    assert _train(_config(run, trigger_check_every_n_steps=1)) == STEPS
    made = list(run.rglob("*"))
    assert any(p.name == "rank-00000.pt.trace.json.gz" for p in made)
    assert any(p.name == "rank-00000.json" and p.parent.name == "t1" for p in made)
    loose = [str(p) for p in made if stat.S_IMODE(p.lstat().st_mode) & strict_umask]
    assert loose == []


def test_files_get_what_the_umask_allows_and_no_more(run: Path) -> None:
    before = os.umask(0o022)
    try:
        write_atomic(run, run / "auto" / "x.json", b"{}", "t")
        with open_folder(run, run / "auto") as folder:
            os.close(folder.append("y.jsonl"))
    finally:
        os.umask(before)
    for name, mode in (("auto", 0o755), ("auto/x.json", 0o644), ("auto/y.jsonl", 0o644)):
        assert stat.S_IMODE((run / name).stat().st_mode) == mode, name


# -- meta and timings --------------------------------------------------------------------


@pytest.mark.parametrize(
    "planted", ["meta", "meta/rank-00000.json", "timings", "timings/rank-00000.jsonl"]
)
def test_meta_and_timings_are_not_written_through_a_link(
    run: Path, outside: Path, planted: str, caplog: pytest.LogCaptureFixture
) -> None:
    link = run / planted
    link.parent.mkdir(parents=True, exist_ok=True)
    target = outside / "target"
    if "." in link.name:
        target.write_text("")  # a file of the user's, that the rank must not touch
    else:
        target.mkdir()
    link.symlink_to(target)
    config = rankscope.ProfileConfig(
        output_dir=run, timer=rankscope.TimerConfig(enable=True, every_n_steps=1)
    )
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        assert _train(config) == STEPS
    assert (target.read_text() == "") if target.is_file() else list(target.iterdir()) == []
    target.unlink() if target.is_file() else target.rmdir()  # `outside` checks the rest
    warned = rankscope_warnings(caplog)
    assert warned and all("symbolic link" in w for w in warned), warned
