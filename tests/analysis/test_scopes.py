"""Collectives ranks leave in groups (analysis/stragglers/_scopes.py), and groups whose ranks share a
host (analysis/stragglers/_imbalance.py): who waits for whom, and what is the data's."""

from __future__ import annotations

import json
import random
from pathlib import Path

from rankscope.analysis import analyse_stragglers
from rankscope.rundir._layout import timing_path
from rankscope.testing._pipeline import Pipeline, SlowStage, write_pipeline
from rankscope.testing._synthetic import write_timings

_EPOCH = 1_790_000_000_000_000_000


def _write(
    root: Path,
    ranks: int,
    steps: int,
    phases: list[tuple[str, str, float, bool]],
    *,
    lag: dict[int, float],
    slow: dict[int, tuple[str, float]] | None = None,
    host_jitter: float = 0.0,
    per_host: int = 1,
) -> None:
    """A data-parallel job's records, by hand: (name, kind, ms, ends in a collective) per
    phase; `lag` (rank -> ms): a rank leaves every collective that much after the others;
    `slow` (rank -> (phase, factor)); `host_jitter`: each host's ranks are slower together
    by this much (lognormal sigma), a different host each step."""
    rng = random.Random(1)
    slow = slow or {}
    lines: dict[int, list[str]] = {r: [] for r in range(ranks)}
    now = _EPOCH

    def record(r: int, step: int, phase: str, kind: str, *, start: float, ms: float) -> None:
        line = {"v": 1, "rank": r, "step": step, "phase": phase, "kind": kind}
        line |= {"start_ns": int(start), "cpu_ms": round(ms, 6), "gpu_ms": None}
        lines[r].append(json.dumps(line | {"depth": 0, "error": False}))

    for step in range(steps):
        host = [rng.lognormvariate(0, host_jitter) for _ in range(ranks // per_host)]
        t = [float(now)] * ranks
        for name, kind, ms, sync in phases:
            own = [
                ms * host[r // per_host] * rng.lognormvariate(0, 0.03) * 1e6 for r in range(ranks)
            ]
            for r, (phase, factor) in slow.items():
                if phase == name:
                    own[r] *= factor
            if sync:
                end = max(t[r] + own[r] for r in range(ranks))
                for r in range(ranks):
                    left = end + lag.get(r, 0.0) * 1e6
                    record(r, step, name, kind, start=t[r], ms=(left - t[r]) / 1e6)
                    t[r] = left
            else:
                for r in range(ranks):
                    record(r, step, name, kind, start=t[r], ms=own[r] / 1e6)
                    t[r] += own[r]
        for r in range(ranks):
            record(r, step, "step", "step", start=now, ms=(t[r] - now) / 1e6)
        now = int(max(t)) + 50_000
    for r in range(ranks):
        timing_path(root, r).write_text("\n".join(lines[r]) + "\n", encoding="utf-8")


def test_a_rank_that_leaves_every_collective_late_is_not_a_collective_of_its_own(
    tmp_path: Path,
) -> None:
    # Rank 3 is slow in forward and its host wakes it 6 ms late after the all-reduce at
    # every step: taken as a group of one, the ranks waiting for it were not said.
    write_timings(tmp_path, ranks=8, steps=2)  # the meta files
    phases = [
        ("forward", "compute", 30.0, False),
        ("allreduce", "comm", 2.0, True),
        ("optimizer", "compute", 8.0, False),
    ]
    _write(tmp_path, 8, 40, phases, lag={3: 6.0}, slow={3: ("forward", 1.3)})
    report = analyse_stragglers(tmp_path).report
    waits = {f.rank for f in report.findings if f.role == "waits" and f.waits_for == (3,)}
    assert waits == {0, 1, 2, 4, 5, 6, 7}


def test_a_slow_rank_of_a_pipeline_is_not_waited_for_by_other_stages(tmp_path: Path) -> None:
    # Rank 6 (stage 3, replica 0) is slow. Each stage's replicas all-reduce apart from
    # the other stages; counting the wait in the threshold that splits them, every
    # stage's replica 1 was said to wait for rank 0 in dp_allreduce.
    write_pipeline(tmp_path, shape=Pipeline(dp=2), slow=[SlowStage(3, 0.5, replica=0)])
    report = analyse_stragglers(tmp_path).report
    assert {(f.rank, f.phase) for f in report.findings if f.role == "slow"} == {
        (6, "forward"),
        (6, "backward"),
    }
    said = {(f.rank, f.phase, f.waits_for) for f in report.findings if f.role == "waits"}
    # The other stages of its own replica (ranks 0, 2, 4) wait for it in their recvs (the
    # pipeline's roles say who waits for whom: analysis/stragglers/_pipeline_waits.py). Rank 1 may
    # wait for rank 0 (stage 0's replica 0, held back by rank 6); no rank of replica 1
    # waits for rank 6.
    own_replica = {(r, "pp_recv", (6,)) for r in (0, 2, 4)}
    assert own_replica <= said
    assert said - own_replica <= {(1, "dp_allreduce", (0,))}


def test_a_slow_rank_of_the_first_stage_is_waited_for_in_a_recv_by_its_own_replica_alone(
    tmp_path: Path,
) -> None:
    # A recv runs once per microbatch: its last exit in a step says nothing of whom it
    # met. Grouped by it, rank 6 was said to wait in pp_recv for rank 7. Its replica's
    # later stages (ranks 2, 4, 6) wait for rank 0 in their recvs; replica 1's do not.
    write_pipeline(tmp_path, shape=Pipeline(dp=2), slow=[SlowStage(0, 0.5, replica=0)])
    report = analyse_stragglers(tmp_path).report
    in_recv = {(f.rank, f.waits_for) for f in report.findings if f.phase == "pp_recv"}
    assert in_recv == {(2, (0,)), (4, (0,)), (6, (0,))}


def test_a_nodes_jitter_is_not_uneven_data(tmp_path: Path) -> None:
    # 16 ranks on 4 hosts whose ranks name their node: each node's ranks are slower
    # together at a step, a different node each time. Its ranks share a machine, not
    # data: this was said to be uneven data ("they share its data").
    write_timings(tmp_path, ranks=16, steps=2, ranks_per_host=4, groups=lambda r: {"node": r // 4})
    phases = [
        ("forward", "compute", 30.0, False),
        ("backward", "compute", 55.0, True),
        ("optimizer", "compute", 8.0, False),
        ("loss_allreduce", "comm", 1.0, True),
    ]
    _write(tmp_path, 16, 40, phases, lag={}, host_jitter=0.2, per_host=4)
    report = analyse_stragglers(tmp_path).report
    assert report.imbalance == []
