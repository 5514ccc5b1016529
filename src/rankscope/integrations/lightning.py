"""Lightning integration: `RankscopeCallback` profiles a `lightning.pytorch.Trainer` fit.

::

    from rankscope.integrations.lightning import RankscopeCallback

    trainer = Trainer(callbacks=[RankscopeCallback("rankscope.yaml")])
    trainer.fit(model, datamodule=dm)

The callback holds one `Profiler` per `fit()` and calls it at the Trainer's hooks; it
adds nothing of its own. The profiler starts at ``on_train_start`` (on every rank, after
the process group exists and after the sanity check) and stops at ``on_train_end``,
``on_exception`` or ``teardown``. One profiler step is one batch that ended in an
optimizer step (``trainer.global_step`` moved on): with ``accumulate_grad_batches=k``, one
step covers k batches. Phases, each bounded by two callback hooks of Lightning 2.x
(checked against 2.6.6's loops):

- ``forward``: ``on_train_batch_start`` to ``on_before_backward``: the LightningModule's
  ``on_train_batch_start`` and ``training_step`` (and ``zero_grad`` on the first batch of
  an accumulation group).
- ``backward``: ``on_before_backward`` to ``on_after_backward``: the backward pass, with
  DDP's gradient all-reduce inside it on the batch that steps.
- ``optimizer``: ``on_before_optimizer_step`` to ``on_train_batch_end``: gradient
  clipping, ``optimizer.step()`` and step-interval LR schedulers. Only batches that step
  have it.
- ``validation`` (kind "eval"): ``on_validation_start`` to ``on_validation_end``, for
  validation inside ``fit()`` (the sanity check runs before the profiler starts).

A hook opens its phase after closing any phase still open, so a phase whose closing hook
never fires (manual optimization, ``on_train_batch_start`` returning -1) ends at the next
phase's hook, at ``on_train_epoch_end``, or when the run ends; phases never nest.

rankscope's figures (``rankscope/...``, docs/timer.md) go to the Trainer's loggers every
``log_every_n_steps`` optimizer steps, from global rank 0 (where Lightning's loggers
write), at the step ``trainer.global_step``. A logger that raises on them is warned about
once, and the figures are left out from then on; training goes on.

Under ``ddp_spawn`` Lightning calls ``on_exception`` in the launching process only; a
worker that raises finishes its run at interpreter exit instead (the interrupted phase is
recorded with ``"error": true``, an open trace window is saved).
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable, Mapping
from typing import Any

try:
    from lightning.pytorch import Callback, LightningModule, Trainer
except ImportError as exc:
    raise ImportError(
        "rankscope.integrations.lightning needs lightning, which is not installed: "
        'pip install "rankscope[lightning]"'
    ) from exc

from .._errors import ConfigError
from .._log import get_logger
from .._profiler import Profiler
from ..config._config import PathLike, ProfileConfig
from ._common import CallbackRun, first_step, guarded

__all__ = ["RankscopeCallback"]

logger = get_logger(__name__)

FORWARD = "forward"
BACKWARD = "backward"
OPTIMIZER = "optimizer"
VALIDATION = "validation"


# Callback is Any to mypy (lightning is not followed); subclassing it is the point.
class RankscopeCallback(Callback, CallbackRun):  # type: ignore[misc]
    """A `lightning.pytorch.Callback` that profiles `Trainer.fit()` with a rankscope `Profiler`.

    `config` is a `ProfileConfig`, a mapping as `ProfileConfig.from_dict` takes, a path to
    a YAML file (`ProfileConfig.from_yaml`), or None for the defaults (everything off
    unless RANKSCOPE_* variables turn it on). It is checked here, the RANKSCOPE_*
    variables included: a bad value raises `ConfigError`. Rank and world size come from
    the Trainer (`global_rank`, `world_size`) when training starts; `rank` and
    `world_size` override them. `environ` stands in for `os.environ` (tests pass it).

    `profiler` is the Profiler of the current (or last) `fit()` in this process, None
    before the first. Under a spawn strategy each worker holds its own; the launching
    process's stays None.
    """

    _WHAT = "Lightning integration"

    def __init__(
        self,
        config: ProfileConfig | Mapping[str, Any] | PathLike | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        self._setup(config, rank, world_size, environ)
        self._global_step = 0  # trainer.global_step at the last profiler step
        self._at_exit: Callable[[], None] | None = None

    # -- start and stop ----------------------------------------------------------------

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Start a Profiler for this fit; a rank selection beyond the world size raises ConfigError."""
        if self._run is not None:
            # The previous fit ended without on_train_end or on_exception reaching us.
            logger.info("rankscope: the previous fit did not end; closing its run first")
            self._finish(interrupted=True)
        if self.profiler is not None:
            logger.warning(
                "rankscope: fit() called again with the same RankscopeCallback; its records "
                "go into %s with steps counted from the trainer's global step again (give each run "
                "its own output_dir)",
                self.config.output_dir,
            )
        rank = trainer.global_rank if self._rank is None else self._rank
        world_size = trainer.world_size if self._world_size is None else self._world_size
        try:
            profiler = Profiler(
                self.config,
                rank=rank,
                world_size=world_size,
                environ=self._environ,
                first_step=first_step(trainer.global_step),
            )
        except ConfigError:
            raise  # a rank selection beyond the world size: the user's to see
        except Exception as exc:
            self._fault("on_train_start", exc)
            return
        self.profiler = self._run = profiler
        try:
            self._global_step = trainer.global_step
            profiler.start()
            self._at_exit = self._close_at_exit(os.getpid())
            atexit.register(self._at_exit)  # registered after the Profiler's own: runs first
        except Exception as exc:
            self._fault("on_train_start", exc)
            return
        if trainer.is_global_zero:
            self._figures()  # starts the reader: the figures are fresh by the first log

    @guarded
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish(interrupted=False)

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        """Record the phase the exception cut short as an error, save an open window, stop."""
        if self._run is None:
            return
        try:
            self._finish(interrupted=True, exception=exception)
        except Exception as exc:  # the user's exception goes on; ours is only logged
            logger.warning(
                "rankscope: stopping the profiler after %s failed: %s: %s",
                type(exception).__name__,
                type(exc).__name__,
                exc,
            )

    @guarded
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Reached with a run still open only when fit ended another way (the tuner's exit).
        self._finish(interrupted=False)

    # -- phases and steps --------------------------------------------------------------

    @guarded
    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._open(FORWARD)

    @guarded
    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: Any) -> None:
        self._open(BACKWARD)

    @guarded
    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._close()

    @guarded
    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: LightningModule, optimizer: Any
    ) -> None:
        self._open(OPTIMIZER)

    @guarded
    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self._close()
        global_step = trainer.global_step
        # One profiler step per batch that stepped an optimizer: accumulating batches
        # belong to the step they feed, and several optimizers stepped in one batch
        # (manual optimization) make one step, not several empty ones.
        if global_step != self._global_step and self._run is not None:
            self._global_step = global_step
            self._run.step()
            if trainer.is_global_zero and global_step % trainer.log_every_n_steps == 0:
                self._log_figures(trainer, global_step)

    @guarded
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # A batch skipped by on_train_batch_start returning -1 never reaches on_train_batch_end.
        self._close()

    @guarded
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._open(VALIDATION, "eval")

    @guarded
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._close()

    # -- inside ------------------------------------------------------------------------

    def _log_figures(self, trainer: Trainer, step: int) -> None:
        figures = self._figures()
        if not figures:
            return
        for each in trainer.loggers:
            try:
                each.log_metrics(figures, step=step)
            except Exception as exc:  # the user's logger: its fault must not end training
                self._figures_fault(f"logging rankscope's figures to {type(each).__name__}", exc)
                return

    def _close_at_exit(self, pid: int) -> Callable[[], None]:
        def close() -> None:
            # A forked child (a data-loader worker) inherits atexit handlers; the run is
            # its parent's to finish.
            if os.getpid() == pid and self._run is not None:
                self._finish(interrupted=True)

        return close

    def __getstate__(self) -> dict[str, Any]:
        # A spawn strategy pickles the Trainer with its callbacks; a live run stays here.
        state = self.__dict__.copy()
        state.update(profiler=None, _run=None, _phase=None, _at_exit=None)
        return state
