"""rankscope's figures in a transformers.Trainer's own logs: a real Trainer (a tiny GPT-2
from a config), its real TensorBoard integration, the event file read back by
TensorBoard's own reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import Trainer, TrainerCallback, TrainingArguments

from rankscope import ProfileConfig, TimerConfig
from rankscope.integrations.hf import RankscopeCallback

from .test_hf import _model, _Tokens

STEPS = 6
LOG_EVERY = 2
PHASES = ("between_steps", "forward_backward", "optimizer")


class _FreshFigures(TrainerCallback):  # type: ignore[misc]
    """Waits, at each step's end, for the figures' reader to read the step just written:
    on a busy machine a log call may otherwise come before the reader's next read (a
    log never waits; this makes the test's figures certain)."""

    def __init__(self, callback: RankscopeCallback) -> None:
        self.callback = callback

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        profiler = self.callback.profiler
        assert profiler is not None and profiler._peers is not None
        assert profiler._peers.wait_fresh()


def _train(out: Path, report_to: list[str]) -> tuple[Trainer, RankscopeCallback]:
    config = ProfileConfig(
        output_dir=out / "run",
        timer=TimerConfig(enable=True, every_n_steps=1, flush_every_n_steps=1),
    )
    callback = RankscopeCallback(config, environ={})
    args = TrainingArguments(
        output_dir=str(out / "trainer"),
        use_cpu=True,
        report_to=report_to,
        save_strategy="no",
        disable_tqdm=True,
        max_steps=STEPS,
        per_device_train_batch_size=4,
        logging_steps=LOG_EVERY,
        seed=0,
    )
    trainer = Trainer(
        model=_model(),
        args=args,
        train_dataset=_Tokens(),
        callbacks=[callback, _FreshFigures(callback)],
    )
    trainer.train()
    return trainer, callback


def test_the_figures_are_curves_in_tensorboard_next_to_the_loss(tmp_path: Path) -> None:
    trainer, _ = _train(tmp_path, ["tensorboard"])
    events = sorted((tmp_path / "trainer").rglob("events.out.tfevents.*"))
    assert len(events) == 1, events
    board = EventAccumulator(str(events[0].parent))
    board.Reload()
    tags = set(board.Tags()["scalars"])
    # transformers' TensorBoard integration files a training log's keys under train/.
    logged = [s.step for s in board.Scalars("train/loss")]
    assert logged == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    for name in ("step_ms", "sampled_steps", *(f"phase_ms/{p}" for p in PHASES)):
        points = board.Scalars(f"train/rankscope/{name}")
        assert [p.step for p in points] == logged, name
        assert all(p.value > 0 for p in points), name
    # Each log's medians cover the steps since the one before: LOG_EVERY steps (the
    # first log's, its first step too, whose step record is written at its end).
    sampled = [p.value for p in board.Scalars("train/rankscope/sampled_steps")]
    assert sampled == [LOG_EVERY] * len(logged)
    assert "train/rankscope/ranks/compared" in tags
    # The heartbeats' figures come once a heartbeat was read, never as 0 before.
    if "train/rankscope/ranks/heartbeats" in tags:
        assert all(p.value >= 1 for p in board.Scalars("train/rankscope/ranks/heartbeats"))
    # trainer.state.log_history holds them too, in the training logs.
    trained = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["step"] for h in trained] == logged
    assert all(h["rankscope/phase_ms/forward_backward"] > 0 for h in trained)


def test_without_a_logger_the_log_history_still_holds_the_figures(tmp_path: Path) -> None:
    trainer, callback = _train(tmp_path, [])
    trained = [h for h in trainer.state.log_history if "loss" in h]
    assert len(trained) == STEPS // LOG_EVERY
    assert all(h["rankscope/ranks/compared"] == 1 for h in trained)
    summary = trainer.state.log_history[-1]  # the end of training's: across ranks alone
    assert "train_runtime" in summary and summary["rankscope/ranks/compared"] == 1
    assert "rankscope/step_ms" not in summary
    assert callback.profiler is not None and callback.profiler._peers is None  # stopped


def test_mlflow_gets_the_figures_in_its_local_file_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mlflow = pytest.importorskip("mlflow")  # not in the dev extra: runs where it is installed
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "rankscope")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.x: the file store is opt-in
    _train(tmp_path, ["mlflow"])
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("rankscope")
    (run,) = client.search_runs([experiment.experiment_id])
    logged = list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    for name in ("loss", "rankscope/step_ms", "rankscope/phase_ms/forward_backward"):
        history = client.get_metric_history(run.info.run_id, name)
        assert sorted(m.step for m in history) == logged, name


def test_wandb_offline_gets_the_figures_in_its_run_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wandb = pytest.importorskip("wandb")  # not in the dev extra: runs where it is installed
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "rankscope")
    _train(tmp_path, ["wandb"])
    # The offline run's summary: the last value the Trainer's W&B integration logged of each.
    assert wandb.run is not None
    logged = dict(wandb.run.summary)
    wandb.finish()
    for name in ("step_ms", "sampled_steps", "phase_ms/forward_backward"):
        assert logged[f"train/rankscope/{name}"] > 0, name
    assert logged["train/global_step"] == STEPS
