"""The top-level records of a pipeline-shaped run in the order each rank ran them
(analysis/core/_ops.py)."""

from __future__ import annotations

import numpy as np

from rankscope.analysis.core._ops import OpsGatherer


def _gathered(rank: list[int], step: list[int], start: list[float]) -> list[tuple[int, int, float]]:
    ops = OpsGatherer()
    n = len(rank)
    ops.add(
        "forward",
        rank=np.asarray(rank, np.int64),
        step=np.asarray(step, np.int64),
        start_ns=np.asarray(start, np.float64),
        end_ns=np.asarray(start, np.float64) + 1,
        ms=np.ones(n),
        device_ms=None,
    )
    done = ops.done()
    assert done is not None
    return list(zip(done.rank.tolist(), done.step.tolist(), done.start_ns.tolist(), strict=True))


def test_records_come_out_by_rank_step_and_start() -> None:
    got = _gathered([1, 0, 1, 0], [0, 1, 1, 0], [50.0, 30.0, 60.0, 10.0])
    assert got == [(0, 0, 10.0), (0, 1, 30.0), (1, 0, 50.0), (1, 1, 60.0)]


def test_a_step_that_starts_before_the_one_before_it_ended_keeps_its_records_together() -> None:
    # Step 1's first record starts before step 0's last (a loader running ahead): by
    # rank and start alone they would interleave.
    got = _gathered([0, 0, 0, 0], [0, 0, 1, 1], [10.0, 40.0, 30.0, 50.0])
    assert got == [(0, 0, 10.0), (0, 0, 40.0), (0, 1, 30.0), (0, 1, 50.0)]
