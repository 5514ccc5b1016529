"""The job behind `rankscope demo`: DDP on CPU processes over gloo, one rank made slow on purpose.

Every rank runs the same loop with the phases a real trainer has: host_to_device
(kind "data"), forward, backward (DDP's gradient all-reduce inside), optimizer, and an
explicit all-reduce of the loss (kind "comm"). On the straggler rank one phase does
its work and then sleeps for `slowdown` times what the work took, so it is that much
slower wherever it runs, as a rank with a slower GPU, a throttled CPU or a noisy
neighbour would be. Sleeping, unlike spinning, takes no CPU from the other ranks on a
small machine.
"""

from __future__ import annotations

import contextlib
import gc
import os
import tempfile
import time
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from .._torch import import_torch
from ..config._config import ProfileConfig, TimerConfig
from ..config._trace import Schedule, TraceConfig

__all__ = ["PHASES", "DemoJob", "quiet_kineto", "run_demo"]

# A large batch for a small model: milliseconds of compute per phase against a gradient
# all-reduce of 400 KB, so that what the demo shows is compute, not how gloo's ring
# happens to finish on each rank.
_BATCH = 1024

PHASES = {
    "host_to_device": "data",
    "forward": "compute",
    "backward": "compute",
    "optimizer": "compute",
    "loss_allreduce": "comm",
}


@dataclass(frozen=True, kw_only=True)
class DemoJob:
    """What the demo trains and which rank it slows down."""

    world_size: int = 4
    """CPU processes, one rank each."""
    steps: int = 60
    """Training steps on every rank."""
    every_n_steps: int = 2
    """The timer samples one step in this many, on every rank."""
    straggler_rank: int | None = 2
    """The rank made slow; None for a clean run."""
    straggler_phase: str = "forward"
    """The phase made slow on that rank (one of PHASES)."""
    slowdown: float = 1.0
    """How much slower: 1 makes the phase take twice as long, 0.5 1.5 times.

    Twice by default: four ranks on two cores are slowed now and then by each other by
    more than half a forward pass (the scheduler's time slice), and a 1.5x rank was then
    found slow at only 77-87% of its steps (once, on a busy CI machine, not at all).
    """
    window_start: int = 20
    """The first step of the 2-step trace window (rank 0 and the straggler rank)."""

    def __post_init__(self) -> None:
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int):
            raise ConfigError("ranks", self.world_size, "an int from 2 to 16")
        if not 2 <= self.world_size <= 16:
            raise ConfigError("ranks", self.world_size, "an int from 2 to 16")
        if self.steps < self.window_start + 3:
            raise ConfigError("steps", self.steps, f"an int >= {self.window_start + 3}")
        if self.every_n_steps < 1:
            raise ConfigError("every", self.every_n_steps, "an int >= 1")
        rank = self.straggler_rank
        if rank is not None and not 0 <= rank < self.world_size:
            raise ConfigError(
                "straggler_rank", rank, f"a rank from 0 to {self.world_size - 1}, or none"
            )
        if self.straggler_phase not in PHASES:
            raise ConfigError("straggler_phase", self.straggler_phase, ", ".join(PHASES))
        if not 0 < self.slowdown <= 10:
            raise ConfigError("slowdown", self.slowdown, "a number in (0, 10]")

    @property
    def traced_ranks(self) -> list[int]:
        return sorted({0} if self.straggler_rank is None else {0, self.straggler_rank})

    @property
    def window(self) -> str:
        """The trace window's directory name under RUN_DIR/traces."""
        return f"step-{self.window_start:06d}-{self.window_start + 1:06d}"

    def config(self, run_dir: Path) -> ProfileConfig:
        return ProfileConfig(
            output_dir=run_dir,
            trace=TraceConfig(
                enable=True,
                ranks=self.traced_ranks,
                schedule=Schedule(wait=self.window_start - 1, warmup=1, active=2, repeat=1),
            ),
            timer=TimerConfig(enable=True, ranks="all", every_n_steps=self.every_n_steps),
        )


_PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "torch._dynamo",
    "rankscope._profiler",
]


def run_demo(
    job: DemoJob, run_dir: Path, progress: Callable[[int, int], None] | None = None
) -> Path:
    """Train on `job.world_size` spawned processes; return the run directory.

    `progress(done, total)` is called from this process as rank 0 finishes steps.
    """
    torch = import_torch("demo")
    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    # Ranks forked from one server that imported torch, DDP's own imports (torch._dynamo)
    # and rankscope once: spawned, each of four ranks imported them itself, 3 s of CPU a
    # rank on a 2-core machine, longer than the training.
    context = torch.multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    done = context.Value("i", 0)
    with tempfile.TemporaryDirectory() as rendezvous:
        init = f"file://{rendezvous}/init"
        processes = torch.multiprocessing.start_processes(
            _train,
            args=(job, init, str(run_dir), done),
            nprocs=job.world_size,
            join=False,
            start_method="forkserver",
        )
        while not processes.join(timeout=0.1):
            if progress is not None:
                progress(done.value, job.steps)
    if progress is not None:
        progress(job.steps, job.steps)
    return run_dir


def quiet_kineto(environ: MutableMapping[str, str]) -> None:
    """Keep Kineto's `USDT: ... profiler_start` / `profiler_stop` lines, which torch 2.13
    writes to stderr from C++ at every window's edges, off the demo's progress bar; a
    level the user set stays.

    torch has no switch for them but KINETO_LOG_LEVEL, read once per process at the first
    profiler start, and the level that hides them (6) hides Kineto's warnings and errors
    too. So only the demo, whose ranks are rankscope's own processes, sets it; a training
    job decides for itself (docs/troubleshooting.md).
    """
    environ.setdefault("KINETO_LOG_LEVEL", "6")


def _train(rank: int, job: DemoJob, init: str, run_dir: str, done: Any) -> None:
    import torch
    import torch.distributed as dist

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    quiet_kineto(os.environ)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=job.world_size)
    try:
        _loop(rank, job, run_dir, done)
        # Rank 0 and the straggler save a trace in stop(); wait for them.
        dist.barrier()
    finally:
        # The DDP model must be gone before its process group: left to the interpreter's
        # exit, gloo's threads abort the process (3 runs in 10 on torch 2.13, CPU).
        gc.collect()
        dist.destroy_process_group()


def _loop(rank: int, job: DemoJob, run_dir: str, done: Any) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from .._profiler import Profiler

    # The model lives in this frame only, so it is freed before gloo goes (see _train).
    torch.manual_seed(0)  # the same initial weights on every rank, as DDP expects
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(
            nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
        )
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    slow = job.straggler_phase if rank == job.straggler_rank else None

    @contextlib.contextmanager
    def phase(name: str) -> Iterator[None]:
        with prof.phase(name, kind=PHASES[name]):
            started = time.perf_counter()
            yield
            if name == slow:
                time.sleep(job.slowdown * (time.perf_counter() - started))

    with Profiler(job.config(Path(run_dir)), rank=rank, world_size=job.world_size) as prof:
        for _ in range(job.steps):
            with phase("host_to_device"):
                x = torch.randn(_BATCH, 128, generator=generator)
                y = torch.randint(0, 10, (_BATCH,), generator=generator)
            with phase("forward"):
                loss = nn.functional.cross_entropy(model(x), y)
            with phase("backward"):
                loss.backward()
            with phase("optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            with phase("loss_allreduce"):
                total = loss.detach().clone()
                dist.all_reduce(total)
            prof.step()
            if rank == 0:
                done.value += 1
