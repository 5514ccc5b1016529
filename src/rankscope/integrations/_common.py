"""What the framework callbacks share: checking their arguments, and hooks that cannot fail training."""

from __future__ import annotations

import atexit
import functools
import os
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from .._errors import ConfigError
from .._intake import as_config
from .._log import get_logger
from .._profiler import Profiler
from ..config._config import ProfileConfig

__all__ = [
    "CallbackRun",
    "Interrupted",
    "OnePhase",
    "ProcessRun",
    "check_rank_args",
    "first_step",
    "guarded",
    "merged",
    "plain",
    "turn_off",
]

logger = get_logger(__name__)

Hook = TypeVar("Hook", bound=Callable[..., None])


class Interrupted(Exception):
    """Marks a phase that the end of a run cut short (passed to Phase.__exit__)."""


def guarded(hook: Hook) -> Hook:
    """Run a callback hook so that a fault inside rankscope never reaches the training loop.

    The callback has `_run` (the Profiler of the run in progress, None when there is
    none: the hook does nothing) and `_fault(where, exc)`, which logs and turns it off.
    """

    @functools.wraps(hook)
    def run(self: Any, *args: Any, **kwargs: Any) -> None:
        if self._run is None:
            return
        try:
            hook(self, *args, **kwargs)
        except Exception as exc:
            self._fault(hook.__name__, exc)

    return run  # type: ignore[return-value]


def first_step(global_step: object) -> int:
    """The Profiler's first step for a trainer at `global_step`: a run resumed from a
    checkpoint starts there, so its steps keep their numbers (0 when it is not a step)."""
    return global_step if type(global_step) is int and global_step > 0 else 0


def check_rank_args(rank: object, world_size: object) -> None:
    """Explicit rank and world size overrides: None, or ints that fit each other."""
    for name, value, minimum in (("rank", rank, 0), ("world_size", world_size, 1)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < minimum
        ):
            raise ConfigError(name, value, f"None or an int >= {minimum}")
    if isinstance(rank, int) and isinstance(world_size, int) and rank >= world_size:
        raise ConfigError("rank", rank, f"a rank below world_size={world_size}")


def enter_phase(run: Profiler, name: str, kind: str, **meta: Any) -> AbstractContextManager[Any]:
    """`run`'s phase `name`, entered: a hook opens it, a later hook leaves it."""
    phase = run.phase(name, kind, **meta)
    phase.__enter__()
    return phase


def leave_phase(phase: AbstractContextManager[Any] | None, exception: BaseException | None) -> None:
    """Leave `phase` (if any); with `exception`, its record says it ended in an error."""
    if phase is None:
        return
    if exception is None:
        phase.__exit__(None, None, None)
    else:
        phase.__exit__(type(exception), exception, exception.__traceback__)


class OnePhase:
    """At most one phase open between two calls of the framework: one call opens it, a
    later one leaves it (a callback's hook, a worker's "after_<method>" gap). `_running()`
    is the Profiler phases open in, None when there is none."""

    _phase: AbstractContextManager[Any] | None = None

    def _running(self) -> Profiler | None:
        raise NotImplementedError

    def _open(self, name: str, kind: str = "compute") -> None:
        """Close the phase that is open (if any) and enter `name`."""
        self._close()
        run = self._running()
        if run is not None:
            self._phase = enter_phase(run, name, kind)

    def _close(self, exception: BaseException | None = None) -> None:
        """Leave the open phase; with `exception`, its record says it ended in an error."""
        phase, self._phase = self._phase, None
        leave_phase(phase, exception)


class CallbackRun(OnePhase):
    """What a framework callback holds between its hooks: one run, at most one open phase.

    Mixed into each framework's callback class, which calls `_setup` from its
    constructor and opens and closes phases from its hooks. `_WHAT` names the
    integration in the warning a fault logs.
    """

    _WHAT = "integration"

    def _setup(
        self,
        config: object,
        rank: int | None,
        world_size: int | None,
        environ: Mapping[str, str] | None,
    ) -> None:
        """Check the arguments now (ConfigError), so that a bad config never waits for training."""
        self.config: ProfileConfig = as_config(config)
        effective = self.config.with_env(environ)  # a bad RANKSCOPE_* value fails here
        check_rank_args(rank, world_size)
        if world_size is not None:
            effective.check_world_size(world_size, environ)
        self.profiler: Profiler | None = None
        """The Profiler of the current (or last) run in this process; None before the first."""
        self._run: Profiler | None = None  # the profiler of the run in progress, while it works
        self._rank = rank
        self._world_size = world_size
        self._environ = environ
        self._phase = None  # the phase a hook opened
        self._at_exit: Callable[[], None] | None = None
        self._figures_off = False  # a fault turned rankscope's figures in the logs off

    def _running(self) -> Profiler | None:
        return self._run

    def _finish(self, interrupted: bool, exception: BaseException | None = None) -> None:
        """End the run: close the open phase, stop the profiler (saving an open window)."""
        profiler, self._run = self._run, None
        try:
            if self._at_exit is not None:
                atexit.unregister(self._at_exit)
                self._at_exit = None
            if interrupted and exception is None:
                exception = Interrupted()
            self._close(exception)
        finally:
            if profiler is not None:
                profiler.stop()

    def _figures(self) -> dict[str, float]:
        """The run's figures for the trainer's logs (`Profiler.metrics()`); {} once a
        fault turned them off. The first call starts the reader of the run directory."""
        run = self._run
        if run is None or self._figures_off:
            return {}
        try:
            return run.metrics()
        except Exception as exc:
            self._figures_fault("reading rankscope's figures", exc)
            return {}

    def _figures_fault(self, doing: str, exc: BaseException) -> None:
        """Warn once and leave the figures out of the logs from now on; profiling and
        training go on."""
        if self._figures_off:
            return
        self._figures_off = True
        logger.warning(
            "rankscope: %s failed on rank %s (%s: %s); rankscope's figures are left out of "
            "the trainer's logs for the rest of this run, profiling and training go on",
            doing,
            self.profiler.rank if self.profiler is not None else "?",
            type(exc).__name__,
            exc,
        )

    def _fault(self, where: str, exc: BaseException) -> None:
        """Log once and turn the integration off for the rest of this run; training goes on."""
        off = f"{self._WHAT} off"
        turn_off(off, self.profiler, where, exc, lambda: self._finish(interrupted=True))


def turn_off(
    off: str,
    profiler: Profiler | None,
    where: str,
    exc: BaseException,
    finish: Callable[[], None],
) -> None:
    """The warning that an integration is `off` ("the verl integration is off") on this
    rank since `where` raised `exc`, then `finish()`, whose own fault is only logged:
    training goes on."""
    logger.warning(
        "rankscope: %s for the rest of the run on rank %s: %s failed: %s: %s",
        off,
        profiler.rank if profiler is not None else "?",
        where,
        type(exc).__name__,
        exc,
    )
    try:
        finish()
    except Exception:
        logger.debug("rankscope: stopping after a fault failed too", exc_info=True)


def plain(value: Any) -> Any:
    """A framework's config value (OmegaConf, a dataclass, YAML's mappings and lists) as
    plain dicts and lists."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(value, (DictConfig, ListConfig)):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:
        pass
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [plain(v) for v in value]
    fields = getattr(value, "__dataclass_fields__", None)
    if fields is not None:
        return {name: plain(getattr(value, name)) for name in fields}
    return value


def merged(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `over` laid on it, mapping by mapping (the user's own section wins)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


class ProcessRun(OnePhase):
    """One process's run for an integration that hooks a framework with no callback object
    of its own (slime's hook functions, verl's and SkyRL's profiler classes, lmms-engine's
    timer): its Profiler, at most one phase open between the framework's calls, stopped at
    the process's exit, and turned off for good by the first fault. `_WHAT` names the
    integration in the warning."""

    _WHAT = "integration"

    def __init__(self) -> None:
        self.profiler: Profiler | None = None
        self.off = False  # a fault turned rankscope off in this process

    def _running(self) -> Profiler | None:
        return self.profiler

    def _finish(self, interrupted: bool) -> None:
        """The end of the run: the open phase is left (cut short, if `interrupted`), then
        the profiler stops."""
        profiler, self.profiler = self.profiler, None
        try:
            self._close(Interrupted() if interrupted else None)
        finally:
            if profiler is not None:
                profiler.stop()

    def _stop_at_exit(self) -> None:
        """Stop the run when this process exits (not a forked child of it)."""
        atexit.register(self._finish_at_exit, os.getpid())

    def _interrupted_at_exit(self) -> bool:
        """Whether a phase is cut short when the process exits now."""
        return False

    def _finish_at_exit(self, pid: int) -> None:
        if os.getpid() == pid and self.profiler is not None:
            try:
                self._finish(interrupted=self._interrupted_at_exit())
            except Exception:
                logger.debug("rankscope: stopping at exit failed", exc_info=True)

    def _fault(self, where: str, exc: BaseException) -> None:
        """Log once and turn rankscope off in this process; training goes on."""
        if self.off:
            return
        self.off = True
        off = f"the {self._WHAT} is off"
        turn_off(off, self.profiler, where, exc, lambda: self._finish(interrupted=True))
