"""Each phase on the clock of its work, on a real multi-process run on one GPU (several
gloo ranks share it): skipped cleanly without CUDA."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import rankscope
from rankscope.cli._main import main
from rankscope.testing._gloo import GlooRanks

pytestmark = pytest.mark.gpu

WORLD, STEPS, EVERY, FROM, SLOW_RANK = 4, 30, 2, 10, 2


def _job(rank: int, world_size: int, run_dir: str) -> None:
    """DDP on cuda:0; from step FROM rank 2 does extra GPU work in forward whose launches
    take little host time (a GPU that is simply slower, as the host sees it)."""
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024)).to(device)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    big = torch.randn(4096, 4096, device=device)
    config = rankscope.ProfileConfig(
        output_dir=run_dir, timer=rankscope.TimerConfig(enable=True, every_n_steps=EVERY)
    )
    with rankscope.Profiler(config) as prof:
        for step in range(STEPS):
            with prof.phase("data", kind="data"):
                x = torch.randn(64, 1024).to(device)
            with prof.phase("forward"):
                loss = model(x).square().mean()
                if rank == SLOW_RANK and step >= FROM:
                    for _ in range(8):
                        big = (big @ big).tanh_()
            with prof.phase("backward"):
                loss.backward()
            with prof.phase("optimizer"):
                opt.step()
                opt.zero_grad()
            loss.item()  # the loop's one wait for the GPU, as a logged loss is
            prof.step()


def test_a_rank_slow_on_the_gpu_is_found_on_device_time(
    tmp_path: Path, gloo_ranks: GlooRanks, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("duckdb")  # `stragglers` reads timings with the analysis extra's DuckDB
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU (CUDA is not available)")
    gloo_ranks.run(_job, WORLD, tmp_path)
    assert main(["stragglers", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["clocks"]["forward"] == "device", data["clocks"]
    slow = [f for f in data["findings"] if f["role"] == "slow"]
    assert [(f["rank"], f["phase"]) for f in slow] == [(SLOW_RANK, "forward")], data["summary"]
    assert slow[0]["since_step"] == FROM, data["summary"]
    assert main(["stragglers", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "clocks: device time" in out or "(device time;" in out, out
