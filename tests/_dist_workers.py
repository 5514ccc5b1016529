"""Functions run in spawned ranks (they must be importable by module path)."""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import rankscope


def train_ddp(rank: int, world_size: int, run_dir: str, steps: int) -> None:
    """DDP on gloo with three profilers in turn: step target, phase target, timer."""
    _train(rank, run_dir, steps)
    dist.barrier()


def _train(rank: int, run_dir: str, steps: int) -> None:
    model = nn.parallel.DistributedDataParallel(nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step_cfg = rankscope.ProfileConfig(
        output_dir=Path(run_dir) / "steps",
        trace=rankscope.TraceConfig(
            enable=True,
            ranks="0,2",
            schedule=rankscope.Schedule(wait=1, warmup=1, active=2, repeat=2),
        ),
    )
    with rankscope.Profiler(step_cfg) as prof:  # rank from torch.distributed
        assert prof.rank == rank
        for _ in range(steps):
            with prof.phase("forward"):
                loss = model(torch.randn(8, 16)).sum()
            with prof.phase("backward"):
                loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    phase_cfg = rankscope.ProfileConfig(
        output_dir=Path(run_dir) / "phases",
        trace=rankscope.TraceConfig(
            enable=True,
            ranks="all",
            target="phase:train_actor",
            schedule=rankscope.Schedule(wait=1, warmup=0, active=1, repeat=2),
        ),
    )
    x = torch.randn(32)
    with rankscope.Profiler(phase_cfg) as prof:
        for _ in range(4):
            torch.cumsum(x, 0)  # outside the phase
            with prof.phase("train_actor"):
                torch.cummax(x, 0)
                dist.all_reduce(x)
            prof.step()
    timer_cfg = rankscope.ProfileConfig(
        output_dir=Path(run_dir) / "timer",
        timer=rankscope.TimerConfig(enable=True, ranks="0,2", every_n_steps=3),
    )
    with rankscope.Profiler(timer_cfg) as prof:
        for _ in range(steps):
            with prof.phase("forward"):
                loss = model(torch.randn(8, 16)).sum()
            with prof.phase("backward"):
                loss.backward()  # DDP all-reduces the gradients in here
            with prof.phase("allreduce", kind="comm"):
                dist.all_reduce(x)
            with prof.phase("optimizer"):
                opt.step()
                opt.zero_grad()
            prof.step()


def train_attempt(rank: int, world_size: int, run_dir: str, steps: int) -> None:
    """One start of a DDP job on gloo with the timer on every step, under the environment
    the launcher would set (TORCHELASTIC_RESTART_COUNT...). Phases sleep a fixed time, so a
    figure that sums two attempts doubles and one that does not stays put."""
    model = nn.parallel.DistributedDataParallel(nn.Linear(16, 4))
    config = rankscope.ProfileConfig(
        output_dir=run_dir, timer=rankscope.TimerConfig(enable=True, every_n_steps=1)
    )
    with rankscope.Profiler(config) as prof:
        for _ in range(steps):
            with prof.phase("forward"):
                time.sleep(0.004)
                loss = model(torch.randn(8, 16)).sum()
            with prof.phase("backward"):
                time.sleep(0.008)
                loss.backward()
            prof.step()
    dist.barrier()
    del model


def hang_one_rank(rank: int, world_size: int, run_dir: str, stuck: int) -> None:
    """Every rank loads data, then all-reduces; rank `stuck` blocks for good in its data
    phase at step 3, so the others wait for it inside the all-reduce (the test kills them)."""
    import threading

    config = rankscope.ProfileConfig(
        output_dir=run_dir,
        timer=rankscope.TimerConfig(enable=True, every_n_steps=1),
        hang=rankscope.HangConfig(after_s=2.0, heartbeat_s=0.5),
    )
    x = torch.ones(4)
    with rankscope.Profiler(config) as prof:
        for step in range(10_000):
            with prof.phase("data_loading", kind="data"):
                if rank == stuck and step == 3:
                    threading.Event().wait()  # a dead data-loader worker: forever
                time.sleep(0.01)
            with prof.phase("all_reduce", kind="comm"):
                dist.all_reduce(x)
            prof.step()


def flight_recorder_hang(rank: int, world_size: int, run_dir: str, fault: str) -> None:
    """Four ranks all-reduce in a comm phase each step, in the world group and, for
    ranks 0 and 1, a sub-group (`new_group`); at step 3 a fault (the test kills them):

    - "skip": rank 3 skips the step's all-reduce, then blocks for good in its data phase;
    - "mismatch": rank 1 calls all_gather where the others call all_reduce;
    - "subgroup": rank 1 blocks for good in its data phase before the sub-group's
      all-reduce, which rank 0 enters; ranks 2 and 3 wait in a phase of their own, the
      world group's collectives all done.
    """
    import threading

    config = rankscope.ProfileConfig(
        output_dir=run_dir,
        timer=rankscope.TimerConfig(enable=True, every_n_steps=1),
        hang=rankscope.HangConfig(after_s=2.0, heartbeat_s=0.5),
    )
    pair = dist.new_group([0, 1], group_desc="pair")
    x = torch.ones(4)
    forever = threading.Event()
    with rankscope.Profiler(config) as prof:
        for step in range(10_000):
            faulty = step == 3
            with prof.phase("data", kind="data"):
                if faulty and fault == "skip" and rank == 3:
                    forever.wait()
                if faulty and fault == "subgroup" and rank == 1:
                    forever.wait()
                time.sleep(0.01)
            with prof.phase("sync", kind="comm"):
                if faulty and fault == "mismatch" and rank == 1:
                    dist.all_gather([torch.zeros(4) for _ in range(world_size)], x)
                elif not (faulty and fault == "subgroup"):
                    dist.all_reduce(x)
            if rank in (0, 1):
                with prof.phase("pair_sync", kind="comm"):
                    dist.all_reduce(x, group=pair)
            elif faulty and fault == "subgroup":
                with prof.phase("eval", kind="compute"):
                    forever.wait()  # waits on the pair, outside any collective
            prof.step()
