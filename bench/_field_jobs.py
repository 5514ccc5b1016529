"""The real jobs of bench/field.py, run on spawned gloo ranks (imported by module name).

Every job takes `(rank, world, run_dir, case)`: `case` is a `Case` (the steps, the timer's
sampling, and the fault or None). Rank 0 writes the truth its own clock measured to
RUN_DIR/truth.json: each step's wall time, between the loop's step boundaries; every rank
writes what the machine did to it to RUN_DIR/truth-core-RANK.json: a fixed probe's time at
each step's end (the speed of the core it ran on) and its training thread's wait for a CPU
in each step (Linux's schedstat: other processes on its cores). Nothing in
a job knows the analysis: it is the user's loop with rankscope turned on.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import rankscope


@dataclass(frozen=True)
class Fault:
    """Rank `rank` takes `ms` more in `phase` from step `since`."""

    rank: int
    phase: str
    ms: float
    since: int

    def extra_s(self, rank: int, step: int) -> float:
        return self.ms / 1000 if rank == self.rank and step >= self.since else 0.0


@dataclass(frozen=True)
class Case:
    steps: int
    every: int
    fault: Fault | None = None
    balanced: bool = False
    """The fault's extra load spread evenly over the ranks: the twin a balancing fix
    makes (the uneven job's truth is the step it saves against this)."""

    def extra_s(self, rank: int, step: int, phase: str) -> float:
        fault = self.fault
        if fault is None or fault.phase != phase:
            return 0.0
        return fault.extra_s(rank, step)


_PROBE = 400
"""Iterations of the core probe: about 20-40 us of pure-Python work a step."""


def _core_us() -> float:
    """The time of a fixed piece of pure-Python work: how fast this rank's core runs now.
    A clean job on cores of unequal speed is not clean: the probe tells the field suite
    which rank's core was the slower (a VM's vCPUs can differ by 2x)."""
    began = time.perf_counter()
    total = 0
    for i in range(_PROBE):
        total += i * i
    return (time.perf_counter() - began) * 1e6


def _queued_ns() -> int | None:
    """The calling thread's time spent waiting for a CPU so far (Linux's schedstat, in ns):
    ready to run, its cores held by other threads. None where the kernel does not say."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as fh:
            return int(fh.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None


class _Truth:
    """Each step's wall time on this rank, and what the machine did to it: the core
    probe's time at each step's end, and how long the training thread waited for a CPU
    in each step; kept in memory and written once at the end."""

    def __init__(self) -> None:
        self.steps: list[float] = []
        self.core_us: list[float] = []
        self.queued_ms: list[float | None] = []
        self._last = time.perf_counter()
        self._queued = _queued_ns()

    def step(self) -> None:
        now = time.perf_counter()
        self.steps.append((now - self._last) * 1000)
        queued = _queued_ns()
        waited = None if queued is None or self._queued is None else (queued - self._queued) / 1e6
        self.queued_ms.append(waited)
        self._queued = queued
        self.core_us.append(_core_us())
        self._last = time.perf_counter()

    def write(self, rank: int, run_dir: str) -> None:
        machine = {"core_us": self.core_us, "queued_ms": self.queued_ms}
        Path(run_dir, f"truth-core-{rank}.json").write_text(json.dumps(machine))
        if rank == 0:
            Path(run_dir, "truth.json").write_text(json.dumps({"step_ms": self.steps}))


def _config(run_dir: str, every: int) -> rankscope.ProfileConfig:
    return rankscope.ProfileConfig(
        output_dir=run_dir, timer=rankscope.TimerConfig(enable=True, every_n_steps=every)
    )


def _mlp(width: int = 256) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))


# -- plain DDP, and the same loop with an all-reduce phase of its own -------------------


def ddp(rank: int, world: int, run_dir: str, case: Case) -> None:
    """DDP's gradient all-reduce inside backward: the phases a user writes."""
    model = nn.parallel.DistributedDataParallel(_mlp())
    _train(rank, run_dir, case, model, sync=None)


def ddp_comm(rank: int, world: int, run_dir: str, case: Case) -> None:
    """The same loop, its gradients all-reduced in a comm phase of the user's own."""
    model = _mlp()

    def sync() -> None:
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= world

    _train(rank, run_dir, case, model, sync=sync)


def fsdp(rank: int, world: int, run_dir: str, case: Case) -> None:
    """FSDP2 (fully_shard) on CPU: all-gathers in forward and backward, reduce-scatters in backward."""
    from torch.distributed.fsdp import fully_shard

    model = _mlp()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    _train(rank, run_dir, case, model, sync=None)


def _train(rank: int, run_dir: str, case: Case, model: nn.Module, sync: Any) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    truth = _Truth()
    with rankscope.Profiler(_config(run_dir, case.every)) as prof:
        for step in range(case.steps):
            with prof.phase("data", kind="data"):
                batch = torch.randn(64, 256)
                time.sleep(0.002 + case.extra_s(rank, step, "data"))
            with prof.phase("forward"):
                loss = model(batch).pow(2).mean()
                time.sleep(case.extra_s(rank, step, "forward"))
            with prof.phase("backward"):
                opt.zero_grad()
                loss.backward()
            if sync is not None:
                with prof.phase("sync", kind="comm"):
                    sync()
            with prof.phase("optimizer"):
                opt.step()
            prof.step()
            truth.step()
    truth.write(rank, run_dir)


# -- uneven data: one rank's sequences longer at random steps ---------------------------


def uneven(rank: int, world: int, run_dir: str, case: Case) -> None:
    """DDP over sequences: the fault gives one rank, drawn anew at each step (the same draw
    on every rank), 3x the tokens: the slowest rank changes from step to step."""
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Embedding(128, 64), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 128))
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rng = random.Random(1000)  # one draw for every rank: who gets the long batch
    truth = _Truth()
    with rankscope.Profiler(_config(run_dir, case.every)) as prof:
        for step in range(case.steps):
            heavy = rng.randrange(world)
            on = case.fault is not None and step >= case.fault.since
            tokens = 3 * 1024 if on and rank == heavy else 1024
            if on and case.balanced:
                tokens = 1024 + 2 * 1024 // world  # the heavy rank's extra, shared out
            with prof.phase("data", kind="data"):
                ids = torch.randint(0, 128, (tokens // 64, 64))
            with prof.phase("forward", tokens=tokens):
                logits = model(ids)
                time.sleep(0.003 * tokens / 1024)  # the rest of a larger model's work per token
                loss = nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
            with prof.phase("backward"):
                opt.zero_grad()
                loss.backward()
            with prof.phase("optimizer"):
                opt.step()
            prof.step()
            truth.step()
    truth.write(rank, run_dir)


# -- a pipeline: two stages x two replicas, send/recv ------------------------------------

_DP, _MICRO = 2, 4


def pipeline(rank: int, world: int, run_dir: str, case: Case) -> None:
    """Rank `stage * 2 + replica`; the fault slows a stage's forward and backward (its
    `rank` is the stage)."""
    stages = world // _DP
    stage, replica = divmod(rank, _DP)
    stage_groups = [dist.new_group([s * _DP + d for d in range(_DP)]) for s in range(stages)]
    before, after = rank - _DP, rank + _DP
    lin = nn.Linear(128, 128)
    act, grad = torch.zeros(32, 128), torch.zeros(32, 128)
    truth = _Truth()
    groups = {"pipeline_stage": stage, "dp": replica}
    config = _config(run_dir, case.every)
    with rankscope.Profiler(config, rank=rank, world_size=world, groups=groups) as prof:
        for step in range(case.steps):
            slow = case.fault is not None and case.fault.rank == stage and step >= case.fault.since
            extra = case.fault.ms / 1000 if slow and case.fault is not None else 0.0
            for _ in range(_MICRO):
                if stage > 0:
                    with prof.phase("pp_recv", kind="comm"):
                        dist.recv(act, before)
                with prof.phase("forward"):
                    out = lin(act)
                    time.sleep(0.002 + extra)
                if stage < stages - 1:
                    with prof.phase("pp_send", kind="comm"):
                        dist.send(out.detach(), after)
            for _ in range(_MICRO):
                if stage < stages - 1:
                    with prof.phase("pp_recv", kind="comm"):
                        dist.recv(grad, after)
                with prof.phase("backward"):
                    lin(act).backward(grad)
                    time.sleep(0.004 + 2 * extra)
                if stage > 0:
                    with prof.phase("pp_send", kind="comm"):
                        dist.send(grad, before)
            with prof.phase("dp_allreduce", kind="comm"):
                for p in lin.parameters():
                    if p.grad is not None:
                        dist.all_reduce(p.grad, group=stage_groups[stage])
            with prof.phase("optimizer"):
                lin.zero_grad()
            prof.step()
            truth.step()
    truth.write(rank, run_dir)


def interleaved(rank: int, world: int, run_dir: str, case: Case) -> None:
    """Megatron's interleaved 1F1B, two chunks a rank, its calls batched as Megatron's
    p2p module makes them (`batch_isend_irecv`) and timed under their names; rank
    `stage * 2 + replica`, the fault slowing a stage (its `rank`)."""
    from rankscope.testing._pipeline import Pipeline, calls_of, exchange

    stages = world // _DP
    stage, replica = divmod(rank, _DP)
    stage_groups = [dist.new_group([s * _DP + d for d in range(_DP)]) for s in range(stages)]
    shape = Pipeline(
        stages=stages, dp=_DP, microbatches=_MICRO, schedule="1f1b", calls="megatron", chunks=2
    )
    lin = nn.Linear(128, 128)
    truth = _Truth()
    groups = {"pipeline_stage": stage, "dp": replica}
    config = _config(run_dir, case.every)
    with rankscope.Profiler(config, rank=rank, world_size=world, groups=groups) as prof:
        for step in range(case.steps):
            slow = case.fault is not None and case.fault.rank == stage and step >= case.fault.since
            extra = case.fault.ms / 1000 if slow and case.fault is not None else 0.0
            for item in calls_of(shape, stage):
                if len(item) == 2:
                    forward = item[0] == "F"
                    with prof.phase("forward" if forward else "backward"):
                        out = lin(torch.ones(32, 128))
                        if not forward:
                            out.sum().backward()
                        time.sleep((0.002 + extra) * (1 if forward else 2))
                    continue
                with prof.phase(item[0], kind="comm"):
                    exchange(item, stage, stages, _DP, replica, (32, 128))
            with prof.phase("dp_allreduce", kind="comm"):
                for p in lin.parameters():
                    if p.grad is not None:
                        dist.all_reduce(p.grad, group=stage_groups[stage])
            with prof.phase("optimizer"):
                lin.zero_grad()
            prof.step()
            truth.step()
    truth.write(rank, run_dir)


# -- the Hugging Face Trainer: a slow collator, or a slow forward, on one rank ----------


def hf(rank: int, world: int, run_dir: str, case: Case) -> None:
    """A tiny GPT-2 from a config under the Trainer with rankscope's callback; the Trainer
    starts the process group from torchrun's variables. A fault in "collate" sleeps in the
    data collator, one in "forward" in a forward hook, both on the fault's rank."""
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from rankscope.integrations.hf import RankscopeCallback

    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=32)
    )
    ids = torch.randint(0, 128, (case.steps * 4 * world + 64, 32))
    dataset = [{"input_ids": row, "labels": row} for row in ids]
    state = {"step": 0}

    def collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        time.sleep(case.extra_s(rank, state["step"], "collate"))
        return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}

    def slow_forward(*_: Any) -> None:
        time.sleep(case.extra_s(rank, state["step"], "forward"))

    model.transformer.register_forward_hook(slow_forward)
    truth = _Truth()

    class Steps(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            state["step"] += 1
            truth.step()

    args = TrainingArguments(
        output_dir=str(Path(run_dir) / "trainer"),
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        max_steps=case.steps,
        per_device_train_batch_size=4,
        logging_steps=10_000,
        seed=0,
    )
    callback = RankscopeCallback(_config(run_dir, case.every), environ={})
    Trainer(
        model=model,
        args=args,
        train_dataset=dataset,
        data_collator=collate,
        callbacks=[callback, Steps()],
    ).train()
    truth.write(rank, run_dir)


# -- Lightning: a slow training_step on one rank ---------------------------------------


def lightning(rank: int, world: int, run_dir: str, case: Case) -> None:
    """A Lightning module under `strategy="ddp"` started by the launcher's torchrun
    variables, rankscope's callback; the fault sleeps in training_step (its forward)."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    from rankscope.integrations.lightning import RankscopeCallback

    truth = _Truth()

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _mlp(128)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            time.sleep(case.extra_s(rank, self.global_step, "forward"))
            return self.net(batch[0]).pow(2).mean()

        def on_train_batch_end(self, *args: Any) -> None:
            truth.step()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    os.environ.setdefault("TORCHELASTIC_RUN_ID", "field")
    os.environ.setdefault("GROUP_RANK", "0")
    os.environ.setdefault("NODE_RANK", "0")
    data = TensorDataset(torch.randn(case.steps * 32 * world, 128))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=world,
        strategy="ddp",
        max_steps=case.steps,
        callbacks=[RankscopeCallback(_config(run_dir, case.every))],
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Module(), DataLoader(data, batch_size=32))
    truth.write(rank, run_dir)
