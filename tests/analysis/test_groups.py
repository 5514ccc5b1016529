"""A parallel group slow as one finding with its own price (analysis/stragglers/_groups.py)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from rankscope.analysis import (
    StragglerOptions,
    analyse_stragglers,
    build_report,
    phase_matrices,
    read_timings,
)
from rankscope.analysis.render._html import render_html
from rankscope.analysis.stragglers._findings import cost_lines
from rankscope.cli import main
from rankscope.testing._synthetic import Slowdown, Uneven, write_timings


def _stage(rank: int) -> dict[str, int | str]:
    return {"pipeline_stage": rank // 2, "dp": rank % 2}


def _step_ms(run: Path) -> float:
    m = phase_matrices(read_timings(run))
    return float(np.nanmean(np.nanmedian(m.ms[m.index("step")], axis=0)))


def test_a_slow_stage_is_one_finding_priced_as_a_whole(tmp_path: Path) -> None:
    slow = [Slowdown(6, "forward", 1.0), Slowdown(7, "forward", 1.0)]
    write_timings(tmp_path / "slow", ranks=8, steps=40, slowdowns=slow, groups=_stage)
    write_timings(tmp_path / "even", ranks=8, steps=40, groups=_stage)  # same seed, same noise
    report = analyse_stragglers(tmp_path / "slow").report
    (group,) = report.groups
    assert (group.name, group.ranks, group.slow, group.phases) == (
        "pipeline_stage=3",
        (6, 7),
        (6, 7),
        ("forward",),
    )
    assert 1.8 < group.ratio < 2.2
    assert group.cost is not None
    truth = _step_ms(tmp_path / "slow") - _step_ms(tmp_path / "even")
    assert group.cost.step_ms_saved == pytest.approx(truth, rel=0.15)
    # Each rank alone frees little: its stage-mate stays the slowest there.
    each = [f.cost.step_ms_saved for f in report.findings if f.role == "slow" and f.cost]
    assert len(each) == 2 and all(e < 0.2 * group.cost.step_ms_saved for e in each)
    assert report.cost is not None and report.cost.step_ms_saved >= group.cost.step_ms_saved
    said = report.to_dict()
    # The ranks that wait, wait for the group: its sentence names them, its cost is theirs.
    assert said["summary"][0].startswith("pipeline_stage=3 (ranks 6, 7) is slow in forward")
    assert said["summary"][0].endswith("; ranks 0-5 wait for it in backward")
    assert not any("wait" in line for line in said["summary"][1:])
    waiting = [f for f in report.findings if f.role == "waits"]
    # Their rows name the group's fix, priced on its line: not a second price.
    assert waiting and all(f.cost_of == group.name and f.cost is None for f in waiting)
    lines = cost_lines(said)
    assert lines[0].startswith("fixing pipeline_stage=3 in forward saves")
    assert lines[0].endswith(
        "ranks 0-5 in backward lose this time waiting for it: the same cost, not a second cause"
    )
    # Every finding and the one host that holds the group are that same fix: not again;
    # nor the group's ranks one by one (each frees little alone), in words or prices.
    assert [line.split(" saves")[0] for line in lines] == ["fixing pipeline_stage=3 in forward"]
    assert not any(line.startswith(("rank 6 ", "rank 7 ")) for line in said["summary"])
    assert {(f["rank"], f["role"]) for f in said["findings"]} >= {(6, "slow"), (7, "slow")}
    assert said["groups"][0]["cost"]["step_ms_saved"] == group.cost.step_ms_saved
    why = [f.cause.text for f in report.findings if f.cause is not None]
    assert why and all(t.startswith("partitioning: ranks 6, 7 are slow") for t in why)


def test_one_slow_rank_of_a_group_stays_a_rank_finding(tmp_path: Path) -> None:
    write_timings(
        tmp_path, ranks=8, steps=40, slowdowns=[Slowdown(6, "forward", 1.0)], groups=_stage
    )
    report = analyse_stragglers(tmp_path).report
    assert report.groups == []
    assert [(f.rank, f.phase) for f in report.findings if f.role == "slow"] == [(6, "forward")]


def test_without_named_groups_there_is_no_group_finding(tmp_path: Path) -> None:
    slow = [Slowdown(6, "forward", 1.0), Slowdown(7, "forward", 1.0)]
    write_timings(tmp_path, ranks=8, steps=40, slowdowns=slow)
    report = analyse_stragglers(tmp_path).report
    assert report.groups == [] and len([f for f in report.findings if f.role == "slow"]) == 2


def test_the_report_page_shows_a_slow_group_and_uneven_data_with_their_prices(
    tmp_path: Path,
) -> None:
    slow = [Slowdown(6, "forward", 1.0), Slowdown(7, "forward", 1.0)]
    # An 8 ms optimizer's load recorded with it: balancing it saves about 2% of the step,
    # at the default's edge; the page is what is tested here, so the edge is lowered.
    uneven = Uneven(phases=("optimizer",), spread=1.6, tokens=512)
    write_timings(tmp_path, ranks=8, steps=40, slowdowns=slow, groups=_stage, uneven=uneven)
    page = render_html(build_report(tmp_path, StragglerOptions(min_saving=0.01)))
    said = re.findall(r"<li>([^<]*)</li>", page)
    assert any(s.startswith("pipeline_stage=3 (ranks 6, 7) is slow in forward") for s in said)
    assert any(s.startswith("fixing pipeline_stage=3 in forward saves") for s in said), said
    assert any(s.startswith("ranks are unevenly loaded in optimizer") for s in said), said
    assert any(s.startswith("balancing optimizer across ranks saves") for s in said), said
    # The group's ranks are its one finding: their rows one by one are in the JSON.
    assert not any(s.startswith(("why rank 6", "why rank 7")) for s in said)
    assert "2 rows of the slow groups&#x27; ranks, one by one" in page or (
        "2 rows of the slow groups' ranks, one by one" in page
    )


def test_ranks_slow_together_are_a_group_not_uneven_data(tmp_path: Path) -> None:
    # Four slow ranks take the slowest place in turn: no one rank holds it at most steps,
    # but they are the slow findings' ranks, not data that loads ranks unevenly.
    slow = [Slowdown(r, "forward", 1.5) for r in range(12, 16)]
    write_timings(tmp_path, ranks=16, steps=40, slowdowns=slow, groups=lambda r: {"tp": r // 4})
    report = analyse_stragglers(tmp_path).report
    assert [g.name for g in report.groups] == ["tp=3"]
    assert report.imbalance == []
    assert not any("unevenly" in line for line in report.summary)


def test_the_terminal_lists_a_slow_groups_ranks_one_by_one_only_with_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slow = [Slowdown(6, "forward", 1.0), Slowdown(7, "forward", 1.0)]
    write_timings(tmp_path, ranks=8, steps=40, slowdowns=slow, groups=_stage)
    rows = re.compile(r"^\s+[67]\s+forward\s+slow\b", re.MULTILINE)
    assert main(["stragglers", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "pipeline_stage=3 (ranks 6, 7) is slow in forward as a group" in out
    assert not rows.search(out) and "why rank 6" not in out
    assert "2 rows of the slow groups' ranks, one by one (--all, or --json)" in out
    assert main(["stragglers", str(tmp_path), "--all"]) == 0
    assert len(rows.findall(capsys.readouterr().out)) == 2


def test_a_slow_group_alone_prints_no_empty_findings_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Every finding is the slow stage's ranks (their waiters named in its sentence): the
    # table of findings would be a header over no row.
    from rankscope.testing._pipeline import Pipeline, SlowStage, write_pipeline

    shape = Pipeline(schedule="1f1b", calls="megatron", chunks=2)
    write_pipeline(tmp_path, shape=shape, slow=[SlowStage(1, 1.0)])
    assert main(["stragglers", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "pipeline_stage=1 (ranks 2, 3) is slow in backward and forward as a group" in out
    assert "4 rows of the slow groups' ranks, one by one" in out
    assert "time lost" not in out  # the table's header
    assert main(["stragglers", str(tmp_path), "--all"]) == 0
    assert "time lost" in capsys.readouterr().out
