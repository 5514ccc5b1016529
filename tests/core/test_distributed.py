"""Real multi-process runs: spawned ranks over gloo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankscope import Schedule
from rankscope.capture import windows
from rankscope.testing._gloo import GlooRanks

from .._dist_workers import train_ddp
from .._helpers import (
    event_names,
    final_files,
    profiler_steps,
    read_trace,
    temp_files,
    timing_records,
)

pytestmark = pytest.mark.slow

WORLD = 3
STEPS = 10


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, gloo_ranks: GlooRanks) -> Path:
    root = tmp_path_factory.mktemp("dist")
    gloo_ranks.run(train_ddp, WORLD, root, STEPS)
    return root


def test_only_selected_ranks_write_one_file_per_window(run_dir: Path) -> None:
    expected = windows(Schedule(wait=1, warmup=1, active=2, repeat=2), stop_step=STEPS)
    assert expected == [(2, 3), (6, 7)]
    names = [f"step-{a:06d}-{b:06d}" for a, b in expected]
    steps = run_dir / "steps"
    # Every rank may be asked for a window (a trigger can name any), so each writes its
    # meta file; only the selected ones record the schedule's windows.
    want = [f"meta/rank-{rank:05d}.json" for rank in range(WORLD)]
    for name in names:
        for rank in (0, 2):
            want += [
                f"traces/{name}/rank-{rank:05d}.pt.trace.json.gz",
                f"traces/{name}/rank-{rank:05d}.summary.json",
            ]
    assert final_files(steps) == sorted(want)
    assert temp_files(steps) == []


def test_each_trace_names_its_rank_and_holds_exactly_its_steps(run_dir: Path) -> None:
    for (first, last), rank in [((2, 3), 0), ((2, 3), 2), ((6, 7), 0), ((6, 7), 2)]:
        trace = read_trace(
            run_dir
            / "steps"
            / "traces"
            / f"step-{first:06d}-{last:06d}"
            / f"rank-{rank:05d}.pt.trace.json.gz"
        )
        assert trace["distributedInfo"]["rank"] == rank
        assert trace["distributedInfo"]["world_size"] == WORLD
        assert profiler_steps(trace) == list(range(first, last + 1))
        assert {"forward", "backward"} <= event_names(trace)


def test_meta_comes_from_torch_distributed(run_dir: Path) -> None:
    for rank in (0, 2):
        meta = json.loads((run_dir / "steps" / "meta" / f"rank-{rank:05d}.json").read_text())
        assert (meta["rank"], meta["world_size"]) == (rank, WORLD)


def test_phase_target_windows_on_every_rank_hold_only_the_phase(run_dir: Path) -> None:
    phases = run_dir / "phases" / "traces"
    assert sorted(p.name for p in phases.iterdir()) == [
        "phase-train_actor-000001",
        "phase-train_actor-000003",
    ]
    for window in phases.iterdir():
        for rank in range(WORLD):
            trace = read_trace(window / f"rank-{rank:05d}.pt.trace.json.gz")
            names = event_names(trace)
            assert trace["distributedInfo"]["rank"] == rank
            assert {"train_actor", "aten::cummax"} <= names
            assert "aten::cumsum" not in names


def test_the_timer_writes_one_file_per_selected_rank_with_the_sampled_steps(run_dir: Path) -> None:
    timings = run_dir / "timer" / "timings"
    assert sorted(p.name for p in timings.iterdir()) == ["rank-00000.jsonl", "rank-00002.jsonl"]
    for rank in (0, 2):
        records = timing_records(run_dir / "timer", rank)
        assert {r["rank"] for r in records} == {rank}
        steps: dict[int, list[str]] = {}
        for r in records:
            steps.setdefault(r["step"], []).append(r["phase"])
        assert sorted(steps) == [0, 3, 6, 9]
        for phases in steps.values():
            assert sorted(phases) == ["allreduce", "backward", "forward", "optimizer", "step"]
        kinds = {r["phase"]: r["kind"] for r in records}
        assert kinds["allreduce"] == "comm"
        meta = json.loads((run_dir / "timer" / "meta" / f"rank-{rank:05d}.json").read_text())
        assert meta["rank"] == rank and meta["world_size"] == WORLD
    assert not (run_dir / "timer" / "meta" / "rank-00001.json").exists()
