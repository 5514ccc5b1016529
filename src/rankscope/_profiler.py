"""Profiler: the one object a training loop holds."""

from __future__ import annotations

import atexit
import contextlib
import functools
import inspect
import json
import os
import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

from ._errors import ConfigError
from ._exit import SettleAtExit
from ._intake import as_config, say_bad_config, warn_incompatible, warn_unused
from ._log import get_logger
from .config._config import ProfileConfig
from .config._ranks import RankInfo, detect_rank_info, parse_ranks
from .rundir._attempt import current_attempt
from .rundir._checks import say_config_differs, say_other_job, say_rank_zero_elsewhere
from .rundir._files import remove_stale_temps
from .rundir._meta import check_groups, write_meta

if TYPE_CHECKING:
    from .capture import TraceCapture
    from .capture._caller import CallerWindow
    from .capture._memory import MemorySnapshots
    from .timing import PhaseTimer
    from .timing._record import Span
    from .watch import Pulse, Watchdog
    from .watch._peers import PeerView

__all__ = ["Profiler", "annotate", "current"]

logger = get_logger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


class Profiler:
    """Profiles one rank of a training job as its config says; safe to leave in the code.

    ::

        with rankscope.Profiler(config) as prof:   # start(); stop() in finally
            for batch in loader:
                with prof.phase("forward"): ...
                prof.step()

    `config` is a ProfileConfig, a mapping of its fields, or a path to a YAML file.
    The environment (RANKSCOPE_*) overrides `config`. `rank` and `world_size` override
    what is detected (Ray workers and tests pass them). `first_step` is the global step
    the loop starts at: a job resumed from a checkpoint passes the checkpoint's step, so
    its steps keep their numbers across attempts. `groups` names the parallel groups
    this rank belongs to ({"pipeline_stage": 3, "tensor_parallel": 1}: names to ints or
    strings); it goes to the meta file, and the analysis uses it to tell a group of ranks
    slow together (the last pipeline stage) from slow machines. With trace.enable any rank may
    be asked for a window (a trigger, SIGUSR2, its own slow steps), so every rank that
    can be holds a capture, idle until asked. A rank that neither times, nor traces, nor
    can be asked holds no torch object; its step() and phase() cost an attribute check.
    """

    _peers: PeerView | None = None  # metrics()'s reader, from its first call to stop()
    _flushes = 0  # the timer's flushes metrics()'s reader was told of

    def __init__(
        self,
        config: ProfileConfig | Mapping[str, Any] | str | os.PathLike[str] | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        environ: Mapping[str, str] | None = None,
        first_step: int = 0,
        groups: Mapping[str, int | str] | None = None,
    ) -> None:
        self.groups = check_groups(groups)
        if isinstance(first_step, bool) or not isinstance(first_step, int) or first_step < 0:
            raise ConfigError("first_step", first_step, "an int >= 0 (the step the loop starts at)")
        self.first_step = first_step
        """The global step the loop starts at: a resumed job's checkpoint step, else 0."""
        try:
            self.config: ProfileConfig = as_config(config).with_env(environ)
            self.rank_info: RankInfo = detect_rank_info(rank, world_size, environ)
            self.config.check_world_size(self.rank_info.world_size, environ)
        except ConfigError as exc:
            say_bad_config(exc, rank, world_size, environ)
            raise
        run_dir = str(self.config.output_dir)
        trace, timer = self.config.trace, self.config.timer
        self._capture: TraceCapture | None = None
        if trace.involves(self.rank_info.rank):
            from .capture import TraceCapture

            self._capture = TraceCapture(trace, run_dir, self.rank_info)
        self._timer: PhaseTimer | None = None
        if timer.enable and self.rank_info.rank in timer.rank_set:
            from .timing import PhaseTimer

            self._timer = PhaseTimer(timer, run_dir, self.rank_info)
        self._memory: MemorySnapshots | None = None
        memory = self.config.memory
        selected = memory.enable and self.rank_info.rank in memory.rank_set
        if selected and not memory.on_oom and self._capture is None:
            logger.warning(
                "rankscope: memory.on_oom is False and rank %d can be asked for no trace "
                "window (not in trace.ranks, no trigger checks, SIGUSR2 or trace.auto), so "
                "no snapshot could be written; memory snapshots are off on this rank",
                self.rank_info.rank,
            )
            selected = False
        if selected:
            from .capture._memory import MemorySnapshots

            snapshots = MemorySnapshots(memory, run_dir, self.rank_info)
            if snapshots.enabled or snapshots.fault_reason is not None:
                self._memory = snapshots  # without CUDA it said so in one line and is done
        if self._capture is not None:
            self._capture.attach_timer(self._timer)
            if self._memory is not None:
                self._capture.on_window_closed = self._memory.dump
        if self.rank_info.rank == 0:
            warn_unused(self.config)
            if self._capture is not None or self._memory is not None:
                warn_incompatible(self.config)
        self._live: TraceCapture | None = None  # the capture between start() and stop(), else None
        self._recorder: MemorySnapshots | None = None  # memory between start() and stop()
        self._timing: PhaseTimer | None = None  # the timer between start() and stop(), else None
        self._sampling = False  # the current step is timed
        self._pulse: Pulse | None = None  # what the watchdog reads, between start() and stop()
        self._watchdog: Watchdog | None = None
        self._before: Pulse | None = None  # the thread's pulse before this one's
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
        _Active.profiler = self
        _STARTED.add(self)
        capture, timer, memory = self._capture, self._timer, self._memory
        run_dir, attempt = str(self.config.output_dir), current_attempt()
        if capture is None and timer is None and memory is None:
            if self.rank_info.rank != 0:  # a setting on this rank alone may be why
                say_config_differs(run_dir, attempt, self.config.to_dict(), self.rank_info.rank)
            return
        if self.rank_info.rank == 0:
            say_other_job(run_dir, attempt)
        try:
            write_meta(
                run_dir, self.rank_info, self.config.to_dict(), attempt.to_dict(), self.groups
            )
            remove_stale_temps(run_dir, self.rank_info.rank)  # what a killed process left
            if self.rank_info.rank != 0:
                say_config_differs(run_dir, attempt, self.config.to_dict(), self.rank_info.rank)
        except OSError as exc:
            what = f"cannot write to {self.config.output_dir} ({exc})"
            for part in (capture, timer, memory):
                if part is not None:
                    part.fault(what)
            return
        if memory is not None:
            memory.start()  # before the capture: a window at step 0 is dumped with history
            self._recorder = memory
        if capture is not None:
            capture.start(self.first_step)
            self._live = capture
        if timer is not None:
            self._sampling = timer.start(self.first_step)
            self._timing = timer
        if self.config.hang.enable:
            self._start_watchdog(run_dir)
        self._at_exit = functools.partial(_stop_at_exit, weakref.ref(self))
        atexit.register(self._at_exit)
        SettleAtExit.register()

    def _start_watchdog(self, run_dir: str) -> None:
        from .watch import Pulse, Watchdog

        pulse = Pulse(self.first_step, threading.get_ident())
        watchdog = Watchdog(self.config.hang, run_dir, self.rank_info, pulse)
        try:
            watchdog.start()
        except Exception as exc:  # no thread to be had: the run goes on without a watchdog
            logger.warning("rankscope: no hang watchdog on rank %d (%s)", self.rank, exc)
            return
        self._pulse, self._watchdog = pulse, watchdog
        # This thread's phases, and no other's, are pushed (another Profiler started on
        # this thread before gets it back at this one's stop()).
        self._before, _TRAINING.pulse = _TRAINING.pulse, pulse

    def step(self) -> None:
        """Mark the end of a training step (call once per iteration). A no-op before start()."""
        pulse = self._pulse
        if pulse is not None:
            pulse.step += 1
        capture = self._live
        if capture is not None:
            capture.step()
        timer = self._timing
        if timer is not None:
            self._sampling = timer.step()
            peers = self._peers
            if peers is not None and timer.flushes != self._flushes:
                self._flushes = timer.flushes
                peers.poke()  # the records it wrote: the figures' reader reads them now
        memory = self._recorder
        if memory is not None:
            memory.step()

    def stop(self) -> None:
        """Close and save an open window and wait for background work. Safe to call twice."""
        if self._state != "started":
            return
        if _Active.profiler is self:
            _Active.profiler = None
        _STARTED.discard(self)
        memory = self._recorder
        watchdog = self._watchdog
        peers, self._peers = self._peers, None
        if peers is not None:
            peers.stop()
        capture, timer = self._detach()
        if timer is not None:
            timer.stop()
            if self.rank_info.rank != 0 and 0 in parse_ranks(
                self.config.timer.ranks, "timer.ranks"
            ):
                # By now rank 0 of this launch has written its meta where it writes.
                say_rank_zero_elsewhere(str(self.config.output_dir), current_attempt(), self.rank)
        if capture is not None:
            capture.stop()
        if memory is not None:
            memory.stop()  # after the capture: a window that stop() closes is dumped first
        if watchdog is not None:
            watchdog.stop()  # last: its final heartbeat says the run ended cleanly

    def _detach(self) -> tuple[TraceCapture | None, PhaseTimer | None]:
        """End the run for step() and phase() (and the atexit hook); return what was live."""
        self._state = "stopped"
        self._recorder = None  # a forked child lets it go without touching CUDA
        capture, self._live = self._live, None
        timer, self._timing = self._timing, None
        self._sampling = False
        pulse, self._pulse, self._watchdog = self._pulse, None, None
        if pulse is not None and _TRAINING.pulse is pulse:
            _TRAINING.pulse = self._before
        if self._at_exit is not None:
            atexit.unregister(self._at_exit)
            self._at_exit = None
        return capture, timer

    def _forget_after_fork(self) -> None:
        """In a forked child (a data-loader worker): let go of the parent's run, silently.

        The parent's records and windows are the parent's to write; the child writes
        nothing, and its exit does not stop the parent's profiler.
        """
        watchdog = self._watchdog
        self._peers = None  # its thread is the parent's
        _, timer = self._detach()
        if timer is not None:
            timer.forget_after_fork()
        if watchdog is not None:
            watchdog.forget_after_fork()

    def __enter__(self) -> Profiler:
        self.start()
        return self

    def __exit__(self, exc_type: object, exc: object, *tb: object) -> None:
        capture = self._live
        if exc_type is not None and capture is not None:
            capture.loop_raised = True  # "captured nothing" then needs no hint about step()
        if exc_type is not None and self._watchdog is not None:
            # The last heartbeat says the loop left on an error, not a clean end: a peer
            # that died makes the others' collectives raise (gloo) rather than hang.
            name = getattr(exc_type, "__name__", "error")
            self._watchdog.ended_by = f"{name}: {exc}"[:_ERROR_TEXT]
        self.stop()

    @property
    def faults(self) -> list[str]:
        """What a fault turned off in this run, and why ("trace capture: ..."); empty if nothing.

        Faults are logged once and never raised: this is how a caller that runs many
        workers (the Ray integration) finds out which ones lost profiling.
        """
        out = []
        for part, component in (
            ("trace capture", self._capture),
            ("phase timer", self._timer),
            ("memory snapshots", self._memory),
        ):
            reason = getattr(component, "fault_reason", None)
            if reason is not None:
                out.append(f"{part}: {reason}")
        return out

    def metrics(self) -> dict[str, float]:
        """rankscope's figures for any logger (`rankscope/...`, docs/timer.md); a call copies
        a dict that a background reader of the run directory keeps fresh, started by the
        first call. {} before start(), after stop(), and where the timer is off."""
        peers = self._peers
        if peers is None:
            if self._state != "started" or not self.config.timer.enable:
                return {}
            from .watch._peers import PeerView

            peers = self._peers = PeerView(str(self.config.output_dir), self.rank_info)
            peers.start()
        return peers.metrics()

    def last_summary(self) -> dict[str, Any] | None:
        """The kernel (or CPU op) summary of the latest finished window, as plain JSON data."""
        capture = self._capture
        return None if capture is None else capture.last_summary

    # -- phases --------------------------------------------------------------------

    def trace_window(self, tag: str) -> CallerWindow:
        """With trace.target "caller", a trace window from entering what this returns to
        leaving it, on ranks in trace.ranks: steps where a framework's own start and stop
        calls say (verl's start_profile, stop_profile), named by their steps and `tag`.
        Entering returns None where it opened, else why not; it never raises."""
        from .capture._caller import CallerWindow

        return CallerWindow(lambda: self._live, tag)

    def phase(
        self, name: str, kind: str = "compute", **meta: Any
    ) -> Phase | _NoPhase | contextlib.nullcontext[None]:
        """A named part of a step, as a context manager or a decorator.

        `kind` is "compute", "comm" (collectives), "data", "io" or a word of your own;
        keyword arguments are kept with the timing record under "meta". On sampled steps
        the timer records the phase; inside a recording window it opens a record_function
        range of the same name; with a "phase:NAME" target, invocations of NAME are what
        the trace schedule counts. Enter one Phase object once at a time.
        """
        if self._capture is None and self._timer is None:
            # A fresh object, not a shared one: torch.compile traces through a context
            # manager made inside the compiled region but not one made outside it.
            return _NoPhase()
        live = self._live
        busy = live is not None and (live.recording or live.phase_target)
        if (self._sampling or busy) and _compiling():
            # torch.compile traces through a plain nullcontext without a graph break.
            return contextlib.nullcontext()
        return Phase(self, name, kind, meta or None)


class Phase:
    """What Profiler.phase() returns on a rank that traces or times; enter it once at a time.

    On a step that is neither sampled nor inside a capture, entering and leaving it
    costs two attribute checks.
    """

    __slots__ = ("_kind", "_meta", "_name", "_open", "_profiler")

    def __init__(
        self, profiler: Profiler, name: str, kind: str, meta: dict[str, Any] | None
    ) -> None:
        self._profiler = profiler
        self._name = name
        self._kind = kind
        self._meta = meta
        self._open: list[_Opened] | None = None  # a stack: the same object may be re-entered

    def __enter__(self) -> Phase:
        profiler = self._profiler
        capture = profiler._live
        if capture is not None and not (capture.recording or capture.phase_target):
            capture = None  # nothing records now: the capture has nothing to open
        if capture is not None or profiler._sampling:
            opened = self._start(profiler, capture)
            if self._open is None:
                self._open = [opened]
            else:
                self._open.append(opened)
        pulse = profiler._pulse
        if pulse is not None and _TRAINING.pulse is pulse:  # the watchdog reads it; no clock
            pulse.open.append(self)
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        stack = self._open
        if stack:
            opened = stack.pop()
            if not stack:
                self._open = None
            _finish(opened, exc_type is not None)
        pulse = self._profiler._pulse
        if pulse is not None:
            phases = pulse.open
            if phases and phases[-1] is self:
                phases.pop()
            elif self in phases:  # left out of order (never pushed, on another thread)
                phases.remove(self)

    def _start(self, profiler: Profiler, capture: TraceCapture | None) -> _Opened:
        token = None
        if capture is not None:
            token = capture.phase_enter(self._name)
        timer, span = profiler._timing, None
        if profiler._sampling and timer is not None:
            ranged = token is not None and token[0] is not None
            span = timer.enter(self._name, self._kind, self._meta, ranged)
        return (capture, token, timer, span)

    def __call__(self, fn: F) -> F:
        profiler, name, kind, meta = self._profiler, self._name, self._kind, self._meta or {}
        return _decorate(fn, lambda: profiler.phase(name, kind, **meta))


# What an entered Phase opened: (capture, its token, timer, its span); Nones where nothing.
_Opened = tuple["TraceCapture | None", Any, "PhaseTimer | None", "Span | None"]


def _finish(opened: _Opened, error: bool) -> None:
    capture, token, timer, span = opened
    if span is not None and timer is not None:
        timer.exit(span, error)  # the timer's span closes inside the capture's range
    if token is not None and capture is not None:
        capture.phase_exit(token)


class _NoPhase:
    """The phase of a rank that does not profile: does nothing, as cheaply as possible."""

    __slots__ = ()

    def __enter__(self) -> _NoPhase:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __call__(self, fn: F) -> F:
        return fn


_STARTED: weakref.WeakSet[Profiler] = weakref.WeakSet()  # started and not stopped


class _Training(threading.local):
    """On the thread that started a Profiler with a watchdog: its Pulse, whose `open` that
    thread's phases push onto; elsewhere None (a class default: a missing attribute of a
    thread-local costs ten times a present one). A thread-local, not a thread id:
    torch.compile traces through it, and cannot through get_ident()."""

    pulse: Pulse | None = None


_TRAINING = _Training()


def _after_fork_in_child() -> None:
    _Active.profiler = None
    for profiler in list(_STARTED):
        profiler._forget_after_fork()
    _STARTED.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class _Active:
    """The profiler that annotate() and current() use: started most recently, not stopped."""

    profiler: Profiler | None = None


def current() -> Profiler | None:
    """The Profiler started most recently and not yet stopped, if any."""
    return _Active.profiler


def annotate(name: str, kind: str = "compute", **meta: Any) -> Callable[[F], F]:
    """Decorate a function so every call is a phase of the active profiler (see `current()`).

    ::

        @rankscope.annotate("actor_update", role="actor", color="red")
        def update_actor(batch): ...

    Works on functions, methods, static and class methods and async functions; the
    profiler is looked up at each call, so the decorator can be applied at import time.
    With no active profiler a call costs one lookup.
    """
    if not isinstance(name, str) or not name:
        raise ConfigError("name", name, "a non-empty phase name")

    def make() -> AbstractContextManager[Any]:
        profiler = _Active.profiler
        if profiler is None:
            return _NoPhase()
        return profiler.phase(name, kind, **meta)

    def decorator(fn: F) -> F:
        return _decorate(fn, make)

    return decorator


_ERROR_TEXT = 300
"""Characters of the error a loop left on, kept in the last heartbeat."""


def _compiling() -> bool:
    """True while torch.compile traces: phases step aside there rather than break the graph."""
    torch = sys.modules.get("torch")
    return torch is not None and bool(torch.compiler.is_compiling())


def _decorate(fn: F, make: Callable[[], AbstractContextManager[Any]]) -> F:
    """Wrap `fn` so every call runs inside a fresh phase; keeps static/class methods and coroutines."""
    if isinstance(fn, (staticmethod, classmethod)):
        return type(fn)(_decorate(fn.__func__, make))
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise ConfigError(
            "fn",
            getattr(fn, "__qualname__", fn),
            "a function or a coroutine function",
            "a generator's body runs after the call returns, so the phase would time only "
            "the call; put `with prof.phase(...)` around the loop that consumes it",
        )
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
