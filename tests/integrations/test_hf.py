"""The Hugging Face Trainer integration, on the real transformers.Trainer with a tiny GPT-2."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

import rankscope
from rankscope import ConfigError, ProfileConfig, Schedule, TimerConfig, TraceConfig
from rankscope.analysis import StragglerOptions, analyse_stragglers
from rankscope.capture import windows
from rankscope.integrations import hf
from rankscope.integrations.hf import RankscopeCallback
from rankscope.testing._gloo import GlooRanks

from .._helpers import (
    event_names,
    final_files,
    profiler_steps,
    read_trace,
    temp_files,
    timing_records,
)

REPO = Path(__file__).resolve().parents[2]
PHASES = ["between_steps", "forward_backward", "optimizer"]
NESTED = {"fetch": "between_steps", "forward": "forward_backward"}  # phase -> its holder
STEPS = 4


# -- a tiny training job, built from configs (no downloads) -----------------------------


class _Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Random token sequences, the same for a given seed."""

    def __init__(self, n: int = 64, seq: int = 16, vocab: int = 64, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, seq), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _model(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=64,
        n_positions=16,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config)


def _args(out: Path, steps: int = STEPS, accumulate: int = 1) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(out / "trainer"),
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        max_steps=steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=accumulate,
        logging_steps=1,
        seed=0,
    )


def _config(run_dir: Path, schedule: Schedule | None = None) -> ProfileConfig:
    """Timer on every rank every step; a trace window on rank 0."""
    return ProfileConfig(
        output_dir=run_dir,
        timer=TimerConfig(enable=True, every_n_steps=1),
        trace=TraceConfig(
            enable=True, ranks="0", schedule=schedule or Schedule(wait=1, warmup=1, active=1)
        ),
    )


def _records(run_dir: Path, rank: int = 0) -> list[dict[str, Any]]:
    return timing_records(run_dir, rank)


def _steps_of(records: list[dict[str, Any]], phase: str) -> list[int]:
    return [r["step"] for r in records if r["phase"] == phase]


class _CountEvents(TrainerCallback):  # type: ignore[misc]
    """Counts the Trainer's per-step events, to show what the run really did."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
        self._count("step_begin")

    def on_substep_end(self, *args: Any, **kwargs: Any) -> None:
        self._count("substep_end")

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        self._count("step_end")


def _record_inputs(model: torch.nn.Module) -> list[int]:
    """A list that gets the sum of the input ids of each forward call of the model from now on."""
    sums: list[int] = []

    def record(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        sums.append(int(kwargs["input_ids"].sum()))

    model.register_forward_pre_hook(record, with_kwargs=True)
    return sums


# -- two ranks over gloo, as torchrun would start them ----------------------------------


def _ddp_rank(rank: int, world_size: int, root: str) -> None:
    """One rank: a Trainer run without and with gradient accumulation; facts to facts-N.json.
    The Trainer starts the process group from torchrun's variables, which the launcher sets."""
    facts: dict[str, Any] = {}
    for accumulate in (1, 2):
        run_dir = Path(root) / f"accumulate-{accumulate}"
        callback = RankscopeCallback(_config(run_dir), environ={})
        counter = _CountEvents()
        model = _model()
        inputs = _record_inputs(model)
        trainer = Trainer(
            model=model,
            args=_args(run_dir, accumulate=accumulate),
            train_dataset=_Tokens(),
            callbacks=[counter, callback],
        )
        trainer.train()
        assert callback.profiler is not None
        weights = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
        facts[str(accumulate)] = {
            "args_world_size": trainer.args.world_size,
            "args_process_index": trainer.args.process_index,
            "ddp": isinstance(trainer.model_wrapped, DistributedDataParallel),
            "backend": dist.get_backend(),
            "dist_world_size": dist.get_world_size(),
            "profiler_rank": callback.profiler.rank,
            "profiler_world_size": callback.profiler.rank_info.world_size,
            "events": counter.counts,
            "inputs": inputs,
            "weights": weights.tolist(),
        }
    (Path(root) / f"facts-{rank}.json").write_text(json.dumps(facts))


@pytest.fixture(scope="module")
def ddp_root(tmp_path_factory: pytest.TempPathFactory, gloo_ranks: GlooRanks) -> Path:
    root = tmp_path_factory.mktemp("hf-ddp")
    gloo_ranks.run(_ddp_rank, 2, root, init=False)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("accumulate", [1, 2])
def test_ddp_run_really_is_two_ranks(ddp_root: Path, accumulate: int) -> None:
    facts = [
        json.loads((ddp_root / f"facts-{r}.json").read_text())[str(accumulate)] for r in (0, 1)
    ]
    for rank, fact in enumerate(facts):
        assert fact["ddp"] is True
        assert (fact["backend"], fact["dist_world_size"], fact["args_world_size"]) == ("gloo", 2, 2)
        assert (fact["args_process_index"], fact["profiler_rank"]) == (rank, rank)
        assert fact["profiler_world_size"] == 2
        assert fact["events"]["step_begin"] == fact["events"]["step_end"] == STEPS
        assert fact["events"].get("substep_end", 0) == STEPS * (accumulate - 1)
        assert len(fact["inputs"]) == STEPS * accumulate  # forward calls
    # Each rank trained on its own shard, and yet the weights agree: gradients were all-reduced.
    assert facts[0]["inputs"] != facts[1]["inputs"]
    assert facts[0]["weights"] == facts[1]["weights"]


@pytest.mark.slow
@pytest.mark.parametrize("accumulate", [1, 2])
def test_ddp_timings_one_sampled_step_per_optimizer_step(ddp_root: Path, accumulate: int) -> None:
    run_dir = ddp_root / f"accumulate-{accumulate}"
    for rank in (0, 1):
        records = _records(run_dir, rank)
        assert {r["rank"] for r in records} == {rank}
        assert _steps_of(records, "step") == list(range(STEPS))
        for phase in PHASES:
            assert sorted(_steps_of(records, phase)) == list(range(STEPS)), phase
        assert {r["phase"] for r in records} == {"step", *PHASES, *NESTED}
        assert {r["phase"]: r["kind"] for r in records if r["phase"] != "step"} == {
            "between_steps": "data",
            "forward_backward": "compute",
            "optimizer": "compute",
            "fetch": "data",
            "forward": "compute",
        }
        assert all(r["error"] is False for r in records)
        assert all(r["depth"] == (r["phase"] in NESTED) for r in records)
        # The fetch once a step (every micro-batch at once), a forward per micro-batch.
        assert sorted(_steps_of(records, "fetch")) == list(range(STEPS))
        assert sorted(_steps_of(records, "forward")) == sorted(list(range(STEPS)) * accumulate)
        for step in range(STEPS):
            # Within a step the phases follow each other in this order...
            mine = [r for r in records if r["step"] == step]
            starts = {r["phase"]: r["start_ns"] for r in mine}
            assert starts["between_steps"] < starts["forward_backward"] < starts["optimizer"]
            # ...and each nested phase runs inside the one that holds it.
            spans = {r["phase"]: (r["start_ns"], r["start_ns"] + r["cpu_ms"] * 1e6) for r in mine}
            for r in mine:
                if r["phase"] in NESTED:
                    outer = spans[NESTED[r["phase"]]]
                    assert (
                        outer[0] <= r["start_ns"] <= r["start_ns"] + r["cpu_ms"] * 1e6 <= outer[1]
                    )


@pytest.mark.slow
@pytest.mark.parametrize("accumulate", [1, 2])
def test_ddp_trace_window_on_rank_zero_only(ddp_root: Path, accumulate: int) -> None:
    run_dir = ddp_root / f"accumulate-{accumulate}"
    assert windows(Schedule(wait=1, warmup=1, active=1), stop_step=STEPS) == [(2, 2)]
    window = "traces/step-000002-000002"
    assert final_files(run_dir) == [
        "meta/rank-00000.json",
        "meta/rank-00001.json",
        "timings/rank-00000.jsonl",
        "timings/rank-00001.jsonl",
        f"{window}/rank-00000.pt.trace.json.gz",
        f"{window}/rank-00000.summary.json",
    ]
    assert temp_files(run_dir) == []
    trace = read_trace(run_dir / window / "rank-00000.pt.trace.json.gz")
    assert (trace["distributedInfo"]["rank"], trace["distributedInfo"]["world_size"]) == (0, 2)
    assert profiler_steps(trace) == [2]
    assert set(PHASES) <= event_names(trace)
    summary = json.loads((run_dir / window / "rank-00000.summary.json").read_text())
    assert (summary["rank"], summary["window"], summary["kind"]) == (
        0,
        "step-000002-000002",
        "cpu_ops",
    )
    assert summary["count"] > 0


# -- one process -------------------------------------------------------------------------


def _train(
    out: Path, callbacks: list[Any], accumulate: int = 2, trainer_cls: type[Trainer] = Trainer
) -> Trainer:
    trainer = trainer_cls(
        model=_model(),
        args=_args(out, accumulate=accumulate),
        train_dataset=_Tokens(),
        callbacks=callbacks,
    )
    trainer.train()
    return trainer


def test_losses_and_weights_are_the_same_with_and_without_the_callback(tmp_path: Path) -> None:
    plain = _train(tmp_path / "plain", [])
    callback = RankscopeCallback(_config(tmp_path / "run"), environ={})
    profiled = _train(tmp_path / "profiled", [callback])
    assert len(_steps_of(_records(tmp_path / "run"), "step")) == STEPS  # it did profile
    assert (tmp_path / "run" / "traces" / "step-000002-000002" / "rank-00000.summary.json").exists()

    def losses(trainer: Trainer) -> list[float]:
        return [h["loss"] for h in trainer.state.log_history if "loss" in h]

    assert len(losses(plain)) == STEPS
    assert losses(profiled) == losses(plain)
    for (name, a), (_, b) in zip(
        plain.model.named_parameters(), profiled.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name


def test_profiler_is_exposed_and_takes_phases_of_ones_own(tmp_path: Path) -> None:
    callback = RankscopeCallback(_config(tmp_path / "run"), environ={})
    assert callback.profiler is None

    class LossPhaseTrainer(Trainer):  # type: ignore[misc]
        def compute_loss(self, *args: Any, **kwargs: Any) -> Any:
            assert callback.profiler is not None
            with callback.profiler.phase("compute_loss", micro="batch"):
                return super().compute_loss(*args, **kwargs)

    _train(tmp_path, [callback], accumulate=2, trainer_cls=LossPhaseTrainer)
    assert callback.profiler is not None
    assert callback.profiler.rank == 0
    assert rankscope.current() is None  # stopped at train end
    assert callback.profiler.last_summary() is not None
    records = _records(tmp_path / "run")
    mine = [r for r in records if r["phase"] == "compute_loss"]
    # Two micro-batches per optimizer step, each inside forward_backward.
    assert [r["step"] for r in mine] == [s for s in range(STEPS) for _ in range(2)]
    assert all(r["depth"] == 1 and r["meta"] == {"micro": "batch"} for r in mine)
    callback.close()  # after a finished run: nothing to do
    assert _records(tmp_path / "run") == records


class _Boom(RuntimeError):
    """The user's own exception, raised from inside the model."""


def _booming_model(at_forward: int) -> tuple[GPT2LMHeadModel, _Boom]:
    """A model whose forward number `at_forward` (from 0) raises; returns it and the exception."""
    model, error = _model(), _Boom(f"boom at forward {at_forward}")
    calls = [0]

    def hook(*_: Any) -> None:
        calls[0] += 1
        if calls[0] - 1 == at_forward:
            raise error

    model.register_forward_hook(hook)  # after our pre-hook opened "forward"
    return model, error


BOOM_AT = 3  # the 4th optimizer step raises (no accumulation: one forward per step)
BOOM_SCHEDULE = Schedule(wait=1, warmup=0, active=1, repeat=0)  # windows at steps 1, 3, 5, ...


def _booming_trainer(out: Path, callback: RankscopeCallback) -> tuple[Trainer, _Boom]:
    model, error = _booming_model(BOOM_AT)
    trainer = Trainer(
        model=model,
        args=_args(out, steps=6),
        train_dataset=_Tokens(),
        callbacks=[callback],
    )
    return trainer, error


def _check_interrupted_records(records: list[dict[str, Any]]) -> None:
    """The timings of a run that raised in forward_backward of step BOOM_AT."""
    assert _steps_of(records, "step") == list(range(BOOM_AT))  # the cut step is not a step
    assert _steps_of(records, "forward_backward") == list(range(BOOM_AT + 1))
    assert _steps_of(records, "optimizer") == list(range(BOOM_AT))
    errors = [(r["step"], r["phase"]) for r in records if r["error"]]
    assert errors == [(BOOM_AT, "forward"), (BOOM_AT, "forward_backward")]  # the model raised


def _check_interrupted_run(run_dir: Path) -> None:
    """What a run that raised in forward_backward of step BOOM_AT leaves on disk."""
    _check_interrupted_records(_records(run_dir))
    assert final_files(run_dir) == [
        "meta/rank-00000.json",
        "timings/rank-00000.jsonl",
        "traces/step-000001-000001/rank-00000.pt.trace.json.gz",  # finished before
        "traces/step-000001-000001/rank-00000.summary.json",
        "traces/step-000003-000003/rank-00000.pt.trace.json.gz",  # open when it raised
        "traces/step-000003-000003/rank-00000.summary.json",
    ]
    assert temp_files(run_dir) == []
    cut = read_trace(run_dir / "traces" / "step-000003-000003" / "rank-00000.pt.trace.json.gz")
    assert "forward_backward" in event_names(cut)


def test_exception_passes_through_and_close_saves_what_was_captured(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    callback = RankscopeCallback(_config(run_dir, BOOM_SCHEDULE), environ={})
    trainer, error = _booming_trainer(tmp_path, callback)
    with pytest.raises(_Boom) as raised:
        trainer.train()
    assert raised.value is error
    # No Trainer event follows an exception: the run stays open until something closes it.
    assert rankscope.current() is callback.profiler
    callback.close()
    assert rankscope.current() is None
    _check_interrupted_run(run_dir)


def test_with_block_closes_the_run_on_the_way_out(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    callback = RankscopeCallback(_config(run_dir, BOOM_SCHEDULE), environ={})
    trainer, error = _booming_trainer(tmp_path, callback)
    with pytest.raises(_Boom) as raised, callback:
        trainer.train()
    assert raised.value is error
    assert rankscope.current() is None
    _check_interrupted_run(run_dir)


def test_next_train_closes_the_interrupted_run_first(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    callback = RankscopeCallback(_config(run_dir, BOOM_SCHEDULE), environ={})
    trainer, _ = _booming_trainer(tmp_path, callback)
    with pytest.raises(_Boom):
        trainer.train()
    first = callback.profiler
    # A notebook runs the cell again: a new Trainer, the same callback.
    again = Trainer(
        model=_model(), args=_args(tmp_path, steps=6), train_dataset=_Tokens(), callbacks=[callback]
    )
    with caplog.at_level(logging.INFO, logger="rankscope.integrations.hf"):
        again.train()
    assert callback.profiler is not first
    assert "the previous train() did not end" in caplog.text
    assert "training began again with the same RankscopeCallback" in caplog.text
    records = _records(run_dir)
    # The interrupted run, up to the failed forward_backward of step 3; the second run
    # follows, counting from 0.
    again_at = next(
        i for i in range(1, len(records)) if records[i]["step"] < records[i - 1]["step"]
    )
    first_run, second_run = records[:again_at], records[again_at:]
    _check_interrupted_records(first_run)
    assert _steps_of(second_run, "step") == list(range(6))
    assert not any(r["error"] for r in second_run)


def test_uncaught_exception_ends_the_process_with_the_run_saved(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    code = f"""
        from pathlib import Path
        from tests.integrations.test_hf import _uncaught_boom
        _uncaught_boom(Path({str(tmp_path)!r}))
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert f"_Boom: boom at forward {BOOM_AT}" in done.stderr
    assert "Traceback" in done.stderr
    _check_interrupted_run(run_dir)  # closed by the callback's atexit hook


def _uncaught_boom(out: Path) -> None:
    """Run in a subprocess: train until the model raises, and let the exception end the process."""
    callback = RankscopeCallback(_config(out / "run", BOOM_SCHEDULE), environ={})
    trainer, _ = _booming_trainer(out, callback)
    trainer.train()


def test_nested_phases_time_training_only_and_come_off_when_it_ends(tmp_path: Path) -> None:
    callback = RankscopeCallback(_config(tmp_path / "run"), environ={})
    model = _model()
    args = _args(tmp_path)
    args.eval_strategy, args.eval_steps = "steps", 2  # forwards outside forward_backward
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=_Tokens(),
        eval_dataset=_Tokens(n=8),
        callbacks=[callback],
    )
    trainer.train()
    records = _records(tmp_path / "run")
    forwards = [r for r in records if r["phase"] == "forward"]
    assert [r["step"] for r in forwards] == list(range(STEPS))  # one per step: no eval's
    holders = {r["step"]: r for r in records if r["phase"] == "forward_backward"}
    for r in forwards:
        outer = holders[r["step"]]
        assert outer["start_ns"] <= r["start_ns"]
        assert r["start_ns"] + r["cpu_ms"] * 1e6 <= outer["start_ns"] + outer["cpu_ms"] * 1e6
    # Taken off at the end: the model has no hook of ours, the Trainer its own method.
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert "get_batch_samples" not in vars(trainer)
    trainer.evaluate()  # and a forward after training records nothing
    assert len([r for r in _records(tmp_path / "run") if r["phase"] == "forward"]) == STEPS


def _collate_slow_on_rank_1(rank: int, world_size: int, root: str) -> None:
    """One of three ranks: a Trainer run whose collator sleeps 20 ms a batch on rank 1 from
    step SLOW_FROM on, and its clean twin before it."""
    _train_collating(rank, world_size, Path(root) / "clean", slow=False)
    _train_collating(rank, world_size, Path(root) / "slow", slow=rank == 1)


def _train_collating(rank: int, world_size: int, run_dir: Path, slow: bool) -> None:
    """Train; each step's wall time (ms) to run_dir/steps-N.json."""
    import time

    step = [0]
    ended: list[float] = []

    def collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        if slow and step[0] >= SLOW_FROM:
            time.sleep(0.02)
        return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}

    class Steps(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            step[0] += 1
            ended.append(time.perf_counter())

    config = ProfileConfig(output_dir=run_dir, timer=TimerConfig(enable=True, every_n_steps=1))
    Trainer(
        model=_model(),
        args=_args(run_dir, steps=SLOW_STEPS),
        train_dataset=_Tokens(n=SLOW_STEPS * 4 * world_size),
        data_collator=collate,
        callbacks=[RankscopeCallback(config, environ={}), Steps()],
    ).train()
    (run_dir / f"steps-{rank}.json").write_text(json.dumps((np.diff(ended) * 1e3).tolist()))


SLOW_FROM, SLOW_STEPS = 16, 40


@pytest.mark.serial  # a truth measured against the clock: other workers' load bends it
@pytest.mark.slow
def test_a_rank_slow_in_its_collator_is_named_with_its_waiters_and_priced(
    tmp_path: Path, gloo_ranks: GlooRanks
) -> None:
    # Every rank leaves between_steps together (the token count's all-gather ends it):
    # only the fetch nested in it shows which rank was late, and what it costs.
    gloo_ranks.run(_collate_slow_on_rank_1, 3, tmp_path, init=False)
    clean = analyse_stragglers(tmp_path / "clean", StragglerOptions()).report
    assert clean.findings == [] and clean.imbalance == []
    report = analyse_stragglers(tmp_path / "slow", StragglerOptions()).report
    said = {(f.rank, f.role, f.phase, f.waits_for) for f in report.findings}
    assert said == {
        (1, "slow", "fetch", ()),
        (0, "waits", "between_steps", (1,)),
        (2, "waits", "between_steps", (1,)),
    }
    (slow,) = [f for f in report.findings if f.role == "slow"]
    assert SLOW_FROM <= slow.since_step <= SLOW_FROM + 2
    steps = np.asarray(json.loads((tmp_path / "slow" / "steps-0.json").read_text()))
    # The saving the job measured: its step's median from the slow steps on less before
    # them (medians: the test run beside it takes the CPU in bursts, a mean swings 10 ms).
    truth = float(np.median(steps[SLOW_FROM:]) - np.median(steps[3 : SLOW_FROM - 1]))
    assert slow.cost is not None
    assert 0.7 * truth <= slow.cost.step_ms_saved <= 1.4 * truth, (slow.cost, truth)


def test_a_fault_inside_rankscope_does_not_stop_training(
    read_only_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    callback = RankscopeCallback(_config(read_only_dir / "run"), environ={})
    with caplog.at_level(logging.WARNING):
        trainer = _train(tmp_path, [callback])
    assert trainer.state.global_step == STEPS
    assert "cannot write to" in caplog.text
    assert not (read_only_dir / "run").exists()


# -- configuration -----------------------------------------------------------------------


def test_config_forms(tmp_path: Path) -> None:
    data = {"output_dir": str(tmp_path / "run"), "timer": {"enable": True, "every_n_steps": 3}}
    expected = ProfileConfig.from_dict(data)
    yaml_file = tmp_path / "rankscope.yaml"
    yaml_file.write_text(
        f"rankscope:\n  output_dir: {tmp_path / 'run'}\n  timer: {{enable: true, every_n_steps: 3}}\n"
    )
    for given in (expected, data, yaml_file, str(yaml_file)):
        assert RankscopeCallback(given, environ={}).config == expected
    assert RankscopeCallback(environ={}).config == ProfileConfig()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"config": {"timer": {"every_n_steps": 0}}}, "timer.every_n_steps"),
        ({"config": {"trace": {"enabled": True}}}, "trace.enabled"),
        ({"config": 42}, "config"),
        ({"config": "/no/such/rankscope.yaml"}, "path"),
        ({"environ": {"RANKSCOPE_TIMER": "maybe"}}, "RANKSCOPE_TIMER"),
        ({"rank": -1}, "rank"),
        ({"rank": True}, "rank"),
        ({"world_size": 0}, "world_size"),
        ({"rank": 2, "world_size": 2}, "rank"),
        ({"config": {"trace": {"ranks": "0,4"}}, "world_size": 2}, "trace.ranks"),
    ],
)
def test_bad_config_fails_at_construction(kwargs: dict[str, Any], field: str) -> None:
    kwargs.setdefault("environ", {})
    with pytest.raises(ConfigError) as raised:
        RankscopeCallback(**kwargs)
    assert field in str(raised.value)


def test_bad_yaml_file_fails_at_construction(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("trace:\n  schedule: {active: 0}\n")
    with pytest.raises(ConfigError, match=r"trace\.schedule\.active=0"):
        RankscopeCallback(path, environ={})


def test_rank_selection_beyond_the_trainers_world_fails_before_the_first_step(
    tmp_path: Path,
) -> None:
    config = {"output_dir": str(tmp_path / "run"), "trace": {"enable": True, "ranks": "3"}}
    callback = RankscopeCallback(config, environ={})  # the world size is not known yet
    counter = _CountEvents()
    with pytest.raises(ConfigError, match=r"trace\.ranks.*world size 1"):
        _train(tmp_path, [counter, callback])
    assert counter.counts == {}
    assert not (tmp_path / "run").exists()


# -- the module ---------------------------------------------------------------------------


def test_all_is_sorted() -> None:
    assert hf.__all__ == sorted(hf.__all__) == ["RankscopeCallback"]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_transformers_without_the_pre_optimizer_event_is_refused() -> None:
    done = _python(
        """
        import sys, types

        old = types.ModuleType("transformers")
        old.__version__ = "4.44.2"
        old.TrainerCallback = type("TrainerCallback", (), {"on_step_begin": lambda *a, **k: None})
        sys.modules["transformers"] = old
        try:
            import rankscope.integrations.hf
        except ImportError as exc:
            print(exc)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "needs transformers>=4.45" in done.stdout
    assert "found 4.44.2" in done.stdout


@pytest.mark.slow
def test_example_runs(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "hf_trainer.py"), str(run_dir), "--steps", "6"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    records = _records(run_dir)
    assert _steps_of(records, "step") == list(range(6))
    assert {r["phase"] for r in records} == {"step", *PHASES, *NESTED}
    assert final_files(run_dir / "traces") == [
        "step-000003-000004/rank-00000.pt.trace.json.gz",
        "step-000003-000004/rank-00000.summary.json",
    ]
    assert f"rankscope report {run_dir}" in done.stderr


def test_a_run_resumed_from_a_checkpoint_keeps_its_step_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rankscope.analysis import read_timings
    from rankscope.rundir import _attempt

    run = tmp_path / "run"
    args = _args(tmp_path, accumulate=1)
    args.save_strategy, args.save_steps = "steps", 2

    def train(resume: str | None) -> None:
        monkeypatch.setattr(_attempt, "_current", None)  # as a new process would be
        callback = RankscopeCallback(_config(run), environ={})
        trainer = Trainer(model=_model(), args=args, train_dataset=_Tokens(), callbacks=[callback])
        trainer.train(resume_from_checkpoint=resume)

    train(None)
    train(str(tmp_path / "trainer" / "checkpoint-2"))  # steps 2 and 3 again
    timings = read_timings(run)
    rank = timings.ranks[0]
    steps = rank.step[rank.phase == rank.names.index("step")]
    assert sorted(steps.tolist()) == list(range(STEPS))  # each once, as numbered before
    assert timings.attempts.count == 2 and timings.attempts.rerun_steps == [2, 3]
    assert sorted(steps[rank.attempt[rank.phase == rank.names.index("step")] == 1]) == [2, 3]
