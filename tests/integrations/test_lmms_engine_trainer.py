"""rankscope inside lmms-engine's trainers (integrations/lmms_engine/_trainer.py).

lmms-engine installs from the package index (`make test-frameworks`); without it these
tests skip. Its trainers need CUDA to train (the FSDP2 trainer's device mesh is "cuda",
and both look up the GPU's name for their FLOPs figures), so on this machine:

- the FSDP2 trainer is lmms-engine's real ``FSDP2SFTTrainer``, built from
  ``TRAINER_REGISTER`` with real ``TrainingArguments`` on real gloo ranks, and its
  profilers are driven in the order its ``train()`` drives them (host_to_device,
  training_step, the step profiler's step, training_metrics, maybe_flush, per
  micro-batch), around a small model whose gradients are all-reduced;
- the HF trainer is lmms-engine's real ``hf_trainer`` class trained on CPU, its GPU-only
  ``compute_loss`` left to transformers' own in a subclass (as lmms-engine's own trainers
  subclass it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

pytest.importorskip("lmms_engine.train.fsdp2.fsdp2_trainer")

import transformers
from lmms_engine.train import TRAINER_REGISTER, TrainingArguments

from rankscope._errors import ConfigError
from rankscope.cli import main
from rankscope.integrations import lmms_engine as adapter
from rankscope.testing._gloo import GlooRanks

from .._helpers import measured_saving_ms

STEPS, SLOW_RANK, SLOW_FROM, SLEEP_S, MICRO_BATCHES = 30, 1, 12, 0.02, 2


def _args(out: str, **fields: Any) -> TrainingArguments:
    return TrainingArguments(output_dir=out, report_to=[], use_cpu=True, **fields)


# -- the mapping of trainer_args ---------------------------------------------------------


def test_trainer_args_map_to_the_timer_the_window_and_the_snapshots(tmp_path: Path) -> None:
    adapter.install()
    args = _args(
        str(tmp_path),
        enable_profiler=True,
        profiler_config={"start_step": 3, "end_step": 6},
        cuda_event_profiler_config={"start_step": 2, "end_step": 50, "record_every_n_steps": 5},
        enable_memory_snapshot=True,
        memory_snapshot_config={"max_entries": 5000},
    )
    config = adapter.config_from_args(args, environ={})
    assert config.output_dir == str(tmp_path / "rankscope")
    timer = config.timer
    assert (timer.enable, timer.ranks, timer.start_step, timer.end_step) == (True, "all", 2, 51)
    assert timer.every_n_steps == 5
    schedule = config.trace.schedule
    assert config.trace.enable and config.trace.ranks == "0"
    assert (schedule.wait, schedule.warmup, schedule.active, schedule.repeat) == (3, 1, 3, 1)
    assert not (config.trace.record_shapes or config.trace.with_stack)
    assert config.trace.profile_memory is False
    assert (config.memory.enable, config.memory.ranks, config.memory.max_entries) == (
        True,
        "all",
        5000,
    )
    # Nothing asked for: the timer alone, on every rank.
    plain = adapter.config_from_args(_args(str(tmp_path)), environ={})
    assert plain.timer.enable and not plain.trace.enable and not plain.memory.enable


def test_install_config_and_the_environment_win_over_the_mapping(tmp_path: Path) -> None:
    try:
        adapter.install({"timer": {"every_n_steps": 1}})
        args = _args(str(tmp_path), cuda_event_profiler_config={"record_every_n_steps": 7})
        assert adapter.config_from_args(args, environ={}).timer.every_n_steps == 1
        env = {"RANKSCOPE_TIMER_EVERY": "3"}
        assert adapter.config_from_args(args, environ=env).with_env(env).timer.every_n_steps == 3
        with pytest.raises(ConfigError, match="RANKSCOPE_TIMER_EVERY"):
            adapter.config_from_args(args, environ={"RANKSCOPE_TIMER_EVERY": "often"})
    finally:
        adapter.install()


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        (
            {"enable_memory_snapshot": True, "memory_snapshot_config": {"stop_step": 5}},
            "memory_snapshot_config.stop_step",
        ),
        (
            {"cuda_event_profiler_config": {"record_every_n_step": 5}},
            "cuda_event_profiler_config.record_every_n_step",
        ),
        (
            {"cuda_event_profiler_config": {"record_every_n_steps": 0}},
            "cuda_event_profiler_config.record_every_n_steps",
        ),
        ({"cuda_event_profiler_config": {"ranks": "0,1"}}, "cuda_event_profiler_config.ranks"),
        (
            {"enable_profiler": True, "profiler_config": {"start_step": 5, "end_step": 5}},
            "profiler_config.end_step",
        ),
    ],
)
def test_a_field_with_no_rankscope_meaning_is_refused_by_name(
    tmp_path: Path, fields: dict[str, Any], named: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"trainer_args.{named}=")):
        adapter.config_from_args(_args(str(tmp_path), **fields), environ={})


# -- the FSDP2 trainer on two gloo ranks ----------------------------------------------------


def _fsdp2_job(rank: int, world: int, out: str, slow: bool = True) -> None:
    """lmms-engine's FSDP2 trainer, its profilers driven as its train() drives them."""
    adapter.install()
    cls = TRAINER_REGISTER["fsdp2_trainer"]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))
    try:  # a field with no rankscope meaning stops the trainer before it trains
        cls(
            model=model,
            args=_args(out, enable_memory_snapshot=True, memory_snapshot_config={"stop_step": 3}),
            train_dataset=[],
        )
        refused = ""
    except ConfigError as exc:
        refused = str(exc)
    args = _args(
        out,
        gradient_accumulation_steps=MICRO_BATCHES,
        enable_cuda_event_profiler=True,
        cuda_event_profiler_config={"start_step": 0, "record_every_n_steps": 1},
    )
    trainer = cls(model=model, args=args, train_dataset=[])
    timer = trainer.cuda_event_profiler
    facts = {
        "refused": refused,
        "timer": type(timer).__name__,
        "step_profiler_on": trainer.step_profiler.check(),
        "memory_profiler_on": trainer.memory_snapshot_profiler.enable,
    }
    ddp = DistributedDataParallel(model)  # the gradients' all-reduce inside backward
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

    def training_step(batch: torch.Tensor) -> torch.Tensor:
        """FSDP2SFTTrainer.training_step's course on CPU (its own needs CUDA): the
        accumulation count the trainer keeps, the backward, the optimizer at the end of
        an accumulation, the loss all-reduced."""
        if trainer.accumulated_grad_steps == 0:
            opt.zero_grad()
        loss = ddp(batch).square().mean() / MICRO_BATCHES
        loss.backward()
        trainer.accumulated_grad_steps += 1
        if trainer.accumulated_grad_steps >= MICRO_BATCHES:
            opt.step()
            trainer.accumulated_grad_steps = 0
        reduced = loss.detach().clone()
        dist.all_reduce(reduced, op=dist.ReduceOp.AVG)
        return reduced

    truth = []
    trainer.step_profiler.start()
    trainer.memory_snapshot_profiler.start()
    for global_step in range(STEPS):
        began = time.perf_counter()
        for _ in range(MICRO_BATCHES):
            # The data loader's next batch (a slow collator on one rank).
            if slow and rank == SLOW_RANK and global_step >= SLOW_FROM:
                time.sleep(SLEEP_S / MICRO_BATCHES)
            batch = torch.randn(64, 64)
            with timer.record("host_to_device", global_step):
                batch = batch.clone()
            trainer.memory_snapshot_profiler.step(global_step)
            with timer.record("training_step", global_step):
                reduced = training_step(batch)
            trainer.step_profiler.step()
            with timer.record("training_metrics", global_step):
                float(reduced)
            timer.maybe_flush(global_step)
        truth.append(time.perf_counter() - began)
    trainer.memory_snapshot_profiler.stop_and_save(reason="train_end")
    timer.close()
    facts["truth"] = truth
    (Path(out) / f"facts-{rank}.json").write_text(json.dumps(facts))


@pytest.fixture(scope="module")
def fsdp2_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lmms-fsdp2")
    GlooRanks(tmp_path_factory.mktemp("gloo")).run(_fsdp2_job, 2, str(out))
    return out


@pytest.fixture(scope="module")
def fsdp2_clean_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lmms-fsdp2-clean")
    GlooRanks(tmp_path_factory.mktemp("gloo")).run(_fsdp2_job, 2, str(out), False)
    return out


def _facts(run: Path, rank: int) -> dict[str, Any]:
    return json.loads((run / f"facts-{rank}.json").read_text())


def _stragglers(run: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    capsys.readouterr()
    assert main(["stragglers", str(run / "rankscope"), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_trainer_holds_rankscope_in_place_of_its_own_profilers(fsdp2_run: Path) -> None:
    for rank in (0, 1):
        facts = _facts(fsdp2_run, rank)
        assert facts["timer"] == "LmmsTimer"
        assert facts["step_profiler_on"] is False and facts["memory_profiler_on"] is False
        assert "trainer_args.memory_snapshot_config.stop_step" in facts["refused"]


def test_every_global_step_has_lmms_engines_phases_per_micro_batch(fsdp2_run: Path) -> None:
    for rank in (0, 1):
        path = fsdp2_run / "rankscope" / "timings" / f"rank-{rank:05d}.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()]
        phases: dict[int, list[str]] = {}
        for record in records:
            if "phase" in record and record["phase"] != "step":
                phases.setdefault(record["step"], []).append(record["phase"])
        # next_batch opens the step whose batch it loads (every step but the first, and
        # the one after the last, cut short at close()) and runs between its micro-batches.
        assert sorted(phases) == list(range(STEPS + 1))
        own = ["host_to_device", "training_step", "training_metrics"] * MICRO_BATCHES
        for step in range(STEPS):
            gaps = MICRO_BATCHES - 1 + (step > 0)
            assert sorted(phases[step]) == sorted(own + [adapter.GAP] * gaps), (step, phases)
        assert phases[STEPS] == [adapter.GAP]
        kinds = {r["phase"]: r["kind"] for r in records if "phase" in r}
        assert kinds["host_to_device"] == "io" and kinds[adapter.GAP] == "data"


def test_a_slow_data_loader_is_named_with_the_rank_that_waits_and_priced(
    fsdp2_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _stragglers(fsdp2_run, capsys)
    slow = [f for f in report["findings"] if f["role"] == "slow"]
    waits = [f for f in report["findings"] if f["role"] == "waits"]
    assert [(f["rank"], f["phase"]) for f in slow] == [(SLOW_RANK, adapter.GAP)], report
    assert [(f["rank"], f["phase"]) for f in waits] == [(0, "training_step")], report
    assert SLOW_FROM - 1 <= slow[0]["since_step"] <= SLOW_FROM + 2
    truth = _facts(fsdp2_run, 0)["truth"]
    saving = measured_saving_ms(truth, slice(3, SLOW_FROM), slice(SLOW_FROM + 2, None))
    price = slow[0]["cost"]["step_ms_saved"]
    assert 0.7 <= price / saving <= 1.4, (price, saving)


def test_the_same_trainer_clean_gets_no_finding(
    fsdp2_clean_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _stragglers(fsdp2_clean_run, capsys)
    assert report["findings"] == [] and report.get("imbalance", []) == [], report["findings"]


# -- the HF trainer, trained ---------------------------------------------------------------


class _Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int = 64, seq: int = 16, vocab: int = 128) -> None:
        self.ids = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def test_lmms_engines_hf_trainer_trains_with_rankscopes_callback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rankscope.integrations.hf import RankscopeCallback

    adapter.install({"timer": {"every_n_steps": 1}})
    adapter.install({"timer": {"every_n_steps": 1}})  # a second call changes nothing twice
    try:

        class Trainer(TRAINER_REGISTER["hf_trainer"]):  # type: ignore[misc, valid-type]
            compute_loss = transformers.Trainer.compute_loss  # lmms-engine's needs a GPU

        config = transformers.Qwen2Config(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
        trainer = Trainer(
            model=transformers.Qwen2ForCausalLM(config),
            args=_args(str(tmp_path), per_device_train_batch_size=4, max_steps=6),
            train_dataset=_Tokens(),
        )
        ours = [c for c in trainer.callback_handler.callbacks if isinstance(c, RankscopeCallback)]
        assert len(ours) == 1
        trainer.train()
    finally:
        adapter.install()
    path = tmp_path / "rankscope" / "timings" / "rank-00000.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    steps = {r["step"] for r in records if r.get("phase") == "forward"}
    assert steps == set(range(6))
    capsys.readouterr()
    assert main(["stragglers", str(tmp_path / "rankscope"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ranks"] == [0] and report["steps"] == list(range(6))
    assert report["findings"] == [], report["findings"]


def test_the_launcher_hands_its_arguments_to_lmms_engines(tmp_path: Path) -> None:
    env = dict(os.environ, HYDRA_FULL_ERROR="1")
    done = subprocess.run(
        [
            *(sys.executable, "-m", "rankscope.integrations.lmms_engine", "--cfg", "job"),
            *("trainer_type=hf_trainer", f"trainer_args.output_dir={tmp_path}"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "trainer_type: hf_trainer" in done.stdout
    assert f"output_dir: {tmp_path}" in done.stdout
