"""verl integration: rankscope as one of verl's profiling tools, in every Ray worker.

Two overrides on verl's command line turn it on::

    global_profiler.tool=rankscope
    +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=rankscope.integrations.verl.install

verl picks a profiler by ``tool`` in ``verl.utils.profiler.DistProfiler`` and falls back
to a no-op for a name it does not know; ``install`` (run by Ray in each worker process
before its actor is made) teaches ``DistProfiler`` the name ``rankscope``. Every role's
profiler config takes ``global_profiler.tool`` (verl's ``${oc.select:...}``), so the
actor, the rollout, the reference, the critic and the reward model all get it.

What is mapped from each role's ``profiler`` config (``ProfilerConfig``):

- The phase timer runs on every rank of every worker group, each step (one in ten
  sampled): the straggler analysis compares ranks. verl's ``enable``, ``all_ranks``
  and ``ranks`` choose the ranks that record trace windows (``ranks: []`` with
  ``enable`` is rank 0, as in verl).
- ``global_profiler.steps`` reach each worker as the controller's ``start_profile`` /
  ``stop_profile`` calls: each opens and closes a trace window there
  (``trace.target: caller``), named ``step-<first>-<last>-verl``.
- ``tool_config.torch.contents`` (verl's torch tool's, kept when switching tools):
  ``cpu`` and ``cuda`` are the activities, ``memory``, ``shapes``, ``stack`` turn on
  ``profile_memory``, ``record_shapes``, ``with_stack``; ``discrete: True`` (a trace per
  role call) has no rankscope meaning and is refused naming that field, as are the
  contents ``profile-by-stage`` and ``merge-profiles``.
- ``save_path`` holds the run directory, ``<save_path>/rankscope``; every worker of
  every group writes into it.
- ``tool_config.rankscope`` (a mapping of ProfileConfig fields) is rankscope's own
  config and wins over the mapped fields; the RANKSCOPE_* variables win over both.

The worker methods verl marks with ``@DistProfiler.annotate(role=...)``
(``actor_update``, ``rollout_generate``, ``actor_compute_log_prob``,
``ref_compute_log_prob``, ``compute_values``, ``critic_update``,
``compute_rm_score``) become phases of those names, and the time from one call's end to
the next call's start the phase ``after_<role>`` (kind "comm"): verl's controller gathers
every rank's results, so the ranks that wait for a slow one wait there. A step of the worker is one PPO
iteration: it begins at ``start_profile(profile_step=N)`` or at a batch whose
``meta_info["global_steps"]`` says N, and otherwise where a role already run in the
current step runs again; a step is written when the next begins (the run's last is
not: nothing tells a worker that it was the last). The timings are flushed every step: Ray kills verl's actors
when training ends, with what they had not written.

A fault inside rankscope is logged once and turns it off in that process; training goes
on. A config value with no rankscope meaning raises ConfigError naming verl's field.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from .._errors import ConfigError
from .._log import get_logger
from .._profiler import Profiler
from ..config._config import ProfileConfig
from ._common import Interrupted, ProcessRun, enter_phase, leave_phase, merged, plain

__all__ = ["AFTER", "TOOL", "config_from_profiler", "install"]

logger = get_logger(__name__)

TOOL = "rankscope"
"""The name verl's ``profiler.tool`` takes for rankscope."""

AFTER = "after_"
"""The phase from a role call's end to the next call, ``after_<role>``: the controller
gathers every rank's results (so waits for the slowest), does its own work and
dispatches the next call. Kind "comm": the ranks wait for each other there, though
through Ray, not a collective. One a role, so that none repeats within a step (a comm
phase run several times a step is a pipeline's send or recv to the analysis)."""

_CONTENTS = {"cpu", "cuda", "memory", "shapes", "stack"}
_TAG = "verl"


def install() -> None:
    """Teach verl's DistProfiler the tool ``rankscope`` in this process (Ray's
    ``worker_process_setup_hook``; call it yourself before verl's workers are made where
    they are not Ray's). Calling it again does nothing."""
    from verl.utils.profiler import profile

    cls = profile.DistProfiler
    if getattr(cls, "_rankscope_installed", False):
        return
    original_init = cls.__init__
    original_annotate = cls.__dict__["annotate"].__func__

    @functools.wraps(original_init)
    def __init__(
        self: Any, rank: int, config: Any = None, tool_config: Any = None, **kw: Any
    ) -> None:
        original_init(self, rank, config=config, tool_config=tool_config, **kw)
        if getattr(config, "tool", None) == TOOL:
            self._rankscope = _RUN.adopt(rank, config)  # ConfigError is the user's to see

    def annotate(
        klass: Any,
        /,
        message: str | None = None,
        color: str | None = None,
        domain: str | None = None,
        category: str | None = None,
        **kwargs_outer: Any,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        theirs = original_annotate(klass, message, color, domain, category, **kwargs_outer)
        name = kwargs_outer.get("role") or message

        def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
            wrapped = theirs(func)

            @functools.wraps(func)
            def run(self_instance: Any, *args: Any, **kwargs: Any) -> Any:
                profiler = getattr(self_instance, "profiler", None)
                if getattr(profiler, "_rankscope", None) is None:
                    return wrapped(self_instance, *args, **kwargs)
                return _RUN.timed(name or func.__name__, func, self_instance, args, kwargs)

            return run

        return decorator

    cls.__init__ = __init__
    cls.check_enable = _checked(cls.check_enable)
    cls.check_this_rank = _checked(cls.check_this_rank)
    cls.check_this_step = _checked(cls.check_this_step)
    cls.start = _started(cls.start)
    cls.stop = _stopped(cls.stop)
    # verl's own wrapper runs a method again when anything inside it raises; rankscope's
    # runs it once, and only decorators applied after this call get it: the workers'
    # modules are imported after Ray's setup hook.
    cls.annotate = classmethod(annotate)
    cls._rankscope_installed = True


def _checked(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """verl's check, True on a rankscope profiler: every rank times every step."""

    @functools.wraps(check)
    def run(self: Any) -> bool:
        return True if getattr(self, "_rankscope", None) is not None else check(self)

    return run


def _started(start: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(start)
    def run(self: Any, **kwargs: Any) -> Any:
        if getattr(self, "_rankscope", None) is None:
            return start(self, **kwargs)
        _RUN.start_profile(kwargs.get("profile_step"))
        return None

    return run


def _stopped(stop: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(stop)
    def run(self: Any, **kwargs: Any) -> Any:
        if getattr(self, "_rankscope", None) is None:
            return stop(self, **kwargs)
        _RUN.stop_profile()
        return None

    return run


def config_from_profiler(config: Any, environ: Mapping[str, str] | None = None) -> ProfileConfig:
    """The ProfileConfig a role's verl ``ProfilerConfig`` asks for (the module docstring
    says the mapping); ConfigError names verl's field whose value has no rankscope meaning."""
    tools = plain(getattr(config, "tool_config", None))
    tools = tools if isinstance(tools, dict) else {}
    own = tools.get(TOOL) or {}
    if not isinstance(own, dict):
        raise ConfigError(
            "profiler.tool_config.rankscope", own, "a mapping of ProfileConfig fields"
        )
    mapped: dict[str, Any] = {
        "timer": {"enable": True, "ranks": "all", "flush_every_n_steps": 1},
        "trace": {"target": "caller"},
    }
    save = getattr(config, "save_path", None)
    if isinstance(save, (str, os.PathLike)) and str(save):
        mapped["output_dir"] = os.path.join(str(save), "rankscope")
    if getattr(config, "enable", False):
        trace = mapped["trace"]
        trace.update(enable=True, ranks=_ranks(config))
        trace.update(_contents(tools.get("torch")))
    out = ProfileConfig.from_dict(merged(mapped, own))
    out.with_env(environ)  # a bad RANKSCOPE_* value fails here, not at the first step
    return out


def _ranks(config: Any) -> object:
    if getattr(config, "all_ranks", False):
        return "all"
    ranks = plain(getattr(config, "ranks", None)) or []
    if not isinstance(ranks, list) or not all(type(r) is int and r >= 0 for r in ranks):
        raise ConfigError("profiler.ranks", ranks, "a list of ranks >= 0 ([] is rank 0)")
    return ranks or "0"  # verl's default: rank 0 alone


def _contents(torch_tool: object) -> dict[str, Any]:
    """verl's torch tool's contents as rankscope's trace fields."""
    if not isinstance(torch_tool, dict):
        return {}
    if torch_tool.get("discrete"):
        raise ConfigError(
            "profiler.tool_config.torch.discrete",
            torch_tool["discrete"],
            "False: a rankscope window spans the profiled steps, each role a phase in it",
        )
    contents = torch_tool.get("contents") or []
    if not isinstance(contents, list) or not set(contents) <= _CONTENTS:
        raise ConfigError(
            "profiler.tool_config.torch.contents",
            contents,
            f"a list of {sorted(_CONTENTS)} (rankscope writes one trace per rank and window)",
        )
    out: dict[str, Any] = {}
    activities = [a for a in ("cpu", "cuda") if a in contents]
    if activities:
        out["activities"] = activities
    for content, field in (
        ("memory", "profile_memory"),
        ("shapes", "record_shapes"),
        ("stack", "with_stack"),
    ):
        if content in contents:
            out[field] = True
    return out


class _VerlRun(ProcessRun):
    """This worker process's run: one Profiler for every role it holds (verl colocates
    the actor, rollout and reference in one process), its step and open window."""

    _WHAT = "verl integration"

    def __init__(self) -> None:
        super().__init__()
        self.config: ProfileConfig | None = None
        self._step: int | None = None  # the PPO step in progress, as verl numbers it
        self._ran: set[str] = set()  # the roles run in this step
        self._window: AbstractContextManager[Any] | None = None
        # The open phase (OnePhase) is after_<role>, from a role's call to the next.

    def adopt(self, rank: int, config: Any) -> ProfileConfig:
        """A DistProfiler of tool rankscope was made: its config checked now."""
        mapped = config_from_profiler(config)
        if self.config is None:
            self.config = mapped
        elif mapped.to_dict() != self.config.to_dict():
            logger.info(
                "rankscope: rank %d holds roles with different profiler configs; the first "
                "made is used (verl's roles in one process share one rankscope run)",
                rank,
            )
        return mapped

    def timed(
        self,
        name: str,
        func: Callable[..., Any],
        owner: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """`func` run as phase `name`, in the step it belongs to."""
        phase = self._enter(name, args)
        try:
            out = func(owner, *args, **kwargs)
        except BaseException as exc:
            self._leave(name, phase, exc)
            raise
        self._leave(name, phase, None)
        return out

    def start_profile(self, step: object) -> None:
        if self.off:
            return
        try:
            self._close()  # the step's edge lies inside after_<role>: the rest is not timed
            self._at(step if type(step) is int else None, None)
            if self.profiler is not None and self._window is None:
                window = self.profiler.trace_window(_TAG)
                if window.__enter__() is None:
                    self._window = window
        except Exception as exc:
            self._fault("start_profile", exc)

    def stop_profile(self) -> None:
        window, self._window = self._window, None
        if window is not None:
            try:
                window.__exit__(None, None, None)
            except Exception as exc:
                self._fault("stop_profile", exc)

    # -- inside ------------------------------------------------------------------------

    def _enter(self, name: str, args: tuple[Any, ...]) -> AbstractContextManager[Any] | None:
        if self.off:
            return None
        try:
            self._close()
            self._at(_global_step(args), name)
            self._ran.add(name)
            if self.profiler is None:
                return None
            return enter_phase(self.profiler, name, "compute")
        except Exception as exc:
            self._fault(name, exc)
            return None

    def _leave(
        self, name: str, phase: AbstractContextManager[Any] | None, exc: BaseException | None
    ) -> None:
        if phase is None or self.off:
            return
        try:
            leave_phase(phase, exc)
            self._open(AFTER + name, "comm")
        except Exception as fault:
            self._fault("leaving a phase", fault)

    def _at(self, step: int | None, role: str | None) -> None:
        """Move to verl's step `step` (None: unknown), or to the next where `role` already
        ran in this one; the Profiler starts at the first."""
        if self.profiler is None:
            self._start(step if step is not None else 0)
            self._step = step if step is not None else 0
            return
        current = self._step if self._step is not None else 0
        if step is None:
            step = current + 1 if role is not None and role in self._ran else current
        while current < step:
            self.profiler.step()
            current += 1
            self._ran = set()
        self._step = current

    def _start(self, first: int) -> None:
        if self.config is None:
            return
        profiler = Profiler(self.config, first_step=first)
        profiler.start()
        self.profiler = profiler
        self._stop_at_exit()

    def _finish(self, interrupted: bool) -> None:
        """ProcessRun's end, the open window saved before the profiler stops."""
        window, self._window = self._window, None
        try:
            self._close(Interrupted() if interrupted else None)
            if window is not None:
                window.__exit__(None, None, None)
        finally:
            super()._finish(interrupted)


def _global_step(args: tuple[Any, ...]) -> int | None:
    """verl's step where the call's batch says it (``meta_info["global_steps"]``)."""
    for arg in args[:1]:
        meta = getattr(arg, "meta_info", None)
        if isinstance(meta, Mapping):
            step = meta.get("global_steps")
            if type(step) is int and step >= 0:
                return step
    return None


_RUN = _VerlRun()
