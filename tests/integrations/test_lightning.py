"""The Lightning integration: a real Trainer, on one process and over DDP (gloo, ddp_spawn)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import rankscope
from rankscope import ConfigError, Profiler, Schedule
from rankscope.analysis import read_timings
from rankscope.capture import windows
from rankscope.integrations.lightning import RankscopeCallback

from .._helpers import (
    event_names,
    final_files,
    profiler_steps,
    read_trace,
    temp_files,
    timing_records,
)

ROOT = Path(__file__).resolve().parents[2]
BATCH = 4


class StepFailed(RuntimeError):
    """The user's own exception, raised from training_step."""


class TinyModule(pl.LightningModule):
    """An MLP on random regression data; keeps its losses, and can fail or record its world."""

    def __init__(self, fail_at_step: int | None = None, world_dir: str | None = None) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        )
        self.fail_at_step = fail_at_step
        self.world_dir = world_dir
        self.losses: list[float] = []
        self.raised: StepFailed | None = None

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.fail_at_step is not None and self.global_step == self.fail_at_step:
            self.raised = StepFailed(f"training_step failed at step {self.global_step}")
            raise self.raised
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def on_train_start(self) -> None:
        if self.world_dir is None:
            return
        # What this process saw of torch.distributed, independent of rankscope.
        dist = torch.distributed
        seen = {
            "global_rank": self.trainer.global_rank,
            "world_size": self.trainer.world_size,
            "dist_rank": dist.get_rank() if dist.is_initialized() else None,
            "dist_world_size": dist.get_world_size() if dist.is_initialized() else None,
            "pid": os.getpid(),
        }
        path = Path(self.world_dir) / f"rank-{self.trainer.global_rank}.json"
        path.write_text(json.dumps(seen), encoding="utf-8")

    def teardown(self, stage: str) -> None:
        # Lightning leaves a gloo process group to interpreter exit, where a rank that exits
        # while its peer is still connected can abort inside gloo ("terminate called without
        # an active exception", about one ddp_spawn run in ten here, with or without
        # rankscope). Wait for each other, then close it.
        dist = torch.distributed
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


class ValidatedModule(TinyModule):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))


class ManualModule(TinyModule):
    """Manual optimization that steps every second batch (gradient accumulation by hand)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.manual_backward(loss / 2)
        if batch_idx % 2 == 1:
            opt = self.optimizers()
            opt.step()
            opt.zero_grad()
        return loss


def loader(batches: int, seed: int = 0) -> DataLoader[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(seed)
    n = batches * BATCH
    data = TensorDataset(torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g))
    return DataLoader(data, batch_size=BATCH, shuffle=False)


def trainer(callbacks: list[pl.Callback], **kwargs: Any) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        callbacks=callbacks,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def config(run_dir: Path, every: int = 1, **trace: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "output_dir": str(run_dir),
        "timer": {"enable": True, "every_n_steps": every},
    }
    if trace:
        data["trace"] = {"enable": True, **trace}
    return data


def records(run_dir: Path, rank: int = 0) -> list[dict[str, Any]]:
    return sorted(timing_records(run_dir, rank), key=lambda r: r["start_ns"])


def phases_by_step(recs: list[dict[str, Any]]) -> dict[int, list[str]]:
    """Phase names per step in the order they began, the "step" record left out."""
    out: dict[int, list[str]] = {}
    for rec in recs:
        if rec["phase"] != "step":
            out.setdefault(rec["step"], []).append(rec["phase"])
    return out


def step_records(recs: list[dict[str, Any]]) -> list[int]:
    return sorted(r["step"] for r in recs if r["phase"] == "step")


# -- DDP on the CPU: two spawned ranks over gloo ------------------------------------------

DDP_STEPS = 6
DDP_SCHEDULE = {"wait": 1, "warmup": 1, "active": 2}


@pytest.mark.slow
@pytest.mark.parametrize("accumulate", [1, 2])
def test_ddp_both_ranks_time_the_documented_phases_and_rank_0_traces(
    tmp_path: Path, accumulate: int
) -> None:
    run_dir, world_dir = tmp_path / "run", tmp_path / "world"
    world_dir.mkdir()
    callback = RankscopeCallback(config(run_dir, every=2, ranks="0", schedule=DDP_SCHEDULE))
    fit = trainer(
        [callback],
        devices=2,
        strategy="ddp_spawn",
        max_steps=DDP_STEPS,
        accumulate_grad_batches=accumulate,
    )
    # Each rank gets half of the batches (DistributedSampler): exactly enough for the steps.
    fit.fit(TinyModule(world_dir=str(world_dir)), loader(2 * DDP_STEPS * accumulate))

    # Both ranks really ran, in one process group of two, each in its own process.
    seen = [json.loads((world_dir / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [(s["global_rank"], s["dist_rank"]) for s in seen] == [(0, 0), (1, 1)]
    assert {s["world_size"] for s in seen} == {s["dist_world_size"] for s in seen} == {2}
    assert len({s["pid"] for s in seen} | {os.getpid()}) == 3
    assert callback.profiler is None  # the workers held the profilers, not this process

    for rank in (0, 1):
        meta = json.loads((run_dir / "meta" / f"rank-{rank:05d}.json").read_text())
        assert (meta["rank"], meta["world_size"]) == (rank, 2)
        recs = records(run_dir, rank)
        assert {r["rank"] for r in recs} == {rank}
        # 6 optimizer steps, one sampled in two: steps 0, 2, 4 (step 6 is cut by stop()).
        assert step_records(recs) == [0, 2, 4]
        per_batch = ["forward", "backward"]
        expected = per_batch * accumulate + ["optimizer"]
        assert phases_by_step(recs) == {0: expected, 2: expected, 4: expected}
        assert all(r["depth"] == 0 and r["error"] is False for r in recs)
        assert {r["kind"] for r in recs} == {"compute", "step"}

    # The analysis side reads both ranks.
    assert sorted(read_timings(run_dir).ranks) == [0, 1]

    # One window on rank 0 only, where the config says, with its summary.
    schedule = Schedule(**DDP_SCHEDULE)
    assert windows(schedule, stop_step=DDP_STEPS) == [(2, 3)]
    window = run_dir / "traces" / "step-000002-000003"
    assert sorted(p.name for p in window.iterdir()) == [
        "rank-00000.pt.trace.json.gz",
        "rank-00000.summary.json",
    ]
    assert temp_files(run_dir) == []
    trace = read_trace(window / "rank-00000.pt.trace.json.gz")
    assert profiler_steps(trace) == [2, 3]
    assert {"forward", "backward", "optimizer"} <= event_names(trace)
    summary = json.loads((window / "rank-00000.summary.json").read_text())
    assert (summary["rank"], summary["window"]) == (0, "step-000002-000003")


# -- one process -------------------------------------------------------------------------


def _fit_losses(callbacks: list[pl.Callback]) -> tuple[list[float], dict[str, torch.Tensor]]:
    pl.seed_everything(1234, verbose=False)
    module = TinyModule()
    trainer(callbacks, max_steps=5, accumulate_grad_batches=2).fit(module, loader(10))
    return module.losses, module.state_dict()


def test_training_is_identical_with_and_without_the_callback(tmp_path: Path) -> None:
    plain_losses, plain_weights = _fit_losses([])
    callback = RankscopeCallback(config(tmp_path, schedule={"warmup": 1, "active": 2}))
    losses, weights = _fit_losses([callback])

    assert len(losses) == 10
    assert losses == plain_losses
    assert weights.keys() == plain_weights.keys()
    for name, tensor in weights.items():
        assert torch.equal(tensor, plain_weights[name]), name
    # The callback did profile: every step timed, one window saved.
    assert step_records(records(tmp_path)) == [0, 1, 2, 3, 4]
    assert (tmp_path / "traces" / "step-000001-000002" / "rank-00000.summary.json").is_file()


def test_an_exception_in_training_step_passes_through_and_the_run_is_saved(
    tmp_path: Path,
) -> None:
    fail_at = 3
    schedule = {"warmup": 1, "active": 4}  # window 1-4: open when step 3 fails
    callback = RankscopeCallback(config(tmp_path, schedule=schedule))
    module = TinyModule(fail_at_step=fail_at)

    with pytest.raises(StepFailed) as raised:
        trainer([callback], max_steps=8).fit(module, loader(8))

    assert raised.value is module.raised  # unchanged: the very object training_step raised
    # on_exception stopped the profiler and no torch.profiler is left running.
    assert callback.profiler is not None
    assert rankscope.current() is None
    assert not torch._C._autograd._profiler_enabled()
    callback.profiler.stop()  # a second stop is harmless

    # Steps 0-2 complete; step 3 holds the interrupted forward, marked as an error.
    recs = records(tmp_path)
    assert step_records(recs) == [0, 1, 2]
    full = ["forward", "backward", "optimizer"]
    assert phases_by_step(recs) == {0: full, 1: full, 2: full, 3: ["forward"]}
    assert [(r["phase"], r["error"]) for r in recs if r["step"] == fail_at] == [("forward", True)]
    assert all(r["depth"] == 0 for r in recs)

    # The open window was closed and saved, cut short at step 3; nothing half-written.
    assert windows(Schedule(**schedule), stop_step=fail_at) == [(1, 3)]
    window = tmp_path / "traces" / "step-000001-000003"
    assert (window / "rank-00000.summary.json").is_file()
    assert profiler_steps(read_trace(window / "rank-00000.pt.trace.json.gz"))[:2] == [1, 2]
    assert temp_files(tmp_path) == []


def test_manual_optimization_steps_once_per_optimizer_step_and_leaves_nothing_open(
    tmp_path: Path,
) -> None:
    callback = RankscopeCallback(config(tmp_path))
    trainer([callback], max_epochs=1).fit(ManualModule(), loader(8))

    recs = records(tmp_path)
    # 8 batches, the optimizer stepped on every second: 4 steps.
    assert step_records(recs) == [0, 1, 2, 3]
    # manual_backward and opt.step() run inside training_step: forward ends at the
    # backward, optimizer runs to the end of the batch.
    one = ["forward", "backward", "forward", "backward", "optimizer"]
    assert phases_by_step(recs) == dict.fromkeys(range(4), one)
    assert all(r["depth"] == 0 and r["error"] is False for r in recs)


def test_validation_inside_fit_is_a_phase_and_the_sanity_check_is_not(tmp_path: Path) -> None:
    callback = RankscopeCallback(config(tmp_path))
    fit = trainer([callback], max_epochs=2, num_sanity_val_steps=2)
    fit.fit(ValidatedModule(), train_dataloaders=loader(3), val_dataloaders=loader(2, seed=1))

    recs = records(tmp_path)
    assert step_records(recs) == list(range(6))
    validation = [(r["step"], r["kind"]) for r in recs if r["phase"] == "validation"]
    # After each epoch's 3 steps; the last one falls after the final step() (step 6).
    assert validation == [(3, "eval"), (6, "eval")]
    assert all(r["depth"] == 0 for r in recs)


def test_a_fault_inside_rankscope_turns_it_off_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    plain_losses, _ = _fit_losses([])

    def broken_step(self: Profiler) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(Profiler, "step", broken_step)
    callback = RankscopeCallback(config(tmp_path))
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        losses, _ = _fit_losses([callback])

    assert losses == plain_losses
    warnings = [r.getMessage() for r in caplog.records if "integration off" in r.getMessage()]
    assert len(warnings) == 1
    assert "on_train_batch_end failed: OSError: disk on fire" in warnings[0]
    assert rankscope.current() is None  # stopped, not left running
    # What was recorded before the fault was flushed: step 0's phases.
    assert phases_by_step(records(tmp_path)) == {
        0: ["forward", "backward", "forward", "backward", "optimizer"]
    }


def test_rank_and_world_size_come_from_the_trainer_or_the_overrides(tmp_path: Path) -> None:
    single = RankscopeCallback(config(tmp_path / "a"))
    trainer([single], max_steps=1).fit(TinyModule(), loader(1))
    assert single.profiler is not None
    assert (single.profiler.rank_info.rank, single.profiler.rank_info.world_size) == (0, 1)

    pinned = RankscopeCallback(config(tmp_path / "b"), rank=3, world_size=4)
    trainer([pinned], max_steps=1).fit(TinyModule(), loader(1))
    assert pinned.profiler is not None
    assert (pinned.profiler.rank_info.rank, pinned.profiler.rank_info.world_size) == (3, 4)
    assert final_files(tmp_path / "b") == ["meta/rank-00003.json", "timings/rank-00003.jsonl"]


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"config": {"timer": {"every_n_steps": 0}}}, "timer.every_n_steps"),
        ({"config": {"trace": {"schedule": {"active": 0}}}}, "trace.schedule.active"),
        ({"config": {"timer": {"enabled": True}}}, "timer.enabled"),
        ({"config": 42}, "config"),
        ({"config": "/no/such/rankscope.yaml"}, "path"),
        ({"rank": -1}, "rank"),
        ({"rank": 2, "world_size": 2}, "rank"),
        ({"world_size": 0}, "world_size"),
        ({"config": {"trace": {"enable": True, "ranks": "3"}}, "world_size": 2}, "trace.ranks"),
        ({"environ": {"RANKSCOPE_TIMER": "maybe"}}, "RANKSCOPE_TIMER"),
    ],
)
def test_a_bad_config_raises_at_construction(
    tmp_path: Path, kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        RankscopeCallback(**{"config": {"output_dir": str(tmp_path)}, **kwargs})
    assert raised.value.field == field


def test_a_yaml_config_is_read_and_nothing_runs_before_training(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text(
        f"rankscope:\n  output_dir: {tmp_path / 'run'}\n  timer: {{enable: true, every_n_steps: 5}}\n",
        encoding="utf-8",
    )
    callback = RankscopeCallback(path)
    assert callback.config.timer.every_n_steps == 5
    assert callback.profiler is None
    assert not (tmp_path / "run").exists()

    path.write_text("rankscope:\n  timer: {every_n_steps: -1}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"timer\.every_n_steps=-1"):
        RankscopeCallback(str(path))


def test_a_rank_selection_beyond_the_trainers_world_fails_before_the_first_step(
    tmp_path: Path,
) -> None:
    callback = RankscopeCallback(
        {"output_dir": str(tmp_path), "trace": {"enable": True, "ranks": "1"}}
    )
    module = TinyModule()
    with pytest.raises(ConfigError, match=r"trace\.ranks"):
        trainer([callback], max_steps=2).fit(module, loader(2))
    assert module.losses == []


def test_public_names_are_sorted() -> None:
    from rankscope.integrations import lightning

    assert lightning.__all__ == sorted(lightning.__all__) == ["RankscopeCallback"]


# -- the example -----------------------------------------------------------------------------


@pytest.mark.slow
def test_the_example_runs_and_writes_a_run_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "lightning_trainer.py"), str(run_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    recs = records(run_dir)
    assert step_records(recs)
    assert {"forward", "backward", "optimizer"} <= {r["phase"] for r in recs}
    traces = sorted(
        p.relative_to(run_dir).parts[1] for p in run_dir.glob("traces/*/*.summary.json")
    )
    assert len(traces) == 1
    assert f"rankscope report {run_dir.resolve()}" in done.stderr + done.stdout
    assert {r["rank"] for r in recs} == {0}


def test_a_fit_resumed_from_a_checkpoint_keeps_its_step_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rankscope.analysis import read_timings
    from rankscope.rundir import _attempt

    run, checkpoint = tmp_path / "run", tmp_path / "after-3.ckpt"
    first = trainer([RankscopeCallback(config(run))], max_steps=3)
    first.fit(TinyModule(), loader(8))
    first.save_checkpoint(checkpoint)
    monkeypatch.setattr(_attempt, "_current", None)  # as a new process would be
    again = trainer([RankscopeCallback(config(run))], max_steps=6)
    again.fit(TinyModule(), loader(8), ckpt_path=str(checkpoint))
    timings = read_timings(run)
    rank = timings.ranks[0]
    is_step = rank.phase == rank.names.index("step")
    assert sorted(rank.step[is_step].tolist()) == list(range(6))  # 3-5 kept their numbers
    assert timings.attempts.count == 2 and timings.attempts.rerun_steps == []
