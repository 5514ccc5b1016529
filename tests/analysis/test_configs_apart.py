"""Ranks configured apart (a RANKSCOPE_ variable set on one rank alone): the job warns at
start, and the analysis says which setting differs and compares the steps both sampled."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import rankscope
from rankscope.cli._main import main
from rankscope.testing._gloo import GlooRanks

WORLD, STEPS, SLOW_RANK = 4, 40, 2


def _job(rank: int, world_size: int, run_dir: str) -> None:
    handler = logging.FileHandler(Path(run_dir) / f"log-{rank}.txt")
    logging.getLogger("rankscope").addHandler(handler)
    if rank == 1:
        os.environ["RANKSCOPE_TIMER_EVERY"] = "5"  # set on this rank alone
    config = {"output_dir": run_dir, "timer": {"enable": True, "every_n_steps": 1}}
    if rank != 0:
        dist.barrier()  # rank 0 has written its meta: the check at start can read it
    with rankscope.Profiler(config) as prof:
        if rank == 0:
            dist.barrier()
        x = torch.ones(8)
        for _ in range(STEPS):
            with prof.phase("forward"):
                time.sleep(0.006 if rank == SLOW_RANK else 0.002)
            with prof.phase("sync", kind="comm"):
                dist.all_reduce(x)
            prof.step()
    handler.close()


@pytest.mark.slow
def test_one_rank_sampling_apart_is_warned_and_said(
    tmp_path: Path, gloo_ranks: GlooRanks, capsys: pytest.CaptureFixture[str]
) -> None:
    gloo_ranks.run(_job, WORLD, tmp_path)
    warned = (tmp_path / "log-1.txt").read_text()
    assert (
        "rank 1's config differs from rank 0's: timer.every_n_steps is 5 here, 1 on rank 0"
        in warned
    )
    assert "differs" not in (tmp_path / "log-2.txt").read_text()
    assert main(["stragglers", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (
        "the ranks' configs differ: timer.every_n_steps is 5 on rank 1, 1 on ranks 0, 2, 3"
        in data["notes"]
    )
    assert data["steps"] == list(range(0, STEPS, 5))
    assert [(f["rank"], f["phase"]) for f in data["findings"] if f["role"] == "slow"] == [
        (SLOW_RANK, "forward")
    ]
    assert main(["stragglers", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "note: the ranks' configs differ: timer.every_n_steps is 5 on rank 1" in out


def _unselected_job(rank: int, world_size: int, run_dir: str) -> None:
    handler = logging.FileHandler(Path(run_dir) / f"log-{rank}.txt")
    logging.getLogger("rankscope").addHandler(handler)
    if rank == 1:
        os.environ["RANKSCOPE_TIMER_RANKS"] = "0"  # this rank leaves itself out, alone
    config = {"output_dir": run_dir, "timer": {"enable": True}}
    if rank != 0:
        dist.barrier()
    with rankscope.Profiler(config) as prof:
        if rank == 0:
            dist.barrier()
        for _ in range(3):
            prof.step()
    handler.close()


@pytest.mark.slow
def test_a_rank_that_leaves_itself_out_alone_warns_and_is_said(
    tmp_path: Path, gloo_ranks: GlooRanks, capsys: pytest.CaptureFixture[str]
) -> None:
    gloo_ranks.run(_unselected_job, 3, tmp_path)
    warned = (tmp_path / "log-1.txt").read_text()
    assert "rank 1's config differs from rank 0's: timer.ranks is \"0\" here" in warned, warned
    # An unselected rank writes nothing (tests/core/test_profiler.py): the analysis can
    # only say that it has no timings; its own warning is where the setting is named.
    assert main(["stragglers", str(tmp_path), "--json"]) == 0
    assert (
        "rank 1: no timings (of a world of 3)"
        "; no meta file either: nothing of it was written here (another output_dir, its own config leaving it out, or it never started: its log says)"
    ) in json.loads(capsys.readouterr().out)["skipped"]


def _elsewhere_job(rank: int, world_size: int, run_dir: str) -> None:
    handler = logging.FileHandler(Path(run_dir) / f"log-{rank}.txt")
    logging.getLogger("rankscope").addHandler(handler)
    if rank == 1:
        os.environ["RANKSCOPE_OUTPUT_DIR"] = str(Path(run_dir) / "elsewhere")  # this rank alone
    config = {"output_dir": str(Path(run_dir) / "run"), "timer": {"enable": True}}
    with rankscope.Profiler(config) as prof:
        for _ in range(3):
            prof.step()
        dist.barrier()  # rank 0 has written its meta by the time rank 1 stops
    handler.close()


@pytest.mark.slow
def test_a_rank_writing_elsewhere_alone_warns_at_stop(
    tmp_path: Path, gloo_ranks: GlooRanks
) -> None:
    gloo_ranks.run(_elsewhere_job, 2, tmp_path)
    warned = (tmp_path / "log-1.txt").read_text()
    assert f"rank 1: rank 0 of this job wrote nothing into {tmp_path / 'elsewhere'}" in warned
    assert "wrote nothing" not in (tmp_path / "log-0.txt").read_text()
