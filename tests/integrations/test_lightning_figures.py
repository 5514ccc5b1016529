"""rankscope's figures through a real Lightning Trainer's loggers: a CSVLogger's
metrics.csv holds them; a logger that raises on them costs one warning, not the run."""

from __future__ import annotations

import csv
import logging
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, Logger
from torch.utils.data import DataLoader, TensorDataset

from rankscope import ProfileConfig, TimerConfig
from rankscope.integrations.lightning import RankscopeCallback

from .._helpers import timing_records
from .test_lightning import TinyModule

STEPS = 8
LOG_EVERY = 2
PHASES = ("forward", "backward", "optimizer")


class _FreshFigures(pl.Callback):
    """Waits, as each batch starts, for the figures' reader to read the step before it: a
    log call never waits for the reader, and on a busy machine it may otherwise come
    before the reader's next read."""

    def __init__(self, callback: RankscopeCallback) -> None:
        self.callback = callback

    def on_train_batch_start(self, *args: Any) -> None:
        profiler = self.callback.profiler
        assert profiler is not None and profiler._peers is not None
        assert profiler._peers.wait_fresh()


class _Rejecting(Logger):  # type: ignore[misc]
    """A logger of the user's that raises on names with a "/" in them."""

    name = "rejecting"
    version = 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if any("/" in key for key in metrics):
            raise ValueError("no '/' in metric names, please")

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        pass


def _fit(
    out: Path,
    loggers: list[Logger],
    *,
    timer: TimerConfig | None = None,
    steps: int = STEPS,
    log_every: int = LOG_EVERY,
    fresh: bool = True,
) -> RankscopeCallback:
    """A fit of `steps` steps; `fresh`: each batch waits for the figures' reader (the
    timer then writes every step), else the timer and the reader run as a user's do."""
    if timer is None:
        timer = TimerConfig(enable=True, every_n_steps=1, flush_every_n_steps=1)
    config = ProfileConfig(output_dir=out / "run", timer=timer)
    callback = RankscopeCallback(config, environ={})
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=loggers,
        log_every_n_steps=log_every,
        callbacks=[callback, _FreshFigures(callback)] if fresh else [callback],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(out),
    )
    samples = max(64, 4 * steps)  # one epoch
    data = TensorDataset(torch.randn(samples, 8), torch.randn(samples, 1))
    trainer.fit(TinyModule(), DataLoader(data, batch_size=4))
    return callback


def _rows(logger: CSVLogger) -> list[dict[str, str]]:
    with open(Path(logger.log_dir) / "metrics.csv", newline="") as file:
        return list(csv.DictReader(file))


def test_a_csv_loggers_metrics_file_holds_the_figures_every_log_every_n_steps(
    tmp_path: Path,
) -> None:
    logger = CSVLogger(tmp_path / "logs")
    _fit(tmp_path, [logger])
    rows = [r for r in _rows(logger) if r.get("rankscope/ranks/compared")]
    assert [int(r["step"]) for r in rows] == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    assert all(float(r["rankscope/ranks/compared"]) == 1 for r in rows)
    # Each log's medians cover the steps read since the last one: the steps before the
    # batch that logs (its own step is written as it ends, after _FreshFigures waited).
    sampled = [float(r["rankscope/sampled_steps"]) for r in rows]
    assert sampled == [LOG_EVERY - 1] + [LOG_EVERY] * (len(rows) - 1)
    for row in rows:
        assert float(row["rankscope/step_ms"]) > 0
        for phase in PHASES:
            assert float(row[f"rankscope/phase_ms/{phase}"]) > 0, phase


def test_a_logger_that_raises_on_the_figures_costs_one_warning_and_the_run_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    logger = CSVLogger(tmp_path / "logs")
    with caplog.at_level(logging.WARNING, "rankscope"):
        callback = _fit(tmp_path, [logger, _Rejecting()])
    said = [
        r.getMessage() for r in caplog.records if "left out of the trainer's logs" in r.getMessage()
    ]
    assert len(said) == 1, said
    assert "_Rejecting" in said[0] and "no '/' in metric names" in said[0]
    # The CSV logger, first in the list, got the first log's figures and no more.
    rows = [r for r in _rows(logger) if r.get("rankscope/ranks/compared")]
    assert [int(r["step"]) for r in rows] == [LOG_EVERY]
    # Profiling went on to the end.
    assert callback.profiler is not None and callback.profiler.faults == []
    steps = {r["step"] for r in timing_records(tmp_path / "run", 0) if r["phase"] == "step"}
    assert steps == set(range(STEPS))


def test_a_short_fit_logs_step_and_phase_figures_with_the_defaults_and_no_zero_heartbeats(
    tmp_path: Path,
) -> None:
    # As a user runs it: the timer's own flush (every 10 steps), nothing waiting for the
    # figures' reader. Its first read came at the first log, before any record was
    # written, and the next one 2 s later: a fit this short logged no step figure at all,
    # and "0 ranks with a heartbeat" while the rank ran.
    logger = CSVLogger(tmp_path / "logs")
    timer = TimerConfig(enable=True, every_n_steps=1)
    _fit(tmp_path, [logger], timer=timer, steps=200, log_every=5, fresh=False)
    rows = _rows(logger)
    assert any(r.get("rankscope/step_ms") for r in rows)
    assert any(r.get("rankscope/phase_ms/forward") for r in rows)
    beats = [r["rankscope/ranks/heartbeats"] for r in rows if r.get("rankscope/ranks/heartbeats")]
    assert all(float(b) >= 1 for b in beats)  # left out until read, never a 0
