"""Profiler: the one object a training loop holds."""

from __future__ import annotations

import atexit
import contextlib
import functools
import inspect
import json
import logging
import sys
import weakref
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

from ._config import ProfileConfig
from ._errors import ConfigError
from ._meta import write_meta
from ._ranks import RankInfo, detect_rank_info

if TYPE_CHECKING:
    from .capture import TraceCapture

__all__ = ["Profiler"]

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


class Profiler:
    """Profiles one rank of a training job as its config says; safe to leave in the code.

    ::

        with rankscope.Profiler(config) as prof:   # start(); stop() in finally
            for batch in loader:
                with prof.phase("forward"): ...
                prof.step()

    The environment (RANKSCOPE_*) overrides `config`. `rank` and `world_size` override
    what is detected (Ray workers and tests pass them). A rank the config does not
    select holds no torch.profiler object; its step() and phase() cost an attribute check.
    """

    def __init__(
        self,
        config: ProfileConfig | Mapping[str, Any] | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.config: ProfileConfig = _as_config(config).with_env(environ)
        self.rank_info: RankInfo = detect_rank_info(rank, world_size, environ)
        self.config.check_world_size(self.rank_info.world_size, environ)
        trace = self.config.trace
        self._capture: TraceCapture | None = None
        if trace.enable and self.rank_info.rank in trace.rank_set:
            from .capture import TraceCapture

            self._capture = TraceCapture(trace, str(self.config.output_dir), self.rank_info)
        self._live: TraceCapture | None = None  # the capture between start() and stop(), else None
        self._state = "new"
        self._at_exit: Callable[[], None] | None = None

    @property
    def rank(self) -> int:
        return self.rank_info.rank

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        """Begin step 0. Calling it twice warns and does nothing."""
        if self._state != "new":
            logger.warning(
                "rankscope: Profiler.start() called on a profiler that is already %s; ignored",
                self._state,
            )
            return
        self._state = "started"
        if self.rank_info.rank == 0:
            logger.info(
                "rankscope: %d rank(s), effective config %s",
                self.rank_info.world_size,
                json.dumps(self.config.to_dict()),
            )
        capture = self._capture
        if capture is None:
            return
        try:
            write_meta(str(self.config.output_dir), self.rank_info, self.config.to_dict())
        except OSError as exc:
            capture.fault(f"cannot write to {self.config.output_dir} ({exc})")
            return
        capture.start()
        self._live = capture
        self._at_exit = functools.partial(_stop_at_exit, weakref.ref(self))
        atexit.register(self._at_exit)

    def step(self) -> None:
        """Mark the end of a training step (call once per iteration). A no-op before start()."""
        capture = self._live
        if capture is not None:
            capture.step()

    def stop(self) -> None:
        """Close and save an open window and wait for background work. Safe to call twice."""
        if self._state != "started":
            return
        self._state = "stopped"
        capture, self._live = self._live, None
        if self._at_exit is not None:
            atexit.unregister(self._at_exit)
            self._at_exit = None
        if capture is not None:
            capture.stop()

    def __enter__(self) -> Profiler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def last_summary(self) -> dict[str, Any] | None:
        """The kernel (or CPU op) summary of the latest finished window, as plain JSON data."""
        capture = self._capture
        return None if capture is None else capture.last_summary

    # -- phases --------------------------------------------------------------------

    def phase(
        self, name: str, kind: str = "compute"
    ) -> Phase | _NoPhase | contextlib.nullcontext[None]:
        """A named part of a step, as a context manager or a decorator.

        Inside a recording window it opens a record_function range of the same name;
        with a "phase:NAME" target, invocations of NAME are what the schedule counts.
        """
        if _compiling():
            # torch.compile traces through a plain nullcontext without a graph break.
            return contextlib.nullcontext()
        if self._capture is None:
            return _NO_PHASE
        return Phase(self, name, kind)


class Phase:
    """What Profiler.phase() returns on a rank that profiles; enter it once at a time."""

    __slots__ = ("_capture", "_kind", "_name", "_profiler", "_token")

    def __init__(self, profiler: Profiler, name: str, kind: str) -> None:
        self._profiler = profiler
        self._name = name
        self._kind = kind
        self._capture: TraceCapture | None = None
        self._token: Any = None

    def __enter__(self) -> Phase:
        capture = self._profiler._live
        if capture is not None and capture.enabled:
            self._token = capture.phase_enter(self._name)
            self._capture = capture
        return self

    def __exit__(self, *exc: object) -> None:
        token, self._token = self._token, None
        if token is not None and self._capture is not None:
            self._capture.phase_exit(token)

    def __call__(self, fn: F) -> F:
        return _decorate(fn, lambda: self._profiler.phase(self._name, self._kind))


class _NoPhase:
    """The phase of a rank that does not profile: does nothing, as cheaply as possible."""

    __slots__ = ()

    def __enter__(self) -> _NoPhase:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __call__(self, fn: F) -> F:
        return fn


_NO_PHASE = _NoPhase()


def _as_config(config: object) -> ProfileConfig:
    if config is None:
        return ProfileConfig()
    if isinstance(config, ProfileConfig):
        return config
    if isinstance(config, Mapping):
        return ProfileConfig.from_dict(config)
    raise ConfigError("config", config, "a ProfileConfig, a mapping of its fields, or None")


def _compiling() -> bool:
    """True while torch.compile traces: phases step aside there rather than break the graph."""
    torch = sys.modules.get("torch")
    return torch is not None and bool(torch.compiler.is_compiling())


def _decorate(fn: F, make: Callable[[], AbstractContextManager[Any]]) -> F:
    """Wrap `fn` so every call runs inside a fresh phase; keeps static/class methods and coroutines."""
    if isinstance(fn, (staticmethod, classmethod)):
        return type(fn)(_decorate(fn.__func__, make))
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            with make():
                return await fn(*args, **kwargs)

        return run_async  # type: ignore[return-value]

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with make():
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]


def _stop_at_exit(ref: weakref.ref[Profiler]) -> None:
    profiler = ref()
    if profiler is not None:
        profiler.stop()
