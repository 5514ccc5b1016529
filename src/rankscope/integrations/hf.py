"""Hugging Face Trainer integration: `RankscopeCallback` profiles a `transformers.Trainer` run.

::

    from rankscope.integrations.hf import RankscopeCallback

    trainer = Trainer(model, args, train_dataset=ds, callbacks=[RankscopeCallback("rankscope.yaml")])
    trainer.train()

The callback holds one `Profiler` per `train()` call and calls it at the Trainer's
events; it adds nothing of its own. Steps count optimizer steps (with gradient
accumulation, one step covers all its micro-batches). Phases, each bounded by two
events of transformers' Trainer (>= 4.45; checked against 5.23):

- ``between_steps`` (kind "data"): from the end of one optimizer step (``on_step_end``;
  ``on_train_begin`` for the first) to the beginning of the next (``on_step_begin``):
  fetching the step's batches (every micro-batch is fetched up front), counting their
  tokens (an all-gather across ranks by default), and whatever logging, checkpointing
  and evaluation followed the previous step.
- ``forward_backward``: ``on_step_begin`` to ``on_pre_optimizer_step``: forward and
  backward of every micro-batch (DDP's gradient all-reduce runs inside the last
  backward), then gradient clipping and the gradient norm.
- ``optimizer``: ``on_pre_optimizer_step`` to ``on_optimizer_step``: ``optimizer.step()``.

Two phases nested in those (depth 1), because the collective at the end of each hides
what ran before it: every rank leaves ``between_steps`` and ``forward_backward``
together, so a rank slow in its data or its forward shows only in a phase inside them.

- ``fetch`` (kind "data", inside ``between_steps``): the step's ``next()`` calls on the
  epoch iterator (loading and collating every micro-batch), timed by handing the
  Trainer's ``get_batch_samples`` an iterator that counts them; the token count's
  all-gather that follows is not in it. The Trainer is found up the stack when training
  begins; where it is not, or has no ``get_batch_samples``, there is no ``fetch``.
- ``forward`` (inside ``forward_backward``): each micro-batch's forward of the model the
  Trainer hands its events (pre- and post-forward hooks on it), summed over the step.
  Forwards outside ``forward_backward`` (evaluation) are not timed.

rankscope's figures (``rankscope/...``, docs/timer.md) join the logs the Trainer sends at
its logging steps, on its process 0 (the one whose logs its integrations send): every
``report_to`` integration gets them, and ``trainer.state.log_history`` holds them.
``on_log`` adds them to the logs dict that the Trainer then hands each callback in turn,
so the callback places itself, when training begins, ahead of the callbacks that handle
logs (the ``report_to`` integrations come first in the Trainer's list otherwise).

TrainerCallback has no event for an exception. A run that ends with one is finished by
the next ``train()`` of the same callback, by `RankscopeCallback.close()`, or at
interpreter exit, whichever comes first: the interrupted phase is recorded with
``"error": true``, an open trace window is closed and saved, and the timings are flushed.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

try:
    import transformers
    from transformers import TrainerCallback
except ImportError as exc:
    raise ImportError(
        "rankscope.integrations.hf needs transformers, which is not installed: "
        'pip install "rankscope[hf]"'
    ) from exc

from .._log import get_logger
from .._profiler import Profiler
from ..config._config import PathLike, ProfileConfig
from ._common import CallbackRun, enter_phase, first_step, guarded, leave_phase

if not hasattr(TrainerCallback, "on_pre_optimizer_step"):
    # The event that separates the optimizer from forward/backward came in 4.45.
    raise ImportError(
        "rankscope.integrations.hf needs transformers>=4.45 (for the on_pre_optimizer_step "
        f'event); found {transformers.__version__}: pip install "transformers>=4.45"'
    )

__all__ = ["RankscopeCallback"]

logger = get_logger(__name__)

_BETWEEN_STEPS = "between_steps"
_FORWARD_BACKWARD = "forward_backward"
_OPTIMIZER = "optimizer"
_FETCH = "fetch"
_FORWARD = "forward"
_FRAMES_UP = 4  # _log_first is called two frames below call_event
_TRAINER_UP = 8  # the Trainer's _inner_training_loop is two frames above call_event
_NO_LOG = TrainerCallback.on_log


# TrainerCallback is Any to mypy (transformers is not followed); subclassing it is the point.
class RankscopeCallback(TrainerCallback, CallbackRun):  # type: ignore[misc]
    """A `transformers.TrainerCallback` that profiles training with a rankscope `Profiler`.

    `config` is a `ProfileConfig`, a mapping as `ProfileConfig.from_dict` takes, a path to
    a YAML file (`ProfileConfig.from_yaml`), or None for the defaults (everything off
    unless RANKSCOPE_* variables turn it on). It is checked here, the RANKSCOPE_*
    variables included: a bad value raises `ConfigError`. Rank and world size come from
    the Trainer's `TrainingArguments` (`process_index`, `world_size`) when training
    begins; `rank` and `world_size` override them. `environ` stands in for `os.environ`
    (tests pass it).

    `profiler` is the Profiler of the current (or last) `train()` call, None before the
    first; use it to add phases of your own (`with callback.profiler.phase("loss"): ...`).
    """

    _WHAT = "Trainer integration"

    def __init__(
        self,
        config: ProfileConfig | Mapping[str, Any] | PathLike | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._setup(config, rank, world_size, environ)
        self._nested: Any = None  # the phase nested in the open one (fetch, forward)
        self._open_name: str | None = None  # the open phase's name
        self._undo: list[Callable[[], None]] = []  # takes the hooks and the wrapper off

    # -- Trainer events ----------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Start a Profiler for this `train()` call; a bad rank selection raises ConfigError."""
        if self._run is not None:
            # The previous train() ended with an exception (auto_find_batch_size retries
            # after an out-of-memory error; a notebook runs the cell again).
            logger.info("rankscope: the previous train() did not end; closing its run first")
            self._finish(interrupted=True)
        if self.profiler is not None:
            logger.warning(
                "rankscope: training began again with the same RankscopeCallback (a second "
                "train(), or auto_find_batch_size retrying); its records go into %s with steps "
                "counted from the Trainer's global step again (give each train() its own callback "
                "and output_dir)",
                self.config.output_dir,
            )
        rank = args.process_index if self._rank is None else self._rank
        world_size = args.world_size if self._world_size is None else self._world_size
        # A ConfigError here (a rank selection beyond the world size) is the user's to see.
        profiler = Profiler(
            self.config,
            rank=rank,
            world_size=world_size,
            environ=self._environ,
            first_step=first_step(getattr(state, "global_step", 0)),
        )
        self.profiler = self._run = profiler
        try:
            profiler.start()
            self._at_exit = self._close_at_exit(os.getpid())
            atexit.register(self._at_exit)  # registered after the Profiler's own: runs first
            self._open(_BETWEEN_STEPS, "data")
            self._time_forward(kwargs.get("model"))
            self._time_fetch()
        except Exception as exc:
            self._fault("on_train_begin", exc)
            return
        if state.is_world_process_zero:
            try:
                self._log_first()
            except Exception as exc:
                self._figures_fault("placing the callback ahead of the Trainer's loggers", exc)
            self._figures()  # starts the reader: the figures are fresh by the first log

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        """Add rankscope's figures to a training log on the Trainer's process 0."""
        if self._run is None or logs is None or not state.is_world_process_zero:
            return
        if any(key.startswith(("eval_", "test_")) for key in logs):
            return  # an evaluation's log: the figures belong to training's
        figures = self._figures()
        if not figures:
            return
        try:
            # The Trainer appended a copy of the logs to log_history before this event.
            history = state.log_history
            entry = history[-1] if history and set(logs) <= set(history[-1]) else None
            logs.update(figures)
            if entry is not None:
                entry.update(figures)
        except Exception as exc:
            self._figures_fault("adding rankscope's figures to the Trainer's logs", exc)

    @guarded
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._open(_FORWARD_BACKWARD)

    @guarded
    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._open(_OPTIMIZER)

    @guarded
    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close()

    @guarded
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close()
        if self._run is not None:
            self._run.step()
        # No between_steps after the last step: it would open a step that never runs.
        if state.global_step < state.max_steps and not control.should_training_stop:
            self._open(_BETWEEN_STEPS, "data")

    @guarded
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._finish(interrupted=False)

    # -- closing -------------------------------------------------------------------------

    def close(self) -> None:
        """Finish a run that an exception interrupted: record the phase it was in as an
        error, close and save an open trace window, flush the timings.

        For code that catches the Trainer's exception and goes on (a notebook); a process
        that exits does this by itself. Does nothing when no run is open.
        """
        if self._run is not None:
            self._finish(interrupted=True)

    def __enter__(self) -> RankscopeCallback:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inside ------------------------------------------------------------------------

    def _log_first(self) -> None:
        """Move this callback ahead of the first callback that handles logs, so that every
        one of them gets the figures on_log adds.

        A callback's events are not given the Trainer's CallbackHandler: it is found up
        the stack, as the `self` of the frame that calls this event (transformers'
        `CallbackHandler.call_event`), whose `callbacks` list holds this callback.
        """
        frame: FrameType | None = sys._getframe(1)
        for _ in range(_FRAMES_UP):
            if frame is None:
                break
            callbacks = getattr(frame.f_locals.get("self"), "callbacks", None)
            if isinstance(callbacks, list) and any(c is self for c in callbacks):
                mine = next(i for i, c in enumerate(callbacks) if c is self)
                first = next(
                    (i for i, c in enumerate(callbacks) if type(c).on_log is not _NO_LOG), mine
                )
                if first < mine:
                    # call_event iterates this list now: moving back an element it passed
                    # makes it neither skip a callback nor call one twice.
                    callbacks.insert(first, callbacks.pop(mine))
                return
            frame = frame.f_back
        logger.warning(
            "rankscope: the Trainer's callback list was not found, so rankscope's figures "
            "reach only the callbacks after RankscopeCallback in it (add it with "
            "Trainer(callbacks=[...]) or trainer.add_callback())"
        )

    def _open(self, name: str, kind: str = "compute") -> None:
        super()._open(name, kind)
        self._open_name = name

    def _close(self, exception: BaseException | None = None) -> None:
        self._unnest(exception)  # a forward that raised never reached its post-hook
        self._open_name = None
        super()._close(exception)

    def _finish(self, interrupted: bool, exception: BaseException | None = None) -> None:
        undo, self._undo = self._undo, []
        for step in undo:
            try:
                step()
            except Exception:  # the model or the Trainer is gone: nothing left to undo
                logger.debug("rankscope: taking a hook off failed", exc_info=True)
        super()._finish(interrupted, exception)

    def _nest(self, name: str, kind: str, inside: str) -> None:
        """Enter `name` nested in the open phase where that is `inside` (else nothing)."""
        self._unnest()
        if self._run is not None and self._open_name == inside:
            self._nested = enter_phase(self._run, name, kind)

    def _unnest(self, exception: BaseException | None = None) -> None:
        phase, self._nested = self._nested, None
        leave_phase(phase, exception)

    def _quietly(self, where: str, action: Callable[[], None]) -> None:
        """Run `action` from inside the Trainer's own code: a fault turns rankscope off."""
        if self._run is None:
            return
        try:
            action()
        except Exception as exc:
            self._fault(where, exc)

    def _time_forward(self, model: Any) -> None:
        """Hooks on `model` that time each forward inside forward_backward as ``forward``."""
        if model is None or not hasattr(model, "register_forward_pre_hook"):
            return

        def enter(*_: Any) -> None:
            self._quietly(
                "timing the forward", lambda: self._nest(_FORWARD, "compute", _FORWARD_BACKWARD)
            )

        def leave(*_: Any) -> None:
            self._quietly("timing the forward", self._unnest)

        before = model.register_forward_pre_hook(enter)
        after = model.register_forward_hook(leave)
        self._undo += [before.remove, after.remove]

    def _time_fetch(self) -> None:
        """Time the batch fetch as ``fetch``: the Trainer's get_batch_samples, found up the
        stack, is handed an iterator that times the `num_batches` batches it takes."""
        trainer = self._trainer()
        fetch = getattr(trainer, "get_batch_samples", None)
        if fetch is None:
            logger.info("rankscope: the Trainer's get_batch_samples was not found: no fetch phase")
            return

        def timed(epoch_iterator: Any, num_batches: int, *args: Any, **kwargs: Any) -> Any:
            counted = _Counted(epoch_iterator, num_batches, self)
            try:
                return fetch(counted, num_batches, *args, **kwargs)
            finally:
                counted.done()

        trainer.get_batch_samples = timed
        self._undo.append(lambda: vars(trainer).pop("get_batch_samples", None))

    def _trainer(self) -> Any:
        """The Trainer whose events call this callback, found up the stack (None if not)."""
        frame: FrameType | None = sys._getframe(1)
        for _ in range(_TRAINER_UP):
            if frame is None:
                return None
            handler = getattr(frame.f_locals.get("self"), "callback_handler", None)
            if any(c is self for c in getattr(handler, "callbacks", ())):
                return frame.f_locals["self"]
            frame = frame.f_back
        return None

    def _close_at_exit(self, pid: int) -> Callable[[], None]:
        def close() -> None:
            # A forked child inherits atexit handlers; the run is its parent's to finish.
            if os.getpid() == pid:
                self.close()

        return close


class _Counted:
    """The epoch iterator handed to get_batch_samples: the `n` batches it takes are timed
    as one ``fetch`` phase, from the first ``next()`` to the `n`-th (or the iterator's
    end); any later ``next()`` passes through untimed."""

    def __init__(self, iterator: Any, n: int, callback: RankscopeCallback) -> None:
        self._iterator, self._left, self._callback = iterator, n, callback
        self._timing = False

    def __iter__(self) -> _Counted:
        return self

    def __next__(self) -> Any:
        if self._left > 0 and not self._timing:
            self._timing = True
            self._callback._quietly(
                "timing the batch fetch",
                lambda: self._callback._nest(_FETCH, "data", _BETWEEN_STEPS),
            )
        try:
            return next(self._iterator)
        except StopIteration:  # the epoch's end: no more batches, and the all-gather follows
            self._left = 0
            raise
        finally:  # a fault: get_batch_samples' wrapper closes it on the way out
            self._left -= 1
            if self._left <= 0:
                self.done()

    def done(self) -> None:
        if self._timing:
            self._timing = False
            self._callback._quietly("timing the batch fetch", self._callback._unnest)
