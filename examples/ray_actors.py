"""Profile trainers that run as Ray actors with rankscope: two CPU workers, one gloo group, seconds.

    python examples/ray_actors.py runs/ray
    rankscope report runs/ray

The shape of an RL post-training loop (verl, OpenRLHF, NeMo-RL): a driver process
tells each worker actor to roll out and then to update the policy; each worker holds
one rank of a torch.distributed group and all-reduces its gradients. The workers mix
in `RankscopeWorker`; the driver wraps its loop in `profile_actors`. Every rank times
its phases (rollout, update_actor, and grad_allreduce inside it) on every step into
RUN_DIR/timings/, and rank 0 captures a trace of its third update_actor into
RUN_DIR/traces/phase-update_actor-000002/. The policy is a small MLP on made-up
observations, so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import logging
import socket
from pathlib import Path

import ray
import torch
import torch.distributed as dist
from torch import nn

import rankscope
from rankscope.integrations.ray import RankscopeWorker, profile_actors

logger = logging.getLogger("ray_actors")

OBS, ACTIONS, BATCH = 16, 4, 64


@ray.remote(num_cpus=1)
class PolicyWorker(RankscopeWorker):
    """One rank of the policy: rolls out a batch, then takes a policy-gradient step."""

    def __init__(self, rank: int, world_size: int) -> None:
        torch.set_num_threads(1)
        torch.manual_seed(0)  # the same initial weights on every rank
        self.rank, self.world_size = rank, world_size
        self.policy = nn.Sequential(nn.Linear(OBS, 64), nn.Tanh(), nn.Linear(64, ACTIONS))
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=1e-2)
        self.data = torch.Generator().manual_seed(rank)
        self.batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def rendezvous(self) -> str:
        """Rank 0's address for the process group: this node's IP and a free port."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    def init_group(self, init_method: str) -> None:
        dist.init_process_group(
            "gloo", init_method=init_method, rank=self.rank, world_size=self.world_size
        )

    def rollout(self) -> None:
        with self.profile_phase("rollout"), torch.no_grad():
            obs = torch.randn(BATCH, OBS, generator=self.data)
            actions = torch.distributions.Categorical(logits=self.policy(obs)).sample()
            rewards = (actions == obs[:, :ACTIONS].argmax(dim=1)).float()  # the "right" action
            self.batch = (obs, actions, rewards)

    def update_actor(self) -> float:
        assert self.batch is not None, "rollout() first"
        obs, actions, rewards = self.batch
        with self.profile_phase("update_actor"):
            log_probs = torch.distributions.Categorical(logits=self.policy(obs)).log_prob(actions)
            loss = -((rewards - rewards.mean()) * log_probs).mean()
            loss.backward()
            with self.profile_phase("grad_allreduce", kind="comm"):
                for p in self.policy.parameters():
                    if p.grad is not None:
                        dist.all_reduce(p.grad)
                        p.grad /= self.world_size
            self.optimizer.step()
            self.optimizer.zero_grad()
        return float(rewards.mean())

    def close(self) -> None:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("run_dir", type=Path, help="where rankscope writes its run directory")
    parser.add_argument("--steps", type=int, default=8, help="training iterations (default 8)")
    parser.add_argument(
        "--address", help="a running Ray cluster to use (default: start a local one, 2 CPUs)"
    )
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    # The rankscope part: which ranks record what.
    config = rankscope.ProfileConfig(
        output_dir=opts.run_dir,
        timer=rankscope.TimerConfig(enable=True, every_n_steps=1),  # every rank, every step
        trace=rankscope.TraceConfig(
            enable=True,
            ranks="0",
            target="phase:update_actor",  # trace the update, not the rollout around it
            schedule=rankscope.Schedule(wait=1, warmup=1, active=1),
        ),
    )

    if opts.address:
        ray.init(address=opts.address)
    else:
        ray.init(num_cpus=2, include_dashboard=False)
    try:
        world_size = 2
        workers = [PolicyWorker.remote(rank, world_size) for rank in range(world_size)]
        init_method = ray.get(workers[0].rendezvous.remote())
        ray.get([w.init_group.remote(init_method) for w in workers])

        with profile_actors(workers, config) as profiling:  # worker i is rank i
            for step in range(opts.steps):
                ray.get([w.rollout.remote() for w in workers])
                rewards = ray.get([w.update_actor.remote() for w in workers])
                profiling.step()
                logger.info("step %d: mean reward %.3f", step, sum(rewards) / len(rewards))

        for summary in profiling.summaries:
            logger.info(
                "rank %s: %s; timings %s; trace windows %s",
                summary["rank"],
                summary["state"],
                summary["timings_file"],
                ", ".join(summary["trace_windows"]) or "none",
            )
        ray.get([w.close.remote() for w in workers])
    finally:
        ray.shutdown()

    run_dir = config.output_dir
    logger.info("next: rankscope report %s", run_dir)
    logger.info("      rankscope kernels %s/traces", run_dir)


if __name__ == "__main__":
    main()
