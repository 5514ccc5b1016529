"""What a phase's record says of the collectives it issued (timing/_collectives.py), on real
gloo ranks: DDP's all-reduce inside backward, a sub-group's collective, none in the rest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import rankscope
from rankscope.analysis import StragglerOptions, analyse_stragglers
from rankscope.testing._gloo import GlooRanks
from rankscope.timing._collectives import CollectiveCount


def _job(rank: int, world: int, run_dir: str) -> None:
    pair = dist.new_group([0, 1])
    model = nn.parallel.DistributedDataParallel(nn.Linear(8, 8))
    config = rankscope.ProfileConfig(
        output_dir=run_dir, timer=rankscope.TimerConfig(enable=True, every_n_steps=1)
    )
    with rankscope.Profiler(config) as prof:
        for _ in range(4):
            with prof.phase("data", kind="data"):
                batch = torch.randn(4, 8)
            with prof.phase("forward"):
                loss = model(batch).sum()
            with prof.phase("backward"):
                loss.backward()  # DDP's all-reduce, issued from C++
            with prof.phase("pair"):
                if rank in (0, 1):
                    dist.all_reduce(torch.ones(1), group=pair)
            prof.step()


def _records(run: Path, rank: int) -> list[dict[str, Any]]:
    path = run / "timings" / f"rank-{rank:05d}.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if "phase" in r]


def test_a_phase_says_how_many_collectives_it_issued(tmp_path: Path, gloo_ranks: GlooRanks) -> None:
    gloo_ranks.run(_job, 3, tmp_path)
    for rank in range(3):
        coll = {(r["phase"], r["step"]): r.get("coll") for r in _records(tmp_path, rank)}
        for step in range(4):
            assert coll["data", step] == 0
            # DDP rebuilds its buckets at its second forward (a broadcast from rank 0); the
            # analysis goes by what most steps say.
            assert coll["forward", step] == 0 or step == 1
            assert coll["backward", step] >= 1
            assert coll["pair", step] == (1 if rank < 2 else 0)
            assert coll["step", step] is None  # the step record says nothing of it
    report = analyse_stragglers(tmp_path, StragglerOptions()).report
    assert "backward" in report.sync_phases
    assert "data" not in report.sync_phases and "forward" not in report.sync_phases


def test_without_a_process_group_nothing_is_counted() -> None:
    assert not dist.is_initialized()
    assert CollectiveCount(torch).now() is None
