from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from rankscope.cli import main

pytestmark = pytest.mark.slow


def test_demo_runs_a_two_rank_capture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--out", str(tmp_path / "run"), "--steps", "6"]) == 0
    out = capsys.readouterr().out
    trace = tmp_path / "run" / "traces" / "step-000003-000004" / "rank-00000.pt.trace.json.gz"
    assert trace.is_file()
    with gzip.open(trace, "rt") as fh:
        info = json.load(fh)["distributedInfo"]
    assert (info["rank"], info["world_size"]) == (0, 2)
    assert "top-level CPU ops" in out  # the window's summary is printed
    assert str(tmp_path / "run") in out
    assert "rank-00000.pt.trace.json.gz" in out
    assert "perfetto" in out.lower()
    assert not (
        tmp_path / "run" / "traces" / "step-000003-000004" / "rank-00001.pt.trace.json.gz"
    ).exists()
    # every rank is timed (so every rank writes its meta), on steps 0, 2, 4 of 6
    assert sorted(p.name for p in (tmp_path / "run" / "meta").iterdir()) == [
        "rank-00000.json",
        "rank-00001.json",
    ]
    for rank in (0, 1):
        lines = (tmp_path / "run" / "timings" / f"rank-{rank:05d}.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        assert sorted({r["step"] for r in records}) == [0, 2, 4]
        assert len(records) == 3 * 5  # 4 phases and the step record, on each sampled step
        assert f"timings/rank-{rank:05d}.jsonl" in out
    assert "median host ms" in out


def test_demo_rejects_too_few_steps(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--steps", "2"]) == 2
    assert "--steps" in capsys.readouterr().err
