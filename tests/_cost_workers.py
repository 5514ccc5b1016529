"""The job behind tests/analysis/test_cost.py, run in spawned ranks (importable by module path)."""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import rankscope

WARMUP = 3
"""Steps before the loop's clock starts (process start-up, first collectives)."""
STEPS = 25
"""Steps the clock measures."""


def train_with_a_slow_rank(rank: int, world: int, run_dir: str, slow: tuple[int, float]) -> None:
    """Data, forward, backward, an all-reduce of the gradients (comm), the optimizer; rank
    `slow[0]` sleeps `slow[1]` ms more in forward, for STEPS steps. Rank 0 writes the mean step time its own
    clock measured to RUN_DIR/measured_ms."""
    _train(rank, world, Path(run_dir), STEPS, slow[1] if rank == slow[0] else 0.0)


def _train(rank: int, world: int, run_dir: Path, steps: int, slow_ms: float) -> None:
    torch.manual_seed(rank)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    config = rankscope.ProfileConfig(
        output_dir=run_dir, timer=rankscope.TimerConfig(enable=True, every_n_steps=1)
    )
    with rankscope.Profiler(config) as prof:
        for step in range(WARMUP + steps):
            if step == WARMUP:
                dist.barrier()
                began = time.perf_counter()
            with prof.phase("data", kind="data"):
                batch = torch.randn(16, 32)
                time.sleep(0.005)
            with prof.phase("forward"):
                loss = model(batch).pow(2).mean()
                time.sleep(0.010 + slow_ms / 1000)
            with prof.phase("backward"):
                opt.zero_grad()
                loss.backward()
                time.sleep(0.010)
            with prof.phase("allreduce", kind="comm"):
                for param in model.parameters():
                    if param.grad is not None:
                        dist.all_reduce(param.grad)
                        param.grad /= world
            with prof.phase("optimizer"):
                opt.step()
            prof.step()
        dist.barrier()
        mean_ms = (time.perf_counter() - began) * 1000 / steps
    if rank == 0:
        (run_dir / "measured_ms").write_text(f"{mean_ms}\n")


def train_with_uneven_data(rank: int, world: int, run_dir: str, heavy: int) -> None:
    """Every rank runs at one speed per token; rank `heavy` gets 4x the tokens at three
    steps in four (sequence-length imbalance), and records its tokens with forward."""
    config = rankscope.ProfileConfig(
        output_dir=run_dir, timer=rankscope.TimerConfig(enable=True, every_n_steps=1)
    )
    grad = torch.zeros(64)
    with rankscope.Profiler(config, groups={"data_parallel": rank}) as prof:
        for step in range(WARMUP + STEPS):
            tokens = 4096 if rank == heavy and step % 4 != 0 else 1024
            with prof.phase("forward", tokens=tokens):
                time.sleep(0.004 * tokens / 1024)
            with prof.phase("allreduce", kind="comm"):
                dist.all_reduce(grad)
            prof.step()


def train_ddp_with_slow_data(
    rank: int, world: int, run_dir: str, slow: tuple[int, float, int, int]
) -> None:
    """A plain DDP loop (the gradient all-reduce inside backward, no comm phase) of
    `slow[3]` steps: rank `slow[0]` sleeps `slow[1]` ms more in its data phase from step
    `slow[2]` on."""
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    config = rankscope.ProfileConfig(
        output_dir=run_dir, timer=rankscope.TimerConfig(enable=True, every_n_steps=1)
    )
    slow_rank, slow_ms, from_step, steps = slow
    with rankscope.Profiler(config) as prof:
        for step in range(steps):
            with prof.phase("data", kind="data"):
                batch = torch.randn(32, 64)
                time.sleep(
                    0.003 + (slow_ms / 1000 if rank == slow_rank and step >= from_step else 0)
                )
            with prof.phase("forward"):
                loss = model(batch).pow(2).mean()
                time.sleep(0.005)
            with prof.phase("backward"):
                opt.zero_grad()
                loss.backward()
                time.sleep(0.005)
            with prof.phase("optimizer"):
                opt.step()
            prof.step()
