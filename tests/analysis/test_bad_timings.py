"""Bad timings and meta files: each is built here, and the exact behaviour checked.

The corpus for traces, summaries and merge is tests/analysis/test_bad_input.py; this one holds
what the timer and meta files can get wrong. Every case names the file and the
problem in one line, leaves the file out (or exits 2 where nothing is left), and keeps
the figures of the other ranks.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rankscope.analysis import build_report, find_stragglers, phase_matrices, read_timings
from rankscope.cli import main
from rankscope.testing._synthetic import Slowdown, write_timings

RANKS = 4


def _run(root: Path) -> Path:
    """A run where rank 2 is slow in forward."""
    write_timings(root, ranks=RANKS, steps=20, slowdowns=[Slowdown(2, "forward", 0.5)])
    return root


def _timings(root: Path, rank: int) -> Path:
    return root / "timings" / f"rank-{rank:05d}.jsonl"


def _meta(root: Path, rank: int) -> Path:
    return root / "meta" / f"rank-{rank:05d}.json"


def _rewrite(path: Path, change: dict[str, object]) -> None:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({**r, **change}) + "\n" for r in lines))


def _summary(root: Path) -> list[str]:
    run = read_timings(root)
    return find_stragglers(phase_matrices(run, "host")).summary


def test_a_rank_of_an_unknown_schema_version_is_said_and_left_out(tmp_path: Path) -> None:
    _run(tmp_path)
    _rewrite(_timings(tmp_path, 3), {"v": 99})
    run = read_timings(tmp_path)
    assert sorted(run.ranks) == [0, 1, 2]
    path = _timings(tmp_path, 3)
    assert run.skipped == [
        f"{path}: 120 line(s) of schema version 99 left out (this rankscope reads version 1; "
        "a newer rankscope wrote them?)",
        f"{path}: no records",
    ]
    assert _summary(tmp_path)[0].startswith("rank 2 is slow in forward")


def test_negative_times_are_bad_lines_and_do_not_hide_the_straggler(tmp_path: Path) -> None:
    _run(tmp_path)
    before = _summary(tmp_path)
    _rewrite(_timings(tmp_path, 1), {"cpu_ms": -50.0})
    run = read_timings(tmp_path)
    assert sorted(run.ranks) == [0, 2, 3]
    path = _timings(tmp_path, 1)
    bad = [s for s in run.skipped if "cpu_ms and gpu_ms must be numbers" in s]
    assert len(bad) == 120 and run.skipped[-1] == f"{path}: no records"
    assert bad[0] == (
        f"{path}:1: cpu_ms and gpu_ms must be numbers from 0 to 604800000 (a week; gpu_ms "
        "may be null)"
    )
    assert before[0].startswith("rank 2 is slow in forward")
    assert _summary(tmp_path)[0].startswith("rank 2 is slow in forward")  # still found


@pytest.mark.parametrize("value", ["1e400", "-0.5", "NaN", "Infinity", '"12"', "true"])
def test_a_time_that_is_not_a_time_is_a_bad_line(tmp_path: Path, value: str) -> None:
    _run(tmp_path)
    path = _timings(tmp_path, 0)
    lines = path.read_text().splitlines()
    lines[4] = re.sub(r'"cpu_ms":[^,]*', f'"cpu_ms":{value}', lines[4])
    path.write_text("\n".join(lines) + "\n")
    run = read_timings(tmp_path)
    assert len(run.ranks[0]) == len(lines) - 1
    (said,) = run.skipped
    assert said.startswith(f"{path}:5: ")


def test_a_world_size_past_any_job_is_said_and_sizes_follow_the_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(tmp_path)
    meta = json.loads(_meta(tmp_path, 0).read_text())
    _meta(tmp_path, 0).write_text(json.dumps({**meta, "world_size": 10**12}))
    report = build_report(tmp_path)
    assert report["ranks"]["world_size"] == RANKS and report["ranks"]["missing"] == []
    assert report["skipped"] == [
        f"{_meta(tmp_path, 0)}: world_size 1000000000000 is past any job's (over 1048576); ignored"
    ]
    assert main(["stragglers", str(tmp_path), "--json"]) == 0
    assert "past any job's" in capsys.readouterr().out


def test_meta_of_an_unknown_schema_version_is_said(tmp_path: Path) -> None:
    _run(tmp_path)
    meta = json.loads(_meta(tmp_path, 1).read_text())
    _meta(tmp_path, 1).write_text(json.dumps({**meta, "v": 99}))
    report = build_report(tmp_path)
    assert report["skipped"] == [
        f"{_meta(tmp_path, 1)}: meta schema version 99 left out (this rankscope reads "
        "version 1; a newer rankscope wrote it?)"
    ]
    assert report["ranks"]["present"] == list(range(RANKS))


def test_missing_ranks_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_timings(tmp_path, ranks=1000, steps=3, only_ranks=[0, 5])
    assert main(["stragglers", str(tmp_path), "--json"]) == 0
    skipped = json.loads(capsys.readouterr().out)["skipped"]
    assert skipped == [
        (
            "ranks 1-4, 6-999: no timings (of a world of 1000)"
            "; no meta file either: nothing of it was written here (another output_dir, its own config leaving it out, or it never started: its log says)"
        )
    ]


def test_json_is_strict_even_where_a_figure_is_not_a_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Device time on a CPU-only run: every gpu_ms is null, so every ratio is NaN (this
    # printed NaN 20 times before).
    _run(tmp_path)

    def strict(word: str) -> None:
        pytest.fail(f"{word} in --json")

    assert main(["stragglers", str(tmp_path), "--json", "--time", "device"]) == 0
    found = json.loads(capsys.readouterr().out, parse_constant=strict)
    assert {row["median_ratio"] for row in found["table"]} == {None}
    assert main(["report", str(tmp_path), "--json", "--no-html", "--time", "device"]) == 0
    json.loads(capsys.readouterr().out, parse_constant=strict)


def test_a_folder_inside_a_run_directory_points_to_the_run_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(tmp_path)
    for command in ("report", "stragglers"):
        assert main([command, str(tmp_path / "timings")]) == 2
        err = capsys.readouterr().err
        assert f"lies inside the run directory {tmp_path.resolve()}" in err
        assert "Traceback" not in err


@pytest.mark.parametrize("folder", ["timings", "meta"])
def test_a_fifo_under_a_timings_or_meta_name_is_said_and_never_opened(
    tmp_path: Path, folder: str
) -> None:
    import os
    import subprocess
    import sys

    _run(tmp_path)
    path = _timings(tmp_path, 3) if folder == "timings" else _meta(tmp_path, 3)
    path.unlink()
    os.mkfifo(path)  # opening it for reading would wait for a writer forever
    for command in ("report", "stragglers"):
        done = subprocess.run(
            [sys.executable, "-m", "rankscope.cli", command, str(tmp_path), "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        skipped = json.loads(done.stdout)["skipped"]
        assert f"{path}: not a regular file (a FIFO)" in skipped, skipped


def test_a_temporary_a_killed_export_left_is_named(tmp_path: Path) -> None:
    _run(tmp_path)
    window = tmp_path / "traces" / "step-000003-000004"
    window.mkdir(parents=True)
    left = window / ".rank-00001.pt.trace.json.raw-4242.tmp.tmp"
    left.write_text('{"traceEvents": [')  # cut short by a kill -9 mid-export
    report = build_report(tmp_path)
    assert [s for s in report["skipped"] if s.startswith(str(left))] == [
        f"{left}: a temporary, not read (a write in progress, or one a killed process left: "
        "its rank removes it when it starts again)"
    ]


def _stragglers_json(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[dict, str]:
    assert main(["stragglers", str(root), "--json"]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def _told(report: dict) -> set[tuple]:
    return {(f["rank"], f["role"], f["phase"]) for f in report["findings"]}


def test_a_time_no_phase_can_take_is_a_bad_line_and_the_costs_stay_finite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 1.797e308 ms in three lines of a healthy rank: summed into its steps it made the
    # step infinite ("a none step against 109 ms measured (infx)", "saves 0 ms").
    want, _ = _stragglers_json(_run(tmp_path / "clean"), capsys)
    root = _run(tmp_path / "run")
    path = _timings(root, 0)
    lines = path.read_text().splitlines()
    records = [i for i, line in enumerate(lines) if '"phase":"backward"' in line][:3]
    for i in records:
        lines[i] = json.dumps({**json.loads(lines[i]), "cpu_ms": 1.797e308})
    path.write_text("\n".join(lines) + "\n")
    got, err = _stragglers_json(root, capsys)
    assert "RuntimeWarning" not in err and "overflow" not in err
    assert _told(got) == _told(want)
    assert len([s for s in got["skipped"] if "cpu_ms and gpu_ms must be numbers" in s]) == 3
    assert got["cost"]["step_ms"] == pytest.approx(want["cost"]["step_ms"], rel=0.05)
    assert all(f["cost"]["step_ms_saved"] > 0 for f in got["findings"] if f["role"] == "slow")
    assert not any("inf" in line or "none step" in line for line in got["summary"])


@pytest.mark.parametrize("copied", ["a flush", "one record"])
def test_a_record_written_twice_counts_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], copied: str
) -> None:
    # One flush appended twice (a copy of the file into itself, a writer retried): the
    # phases read as run twice a step (a pipeline), the waiters vanished and the price
    # fell 400x; one record twice made its rank "slow" in that phase.
    want, _ = _stragglers_json(_run(tmp_path / "clean"), capsys)
    root = _run(tmp_path / "run")
    path = _timings(root, 1)
    lines = path.read_text().splitlines(keepends=True)
    if copied == "a flush":
        path.write_text("".join(lines + lines[: len(lines) // 2]))
    else:
        at = next(i for i, line in enumerate(lines) if '"phase":"forward"' in line)
        path.write_text("".join([*lines[: at + 1], lines[at], *lines[at + 1 :]]))
    got, _ = _stragglers_json(root, capsys)
    assert _told(got) == _told(want)
    assert got["cost"]["step_ms"] == pytest.approx(want["cost"]["step_ms"], rel=0.01)
    assert any("counted once" in s for s in got["skipped"])


def test_a_line_longer_than_any_record_is_skipped_unread_by_every_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A 64 MB line (a record's meta gone wrong): parsed, a 1 GB one took 6 GB; DuckDB
    # refused it (past 16-32 MB) with a traceback from sql and export.
    from rankscope.analysis.read._timings import MAX_LINE

    want, _ = _stragglers_json(_run(tmp_path / "clean"), capsys)
    root = _run(tmp_path / "run")
    path = _timings(root, 1)
    lines = path.read_text().splitlines()
    lines.insert(4, json.dumps({**json.loads(lines[3]), "meta": {"x": "a" * (MAX_LINE + 1)}}))
    path.write_text("\n".join(lines) + "\n")
    said = f"{path}:5: a line of {len(lines[4])} bytes, longer than any record (64 MB)"
    got, _ = _stragglers_json(root, capsys)
    assert _told(got) == _told(want)
    assert [s for s in got["skipped"] if "longer than any record" in s] == [
        f"{said}; skipped unread"
    ]
    counted = []
    for run in (tmp_path / "clean", root):
        assert main(["sql", str(run), "select count(*) as n from timings", "--json"]) == 0
        out = capsys.readouterr()
        counted.append(json.loads(out.out))
    assert counted[0] == counted[1]  # every record but the long line's
    assert said in out.err and "Traceback" not in out.err
    assert main(["export", str(root), "--parquet", str(tmp_path / "pq")]) == 0
    assert (tmp_path / "pq" / "timings.parquet").is_file()
