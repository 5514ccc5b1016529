"""A small DDP job on CPU processes over gloo: every rank timed, rank 0 traced for two steps."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._config import ProfileConfig, Schedule, TimerConfig, TraceConfig
from .._torch import import_torch

__all__ = ["DemoResult", "run_capture_demo"]


@dataclass
class DemoResult:
    """What the demo wrote."""

    run_dir: Path
    world_size: int
    steps: int
    traces: list[Path] = field(default_factory=list)
    summaries: list[Path] = field(default_factory=list)
    meta: list[Path] = field(default_factory=list)
    timings: list[Path] = field(default_factory=list)


def demo_config(run_dir: Path) -> ProfileConfig:
    """Every rank timed on every other step; rank 0 traced for steps 3-4, after two idle
    steps and one warm-up step."""
    return ProfileConfig(
        output_dir=run_dir,
        trace=TraceConfig(
            enable=True, ranks="0", schedule=Schedule(wait=2, warmup=1, active=2, repeat=1)
        ),
        timer=TimerConfig(enable=True, ranks="all", every_n_steps=2),
    )


def run_capture_demo(run_dir: Path, world_size: int = 2, steps: int = 8) -> DemoResult:
    """Spawn `world_size` CPU processes, train a small MLP with DDP, profile rank 0."""
    torch = import_torch("demo")
    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as rendezvous:
        init = f"file://{rendezvous}/init"
        torch.multiprocessing.spawn(
            _train, args=(world_size, init, str(run_dir), steps), nprocs=world_size, join=True
        )
    return DemoResult(
        run_dir=run_dir,
        world_size=world_size,
        steps=steps,
        traces=sorted(run_dir.glob("traces/*/rank-*.pt.trace.json*")),
        summaries=sorted(run_dir.glob("traces/*/rank-*.summary.json")),
        meta=sorted(run_dir.glob("meta/rank-*.json")),
        timings=sorted(run_dir.glob("timings/rank-*.jsonl")),
    )


def _train(rank: int, world_size: int, init: str, run_dir: str, steps: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from .._profiler import Profiler

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(
            nn.Sequential(
                nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8)
            )
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        generator = torch.Generator().manual_seed(rank)
        with Profiler(demo_config(Path(run_dir))) as prof:
            for _ in range(steps):
                with prof.phase("host_to_device", kind="data"):
                    x = torch.randn(32, 64, generator=generator)
                    y = torch.randint(0, 8, (32,), generator=generator)
                with prof.phase("forward"):
                    loss = nn.functional.cross_entropy(model(x), y)
                with prof.phase("backward"):
                    loss.backward()
                with prof.phase("optimizer"):
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                prof.step()
    finally:
        dist.destroy_process_group()


def load_summary(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


def phase_medians(path: Path) -> dict[str, tuple[int, float]]:
    """Per phase in one rank's timings file: (records, median host ms)."""
    times: dict[str, list[float]] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            record = json.loads(line)
            times.setdefault(record["phase"], []).append(record["cpu_ms"])
    return {name: (len(v), sorted(v)[len(v) // 2]) for name, v in times.items()}
