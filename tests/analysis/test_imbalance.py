"""Step-to-step imbalance: the slowest rank changes every step (analysis/stragglers/_imbalance.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rankscope.analysis import analyse_stragglers, phase_matrices, read_timings
from rankscope.analysis.read._run import RunMeta
from rankscope.analysis.read._values import read_phase_values
from rankscope.analysis.stragglers._findings import cost_lines
from rankscope.analysis.stragglers._imbalance import _values_follow, find_imbalance
from rankscope.analysis.stragglers._model import Imbalance
from rankscope.analysis.stragglers._stragglers import find_stragglers
from rankscope.testing._synthetic import Slowdown, Uneven, write_timings


def _imbalance(tmp_path: Path, **run: Any) -> tuple[list[Imbalance], int]:
    write_timings(tmp_path, **run)
    m = phase_matrices(read_timings(tmp_path))
    report = find_stragglers(m)
    found = find_imbalance(
        m,
        set(report.sync_phases),
        threshold=1.10,
        min_persistence=0.5,
        floor=1.0,
        values=lambda phases: read_phase_values(tmp_path, m.ranks, m.steps, phases),
    )
    return found, len(report.findings)


def test_uneven_data_without_a_value_is_found_and_called_likely_the_data(tmp_path: Path) -> None:
    found, findings = _imbalance(tmp_path, ranks=16, steps=60, uneven=Uneven(spread=0.6))
    assert findings == 0  # no rank is slow for long: the straggler rules name none
    (imbalance,) = found
    assert imbalance.phase == "forward" and imbalance.since_step == 0
    assert imbalance.top_share < 0.5 and imbalance.changes > 0.7
    assert imbalance.ranks_slowest >= 10
    assert 1.15 < imbalance.ratio < 1.35  # the top of 16 draws in 1 +- 0.3 over their median
    assert imbalance.cause.kind == "data-driven" and "data-driven" in imbalance.cause.could_be
    assert 'prof.phase("forward", tokens=n)' in imbalance.cause.text
    assert "optimizer" in imbalance.evidence  # the phase whose work does not follow the data
    assert imbalance.summary.startswith("ranks are unevenly loaded in forward from step to step")


@pytest.mark.parametrize(("cpus", "judged"), [(None, True), (64, True), (8, False)])
def test_a_spread_alone_is_no_evidence_where_ranks_took_turns_on_the_cores(
    tmp_path: Path, cpus: int | None, judged: bool
) -> None:
    # Sixteen ranks on one host with 8 CPUs took turns on them: a phase's spread says
    # when each rank got a core. With a value recorded, the data still says it.
    write_timings(tmp_path, ranks=16, steps=60, uneven=Uneven(spread=0.6))
    for path in (tmp_path / "meta").glob("rank-*.json"):
        meta = json.loads(path.read_text())
        meta["host"], meta["cpus"] = "node", cpus
        path.write_text(json.dumps(meta))
    report = analyse_stragglers(tmp_path).report
    assert [u.phase for u in report.imbalance] == (["forward"] if judged else [])


def test_shared_cores_are_read_from_the_meta_files_and_bad_counts_say_nothing(
    tmp_path: Path,
) -> None:
    def shared(*metas: dict[str, Any]) -> bool:
        return RunMeta(tmp_path, dict(enumerate(metas)), len(metas)).shared_cores

    assert shared({"host": "a", "cpus": 1}, {"host": "a", "cpus": 1})
    assert not shared({"host": "a", "cpus": 1}, {"host": "b", "cpus": 1})  # a core each
    assert not shared({"host": "a", "cpus": 2}, {"host": "a", "cpus": 2})
    assert shared({"host": "a", "cpus": 2}, {"host": "a", "cpus": 1})  # the fewer counts
    for bad in (True, 0, -3, "1", 1.0, None, 1 << 40):
        assert not shared({"host": "a", "cpus": bad}, {"host": "a", "cpus": bad}), bad
    assert not shared({"cpus": 1}, {"cpus": 1})  # no host: nothing to share


def test_a_recorded_value_that_follows_the_slowest_rank_confirms_the_data(tmp_path: Path) -> None:
    uneven = Uneven(spread=0.6, tokens=1000)
    (imbalance,), _ = _imbalance(tmp_path, ranks=16, steps=60, uneven=uneven)
    assert imbalance.cause.kind == "data-driven" and imbalance.cause.could_be == ()
    assert "tokens" in imbalance.cause.text and "balance the data" in imbalance.cause.text


def test_the_onset_is_the_step_the_data_turned_uneven(tmp_path: Path) -> None:
    uneven = Uneven(spread=0.6, from_step=20)
    (imbalance,), _ = _imbalance(tmp_path, ranks=16, steps=60, uneven=uneven)
    assert 20 <= imbalance.since_step <= 22


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    ("ranks", "noise", "spikes"), [(4, 0.08, 0.05), (16, 0.05, 0.02), (64, 0.10, 0.05)]
)
def test_noise_that_spreads_every_phase_alike_is_not_imbalance(
    tmp_path: Path, seed: int, ranks: int, noise: float, spikes: float
) -> None:
    found, _ = _imbalance(tmp_path, ranks=ranks, steps=40, noise=noise, spikes=spikes, seed=seed)
    assert found == []


def test_one_slow_rank_is_a_straggler_not_imbalance(tmp_path: Path) -> None:
    found, findings = _imbalance(
        tmp_path, ranks=16, steps=40, slowdowns=[Slowdown(3, "forward", 0.4)], noise=0.05
    )
    assert findings > 0 and found == []


def test_two_ranks_have_no_median_rank_to_judge_by(tmp_path: Path) -> None:
    found, _ = _imbalance(tmp_path, ranks=2, steps=40, uneven=Uneven(spread=0.6))
    assert found == []


def _step_ms(run: Path) -> float:
    m = phase_matrices(read_timings(run))
    return float(np.nanmean(np.nanmedian(m.ms[m.index("step")], axis=0)))


def test_balancing_is_priced_at_what_the_uneven_data_costs_the_step(tmp_path: Path) -> None:
    uneven = Uneven(spread=0.6)
    write_timings(tmp_path / "uneven", ranks=16, steps=60, uneven=uneven)
    write_timings(tmp_path / "even", ranks=16, steps=60)  # the same seed: the same noise
    report = analyse_stragglers(tmp_path / "uneven").report
    (imbalance,) = report.imbalance
    assert imbalance.cost is not None
    truth = _step_ms(tmp_path / "uneven") - _step_ms(tmp_path / "even")
    assert imbalance.cost.step_ms_saved == pytest.approx(truth, rel=0.15)
    assert report.cost is not None and report.cost.step_ms_saved >= imbalance.cost.step_ms_saved
    said = report.to_dict()["summary"]
    assert said[0].startswith("ranks are unevenly loaded in forward")
    assert said[1].startswith("why forward is uneven: likely the data")
    # Balancing is the one fix: "fixing every finding" would say it again.
    (line,) = cost_lines(report.to_dict())
    assert line.startswith("balancing forward across ranks saves")
    assert report.to_dict()["imbalance"][0]["cost"]["step_ms_saved"] == imbalance.cost.step_ms_saved


def test_fixing_everything_saves_no_less_than_balancing_or_the_slow_rank(tmp_path: Path) -> None:
    # A slow rank in optimizer and uneven data in forward, in one run.
    write_timings(
        tmp_path,
        ranks=16,
        steps=60,
        uneven=Uneven(spread=0.6),
        slowdowns=[Slowdown(5, "optimizer", 3.0)],
    )
    report = analyse_stragglers(tmp_path).report
    (imbalance,) = report.imbalance
    slow = [f for f in report.findings if f.role == "slow"]
    assert [(f.rank, f.phase) for f in slow] == [(5, "optimizer")]
    parts = [imbalance.cost, *(f.cost for f in slow)]
    assert report.cost is not None and all(c is not None for c in parts)
    every = report.cost.step_ms_saved
    assert every >= max(c.step_ms_saved for c in parts if c is not None)
    assert every >= 0.9 * sum(c.step_ms_saved for c in parts if c is not None)


def test_a_value_alike_on_every_rank_follows_nothing() -> None:
    # Every batch 1024 tokens: each rank ties for the top quarter, which says nothing of
    # which rank is slowest (every clean run of a real DDP job was called uneven by it).
    slowest = np.array([0, 3, 1, 2, 0, 1])
    assert _values_follow(slowest, {"tokens": np.full((4, 6), 1024.0)}) is None
    # The slowest rank holding 3x the tokens of the others at each step: the data.
    varied = np.full((4, 6), 1024.0)
    varied[slowest, np.arange(6)] = 3072.0
    assert _values_follow(slowest, {"tokens": varied}) == ("tokens", 1.0, 3.0)
