"""Straggler findings on simulated runs whose answer is known (rankscope.testing._synthetic)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rankscope import ConfigError
from rankscope.analysis import StragglerOptions, read_run_meta, read_timings
from rankscope.analysis.read._matrix import phase_matrices
from rankscope.analysis.stragglers._arrivals import (
    _late_by_own_work,
    ends_in_collective,
    whom_it_waits_for,
)
from rankscope.analysis.stragglers._judge import _medians_without, _slow_at_its_best
from rankscope.analysis.stragglers._rows import row_of as _row
from rankscope.analysis.stragglers._rows import rows_of as _rows
from rankscope.analysis.stragglers._stragglers import find_stragglers, format_ranks, ratio_text
from rankscope.testing._synthetic import DDP_PHASES, PhaseSpec, Slowdown, write_timings


def _analyse(tmp_path: Path, **run: Any) -> Any:
    options = {
        k: run.pop(k) for k in ("threshold", "min_persistence", "min_share", "time") if k in run
    }
    write_timings(tmp_path, **run)
    hosts = read_run_meta(tmp_path).hosts  # as the CLI passes them
    chosen = StragglerOptions(**options)
    return find_stragglers(phase_matrices(read_timings(tmp_path), chosen.time), chosen, hosts=hosts)


def _roles(report: Any) -> dict[tuple[int, str], str]:
    return {(f.rank, f.phase): f.role for f in report.findings}


def test_a_slow_forward_is_named_and_the_ranks_waiting_in_backward_are_told_apart(
    tmp_path: Path,
) -> None:
    report = _analyse(tmp_path, ranks=4, steps=40, slowdowns=[Slowdown(2, "forward", 0.41)])
    assert _roles(report) == {
        (2, "forward"): "slow",
        (0, "backward"): "waits",
        (1, "backward"): "waits",
        (3, "backward"): "waits",
    }
    slow = next(f for f in report.findings if f.role == "slow")
    assert slow.median_ratio == pytest.approx(1.41, abs=0.03)
    assert slow.share_above == 1.0 and slow.since_step == 0 and slow.steps == 40
    assert all(f.waits_for == (2,) for f in report.findings if f.role == "waits")
    assert "backward" in report.sync_phases and "forward" not in report.sync_phases
    assert report.reference == "median"
    (sentence,) = report.summary
    assert re.fullmatch(
        r"rank 2 is slow in forward \(\+(39|4[0-3])% vs median at 100% of sampled steps\); "
        r"ranks 0, 1, 3 wait for it in backward",
        sentence,
    ), sentence


def test_a_straggler_hidden_behind_a_collective_is_blamed_not_its_waiters(tmp_path: Path) -> None:
    # Rank 1's optimizer is slow; every other rank pays for it inside the loss all-reduce,
    # where their time is 10x the median of... themselves: the all-reduce is what looks slow.
    report = _analyse(tmp_path, ranks=4, steps=40, slowdowns=[Slowdown(1, "optimizer", 1.0)])
    roles = _roles(report)
    assert roles[(1, "optimizer")] == "slow"
    assert {r for (r, p), role in roles.items() if role == "slow"} == {1}
    assert {r for (r, p), role in roles.items() if role == "waits" and p == "loss_allreduce"} == {
        0,
        2,
        3,
    }
    assert report.summary[0].startswith("rank 1 is slow in optimizer")
    assert report.summary[0].endswith("ranks 0, 2, 3 wait for it in loss_allreduce")


def test_two_ranks_compare_with_the_faster_and_the_waiter_is_not_called_slow(
    tmp_path: Path,
) -> None:
    report = _analyse(tmp_path, ranks=2, steps=30, slowdowns=[Slowdown(0, "forward", 0.3)])
    assert report.reference == "faster rank"
    # Against the faster rank, rank 1's backward is 15% longer at every step: waiting.
    assert _roles(report) == {(0, "forward"): "slow", (1, "backward"): "waits"}
    assert report.summary == [report.summary[0].split(";")[0] + "; rank 1 waits for it in backward"]
    assert "vs the faster rank" in report.summary[0]


def test_a_slowdown_that_starts_part_way_says_since_when(tmp_path: Path) -> None:
    report = _analyse(
        tmp_path, ranks=8, steps=100, slowdowns=[Slowdown(5, "optimizer", 2.0, from_step=60)]
    )
    slow = [f for f in report.findings if f.role == "slow"]
    assert [(f.rank, f.phase, f.since_step, f.steps) for f in slow] == [(5, "optimizer", 60, 40)]
    assert "since step 60" in report.summary[0]
    waits = [f for f in report.findings if f.role == "waits"]
    assert {f.rank for f in waits} == {0, 1, 2, 3, 4, 6, 7}
    assert all(f.phase == "loss_allreduce" and f.since_step == 60 for f in waits)


def test_skewed_clocks_are_lined_up_through_the_collectives(tmp_path: Path) -> None:
    # 50 ms of skew is larger than the 12 ms a rank waits: raw timestamps would mislead.
    report = _analyse(
        tmp_path,
        ranks=4,
        steps=40,
        slowdowns=[Slowdown(2, "forward", 0.41)],
        clock_skew_ms=50,
        ranks_per_host=1,
    )
    assert _roles(report)[(2, "forward")] == "slow"
    assert {r for (r, _), role in _roles(report).items() if role == "waits"} == {0, 1, 3}


@pytest.mark.parametrize("seed", range(4))
def test_ranks_woken_one_after_another_on_one_host_are_not_taken_for_late_clocks(
    tmp_path: Path, seed: int
) -> None:
    # Four processes on two cores: after each collective the scheduler wakes them up to a
    # time slice apart. On one host that is not clock skew, and not a straggler either:
    # the rank woken last is late at the next collective by the lateness it carried out
    # of the last one, not by its own work, and no rank is taken for late.
    lag = _analyse(tmp_path / "in-order", ranks=4, steps=30, resume_lag_ms=9, seed=seed)
    assert lag.findings == [], lag.summary
    # In a new order each time, it is noise: nothing to report.
    noisy = _analyse(
        tmp_path / "any-order", ranks=4, steps=30, resume_lag_ms=9, resume_in_order=False, seed=seed
    )
    assert noisy.findings == []
    slow = _analyse(
        tmp_path / "slow",
        ranks=4,
        steps=30,
        resume_lag_ms=9,
        resume_in_order=False,
        seed=seed,
        slowdowns=[Slowdown(1, "forward", 0.5)],
    )
    assert [(f.rank, f.phase) for f in slow.findings if f.role == "slow"] == [(1, "forward")]


def test_device_times_find_the_same_straggler(tmp_path: Path) -> None:
    report = _analyse(
        tmp_path,
        ranks=4,
        steps=30,
        gpu=True,
        time="device",
        slowdowns=[Slowdown(3, "forward", 0.5)],
    )
    assert report.time == "device"
    assert _roles(report) == {
        (3, "forward"): "slow",
        (0, "backward"): "waits",
        (1, "backward"): "waits",
        (2, "backward"): "waits",
    }


def test_an_intermittent_straggler_above_the_persistence_is_found(tmp_path: Path) -> None:
    report = _analyse(
        tmp_path, ranks=6, steps=80, slowdowns=[Slowdown(4, "forward", 0.5, share=0.7)]
    )
    (slow,) = [f for f in report.findings if f.role == "slow"]
    assert (slow.rank, slow.phase) == (4, "forward")
    assert 0.55 <= slow.share_above <= 0.85


# Ranks that meet in no timed collective: no rank can be seen waiting for another, so a
# slow row stands on its own evidence alone.
_APART = (PhaseSpec("load", "data", 10.0), PhaseSpec("compute", "compute", 30.0))
_TOGETHER = (*_APART, PhaseSpec("sync", "comm", 1.0, sync=True))


def _shares_above(run_dir: Path, phase: str, from_step: int) -> list[float]:
    """Per rank, the share of steps from `from_step` on where it is 10% above the median."""
    m = phase_matrices(read_timings(run_dir))
    d = m.ms[m.index(phase)][:, from_step:]
    return [float(s) for s in np.mean(d > 1.10 * np.median(d, axis=0), axis=1)]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("from_step", [0, 30])
def test_an_excess_that_comes_and_goes_with_no_one_waiting_is_not_a_straggler(
    tmp_path: Path, seed: int, from_step: int
) -> None:
    # +50% at 60% of the steps (from the start, or over the last half): far more often
    # than chance, but at its fast steps the rank is as fast as the others, and no rank
    # waits for it. That is what a busy machine does to a rank now and then.
    slow = [Slowdown(1, "compute", 0.5, from_step, share=0.6)]
    report = _analyse(tmp_path, ranks=4, steps=60, phases=_APART, slowdowns=slow, seed=seed)
    assert report.findings == [], report.summary
    # It was above far more often than chance, as the other ranks show: the rule kept it out.
    shares = _shares_above(tmp_path, "compute", from_step)
    assert shares[1] > 0.4 and max(shares[:1] + shares[2:]) < 0.1, shares


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("from_step", [0, 30])
def test_a_steady_excess_is_found_though_no_one_waits(
    tmp_path: Path, seed: int, from_step: int
) -> None:
    slow = [Slowdown(1, "compute", 0.5, from_step)]
    report = _analyse(tmp_path, ranks=4, steps=60, phases=_APART, slowdowns=slow, seed=seed)
    assert [(f.rank, f.phase, f.role, f.since_step) for f in report.findings] == [
        (1, "compute", "slow", from_step)
    ]


@pytest.mark.parametrize("seed", range(4))
def test_an_excess_that_comes_and_goes_is_found_where_others_wait_for_it(
    tmp_path: Path, seed: int
) -> None:
    # The same +50% at 60% of the steps, before a collective: the others wait for rank 1
    # there, and that is the second piece of evidence it needs.
    slow = [Slowdown(1, "compute", 0.5, share=0.6)]
    report = _analyse(tmp_path, ranks=4, steps=60, phases=_TOGETHER, slowdowns=slow, seed=seed)
    assert _roles(report) == {(1, "compute"): "slow", **{(r, "sync"): "waits" for r in (0, 2, 3)}}
    assert all(f.waits_for == (1,) for f in report.findings if f.role == "waits")


@pytest.mark.parametrize("seed", range(4))
def test_a_straggler_among_ranks_woken_in_order_is_still_found(tmp_path: Path, seed: int) -> None:
    report = _analyse(
        tmp_path,
        ranks=4,
        steps=30,
        resume_lag_ms=9,
        seed=seed,
        slowdowns=[Slowdown(2, "forward", 0.5)],
    )
    assert [(f.rank, f.phase) for f in report.findings if f.role == "slow"] == [(2, "forward")]
    assert {f.waits_for[0] for f in report.findings if f.role == "waits"} <= {2}


_STEPS = 40


@pytest.mark.parametrize(
    ("times", "expected"),
    [
        # every step 1.5x the others: slower at its fastest too
        (lambda i: 15.0, True),
        # 1.5x at 7 steps in 10, as fast as the others at the rest
        (lambda i: 15.0 if i % 10 < 7 else 10.0, False),
        # steadily 5% slower: under the 10% threshold
        (lambda i: 10.5, False),
        # 1.5x, with a record missing at every other step
        (lambda i: 15.0 if i % 2 else float("nan"), True),
    ],
)
def test_a_rank_is_slow_at_its_best_only_when_its_fast_steps_are_slow(
    times: Any, expected: bool
) -> None:
    rng = np.random.default_rng(0)
    d = 10.0 * rng.lognormal(0.0, 0.02, size=(4, _STEPS))
    d[2] = [times(i) for i in range(_STEPS)]
    assert _slow_at_its_best(d, 2, np.arange(_STEPS), 1.10) is expected


def test_over_a_few_steps_a_rank_as_fast_as_the_others_at_one_is_not_slow_at_its_best() -> None:
    # A clean demo run on a busy 2-core machine (four ranks): the scheduler held rank 0
    # off its core at 5 of the last 6 sampled steps. Its sixth step was as fast as the
    # others'; a tenth percentile drawn between that step and a slow one called it slow.
    rng = np.random.default_rng(1)
    d = 2.8 * rng.lognormal(0.0, 0.02, size=(4, 30))
    d[0, 24:] = [7.0, 6.5, 2.8, 7.7, 6.2, 6.9]
    last = np.arange(24, 30)
    assert not _slow_at_its_best(d, 0, last, 1.10)
    d[0, 26] = 6.0  # slowed at all six: slow at its best
    assert _slow_at_its_best(d, 0, last, 1.10)


@pytest.mark.parametrize(
    ("late", "made", "expected"),
    [
        ([4.0, 5.0, 6.0], [4.0, 5.0, 6.0], True),  # all of it in its own work
        ([4.0, 5.0, 6.0], [0.0, 0.5, -0.2], False),  # carried out of the last collective
        ([4.0, 5.0, 6.0], [3.0, 2.0, 3.0], True),  # more than half its own
        ([np.nan, np.nan], [np.nan, np.nan], True),  # nothing to tell it by
        # A real gloo job's slow rank: its first step 21 ms late for the group's first
        # collective, then 5-6 ms at each step, 3-4 of them made in its own work. On
        # sums (112 of 226 ms) that first step called it carried in.
        ([21.2] + [5.6] * 9, [4.2] + [3.2] * 9, True),
        ([21.2] + [5.6] * 9, [4.2] + [1.2] * 9, False),  # the typical step mostly carried
    ],
)
def test_lateness_counts_as_the_ranks_own_when_it_made_most_of_it(
    late: list[float], made: list[float], expected: bool
) -> None:
    assert _late_by_own_work(np.array(late), np.array(made)) is expected


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize(
    ("ranks", "noise", "spikes"),
    [(2, 0.05, 0.05), (4, 0.08, 0.05), (16, 0.05, 0.02), (64, 0.10, 0.05)],
)
def test_a_clean_noisy_run_flags_nothing(
    tmp_path: Path, seed: int, ranks: int, noise: float, spikes: float
) -> None:
    report = _analyse(tmp_path, ranks=ranks, steps=40, noise=noise, spikes=spikes, seed=seed)
    assert report.findings == [], report.summary
    assert report.summary == []


def test_one_rank_has_nothing_to_compare(tmp_path: Path) -> None:
    report = _analyse(tmp_path, ranks=1, steps=10)
    assert report.findings == [] and report.ranks == [0]


def test_missing_ranks_and_steps_are_left_out_not_zero(tmp_path: Path) -> None:
    write_timings(
        tmp_path,
        ranks=6,
        steps=30,
        slowdowns=[Slowdown(2, "forward", 0.5)],
        only_ranks=[0, 2, 3, 5],
    )
    path = tmp_path / "timings" / "rank-00003.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[: len(lines) // 2]))  # rank 3 stopped half-way
    report = find_stragglers(phase_matrices(read_timings(tmp_path)))
    assert report.ranks == [0, 2, 3, 5]
    assert _roles(report)[(2, "forward")] == "slow"
    (row,) = [r for r in report.table if r.rank == 3 and r.phase == "forward"]
    assert not np.isnan(row.median_ratio)


def test_custom_phases_and_a_threshold_of_ones_own(tmp_path: Path) -> None:
    phases = (
        PhaseSpec("rollout", "compute", 40.0),
        PhaseSpec("gather", "comm", 2.0, sync=True),
        PhaseSpec("train", "compute", 20.0, sync=True),
    )
    slow = [Slowdown(1, "rollout", 0.15)]
    loose = _analyse(tmp_path / "a", ranks=3, steps=40, phases=phases, slowdowns=slow)
    strict = _analyse(
        tmp_path / "b", ranks=3, steps=40, phases=phases, slowdowns=slow, threshold=1.2
    )
    assert _roles(loose)[(1, "rollout")] == "slow"
    assert (1, "rollout") not in _roles(strict)  # +15% is under a 20% threshold


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("threshold", 1.0),
        ("threshold", float("nan")),
        ("min_persistence", 0),
        ("min_persistence", 1.5),
        ("min_share", -0.1),
        ("time", "wall"),
    ],
)
def test_bad_settings_name_the_option(tmp_path: Path, option: str, value: Any) -> None:
    write_timings(tmp_path, ranks=2, steps=5)
    with pytest.raises(ConfigError, match=option):
        find_stragglers(phase_matrices(read_timings(tmp_path)), StragglerOptions(**{option: value}))


def test_the_table_covers_every_rank_and_phase(tmp_path: Path) -> None:
    report = _analyse(tmp_path, ranks=3, steps=10)
    phases = [p.name for p in DDP_PHASES]
    assert report.phases == phases
    assert sorted((r.rank, r.phase) for r in report.table) == sorted(
        (rank, phase) for rank in range(3) for phase in phases
    )
    data = report.to_dict()
    assert data["summary"] == [] and len(data["table"]) == 15


def test_phases_come_in_the_order_a_step_runs_them(tmp_path: Path) -> None:
    write_timings(tmp_path, ranks=2, steps=5)
    m = phase_matrices(read_timings(tmp_path))
    assert m.phases == [p.name for p in DDP_PHASES] + ["step"]
    assert m.kinds == [p.kind for p in DDP_PHASES] + ["step"]


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([3], "rank 3"),
        ([0, 1, 3], "ranks 0, 1, 3"),
        ([0, 1, 2, 3, 5, 6, 7, 8, 10], "ranks 0-3, 5-8, 10"),
        ([5, 4], "ranks 4, 5"),
    ],
)
def test_rank_lists_read_well(ranks: list[int], text: str) -> None:
    assert format_ranks(ranks) == text


@pytest.mark.parametrize(
    ("ratio", "text"),
    [
        (1.41, "+41%"),
        (0.92, "-8%"),
        (1.999, "+100%"),
        (2.0, "2.0x"),
        (3.96, "4.0x"),
        (526.0, "526x"),
        (12345.6, "12,346x"),
        (None, "none"),
        (float("nan"), "none"),
    ],
)
def test_ratios_read_as_people_say_them(ratio: float | None, text: str) -> None:
    assert ratio_text(ratio) == text


def test_a_huge_slowdown_reads_as_a_factor_and_the_slow_rank_comes_first(tmp_path: Path) -> None:
    report = _analyse(tmp_path, ranks=3, steps=30, slowdowns=[Slowdown(1, "host_to_device", 525)])
    assert re.fullmatch(
        r"rank 1 is slow in host_to_device \(5\d\dx vs median at 100% of sampled steps\); "
        r"ranks 0, 2 wait for it in backward",
        report.summary[0],
    ), report.summary
    # the waiting ranks lose more time than the slow one, yet the cause is listed first
    assert (report.findings[0].rank, report.findings[0].role) == (1, "slow")
    assert max(f.lost_ms for f in report.findings) > report.findings[0].lost_ms
    assert report.undecided == []


def test_too_few_samples_are_said_not_dropped(tmp_path: Path) -> None:
    # With 8 sampled steps, rank 1 arriving last at all of them could still be chance for
    # the count test: the waiting is said, with how many steps would tell.
    report = _analyse(tmp_path, ranks=3, steps=8, slowdowns=[Slowdown(1, "host_to_device", 525)])
    assert [(f.rank, f.role) for f in report.findings] == [(1, "slow")]
    assert {(u.rank, u.phase, u.role, u.waits_for) for u in report.undecided} == {
        (0, "backward", "waits", (1,)),
        (2, "backward", "waits", (1,)),
    }
    (sentence,) = report.summary
    match = re.fullmatch(
        r"rank 1 is slow in host_to_device \(5\d\dx vs median at 100% of sampled steps\); "
        r"ranks 0, 2 seem to wait for it in backward, but 8 sampled steps are too few to tell "
        r"that from chance \(needs more samples: about (\d+) at this rate\)",
        sentence,
    )
    assert match, sentence
    needed = int(match.group(1))
    assert 8 < needed <= 32
    assert report.to_dict()["undecided"][0]["needed_steps"] == needed
    # and with that many, it is a finding
    again = _analyse(
        tmp_path / "more", ranks=3, steps=needed + 2, slowdowns=[Slowdown(1, "host_to_device", 525)]
    )
    assert {(f.rank, f.role) for f in again.findings} == {(1, "slow"), (0, "waits"), (2, "waits")}


def test_two_sampled_steps_say_they_are_too_few(tmp_path: Path) -> None:
    report = _analyse(tmp_path, ranks=3, steps=2, slowdowns=[Slowdown(1, "forward", 1.0)])
    assert report.findings == []
    assert report.summary == ["2 sampled steps are too few to find a straggler: it takes 3 or more"]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 10, 33])
def test_the_median_of_the_others_is_each_entrys_own_median(n: int) -> None:
    """One sort for every rank's chance rate gives what a median per rank gives (ties,
    odd and even counts), exactly."""
    rng = np.random.default_rng(n)
    for _ in range(30):
        values = rng.integers(0, 4, n) / rng.integers(1, 5)
        want = [np.median(np.delete(values, i)) if n > 1 else np.nan for i in range(n)]
        assert np.array_equal(_medians_without(values), np.array(want), equal_nan=True)


@pytest.mark.parametrize("seed", range(6))
def test_rows_worked_out_together_equal_rows_worked_out_one_by_one(seed: int) -> None:
    """rows_of does at once, for rows valid at every step, what row_of does for one row."""
    rng = np.random.default_rng(seed)
    ranks, steps = 40, 30
    ratio = rng.lognormal(0.05, 0.1, (ranks, steps))
    ratio[rng.random((ranks, steps)) < 0.3 * (seed % 2)] = np.nan  # some rows with gaps
    ratio[:8, : steps // 2] = 1.0  # rows slow only from the middle on
    ratio[:8, steps // 2 :] = rng.lognormal(0.4, 0.1, (8, steps - steps // 2))
    excess = (ratio - 1) * 10
    rows = np.arange(ranks)
    together = _rows(ratio, excess, rows, threshold=1.1, floor=0.1, min_persistence=0.5)
    for r in rows.tolist():
        alone = _row(ratio[r], excess[r], 1.1, 0.1)
        onset = alone.onset(0.5)
        assert together[r].onset(0.5) == onset
        if onset is not None:
            assert together[r].median_ratio(onset) == alone.median_ratio(onset)
            assert together[r].median_excess(onset) == alone.median_excess(onset)
            assert together[r].share(onset) == alone.share(onset)
            assert together[r].lost(onset) == alone.lost(onset)
    assert {together[r].onset(0.5) for r in range(8)} - {None, 0}  # onsets part-way, too


@pytest.mark.parametrize(
    ("last", "ranks", "ends_in_it"),
    [
        ("a different rank", 4, True),
        ("a different rank", 2, True),
        ("rank 1", 4, False),
        ("rank 1", 2, False),
        ("rank 1 from the middle on", 4, False),
    ],
)
def test_a_phase_that_issued_a_collective_is_work_only_where_one_rank_leaves_it_last(
    last: str, ranks: int, ends_in_it: bool
) -> None:
    # Ranks enter together and leave 3 ms apart in a 4 ms phase that issued a collective.
    # A different rank last each time is a busy machine's late wake-ups after it (a tiny
    # DDP backward on two shared cores): the phase still ends in it. Rank 1 last every
    # time is its own work after the collective (an FSDP forward): the phase is work;
    # so too where that began part-way (a real FSDP job, rank 1 slow from step 80 of
    # 160, was read as ending in a collective: the exits spread at under half the steps).
    from dataclasses import replace

    from .test_cost import _matrices

    # Of two ranks one is last at half the steps in any order: that is no rank's work (a
    # clean 2-rank Lightning job's backward was taken for work at 3 of 10 runs).
    steps = list(range(24))
    late = [(s % ranks if last == "a different rank" else 1) for s in steps]
    if last == "rank 1 from the middle on":
        late = [1 if s >= 13 else -1 for s in steps]  # 11 of 24 steps
    forward = [[4.0 + (3.0 if late[s] == r else 0.0) for s in steps] for r in range(ranks)]
    data = [[2.0] * 24] * ranks
    m = _matrices({"data": ("data", data), "forward": ("compute", forward)}, steps)
    m = replace(m, issued={"data": False, "forward": True})
    assert ("forward" in ends_in_collective(m)) is ends_in_it


@pytest.mark.parametrize("comm", [True, False])
def test_ranks_on_several_hosts_without_a_comm_phase_are_told_their_clocks_are_not_measured(
    tmp_path: Path, comm: bool
) -> None:
    # A plain DDP job across hosts: its all-reduce inside backward, no phase of kind comm
    # to measure the hosts' clock offsets by. A 5 ms offset then made the waiting ranks
    # vanish and the price fall 400x, with no word.
    phases = DDP_PHASES if comm else tuple(p for p in DDP_PHASES if p.kind != "comm")
    report = _analyse(
        tmp_path,
        ranks=4,
        steps=40,
        phases=phases,
        ranks_per_host=2,
        slowdowns=[Slowdown(1, "forward", 0.4)],
    )
    said = [n for n in report.notes if "no phase of kind comm measures how far apart" in n]
    assert len(said) == (0 if comm else 1)
    if said:
        assert said[0].startswith("the ranks ran on 2 hosts")
    one_host = _analyse(tmp_path / "one", ranks=4, steps=40, phases=phases, ranks_per_host=4)
    assert not any("measures how far apart" in n for n in one_host.notes)


def test_a_hosts_clock_stepped_mid_run_is_followed_across_the_step(tmp_path: Path) -> None:
    # NTP steps one host's clock by +2 s at step 20. One offset for the whole run put
    # half the steps 2 s off, and the ranks that wait for the slow one vanished.
    import json

    def run(root: Path, stepped: bool) -> Any:
        write_timings(
            root, ranks=4, steps=40, ranks_per_host=2, slowdowns=[Slowdown(1, "forward", 0.4)]
        )
        if stepped:
            for rank in (2, 3):  # the second host
                path = root / "timings" / f"rank-{rank:05d}.jsonl"
                lines = [json.loads(line) for line in path.read_text().splitlines()]
                for record in lines:
                    if record.get("step", -1) >= 20:
                        record["start_ns"] += 2 * 10**9
                path.write_text("".join(json.dumps(r) + "\n" for r in lines))
        hosts = read_run_meta(root).hosts
        return find_stragglers(phase_matrices(read_timings(root)), hosts=hosts)

    want, got = run(tmp_path / "even", False), run(tmp_path / "stepped", True)
    assert {(f.rank, f.role) for f in want.findings} == {
        (1, "slow"),
        (0, "waits"),
        (2, "waits"),
        (3, "waits"),
    }
    assert {(f.rank, f.role) for f in got.findings} == {(f.rank, f.role) for f in want.findings}
    assert got.cost is not None and want.cost is not None
    assert got.cost.step_ms == pytest.approx(want.cost.step_ms, rel=0.02)


def test_a_wait_that_began_part_way_through_its_row_is_found_from_there() -> None:
    """A waiting row whose own onset came early (a busy machine: its waits before the slow
    rank turned slow looked long too): rank 1 last at 29 of its 50 steps, too few over all
    of them for 900 rows tried, but at 27 of the last 30. Whoever arrives last at random
    over the same 50 steps is no one's wait."""
    rng = np.random.default_rng(7)
    before = np.array([1, 1] + [0, 2] * 9)  # 20 steps, rank 1 last at 2
    after = np.array([1] * 27 + [0, 2, 0])
    last = np.concatenate([before, rng.permutation(after)])
    assert int(np.sum(last == 1)) == 29
    cols = np.arange(50)
    own = np.ones(50)  # late by its own work
    found, short = whom_it_waits_for(2, cols, last, own, own, ranks=3, tests=900)
    assert (found, short) == ((1,), None)
    # The same 29 hits spread over the whole window: not beyond chance at 900 rows.
    spread = rng.permutation(last)
    assert whom_it_waits_for(2, cols, spread, own, own, ranks=3, tests=900)[0] == ()
    # Clean: who arrives last is chance at every step; over 500 windows at 900 rows, none.
    found_on_clean = [
        whom_it_waits_for(2, cols, rng.integers(0, 3, 50), own, own, ranks=3, tests=900)[0]
        for _ in range(500)
    ]
    assert not any(found_on_clean)


# Rank 1's forward against the median of 3 ranks at each of 50 sampled steps, measured on
# a real HF Trainer job (bench/field.py's hf_compute) with the test suite running beside
# it; 20 ms more forward from sampled step 20 on. Before it, the busy machine put rank 1
# above 1.10 at 9 of 20 steps (median 1.06).
_BUSY_THEN_SLOW = [
    0.7115, 1.4778, 1.3382, 1.8139, 1.0728, 1.1004, 1.3774, 1.0423, 1.0, 1.0, 1.1648, 1.2185,
    0.2523, 0.7184, 0.7031, 1.0, 1.1938, 0.8595, 1.3974, 1.0, 2.8754, 3.4695, 2.6128, 3.3893,
    2.0028, 2.7979, 2.7497, 1.6677, 1.6572, 1.7294, 1.4183, 2.8278, 1.0, 1.0, 3.2102, 3.0499,
    4.8873, 2.4666, 7.1508, 2.3568, 1.0, 1.0, 1.0, 2.3581, 1.6944, 2.8244, 1.0, 0.6082,
    4.1041, 1.0,
]  # fmt: skip


def test_a_rank_slow_part_way_on_a_busy_machine_is_slow_from_where_its_excess_rose() -> None:
    """Counting steps above the threshold finds no split in this row (its noise before the
    fault was above at 9 of 20 steps); its excess does, and by its median the rank was
    not slow before the fault."""
    ratio = np.asarray(_BUSY_THEN_SLOW)
    excess = (ratio - 1) * 15.0  # ms: a 15 ms median forward
    row = _row(ratio, excess, 1.1, 0.3)
    assert row.onset(0.5) == 20
    # The same row, every step slow from the start (its noise kept): no later start.
    steady = np.where(np.arange(len(ratio)) < 20, ratio + 1.2, ratio)
    assert _row(steady, (steady - 1) * 15.0, 1.1, 0.3).onset(0.5) == 0
    together = _rows(ratio[None, :], excess[None, :], np.arange(1), threshold=1.1, floor=0.3,
                     min_persistence=0.5)  # fmt: skip
    assert together[0].onset(0.5) == 20


@pytest.mark.parametrize("seed", range(40))
def test_a_rank_slow_from_the_start_with_noise_stays_slow_from_the_start(seed: int) -> None:
    """A row slow at every step (1.5x, with a busy machine's noise) never gets a later
    onset from its noise: its median before any split is above the threshold."""
    rng = np.random.default_rng(seed)
    ratio = rng.lognormal(np.log(1.5), 0.3, 60)
    ratio[rng.random(60) < 0.2] = 1.0  # steps where the slow rank is the median itself
    row = _row(ratio, (ratio - 1) * 10.0, 1.1, 0.1)
    assert row.onset(0.5) in (0, None)


def _exits(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Three ranks' arrival at a phase's collective and their exits from the phase (ns), 50
    sampled steps, shaped as a real HF job measured them: the collective is followed by
    work, in which rank 2 (sharing a core) is last at most steps; from step 20 on, rank 1
    reaches the collective 18-24 ms late (its collator) and the others wait for it."""
    rng = np.random.default_rng(seed)
    reached = rng.uniform(0, 2e6, (3, 50))
    reached[1, 20:] += rng.uniform(18e6, 24e6, 30)
    met = reached.max(axis=0)
    after = rng.uniform(0.5e6, 1.5e6, (3, 50))
    after[2, :20] += rng.uniform(2e6, 5e6, 20)  # rank 2's work after it, before the fault
    return reached, met + after


@pytest.mark.parametrize("seed", range(5))
def test_ranks_that_reached_a_collective_far_apart_and_left_together_waited_there(
    seed: int,
) -> None:
    """The records say a collective was issued; one rank's work after it spreads the exits
    (the rule that overturns the records fires), but at the steps the ranks reached it far
    apart they left together: they waited there, and the phase ends in it."""
    from rankscope.analysis.stragglers._arrivals import _leave_apart, _waited_there

    reached, left = _exits(seed)
    assert _leave_apart(reached, left, np.full((3, 50), 5.0))
    assert _waited_there(reached, left)
    # FSDP's shape: the ranks reach the collective together, and one rank's work after it
    # is 15 ms longer from step 25: no waiting there, the records stay overturned.
    reached = np.random.default_rng(seed).uniform(0, 1e6, (3, 50))
    left = reached.max(axis=0) + 20e6 + np.random.default_rng(seed + 1).uniform(0, 1e6, (3, 50))
    left[1, 25:] += 15e6
    assert _leave_apart(reached, left, np.full((3, 50), 20.0))
    assert not _waited_there(reached, left)


@pytest.mark.parametrize("seed", range(5))
def test_late_wake_ups_scattered_over_a_run_do_not_overturn_the_records(seed: int) -> None:
    """A busy machine's shape: the ranks leave a DDP backward's all-reduce at once, then
    one rank (its core shared) wakes 10-20 ms late at 6 scattered steps of 100. It is last
    there far beyond chance, but not over a stretch: the records stand. The same lateness
    over a stretch of steps (a rank's work after the collective, from step 60) overturns
    them."""
    from rankscope.analysis.stragglers._arrivals import _leave_apart

    rng = np.random.default_rng(seed)
    reached = rng.uniform(0, 3e6, (4, 100))
    left = reached.max(axis=0) + 1e6 + rng.uniform(0, 0.5e6, (4, 100))
    late = rng.choice(100, 6, replace=False)
    left[3, late] += rng.uniform(10e6, 20e6, 6)
    typical = np.full((4, 100), 10.0)
    assert not _leave_apart(reached, left, typical)
    left[3, 60:] += rng.uniform(10e6, 20e6, 40)
    assert _leave_apart(reached, left, typical)


@pytest.mark.parametrize("seed", range(4))
def test_a_stretch_in_one_pass_is_the_check_of_every_run(seed: int) -> None:
    """The one-pass check against its definition: some run of the steps, 5 long or more,
    holds half the known steps or more from its first to its last."""
    from rankscope.analysis.stragglers._arrivals import _OVERTURN, _a_stretch

    rng = np.random.default_rng(seed)
    for _ in range(300):
        n = int(rng.integers(5, 80))
        known = rng.random(n) < rng.uniform(0.5, 1.0)
        at = np.flatnonzero((rng.random(n) < rng.uniform(0.05, 0.7)) & known)
        so_far = np.cumsum(known)
        every_run = any(
            j - i + 1 >= _OVERTURN
            and 2 * (j - i + 1) >= so_far[at[j]] - (so_far[at[i] - 1] if at[i] else 0)
            for i in range(len(at))
            for j in range(i, len(at))
        )
        assert _a_stretch(at, so_far) == every_run
