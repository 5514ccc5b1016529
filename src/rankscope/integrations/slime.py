"""slime integration: rankscope inside slime's Megatron training, through slime's own hooks.

One flag on slime's command line turns it on::

    --custom-megatron-before-train-step-hook-path rankscope.integrations.slime.before_train_step

and a second, optional one checks the config when Megatron starts, before any rollout
(a bad value then stops the job in seconds, not after the first rollout)::

    --custom-megatron-init-path rankscope.integrations.slime.init

slime loads both by dotted path (``slime.utils.misc.load_function``) and calls them on
every training rank: ``init(args)`` at the end of Megatron's initialisation,
``before_train_step(args, rollout_id, step_id, model, optimizer, opt_param_scheduler)``
in ``train_one_step``, after the gradients are zeroed and before the forward pass.

The config (`config_from_args`) is read from slime's own arguments, mapped:

- ``use_pytorch_profiler`` turns the trace on; ``profile_step_start`` and
  ``profile_step_end`` (slime counts rollouts there) become the train steps of those
  rollouts, ``profile_ranks`` (default ``[0]``) the ranks that trace;
  ``profile_target`` must name ``train_overall`` or ``train_actor`` (the train steps;
  rankscope does not trace slime's log-prob passes).
- ``record_memory_history`` turns memory snapshots on, on the same ranks.
- ``tensorboard_dir`` (where slime writes its traces) holds the run directory,
  ``<tensorboard_dir>/rankscope``, where no output_dir is given.
- ``rankscope`` (a mapping of ProfileConfig fields or a YAML path; slime's
  ``--custom-config-path`` YAML sets it) is rankscope's own config and wins over the
  mapped fields; the RANKSCOPE_* variables win over both.

slime's profiler records every op's shapes, stacks, memory and FLOPs; rankscope keeps
all four off unless asked (``rankscope: {trace: {record_shapes: true}}``): they are
what fills host memory in a long window. The phase timer is on (every rank, one step in
ten), which is what the straggler analysis reads.

Each train step is one rankscope step, numbered ``rollout_id * steps_per_rollout +
step_id`` so a resumed run keeps its numbers. Its phases:

- ``data`` (kind "data"): from the hook to the first forward of the step's model
  chunks: the first micro-batch's ``get_batch``.
- ``forward_backward``: from that forward to the gradients' reduction: every
  micro-batch's forward and backward, the pipeline's sends and receives (and a
  reduction Megatron overlaps with backward).
- ``grad_sync`` (kind "comm"): Megatron's ``finalize_model_grads_func`` (the model
  chunks' ``config``), called once a step after the last backward: the data-parallel
  gradient reduction's end, the embedding and layernorm all-reduces. The ranks that
  wait for a slow one wait here, and the records say it is a collective.
- ``optimizer``: ``optimizer.step()`` (Megatron's: gradient clipping, the update, the
  parameter all-gather of a distributed optimizer).
- ``between_steps`` (kind "data"): from the end of one step to the next hook; at a
  rollout's first step it holds the rollout (generation, rewards, log-probs).

The timings are flushed at the end of every rollout (slime's Ray actors are killed when
training ends, with what they had not written), and the run ends after the last train
step that ``num_rollout`` says; where it is not set, at interpreter exit.

A fault inside rankscope is logged once and turns it off on that rank; training goes
on. A config value with no rankscope meaning raises ConfigError naming slime's field.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._errors import ConfigError
from .._log import get_logger
from .._profiler import Profiler
from ..config._config import ProfileConfig
from ._common import ProcessRun, merged, plain

__all__ = ["before_train_step", "config_from_args", "init"]

logger = get_logger(__name__)

DATA = "data"
FORWARD_BACKWARD = "forward_backward"
OPTIMIZER = "optimizer"
GRAD_SYNC = "grad_sync"
BETWEEN_STEPS = "between_steps"

_TARGETS = ("train_overall", "train_actor")
"""slime's profile targets that are its train steps, the steps rankscope counts."""


def init(args: Any) -> None:
    """slime's ``--custom-megatron-init-path``: check the config now, on every rank.

    The Profiler itself starts at the first train step, where the step's number is known.
    """
    _RUN.check(args)


def before_train_step(  # noqa: PLR0917 - slime's hook signature, called positionally
    args: Any,
    rollout_id: int,
    step_id: int,
    model: Sequence[Any],
    optimizer: Any,
    opt_param_scheduler: Any,
) -> None:
    """slime's ``--custom-megatron-before-train-step-hook-path``: one train step begins."""
    _RUN.train_step(args, rollout_id, step_id, model, optimizer)


def config_from_args(args: Any, environ: Mapping[str, str] | None = None) -> ProfileConfig:
    """The ProfileConfig slime's `args` ask for (the module docstring says the mapping);
    ConfigError names the slime field whose value has no rankscope meaning."""
    own = getattr(args, "rankscope", None)
    if own is None:
        data: dict[str, Any] = {}
    elif isinstance(own, Mapping):
        data = plain(own)
    elif isinstance(own, (str, os.PathLike)):
        data = ProfileConfig.from_yaml(own).to_dict()
    else:
        raise ConfigError("rankscope", own, "a mapping of ProfileConfig fields or a YAML path")
    # Records are flushed at each rollout's end: slime's Ray actors are killed when
    # training ends, and what a rank had not flushed would be lost with them.
    mapped: dict[str, Any] = {
        "timer": {"enable": True, "flush_every_n_steps": steps_per_rollout(args)}
    }
    tensorboard = getattr(args, "tensorboard_dir", None)
    if tensorboard:
        mapped["output_dir"] = os.path.join(str(tensorboard), "rankscope")
    ranks = _ranks(getattr(args, "profile_ranks", None))
    if getattr(args, "use_pytorch_profiler", False):
        mapped["trace"] = {"enable": True, "ranks": ranks, "schedule": _window(args)}
    if getattr(args, "record_memory_history", False):
        mapped["memory"] = _memory(args, ranks)
    config = ProfileConfig.from_dict(merged(mapped, data))
    config.with_env(environ)  # a bad RANKSCOPE_* value fails here, not at the first step
    return config


def steps_per_rollout(args: Any) -> int:
    """Train steps in one rollout: ``num_steps_per_rollout``, else slime's
    ``rollout_batch_size * n_samples_per_prompt // global_batch_size``."""
    given = getattr(args, "num_steps_per_rollout", None)
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int) or given < 1:
            raise ConfigError("num_steps_per_rollout", given, "an int >= 1")
        return given
    try:
        steps = (
            int(args.rollout_batch_size)
            * int(args.n_samples_per_prompt)
            // int(args.global_batch_size)
        )
    except (AttributeError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise ConfigError(
            "num_steps_per_rollout",
            given,
            "set, or rollout_batch_size, n_samples_per_prompt and global_batch_size set "
            f"(rankscope numbers train steps by rollout; {type(exc).__name__}: {exc})",
        ) from exc
    if steps < 1:
        raise ConfigError(
            "global_batch_size",
            args.global_batch_size,
            "at most rollout_batch_size * n_samples_per_prompt (one train step per rollout at least)",
        )
    return steps


def _ranks(value: object) -> object:
    """Megatron's ``profile_ranks`` (a list of ints, [0] by default) as rankscope ranks."""
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return "0"  # Megatron's default: rank 0 alone
    if isinstance(value, str):
        return value  # "all", "0-7": rankscope's own forms, checked by the config
    if isinstance(value, (list, tuple)) and all(type(r) is int and r >= 0 for r in value):
        return list(value)
    raise ConfigError("profile_ranks", value, 'a list of ranks >= 0 (Megatron\'s [0]) or "all"')


def _window(args: Any) -> dict[str, int]:
    """slime's rollouts [profile_step_start, profile_step_end) as a schedule of train steps."""
    targets = getattr(args, "profile_target", None) or ["train_overall"]
    if isinstance(targets, str):
        targets = [targets]
    if not any(t in _TARGETS for t in targets):
        raise ConfigError(
            "profile_target",
            targets,
            "train_overall or train_actor: rankscope traces slime's train steps, not its "
            "log-prob passes",
        )
    start = getattr(args, "profile_step_start", 10)
    end = getattr(args, "profile_step_end", 12)
    for name, value in (("profile_step_start", start), ("profile_step_end", end)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(name, value, "an int >= 0 (a rollout)")
    if end <= start:
        raise ConfigError("profile_step_end", end, f"a rollout after profile_step_start={start}")
    per = steps_per_rollout(args)
    first = start * per
    # One warm-up step before the window where there is one, as slime's schedule has.
    warmup = 1 if first > 0 else 0
    return {
        "skip_first": first - warmup,
        "wait": 0,
        "warmup": warmup,
        "active": (end - start) * per,
        "repeat": 1,
    }


def _memory(args: Any, ranks: object) -> dict[str, Any]:
    recorder = getattr(args, "memory_recorder", "torch")
    if recorder != "torch":
        raise ConfigError(
            "memory_recorder", recorder, '"torch": rankscope records the CUDA allocator\'s history'
        )
    steps = getattr(args, "memory_snapshot_num_steps", None)
    if steps is not None:
        raise ConfigError(
            "memory_snapshot_num_steps",
            steps,
            "None: rankscope dumps a snapshot when a trace window closes and on an out-of-memory "
            "error, not after a number of rollouts",
        )
    return {"enable": True, "ranks": ranks}


class _SlimeRun(ProcessRun):
    """This process's run: its Profiler, the phase a hook opened, the step it is at."""

    _WHAT = "slime integration"

    def __init__(self) -> None:
        super().__init__()
        self._config: ProfileConfig | None = None
        self._per_rollout = 1
        self._last: int | None = None  # the run's last train step, where num_rollout says it
        self._hooked: set[int] = set()  # ids of the model chunks and optimizers wrapped
        self._in_step = False  # between the hook and optimizer.step's end
        self._step = -1  # the train step in progress (or last), as numbered here
        self._forward_seen = False

    def check(self, args: Any) -> ProfileConfig:
        if self._config is None:
            self._config = config_from_args(args)
            self._per_rollout = steps_per_rollout(args)
            rollouts = getattr(args, "num_rollout", None)
            if type(rollouts) is int and rollouts > 0:
                self._last = rollouts * self._per_rollout - 1
        return self._config

    def train_step(
        self, args: Any, rollout_id: int, step_id: int, model: Sequence[Any], optimizer: Any
    ) -> None:
        if self.off:
            return
        if self.profiler is None:
            config = self.check(args)  # a ConfigError is the user's: it stops the job
            self._start(config, rollout_id * self._per_rollout + step_id)
            if self.profiler is None:
                return
        try:
            self._wrap(model, optimizer)
            if self._in_step:  # the last step never reached optimizer.step(): it ends here
                self._end_step()
            self._open(DATA, "data")
            self._in_step, self._forward_seen = True, False
            self._step = rollout_id * self._per_rollout + step_id
        except Exception as exc:
            self._fault("before_train_step", exc)

    # -- inside ------------------------------------------------------------------------

    def _start(self, config: ProfileConfig, first: int) -> None:
        try:
            profiler = Profiler(config, first_step=first)
            profiler.start()
        except ConfigError:
            raise  # ranks beyond the world size: the user's to see
        except Exception as exc:
            self._fault("starting the profiler", exc)
            return
        self.profiler = profiler
        self._stop_at_exit()

    def _wrap(self, model: Sequence[Any], optimizer: Any) -> None:
        """Mark the first forward of each step, time the gradients' reduction and
        optimizer.step(), once per object."""
        chunks = model if isinstance(model, (list, tuple)) else [model]
        for chunk in chunks:
            if id(chunk) not in self._hooked and hasattr(chunk, "register_forward_pre_hook"):
                chunk.register_forward_pre_hook(self._forward_began)
                self._hooked.add(id(chunk))
            # Megatron's schedules call config.finalize_model_grads_func once a step, after
            # the last backward: the data-parallel reduction of the gradients (and the
            # embedding and layernorm all-reduces). Timed as a comm phase, the ranks that
            # wait there are known to wait in a collective, not guessed from their exits.
            config = getattr(chunk, "config", None)
            finalize = getattr(config, "finalize_model_grads_func", None)
            if config is not None and callable(finalize) and id(config) not in self._hooked:
                config.finalize_model_grads_func = self._timed(finalize, GRAD_SYNC, "comm")
                self._hooked.add(id(config))
        if id(optimizer) not in self._hooked and callable(getattr(optimizer, "step", None)):
            optimizer.step = self._timed(optimizer.step, OPTIMIZER, "compute", self._step_done)
            self._hooked.add(id(optimizer))

    def _forward_began(self, *_: Any) -> None:
        if self._forward_seen or not self._in_step or self.off:
            return
        self._forward_seen = True
        try:
            self._open(FORWARD_BACKWARD)
        except Exception as exc:
            self._fault("the first forward", exc)

    def _timed(
        self, fn: Callable[..., Any], name: str, kind: str, then: Callable[[], None] | None = None
    ) -> Callable[..., Any]:
        """`fn` run as phase `name` inside a train step; the phase ends with it, and
        `then` (the step's end, for optimizer.step) runs after it."""
        after = self._close if then is None else then

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self._in_step or self.off or self.profiler is None:
                return fn(*args, **kwargs)
            try:
                self._open(name, kind)
            except Exception as exc:
                self._fault(name, exc)
            try:
                return fn(*args, **kwargs)
            except BaseException as exc:
                self._close(exc)
                raise
            finally:
                if not self.off:
                    try:
                        after()
                    except Exception as exc:
                        self._fault(name, exc)

        return timed

    def _step_done(self) -> None:
        """optimizer.step() returned: the train step ends; the run too after its last."""
        self._end_step()
        if self._step == self._last:
            self._finish(interrupted=False)
        else:
            self._open(BETWEEN_STEPS, "data")

    def _end_step(self) -> None:
        self._close()
        self._in_step = False
        if self.profiler is not None:
            self.profiler.step()

    def _interrupted_at_exit(self) -> bool:
        return self._in_step


_RUN = _SlimeRun()
