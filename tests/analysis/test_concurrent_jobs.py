"""Two jobs started at once with one output_dir: their records never mix, each job warns,
and the analysis says they ran at the same time and names each one's slow rank."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import rankscope
from rankscope.cli._main import main
from rankscope.testing._gloo import GlooRanks

STEPS, WORLD = 60, 2


def _job(rank: int, world_size: int, run_dir: str, name: str, slow_rank: int) -> None:
    dist.init_process_group("gloo")  # torchrun's way: MASTER_ADDR and MASTER_PORT
    handler = logging.FileHandler(Path(run_dir) / f"log-{name}-{rank}.txt")
    logging.getLogger("rankscope").addHandler(handler)
    config = {
        "output_dir": run_dir,
        "timer": {"enable": True, "every_n_steps": 1, "flush_every_n_steps": 5},
    }
    x = torch.ones(4)
    with rankscope.Profiler(config) as prof:
        for _ in range(STEPS):
            with prof.phase("forward"):
                time.sleep(0.012 if rank == slow_rank else 0.004)
            with prof.phase("sync", kind="comm"):
                dist.all_reduce(x)
            prof.step()
    handler.close()
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_jobs_at_once_in_one_directory_are_kept_apart_and_each_named(
    tmp_path: Path, gloo_ranks: GlooRanks, capsys: pytest.CaptureFixture[str]
) -> None:
    a = gloo_ranks.start(_job, WORLD, tmp_path, "a", 0, init=False)
    b = gloo_ranks.start(_job, WORLD, tmp_path, "b", 1, init=False)
    a.check(a.join())
    b.check(b.join())
    logs = {p.name: p.read_text() for p in tmp_path.glob("log-*.txt")}
    for name in ("a", "b"):
        assert any(
            "another process appends to" in text for f, text in logs.items() if f"-{name}-" in f
        ), f"job {name} warned: {logs}"
    assert main(["stragglers", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    attempts = data["attempts"]
    assert attempts["count"] == 2 and attempts["concurrent"] == [1, 2], attempts
    assert attempts["used"] == 2
    # Each job's own records, none of the other's: one record per (rank, step, phase).
    assert len(data["steps"]) == STEPS
    slow = [(f["rank"], f["phase"]) for f in data["findings"] if f["role"] == "slow"]
    other = [n for n in data["notes"] if n.startswith("attempt 1, which ran at the same time")]
    # Which job started first decides which is attempt 1: each names its own slow rank.
    assert len(other) == 1 and slow in ([(0, "forward")], [(1, "forward")]), (slow, other)
    named = 1 - slow[0][0]
    assert f"rank {named} is slow in forward" in other[0], other
    assert "ran at the same time" in attempts["note"]
    assert main(["stragglers", str(tmp_path), "--attempt", "1", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert [(f["rank"], f["phase"]) for f in first["findings"] if f["role"] == "slow"] == [
        (named, "forward")
    ]
