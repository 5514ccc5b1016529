"""The run directory's contract (_layout.py): every kind of file the job writes is found
again by RunDir, with its rank; names from elsewhere get their rank by the one rule."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import rankscope
from rankscope import TraceError
from rankscope.capture._auto import SlowSteps
from rankscope.capture._export import WindowExporter
from rankscope.capture._memory import write_atomic
from rankscope.capture._ondemand import OnDemand
from rankscope.capture._requests import WindowRequests
from rankscope.capture._schedule import StepPlan
from rankscope.config._trace import AutoTrigger, TraceConfig
from rankscope.rundir._layout import (
    SIGNAL_TAG,
    is_trace_name,
    memory_path,
    rank_of_file,
    step_window_name,
    summary_of,
    trigger_tag,
    window_key,
)
from rankscope.rundir._listing import (
    RunDir,
    is_run_dir,
    not_regular,
    open_regular,
    traces_under,
)
from rankscope.rundir._trigger import Trigger, write_trigger

from .._helpers import tiny_model, tiny_step

RANK = 3
WINDOW = "step-000002-000003"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory with one of every kind of file, each written by the capture side."""
    root = tmp_path_factory.mktemp("run")
    config = rankscope.ProfileConfig(
        output_dir=root,
        timer=rankscope.TimerConfig(enable=True, every_n_steps=1),
        trace=rankscope.TraceConfig(
            enable=True, ranks=str(RANK), schedule=rankscope.Schedule(wait=1, warmup=1, active=2)
        ),
    )
    model, opt = tiny_model()
    with rankscope.Profiler(config, rank=RANK, world_size=4) as prof:  # meta, timings, a trace
        for _ in range(6):
            tiny_step(model, opt, prof)
            prof.step()
    trace = TraceConfig(enable=True, auto=AutoTrigger(enable=True))
    requests = WindowRequests(trace, StepPlan(None))
    asking = OnDemand(str(root), RANK, requests, check_every=1)
    trigger = Trigger("t-1", 40, 2, "all", None)
    write_trigger(root, trigger)
    asking.check_triggers(10)  # the rank answers the trigger
    asking.close_triggers()
    slow = SlowSteps(step=20, seconds=(0.5, 0.6), steps=(19, 20), median=0.1, ratio=1.5, capture=1)
    asking.on_slow(slow, 21, None, 2)  # a line of RUN_DIR/auto
    exporter = WindowExporter(str(root), RANK, True, lambda _cause: None)
    nsys = SimpleNamespace(first_step=40, start_ns=1, end_ns=2)
    exporter.note_nsys_range(nsys, trigger.window, 41, None)  # type: ignore[arg-type]
    write_atomic(b"snapshot", memory_path(root, WINDOW, RANK), "test")
    return root


def test_every_kind_of_file_is_listed_with_its_rank(run_dir: Path) -> None:
    run = RunDir(run_dir)
    assert [(f.rank, f.path.name) for f in run.meta()] == [(RANK, "rank-00003.json")]
    assert [f.rank for f in run.timings()] == [RANK]
    assert run.windows() == [WINDOW]
    traces = run.traces()
    assert [(t.rank, t.window, t.path.name) for t in traces] == [
        (RANK, WINDOW, "rank-00003.pt.trace.json.gz")
    ]
    assert [(s.rank, s.folder) for s in run.summaries()] == [(RANK, WINDOW)]
    assert summary_of(traces[0].path) == run.summaries()[0].path
    assert [f.rank for f in run.auto_records()] == [RANK]
    assert [p.name for p in run.triggers()] == ["t-1.json"]
    assert [(f.rank, f.folder) for f in run.trigger_answers()] == [(RANK, "t-1")]
    assert run.trigger_answers("t-1") == run.trigger_answers()
    assert run.trigger_answers("another") == []
    window = step_window_name(40, 41, trigger_tag("t-1"))
    assert [(f.rank, f.folder) for f in run.nsys_ranges()] == [(RANK, window)]
    assert [(f.rank, f.folder) for f in run.memory_snapshots()] == [(RANK, WINDOW)]


def test_what_the_files_say_matches_where_they_are(run_dir: Path) -> None:
    """The contents agree with the names RunDir gives: the same rank, the same window."""
    run = RunDir(run_dir)
    assert json.loads(run.meta()[0].path.read_text())["rank"] == RANK
    first = json.loads(run.timings()[0].path.read_text().splitlines()[0])
    assert first["rank"] == RANK
    answer = json.loads(run.trigger_answers()[0].path.read_text())
    assert answer["status"] == "accepted"
    nsys = json.loads(run.nsys_ranges()[0].path.read_text())
    assert nsys["window"] == run.nsys_ranges()[0].folder
    auto = json.loads(run.auto_records()[0].path.read_text())
    assert auto["status"] == "accepted"
    # seen at step 21: a warm-up step (22), then the window from 23
    assert window_key(auto["window"]) == (23, "slow-steps")


def test_files_being_written_are_never_listed(run_dir: Path) -> None:
    (run_dir / "timings" / ".rank-00009.jsonl.123.tmp").write_text("{")
    try:
        assert [f.rank for f in RunDir(run_dir).timings()] == [RANK]
    finally:
        os.unlink(run_dir / "timings" / ".rank-00009.jsonl.123.tmp")


def test_saved_matches_a_window_cut_short(tmp_path: Path) -> None:
    """A window announced as steps 40-41 that stop() ended at 40 is still the one saved."""
    announced = step_window_name(40, 41, trigger_tag("t-1"))
    cut = tmp_path / "traces" / step_window_name(40, 40, trigger_tag("t-1"))
    cut.mkdir(parents=True)
    (cut / "rank-00002.pt.trace.json.gz").write_bytes(b"")
    run = RunDir(tmp_path)
    assert run.saved(announced, 2) == [cut / "rank-00002.pt.trace.json.gz"]
    assert run.saved(announced, 1) == []
    assert run.saved(step_window_name(50, 51), 2) == []


def test_a_missing_run_directory_lists_nothing(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "nowhere")
    assert run.meta() == run.timings() == run.summaries() == []
    assert run.traces() == [] and run.windows() == [] and run.triggers() == []
    assert not is_run_dir(tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("name", "suffix", "rank"),
    [
        ("rank-00003.jsonl", ".jsonl", 3),
        ("rank-3.jsonl", ".jsonl", 3),
        ("rank-00003.json", ".jsonl", None),  # another kind of file
        ("rank-x.jsonl", ".jsonl", None),
        ("old-rank-00003.jsonl", ".jsonl", None),  # rankscope never writes such a name
        ("rank-00003.pt.trace.json.gz", None, 3),
        ("rank3_trace.json", None, 3),  # kernels and merge agree on other tools' names
        ("trace-rank_12.json.gz", None, 12),
        ("worker.RANK-7.json", None, 7),
        ("gpu-128rank-sampled-rank1.json.gz", None, 1),
        ("frank3.json", None, None),  # "rank" must start a word
        ("trace.json", None, None),
    ],
)
def test_the_one_rule_for_a_files_rank(name: str, suffix: str | None, rank: int | None) -> None:
    assert rank_of_file(name, suffix) == rank


def test_trace_names() -> None:
    assert is_trace_name("rank-00003.pt.trace.json.gz")
    assert is_trace_name("x.json")
    assert not is_trace_name("rank-00003.summary.json")
    assert not is_trace_name(".rank-00003.pt.trace.json.raw-1.tmp")
    assert not is_trace_name("rank-00003.pickle")


def test_window_tags_are_what_the_names_carry() -> None:
    name = step_window_name(120, 121, SIGNAL_TAG)
    assert name == "step-000120-000121-sigusr2"
    assert window_key(name) == (120, SIGNAL_TAG)
    assert window_key(step_window_name(120, 120, SIGNAL_TAG)) == window_key(name)
    assert window_key("phase-forward-000003") is None


def test_kernels_and_merge_read_the_rank_of_a_foreign_name_alike(tmp_path: Path) -> None:
    """`rank3_trace.json`: kernels found no rank for it before the rule lived once."""
    from rankscope.analysis import kernel_report, merge_traces

    path = tmp_path / "rank3_trace.json"  # no distributedInfo: only its name says its rank
    event = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 5, "pid": 1, "tid": 1}
    path.write_text(json.dumps({"traceEvents": [event]}))
    assert kernel_report([path]).traces[0]["rank"] == 3
    assert merge_traces([path], tmp_path / "out.json").ranks == (3,)


# -- only regular files: what is named like one and is not is left out, and said ---------


def test_what_is_named_like_a_file_and_is_not_one_is_left_out_and_said(tmp_path: Path) -> None:
    for folder in ("meta", "timings", "auto", "traces/w", "nsys/w", "memory/w", "triggers/t"):
        (tmp_path / folder).mkdir(parents=True)
    odd = {
        tmp_path / "meta" / "rank-00000.json": "not a regular file (a FIFO)",
        tmp_path / "timings" / "rank-00001.jsonl": "not a regular file (a directory)",
        tmp_path / "timings" / "rank-x.jsonl": "not a regular file (a FIFO)",
        tmp_path / "auto" / "rank-00002.jsonl": "a symlink loop",
        tmp_path / "traces" / "w" / "rank-00003.pt.trace.json.gz": "a broken symlink",
        tmp_path / "traces" / "w" / "rank-00003.summary.json": "not a regular file (a FIFO)",
        tmp_path / "nsys" / "w" / "rank-00004.json": "not a regular file (a FIFO)",
        tmp_path / "memory" / "w" / "rank-00005.pickle": "not a regular file (a character device)",
        tmp_path / "triggers" / "t.json": "not a regular file (a directory)",
        tmp_path / "triggers" / "t" / "rank-00006.json": "not a regular file (a FIFO)",
    }
    for path, why in odd.items():
        if "FIFO" in why:
            os.mkfifo(path)
        elif "directory" in why:
            path.mkdir()
        elif "loop" in why:
            path.symlink_to(path.name)
        elif "device" in why:
            path.symlink_to("/dev/null")
        else:
            path.symlink_to("nowhere")
    run = RunDir(tmp_path)
    listed = [
        run.meta(),
        run.timings(),
        run.misnamed_timings(),
        run.auto_records(),
        run.traces(),
        run.summaries(),
        run.nsys_ranges(),
        run.memory_snapshots(),
        run.triggers(),
        run.trigger_answers(),
    ]
    assert listed == [[]] * len(listed)  # nothing of these is handed out
    assert sorted(run.left_out) == sorted(f"{path}: {why}" for path, why in odd.items())


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda p: p.write_text("a file"), "not a directory (a regular file)"),
        (lambda p: p.symlink_to(p.name), "a symlink loop"),
        (lambda p: p.symlink_to("nowhere"), "a broken symlink"),
    ],
    ids=["file", "loop", "broken-link"],
)
def test_a_folder_that_cannot_be_listed_is_said(tmp_path: Path, make: Any, why: str) -> None:
    make(tmp_path / "traces")
    run = RunDir(tmp_path)
    assert run.traces() == [] and run.windows() == []
    assert run.left_out == [f"{tmp_path / 'traces'}: {why}"]
    assert RunDir(tmp_path).meta() == [] and RunDir(tmp_path / "meta").left_out == []


def test_traces_are_found_through_links_each_folder_once(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "rank-00000.pt.trace.json").write_text("{}")
    top = tmp_path / "run" / "traces"
    top.mkdir(parents=True)
    (top / "w").symlink_to(elsewhere)
    (top / "again").symlink_to(elsewhere)
    (top / "w2").mkdir()
    (top / "w2" / "up").symlink_to(top)  # a way round, read once
    said: list[str] = []
    found = traces_under(top, note=lambda path, why: said.append(f"{path}: {why}"))
    assert [(t.window, t.rank) for t in found] == [("again", 0)]
    assert said == []


def test_open_regular_never_blocks_on_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    opening = ThreadPoolExecutor(1).submit(open_regular, fifo)  # a hang fails, not blocks
    with pytest.raises(TraceError, match=r"fifo\.json: not a regular file \(a FIFO\)$"):
        opening.result(timeout=30)
    (tmp_path / "file.json").write_text("{}")
    with open_regular(tmp_path / "file.json") as fh:
        assert fh.read() == b"{}"
    assert not_regular(tmp_path / "file.json") is None
    assert not_regular(fifo) == "not a regular file (a FIFO)"
    assert not_regular(tmp_path / "absent") == "no such file"
