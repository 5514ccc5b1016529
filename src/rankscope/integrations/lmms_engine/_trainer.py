"""rankscope inside lmms-engine's trainers: its profiling fields mapped, its phases timed.

``install()`` (or the launcher, ``python -m rankscope.integrations.lmms_engine`` in place
of ``python -m lmms_engine.launch.cli``) changes two classes of lmms-engine, so that every
trainer built on them runs rankscope, whatever ``trainer_type`` names:

- ``FSDP2SFTTrainer`` (``fsdp2_trainer``; Bagel's, RAE's and SiT's are subclasses): after
  its constructor, its ``cuda_event_profiler`` is an ``LmmsTimer``, which takes the same
  calls (``record(name, step)``, ``maybe_flush``, ``flush``, ``close``) and times them
  with rankscope's phase timer, and its ``step_profiler`` and ``memory_snapshot_profiler``
  are lmms-engine's own, turned off: rankscope's trace windows and memory snapshots do
  their work, from the fields below.
- lmms-engine's HF ``Trainer`` (``hf_trainer``; the dLLM and WAN trainers are subclasses):
  rankscope's HF callback (``rankscope.integrations.hf``) is added to it.

What is mapped from ``trainer_args``:

- ``output_dir`` holds the run directory, ``<output_dir>/rankscope``.
- The timer is on, on every rank. ``cuda_event_profiler_config``: ``start_step`` and
  ``end_step`` (the last step recorded) bound the sampled steps, ``record_every_n_steps``
  is ``timer.every_n_steps``, ``flush_every_n_steps`` the timer's, ``ranks`` the ranks
  that time (every rank when absent: the straggler analysis compares them). On a CUDA
  rank the timer reads the GPU's time with CUDA events, as lmms-engine's profiler does.
- ``enable_profiler`` with ``profiler_config{start_step, end_step}``: one trace window,
  as lmms-engine's StepProfiler schedules it (``start_step`` steps idle, one of warm-up,
  then up to ``end_step``), on rank 0 (rankscope's default; lmms-engine traces every
  rank). Its ``record_shapes``, ``profile_memory`` and ``with_stack`` stay off, the
  options that fill host memory; rankscope's own config turns them on.
- ``enable_memory_snapshot`` with ``memory_snapshot_config{max_entries}``: the CUDA
  allocator's history on every rank, dumped when a trace window closes and on
  out-of-memory. ``stop_step`` has no rankscope meaning (a snapshot is taken when a
  window closes) and is refused, naming the field.

``install(config)``'s own fields (a ProfileConfig or a mapping of its fields) win over
the mapped ones; the RANKSCOPE_* variables win over both. A value with no rankscope
meaning raises ConfigError naming lmms-engine's field, before training starts.

Phases of an FSDP2 trainer: lmms-engine's own, ``host_to_device`` (kind "io"),
``training_step`` (the forward, the backward and, at the end of an accumulation, the
optimizer step) and ``training_metrics``; the time from one micro-batch's
``maybe_flush`` to the next ``record`` is ``next_batch`` (kind "data"): the data
loader's next batch, the trainer's logging and, on a save step, the checkpoint. A step is
lmms-engine's ``global_step`` (micro-batches of one step under gradient accumulation are
the same phases again). It ends at the ``maybe_flush`` of its last micro-batch, so that
``next_batch`` opens the step whose batch it loads: a rank slow there is late at the
next ``training_step`` by its own step's work, which is how the analysis tells the rank
that waits from the one it waits for. A fault inside rankscope is logged once and turns it off in that
process; training goes on.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

from ..._errors import ConfigError
from ..._intake import as_config
from ..._profiler import Profiler
from ...config._config import ProfileConfig
from .._common import ProcessRun, enter_phase, first_step, leave_phase, merged, plain
from ._events import KINDS

__all__ = ["GAP", "LmmsTimer", "config_from_args", "install"]

GAP = "next_batch"
"""The phase from one micro-batch's end to the next one's ``host_to_device``."""

_ARGS = "trainer_args"
_FSDP2 = "lmms_engine.train.fsdp2.fsdp2_trainer"
_HF = "lmms_engine.train.hf.trainer"
_TIMER_FIELDS = {
    "start_step": "start_step",
    "end_step": "end_step",
    "record_every_n_steps": "every_n_steps",
    "flush_every_n_steps": "flush_every_n_steps",
    "ranks": "ranks",
}

_own: dict[str, Any] = {}
"""install(config)'s fields, laid over what trainer_args map to (install() replaces them)."""


def install(config: object = None) -> None:
    """Make lmms-engine's FSDP2 and HF trainers (and every subclass) run rankscope (see
    the module). `config` is rankscope's own (a ProfileConfig or a mapping of its
    fields), over what ``trainer_args`` map to; calling it again replaces it."""
    own: dict[str, Any] = {}
    if isinstance(config, Mapping):
        own = plain(config)
        ProfileConfig.from_dict(own)  # a bad field fails here, not at the trainer
    elif config is not None:
        own = as_config(config).to_dict()
    _own.clear()
    _own.update(own)
    from lmms_engine.train.fsdp2.fsdp2_trainer import FSDP2SFTTrainer
    from lmms_engine.train.hf.trainer import Trainer

    _after_init(FSDP2SFTTrainer, _attach_timer)
    _after_init(Trainer, _attach_callback)


def config_from_args(args: Any, environ: Mapping[str, str] | None = None) -> ProfileConfig:
    """The ProfileConfig lmms-engine's ``trainer_args`` ask for (the module says the
    mapping), with install(config)'s fields over it; ConfigError names the field of
    ``trainer_args`` whose value has no rankscope meaning."""
    output = getattr(args, "output_dir", None)
    if not isinstance(output, (str, os.PathLike)) or not str(output):
        raise ConfigError(f"{_ARGS}.output_dir", output, "a local path")
    mapped: dict[str, Any] = {
        "output_dir": os.path.join(str(output), "rankscope"),
        "timer": _timer(plain(getattr(args, "cuda_event_profiler_config", None))),
    }
    if getattr(args, "enable_profiler", False):
        mapped["trace"] = _trace(plain(getattr(args, "profiler_config", None)))
    if getattr(args, "enable_memory_snapshot", False):
        mapped["memory"] = _memory(plain(getattr(args, "memory_snapshot_config", None)))
    out = ProfileConfig.from_dict(merged(mapped, _own))
    out.with_env(environ)  # a bad RANKSCOPE_* value fails here, not at the first step
    return out


def _section(value: Any, name: str, known: Mapping[str, Any] | set[str]) -> dict[str, Any]:
    """``trainer_args.<name>`` as a dict of known keys (a typo would do nothing)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{_ARGS}.{name}", value, "a mapping")
    for key in value:
        if key not in known:
            raise ConfigError(f"{_ARGS}.{name}.{key}", value[key], f"one of {sorted(known)}")
    return value


def _step(value: Any, field: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{_ARGS}.{field}", value, f"an int >= {minimum}")
    return value


def _timer(section: Any) -> dict[str, Any]:
    name = "cuda_event_profiler_config"
    fields = _section(section, name, _TIMER_FIELDS)
    timer: dict[str, Any] = {"enable": True, "ranks": "all"}
    for key, value in fields.items():
        if key == "ranks":
            if not isinstance(value, list) or not all(type(r) is int and r >= 0 for r in value):
                raise ConfigError(f"{_ARGS}.{name}.ranks", value, "a list of ranks >= 0")
            timer["ranks"] = value
        elif key == "end_step":  # lmms-engine records the end step; rankscope stops before it
            if value is not None:
                timer["end_step"] = _step(value, f"{name}.end_step") + 1
        else:
            minimum = 0 if key == "start_step" else 1
            timer[_TIMER_FIELDS[key]] = _step(value, f"{name}.{key}", minimum)
    return timer


def _trace(section: Any) -> dict[str, Any]:
    name = "profiler_config"
    fields = _section(section, name, {"start_step", "end_step"})
    start = _step(fields.get("start_step", 0), f"{name}.start_step")
    end = _step(fields.get("end_step", 5), f"{name}.end_step")
    if end <= start:
        raise ConfigError(f"{_ARGS}.{name}.end_step", end, f"a step after start_step={start}")
    schedule = {"wait": start, "warmup": 1, "active": end - start, "repeat": 1}
    return {"enable": True, "schedule": schedule}


def _memory(section: Any) -> dict[str, Any]:
    name = "memory_snapshot_config"
    fields = _section(section, name, {"max_entries", "stop_step"})
    if fields.get("stop_step") is not None:
        raise ConfigError(
            f"{_ARGS}.{name}.stop_step",
            fields["stop_step"],
            "none (rankscope dumps a snapshot when a trace window closes and on "
            "out-of-memory: profiler_config's end_step ends the window)",
        )
    memory: dict[str, Any] = {"enable": True, "ranks": "all"}
    if "max_entries" in fields:
        memory["max_entries"] = _step(fields["max_entries"], f"{name}.max_entries", 1)
    return memory


# -- lmms-engine's classes, changed --------------------------------------------------------


def _after_init(cls: type, attach: Callable[[Any], None]) -> None:
    """`cls.__init__` followed by `attach(self)`; done once per class."""
    init = cls.__init__  # type: ignore[misc]  # its own or its base's
    if getattr(init, "_rankscope", False):
        return

    @functools.wraps(init)
    def run(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        attach(self)

    run._rankscope = True  # type: ignore[attr-defined]
    cls.__init__ = run  # type: ignore[misc]


def _attach_timer(trainer: Any) -> None:
    """An FSDP2 trainer's profilers: lmms-engine's turned off, rankscope's in their place."""
    from lmms_engine.utils.profiler import MemorySnapshotProfiler, StepProfiler

    args = trainer.args
    timer = LmmsTimer(  # ConfigError is the user's to see
        config_from_args(args), ends_step=lambda: trainer.accumulated_grad_steps == 0
    )
    rank = trainer.step_profiler.rank
    theirs = trainer.cuda_event_profiler
    trainer.cuda_event_profiler = timer
    with contextlib.suppress(Exception):
        theirs.close()  # its file, opened on a CUDA rank, closed empty
    trainer.step_profiler = StepProfiler(enable=False, directory=args.output_dir, rank=rank)
    trainer.memory_snapshot_profiler = MemorySnapshotProfiler(
        enable=False, directory=args.output_dir, rank=rank
    )


def _attach_callback(trainer: Any) -> None:
    """An HF trainer of lmms-engine's: rankscope's HF callback added."""
    from ..hf import RankscopeCallback

    trainer.add_callback(RankscopeCallback(config_from_args(trainer.args)))


class LmmsTimer(ProcessRun):
    """What an FSDP2 trainer holds as ``cuda_event_profiler`` once rankscope is installed:
    lmms-engine's CudaEventProfiler calls, each a rankscope phase (see the module)."""

    _WHAT = "lmms-engine integration"

    def __init__(self, config: ProfileConfig, ends_step: Callable[[], bool] | None = None) -> None:
        """`ends_step()`, asked at ``maybe_flush``, says whether the micro-batch just done
        ends its global step (the trainer's accumulation is complete); without it a step
        ends at the first ``record`` of the next."""
        super().__init__()
        self.config = config
        self._ends_step = ends_step
        self._step = 0  # the global step rankscope's profiler is at
        # The open phase (OnePhase) is next_batch, from maybe_flush to the next record.

    def should_record(self, step: int) -> bool:
        """Whether rankscope is on in this process (which steps it samples is its own)."""
        return not self.off

    @contextlib.contextmanager
    def record(self, name: str, step: int, **metadata: Any) -> Iterator[None]:
        """lmms-engine's phase `name` of its global step `step`, as a rankscope phase."""
        phase = None
        if not self.off:
            try:
                phase = self._enter(name, step, metadata)
            except Exception as exc:
                self._fault(f"record({name!r})", exc)
        error: BaseException | None = None
        try:
            yield
        except BaseException as exc:
            error = exc
            raise
        finally:
            if phase is not None:
                try:
                    leave_phase(phase, error)
                except Exception as exc:
                    self._fault(f"record({name!r})", exc)

    def maybe_flush(self, step: int) -> None:
        """The end of a micro-batch: ``next_batch`` runs until the next ``record``
        (rankscope's timer flushes on its own ``flush_every_n_steps``)."""
        profiler = self.profiler
        if profiler is None or self.off:
            return
        try:
            self._close()
            if self._ends_step is not None and self._ends_step():
                profiler.step()
                self._step = max(self._step, step + 1)
            self._open(GAP, "data")
        except Exception as exc:
            self._fault("maybe_flush", exc)

    def flush(self, blocking: bool = False) -> None:
        """Nothing to do: rankscope's timer writes on its own schedule and at close()."""

    def close(self) -> None:
        """The end of training: the open ``next_batch`` is cut short, the profiler stops
        (its pending timings written)."""
        if self.profiler is None:
            return
        try:
            self._finish(interrupted=True)
        except Exception as exc:
            self._fault("close", exc)

    def _enter(self, name: str, step: int, metadata: dict[str, Any]) -> AbstractContextManager[Any]:
        profiler = self.profiler
        if profiler is None:
            self._step = first_step(step)
            profiler = Profiler(self.config, first_step=self._step)
            profiler.start()
            self.profiler = profiler
            self._stop_at_exit()
        self._close()
        while self._step < step:  # a new global step: every micro-batch of it is done
            profiler.step()
            self._step += 1
        return enter_phase(profiler, name, KINDS.get(name, "compute"), **metadata)
