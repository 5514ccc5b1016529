"""Ranks are compared on the sampled steps they share: a rank with far more steps, or one
that samples differently, neither sets the run's figures nor goes unsaid."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rankscope.cli._main import main
from rankscope.testing._synthetic import Slowdown, write_timings

LINES_PER_STEP = 6  # DDP_PHASES' five phases and the step record


def _keep(path: Path, wanted: Any) -> None:
    """Keep the records of the steps `wanted(step)` says yes to."""
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(line for line in lines if wanted(json.loads(line)["step"])))


def _stragglers(root: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["stragglers", str(root), "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def _saves(data: dict[str, Any]) -> float:
    (slow,) = [f for f in data["findings"] if f["role"] == "slow"]
    assert (slow["rank"], slow["phase"]) == (2, "forward")
    saved: float = slow["cost"]["step_ms_saved"]
    return saved


def test_a_rank_with_far_more_steps_does_not_set_the_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slow = [Slowdown(2, "forward", 0.3)]
    long = write_timings(tmp_path / "long", ranks=4, steps=2000, slowdowns=slow)
    for rank in (1, 2, 3):
        _keep(long / "timings" / f"rank-{rank:05d}.jsonl", lambda step: step < 200)
    even = write_timings(tmp_path / "even", ranks=4, steps=200, slowdowns=slow)
    data, truth = _stragglers(long, capsys), _stragglers(even, capsys)
    assert len(data["steps"]) == 200
    assert _saves(data) == pytest.approx(_saves(truth), rel=0.1)
    said = [line for line in data["skipped"] if "not every rank has" in line]
    assert said == [
        "rank 0: 1800 sampled steps that not every rank has (steps 200-1999), left out: ranks "
        "are compared on the 200 steps they all have"
    ]
    assert main(["report", str(long), "--no-html", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert said[0] in report["skipped"] and len(report["steps"]["sampled"]) == 200


def test_a_rank_sampling_every_fifth_step_is_compared_where_all_sampled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slow = [Slowdown(2, "forward", 0.3)]
    mixed = write_timings(tmp_path / "mixed", ranks=4, steps=40, slowdowns=slow)
    _keep(mixed / "timings" / "rank-00001.jsonl", lambda step: step % 5 == 0)
    data = _stragglers(mixed, capsys)
    assert data["steps"] == list(range(0, 40, 5))
    said = [line for line in data["skipped"] if "not every rank has" in line]
    assert len(said) == 1 and said[0].startswith("ranks 0, 2, 3: 32 sampled steps each")
    # The same saving as with every rank sampling those steps alone.
    alike = write_timings(tmp_path / "alike", ranks=4, steps=40, slowdowns=slow)
    for rank in range(4):
        _keep(alike / "timings" / f"rank-{rank:05d}.jsonl", lambda step: step % 5 == 0)
    assert _saves(data) == pytest.approx(_saves(_stragglers(alike, capsys)))
