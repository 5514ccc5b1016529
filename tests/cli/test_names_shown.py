"""Names from a run's files are shown, never acted on: a phase name holding escape sequences
(clear the screen, set the window title, move the cursor, an 8-bit CSI) or a newline
reaches no terminal and no log raw, from any command."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from rankscope.testing._synthetic import Slowdown, write_timings

from .._helpers import run_cli
from ..analysis.test_hang_analysis import hang_file as a_hang
from ..analysis.test_hang_analysis import heartbeat, phase, write_hang, write_heartbeat

EVIL = "fwd\x1b[2J\x1b]0;pwned\x07\x1b[1A\x9b2K\nFORGED: rank 3 is slow in everything\r"
ACTING = ("\x1b", "\x07", "\x9b", "\r")


@pytest.fixture
def run(tmp_path: Path) -> Path:
    root = tmp_path / "run"
    write_timings(root, ranks=4, steps=40, slowdowns=[Slowdown(2, "forward", 1.0)])
    for path in (root / "timings").glob("*.jsonl"):
        text = path.read_text().replace('"phase":"forward"', f'"phase":{json.dumps(EVIL)}')
        path.write_text(text)
    for meta in (root / "meta").glob("*.json"):
        data = json.loads(meta.read_text())
        data["host"] = "node\x1b]0;pwned\x07\nFORGED"
        meta.write_text(json.dumps(data))
    for rank in range(4):
        opened = [phase(EVIL, "compute\x1b[2J", 30.0)]
        write_heartbeat(
            root, heartbeat(rank, open_phases=opened, moved_ago=400 if rank == 1 else 0.5)
        )
    write_hang(root, a_hang(1, detected_ago=100, open_phases=[phase(EVIL, "compute", 400.0)]))
    return root


def _safe(text: str) -> None:
    assert not any(char in text for char in ACTING), repr(text[:400])
    assert not any(line.lstrip().startswith("FORGED") for line in text.splitlines())


@pytest.mark.parametrize(
    "argv",
    [
        ["stragglers", "{run}"],
        ["report", "{run}", "--no-html"],
        ["sql", "{run}", "select distinct phase, kind from timings"],
        ["top", "{run}", "--once"],
        ["hang", "{run}"],
        ["hosts", "{run}"],
    ],
)
def test_a_name_s_control_characters_are_written_out_by_every_command(
    run: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, out, err = run_cli([a.format(run=run) for a in argv], capsys)
    assert code in (0, 1), err
    _safe(out)
    _safe(err)
    if argv[0] in ("stragglers", "report", "sql"):
        assert "fwd\\x1b[2J" in out  # shown, escaped: still readable


def test_csv_through_a_pipe_keeps_the_name_as_data(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --csv is data for a program: the name exactly, its newline quoted as CSV quotes one
    # (a terminal is given the name written out instead).
    import csv
    import io

    code, out, err = run_cli(
        ["sql", str(run), "select distinct phase from timings", "--csv"], capsys
    )
    assert code == 0, err
    assert EVIL in [row[0] for row in csv.reader(io.StringIO(out))]


def test_the_names_in_a_finding_s_sentence_are_one_line(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["stragglers", str(run), "--json"], capsys)
    assert code == 0, err
    summary = json.loads(out)["summary"]
    assert summary and summary[0].startswith("rank 2 is slow in fwd\\x1b[2J")
    assert all("\n" not in line for line in summary)


def test_the_job_s_log_writes_a_name_s_control_characters_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from rankscope.capture import _ondemand

    with caplog.at_level(logging.INFO, logger="rankscope"):
        _ondemand.logger.warning("rankscope: trigger %s declined on rank %d: %s", EVIL, 0, "x")
    (record,) = caplog.records
    _safe(record.getMessage())
    assert "fwd\\x1b[2J" in record.getMessage()
