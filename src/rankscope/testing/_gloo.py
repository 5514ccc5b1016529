"""Gloo ranks for the distributed tests and the field benchmark, forked from a forkserver: one launcher.

A job is a module-level function `job(rank, world_size, run_dir, *args)`: the ranks
unpickle it by module name. The launcher starts one process per rank; in each, it sets
one thread for torch, joins the gloo group through a rendezvous file of its own (two
launches at once, as pytest-xdist runs them, cannot meet), runs the job, then collects
garbage before it destroys the group: a DDP model left to the interpreter's exit makes
gloo abort the process (tests/core/test_exit.py says why). A job that starts the group
itself (a framework that reads torchrun's variables) gets `init=False` and finds RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and a free MASTER_PORT in its environment instead.

A rank that raises leaves its traceback for the launcher, which fails with every rank's
exit code and traceback; a launch that outlives its timeout is killed and fails too.
"""

from __future__ import annotations

import gc
import multiprocessing.connection
import os
import socket
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

TIMEOUT_S = 300.0
"""How long a launch may run: several times the slowest job here on a busy 2-core machine."""
GRACE_S = 10.0
"""How long the other ranks have to end once one failed."""


def free_port() -> int:
    """A TCP port nothing listens on now (the caller's rank 0 binds it soon after)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RanksFailed(AssertionError):
    """A rank exited non-zero or the launch timed out; the message holds every rank's story."""


@dataclass(frozen=True)
class _Launch:
    job: Callable[..., None]
    world: int
    run_dir: str
    args: tuple[Any, ...]
    env: dict[str, str]
    init: bool
    rendezvous: str
    errors: str
    timeout_s: float
    cwd: str


def _rank_main(rank: int, launch: _Launch) -> None:
    import torch
    import torch.distributed as dist

    # A forkserver's child inherits the server's environment and folder, not the
    # launcher's: it is given the launcher's whole environment, as a spawned rank has it.
    os.environ.clear()
    os.environ.update(launch.env, OMP_NUM_THREADS="1")
    os.chdir(launch.cwd)
    if not launch.init:
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    try:
        if launch.init:
            dist.init_process_group(
                "gloo",
                init_method=f"file://{launch.rendezvous}",
                rank=rank,
                world_size=launch.world,
                timeout=timedelta(seconds=launch.timeout_s),
            )
        launch.job(rank, launch.world, launch.run_dir, *launch.args)
    except BaseException:
        # No teardown here: the other ranks may wait in a collective this rank left.
        Path(launch.errors, f"traceback-{rank}.txt").write_text(traceback.format_exc())
        raise
    # A job may end the group itself (tests/core/test_exit.py checks how ranks exit).
    if launch.init and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


_PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.nn",
    "torch.nn.parallel",
    "torch._dynamo",
    "torch.profiler",
    "rankscope._profiler",
    "rankscope.capture",
]
"""Imported once by the forkserver, which forks each rank: a spawned rank imported torch
again (1.5-2 s of CPU a rank, most of the distributed tests' time on 2 cores), and the
first DistributedDataParallel of each rank imported torch._dynamo (1.3 s of CPU more:
sympy and the compiler's trace rules, which DDP checks its module against), and the
job side of rankscope (0.3 s a rank, its first Profiler.start()): what a rank then does
is its own test's work."""


def _preload() -> None:
    from multiprocessing import forkserver

    forkserver.set_forkserver_preload(_PRELOAD)


class RankProcesses:
    """The processes of one launch, started; `join()` waits, `kill()` ends them."""

    def __init__(self, processes: list[Any], launch: _Launch) -> None:
        self._processes = processes
        self._launch = launch
        self._timed_out: list[int] = []

    def join(self) -> list[int | None]:
        """Every rank's exit code. Once a rank fails, the others have GRACE_S to end (they
        may wait for it in a collective); a rank still running then, or at the timeout,
        is killed (-9)."""
        deadline = time.monotonic() + self._launch.timeout_s
        failed = False
        while alive := [p for p in self._processes if p.is_alive()]:
            if not failed and any(p.exitcode for p in self._processes):
                failed, deadline = True, min(deadline, time.monotonic() + GRACE_S)
            if time.monotonic() >= deadline:
                break
            multiprocessing.connection.wait([p.sentinel for p in alive], 0.5)
        self._timed_out = [r for r, p in enumerate(self._processes) if p.is_alive()]
        self.kill()
        return [p.exitcode for p in self._processes]

    def kill(self) -> None:
        for process in self._processes:
            if process.is_alive():
                process.kill()
            process.join()

    def check(self, codes: list[int | None]) -> None:
        """Fail with every rank's exit code and traceback unless all exited 0."""
        if all(code == 0 for code in codes):
            return
        launch = self._launch
        lines = [f"{launch.job.__name__} on {launch.world} gloo ranks ({launch.timeout_s:.0f} s):"]
        for rank, code in enumerate(codes):
            said = "killed, still running" if rank in self._timed_out else f"exit code {code}"
            error = Path(self._launch.errors, f"traceback-{rank}.txt")
            told = error.read_text() if error.exists() else ""
            lines.append(f"rank {rank}: {said}\n{told}".rstrip())
        raise RanksFailed("\n".join(lines))


class GlooRanks:
    """Launches jobs on spawned gloo ranks; each launch gets its own rendezvous."""

    def __init__(self, scratch: Path) -> None:
        self._scratch = scratch

    def start(
        self,
        job: Callable[..., None],
        world: int,
        run_dir: Path | str,
        *args: Any,
        env: dict[str, str] | None = None,
        init: bool = True,
        timeout_s: float = TIMEOUT_S,
    ) -> RankProcesses:
        """Start `job(rank, world, str(run_dir), *args)` on `world` ranks; returns at once."""
        import torch.multiprocessing as mp

        here = self._scratch / uuid.uuid4().hex[:12]
        (here / "errors").mkdir(parents=True)
        env = {**os.environ, **(env or {})}
        if not init:  # what torchrun would set; RANK and LOCAL_RANK are set in each rank
            env.update(
                WORLD_SIZE=str(world),
                LOCAL_WORLD_SIZE=str(world),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(free_port()),
            )
        launch = _Launch(
            job=job,
            world=world,
            run_dir=str(run_dir),
            args=args,
            env=env,
            init=init,
            rendezvous=str(here / "rendezvous"),
            errors=str(here / "errors"),
            timeout_s=timeout_s,
            cwd=os.getcwd(),
        )
        _preload()
        context = mp.start_processes(
            _rank_main,
            args=(launch,),
            nprocs=world,
            join=False,
            start_method="forkserver",
        )
        return RankProcesses(list(context.processes), launch)

    def run(
        self, job: Callable[..., None], world: int, run_dir: Path | str, *args: Any, **how: Any
    ) -> None:
        """Run `job` on `world` ranks to the end (`how`: start's env, init and timeout_s);
        fails unless every rank exits 0."""
        ranks = self.start(job, world, run_dir, *args, **how)
        ranks.check(ranks.join())
