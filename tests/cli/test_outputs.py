"""No command writes over what a run directory holds (the job's records, meta, traces), and
no demo runs into a folder that holds a run; the page a command writes there is rewritten."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from rankscope.testing._synthetic import write_timings
from rankscope.testing._synthetic_traces import write_trace

from .._helpers import run_cli

WINDOW = "step-000004-000005"


def _run(root: Path) -> Path:
    write_timings(root, ranks=4, steps=12)
    for rank in range(4):
        trace = root / "traces" / WINDOW / f"rank-{rank:05d}.pt.trace.json.gz"
        trace.parent.mkdir(parents=True, exist_ok=True)
        write_trace(trace, rank=rank, world_size=4, size_bytes=20_000)
    (root / "traces" / WINDOW / "rank-00002.summary.json").write_text("{}")
    return root


def _sums(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "report.html"
    }


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return _run(tmp_path / "run")


def _traces(run: Path) -> list[str]:
    return [str(p) for p in sorted((run / "traces" / WINDOW).glob("*.pt.trace.json.gz"))]


@pytest.mark.parametrize(
    ("argv", "flag", "target"),
    [
        (
            ["report", "{run}", "-o", "{run}/timings/rank-00000.jsonl"],
            "-o",
            "timings/rank-00000.jsonl",
        ),
        (["report", "{run}", "-o", "{run}/meta/rank-00000.json"], "-o", "meta/rank-00000.json"),
        (["report", "{run}", "-o", "{run}/timings"], "-o", "timings"),
        (["diff", "{run}", "{run}", "--html", "{run}/timings/rank-00001.jsonl"], "--html", None),
        (
            ["merge", "{traces}", "-o", f"{{run}}/traces/{WINDOW}/rank-00002.summary.json"],
            "-o",
            None,
        ),
        (["merge", "{traces}", "-o", "{run}/timings/rank-00003.jsonl"], "-o", None),
        (["export", "{run}", "--parquet", "{run}/meta"], "--parquet", None),
        (["report", "{run}", "-o", "{link}"], "-o", None),  # a link into the run's data
    ],
)
def test_a_command_does_not_write_over_the_runs_data(
    run: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    flag: str,
    target: str | None,
) -> None:
    link = run.parent / "page.html"
    os.symlink(run / "timings" / "rank-00002.jsonl", link)
    before = _sums(run)
    args: list[str] = []
    for arg in argv:
        if arg == "{traces}":
            args += _traces(run)
        else:
            args.append(arg.format(run=run, link=link))
    code, out, err = run_cli(args, capsys)
    assert code == 2, (out, err)
    assert f"{flag} " in err and "would write over the data of the run" in err
    assert str(run) in err and "Traceback" not in err
    assert _sums(run) == before  # not a byte changed
    if target is not None:
        assert (run / target).exists()


def test_the_page_and_the_merged_trace_are_written_in_the_run_and_again(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for _ in range(2):
        code, _, err = run_cli(
            ["report", str(run), "--json", "-o", str(run / "report.html")], capsys
        )
        assert code == 0, err
        merged = run / "merged.pt.trace.json.gz"
        code, _, err = run_cli(["merge", *_traces(run), "-o", str(merged), "--json"], capsys)
        assert code == 0, err
    assert (run / "report.html").stat().st_size > 0 and merged.stat().st_size > 0
    code, _, err = run_cli(["report", str(run), "--json", "-o", str(run / "mine.html")], capsys)
    assert code == 0, err  # a new page in the run's root: nothing of the job's is there


def test_a_demo_does_not_run_into_a_folder_that_holds_a_run(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _sums(run)
    code, out, err = run_cli(["demo", "--out", str(run)], capsys)
    assert code == 2, (out, err)
    assert f"--out {run} holds a run already" in err
    assert _sums(run) == before
