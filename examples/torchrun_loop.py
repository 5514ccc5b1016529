"""A plain DDP training loop with rankscope, launched by torchrun (CPU, gloo).

    torchrun --nproc-per-node 2 examples/torchrun_loop.py --steps 40 \\
        --rankscope-output-dir runs/loop --rankscope-timer-enable --rankscope-timer-every-n-steps 2 \\
        --rankscope-trace-enable --rankscope-trace-ranks 0 --rankscope-trace-schedule-wait 10
    rankscope report runs/loop

The profiling config comes from the `--rankscope-*` flags, from a YAML file
(`--rankscope-config profile.yaml`), or from RANKSCOPE_* variables, which win
(`RANKSCOPE_TIMER=1 torchrun ...`). Run without torchrun it trains as one process.
"""

from __future__ import annotations

import argparse
import gc
import os

import torch
import torch.distributed as dist
from torch import nn

import rankscope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=256)
    rankscope.add_arguments(parser)  # the --rankscope-* flags
    args = parser.parse_args()
    config = rankscope.ProfileConfig.from_args(args)

    distributed = "RANK" in os.environ  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, ...
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    try:
        train(args, config, distributed)
        if distributed:
            dist.barrier()  # ranks that save a trace in stop() finish before gloo goes away
    finally:
        if distributed:
            gc.collect()  # free the DDP model before its process group, or gloo may abort
            dist.destroy_process_group()
    if rank == 0:
        print(f"done: {args.steps} steps; run directory {config.output_dir}")


def train(args: argparse.Namespace, config: rankscope.ProfileConfig, distributed: bool) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(dist.get_rank() if distributed else 0)
    # Rank and world size are found from torchrun's variables.
    with rankscope.Profiler(config) as prof:
        for _ in range(args.steps):
            with prof.phase("host_to_device", kind="data"):
                x = torch.randn(args.batch, 64, generator=data)
                y = torch.randint(0, 10, (args.batch,), generator=data)
            with prof.phase("forward"):
                loss = nn.functional.cross_entropy(model(x), y)
            with prof.phase("backward"):
                loss.backward()
            with prof.phase("optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            if distributed:
                with prof.phase("loss_allreduce", kind="comm"):
                    dist.all_reduce(loss.detach())
            prof.step()


if __name__ == "__main__":
    main()
