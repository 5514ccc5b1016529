"""Ray integration: profile trainers that run as Ray actors, one rank per actor.

RL post-training frameworks (verl, OpenRLHF, NeMo-RL) run each rank of a
torch.distributed group in a Ray actor, driven by one driver process. Mix
`RankscopeWorker` into the actor class; the driver starts, steps and stops profiling
on all of them::

    from rankscope.integrations.ray import RankscopeWorker, profile_actors

    @ray.remote
    class PolicyWorker(RankscopeWorker):
        def update_actor(self, batch):
            with self.profile_phase("update_actor"):
                ...

    workers = [PolicyWorker.remote() for _ in range(4)]
    with profile_actors(workers, config) as profiling:   # rank i = workers[i]
        for batch in batches:
            ray.get([w.update_actor.remote(batch) for w in workers])
            profiling.step()
    profiling.summaries   # what each worker wrote, or why it could not

Each worker holds one `Profiler` per start/stop, with the rank and world size the
driver gives it; the integration adds nothing of its own beyond calling it. A fault
inside rankscope on one worker turns profiling off on that worker only, is reported in
its summary and logged on the driver; no mixin method ever raises into training.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

try:
    import ray
except ImportError as exc:
    raise ImportError(
        'rankscope.integrations.ray needs ray, which is not installed: pip install "rankscope[ray]"'
    ) from exc

from .._errors import ConfigError
from .._log import get_logger
from .._profiler import Profiler
from ..config._config import ProfileConfig
from ..rundir._layout import timing_path
from ..rundir._listing import RunDir

__all__ = [
    "ActorProfiling",
    "RankscopeWorker",
    "profile_actors",
    "start_profiling",
    "step_profiling",
    "stop_profiling",
]

logger = get_logger(__name__)

# How long the driver waits for the actors' answers, counted from the call: a call
# queues behind the actor's calls in flight, and stop_profile() waits up to 600 s for
# trace windows still being compressed.
_START_TIMEOUT_S = 120.0
_STOP_TIMEOUT_S = 660.0

_MAX_WARNINGS = 20  # rankscope warnings kept per worker run for its summary
_MAX_REASON = 500  # characters of an actor's error kept in a summary


class RankscopeWorker:
    """Mix into a Ray actor class to profile the rank it holds; needs no ``__init__`` call.

    The driver calls `start_profile`, `step_profile` and `stop_profile` remotely
    (`profile_actors` does it for a list of actors), or the actor calls them itself.
    Inside the actor's own methods, `profile_phase` times a part of the step, and
    functions decorated with `rankscope.annotate` become phases while profiling runs.

    No method raises: a fault inside rankscope (a bad config, an unwritable run
    directory, torch.profiler failing) logs one warning on the worker, turns this
    worker's profiling off until the next `start_profile`, and is reported by
    `profile_summary`. Use it on a plain or an async actor: torch.profiler windows
    belong to the thread that started them, so in a threaded actor
    (``max_concurrency > 1``) trace capture turns itself off.
    """

    # Set on first start_profile(); a class default so that subclasses need not call
    # an __init__ of ours.
    _rankscope_run: _WorkerRun | None = None

    def start_profile(
        self,
        config: ProfileConfig | Mapping[str, Any],
        rank: int | None = None,
        world_size: int | None = None,
    ) -> dict[str, Any]:
        """Start profiling this worker as `rank` of `world_size`; returns `profile_summary()`.

        `config` is a `ProfileConfig` or its `to_dict()` form (what the driver sends);
        the worker's RANKSCOPE_* variables override it. `rank` and `world_size` default
        to what the Profiler detects (an initialised torch.distributed). Called while
        profiling runs, it warns and changes nothing.
        """
        run = self._rankscope_run
        if run is not None and run.state == "running":
            logger.warning(
                "rankscope: start_profile() called on rank %s while profiling runs; "
                "ignored (call stop_profile() first)",
                run.rank,
            )
            return run.summary()
        run = _WorkerRun(rank, world_size)
        self._rankscope_run = run
        run.start(config)
        return run.summary()

    def step_profile(self) -> None:
        """Mark the end of a training step (once per iteration, by the driver or the worker)."""
        run = self._rankscope_run
        if run is not None:
            run.step()

    def stop_profile(self) -> dict[str, Any]:
        """Stop profiling, saving an open trace window; returns `profile_summary()`. Safe twice."""
        run = self._rankscope_run
        if run is None:
            return _WorkerRun(None, None).summary()
        run.stop()
        return run.summary()

    def profile_summary(self) -> dict[str, Any]:
        """This worker's profiling as plain JSON data.

        Keys: ``rank``, ``world_size``, ``host``, ``pid``, ``state`` ("off" before the
        first start, "running", "stopped", or "failed: <why>"), ``run_dir``,
        ``timings_file`` (this rank's JSONL, or None), ``trace_windows`` (windows this
        run saved a trace of this rank into), ``last_summary`` (`Profiler.last_summary()`),
        ``faults`` (every fault, first first) and ``warnings`` (what rankscope warned
        about on this worker during the run).
        """
        run = self._rankscope_run
        return (run if run is not None else _WorkerRun(None, None)).summary()

    def profile_phase(
        self, name: str, kind: str = "compute", **meta: Any
    ) -> AbstractContextManager[Any]:
        """A phase of the running profiler (see `Profiler.phase`), for ``with``; a no-op when
        this worker does not profile. Call it in the actor, not remotely."""
        run = self._rankscope_run
        profiler = None if run is None else run.profiler
        if run is None or profiler is None:
            return contextlib.nullcontext()
        return run.phase(profiler, name, kind, meta)


class _WorkerRun:
    """One start_profile() .. stop_profile() on a worker: its Profiler, faults and warnings."""

    def __init__(self, rank: int | None, world_size: int | None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.profiler: Profiler | None = None  # None when off, stopped or failed
        self.state = "off"  # "off", "running", "stopped"; a failure is kept apart
        self.run_dir: str | None = None
        self.failure: str | None = None
        self.faults: list[str] = []  # why parts of the Profiler turned themselves off
        self._faulted: set[str] = set()  # those parts
        self._started_ns = time.time_ns()
        self._log = _WarningLog()
        self._last_summary: dict[str, Any] | None = None

    # -- the Profiler's lifecycle, guarded -----------------------------------------

    def start(self, config: ProfileConfig | Mapping[str, Any]) -> None:
        self._log.attach()
        try:
            if not isinstance(config, (ProfileConfig, Mapping)):
                raise ConfigError("config", config, "a ProfileConfig or a mapping of its fields")
            profiler = Profiler(config, rank=self.rank, world_size=self.world_size)
            self.rank = profiler.rank
            self.world_size = profiler.rank_info.world_size
            self.run_dir = str(profiler.config.output_dir)
            self.profiler = profiler
            self.state = "running"
            profiler.start()
        except Exception as exc:
            self.fail("start_profile", exc)

    def step(self) -> None:
        profiler = self.profiler
        if profiler is not None:
            try:
                profiler.step()
            except Exception as exc:
                self.fail("step_profile", exc)

    def stop(self) -> None:
        profiler = self.profiler
        if profiler is None:
            return
        try:
            profiler.stop()
            self._note_faults(profiler)
            self._last_summary = profiler.last_summary()
        except Exception as exc:
            self.fail("stop_profile", exc)
        else:
            self.profiler = None
            self.state = "stopped"
            self._log.detach()

    def phase(
        self, profiler: Profiler, name: str, kind: str, meta: dict[str, Any]
    ) -> AbstractContextManager[Any]:
        try:
            return _WorkerPhase(self, profiler.phase(name, kind, **meta), name)
        except Exception as exc:
            self.fail(f"profile_phase({name!r})", exc)
            return contextlib.nullcontext()

    def fail(self, where: str, exc: BaseException) -> None:
        """Log once, remember why, and turn this worker's profiling off; never raises."""
        if self.failure is None:
            self.failure = f"{where} failed: {type(exc).__name__}: {exc}"
            logger.warning(
                "rankscope: profiling off on this worker (rank %s) until the next "
                "start_profile(): %s; training goes on",
                self.rank,
                self.failure,
            )
        profiler, self.profiler = self.profiler, None
        if profiler is not None:
            try:
                self._note_faults(profiler)
                profiler.stop()  # close an open window; safe after a fault
            except Exception:
                logger.debug("rankscope: stopping after a fault failed too", exc_info=True)
        self._log.detach()

    # -- reporting -----------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        profiler = self.profiler
        if profiler is not None:
            self._note_faults(profiler)
            try:
                last = profiler.last_summary()
            except Exception:
                last = None  # a summary is a report; it never fails the call that asks
        else:
            last = self._last_summary
        faults = ([self.failure] if self.failure else []) + self.faults
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "state": f"failed: {faults[0]}" if faults else self.state,
            "run_dir": self.run_dir,
            "timings_file": self._timings_file(),
            "trace_windows": self._trace_windows(),
            "last_summary": last,
            "faults": faults,
            "warnings": self._log.messages,
        }

    def _note_faults(self, profiler: Profiler) -> None:
        """Record the parts of `profiler` that a fault turned off, and why (once each)."""
        for fault in profiler.faults:
            part = fault.split(":", 1)[0]
            if part not in self._faulted:
                self._faulted.add(part)
                self.faults.append(fault)

    def _timings_file(self) -> str | None:
        if self.run_dir is None or self.rank is None:
            return None
        path = timing_path(self.run_dir, self.rank)
        try:
            return str(path) if path.is_file() else None
        except OSError:  # a run directory this worker may not look into
            return None

    def _trace_windows(self) -> list[str]:
        """Windows with a trace of this rank written since this run started (not a previous run's)."""
        if self.run_dir is None or self.rank is None:
            return []
        windows: list[str] = []
        try:
            for trace in RunDir(self.run_dir).traces():
                if (
                    trace.rank == self.rank
                    and trace.window not in windows
                    and trace.path.stat().st_mtime_ns >= self._started_ns - 1_000_000_000
                ):
                    windows.append(trace.window)
        except OSError:
            pass  # no traces directory yet, or one that cannot be read: nothing to list
        return windows


class _WorkerPhase:
    """A Profiler phase whose faults turn the worker's profiling off instead of raising."""

    __slots__ = ("_entered", "_inner", "_name", "_run")

    def __init__(self, run: _WorkerRun, inner: AbstractContextManager[Any], name: str) -> None:
        self._run = run
        self._inner = inner
        self._name = name
        self._entered = False

    def __enter__(self) -> _WorkerPhase:
        try:
            self._inner.__enter__()
            self._entered = True
        except Exception as exc:
            self._run.fail(f"phase {self._name!r}", exc)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._entered:
            self._entered = False
            try:
                self._inner.__exit__(exc_type, exc, tb)
            except Exception as error:
                self._run.fail(f"phase {self._name!r}", error)
        # None: the user's own exception passes through unchanged.


class _WarningLog(logging.Handler):
    """Keeps what rankscope warns about in this process while a worker profiles.

    A Ray actor has its process to itself, so every rankscope warning there is the
    worker's. The integration's own warnings are left out: they are in `failure`.
    Records still reach the process's own handlers (or stderr, where there are none).
    """

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[tuple[str, str]] = []  # (logger name, message)
        self._attached = False

    def attach(self) -> None:
        if not self._attached:
            logging.getLogger("rankscope").addHandler(self)
            self._attached = True

    def detach(self) -> None:
        if self._attached:
            logging.getLogger("rankscope").removeHandler(self)
            self._attached = False

    def emit(self, record: logging.LogRecord) -> None:
        last_resort = logging.lastResort
        # Being attached, this handler stops Python falling back to stderr where no
        # logging is configured (a Ray worker); do what it would have done.
        if (
            last_resort is not None
            and record.levelno >= last_resort.level
            and not self._others_handle(record)
        ):
            last_resort.handle(record)
        if record.name == __name__ or len(self.records) >= _MAX_WARNINGS:
            return
        try:
            message = record.getMessage()
        except Exception:
            message = str(record.msg)
        self.records.append((record.name, message.removeprefix("rankscope: ")))

    def _others_handle(self, record: logging.LogRecord) -> bool:
        """Whether a handler other than this one sees `record` (as Logger.callHandlers walks)."""
        node: logging.Logger | None = logging.getLogger(record.name)
        while node is not None:
            if any(handler is not self for handler in node.handlers):
                return True
            node = node.parent if node.propagate else None
        return False

    @property
    def messages(self) -> list[str]:
        return [message for _, message in self.records]


# -- the driver's side ---------------------------------------------------------------


class ActorProfiling:
    """The profiling of a list of actors, as `profile_actors` yields it."""

    def __init__(self, actors: list[Any], ranks: list[int], world_size: int) -> None:
        self.actors = actors
        """The actor handles, in the order given."""
        self.ranks = ranks
        """The rank each actor profiles as."""
        self.world_size = world_size
        """The world size every actor was given."""
        self.summaries: list[dict[str, Any]] = []
        """One `RankscopeWorker.profile_summary()` per actor: as of start inside the block,
        as of stop after it. An actor that died or did not answer in time gets one that
        says so in `state`."""

    def step(self) -> None:
        """Mark the end of a training step on every actor (`step_profiling`)."""
        step_profiling(self.actors)


@contextlib.contextmanager
def profile_actors(
    actors: Sequence[Any],
    config: ProfileConfig | Mapping[str, Any],
    *,
    ranks: Sequence[int] | None = None,
    world_size: int | None = None,
    start_timeout: float = _START_TIMEOUT_S,
    stop_timeout: float = _STOP_TIMEOUT_S,
) -> Iterator[ActorProfiling]:
    """Profile `actors` (handles of `RankscopeWorker` actors) for the ``with`` block.

    Starts profiling on every actor (actor i as rank ``ranks[i]``, by default i, of
    `world_size`, by default ``len(actors)``) and stops it when the block ends, also
    when it raises, gathering each actor's summary into `ActorProfiling.summaries`.
    The config is checked first, here: a bad one raises `ConfigError` before any actor
    is called. Workers whose profiling failed, died or did not answer are logged and
    reported, never raised; training goes on.
    """
    actors = list(actors)
    data, rank_list, world = _plan(actors, config, ranks, world_size)
    _check_timeout("start_timeout", start_timeout)
    _check_timeout("stop_timeout", stop_timeout)
    profiling = ActorProfiling(actors, rank_list, world)
    try:
        profiling.summaries = _call_all(
            actors,
            "start_profile",
            ranks=rank_list,
            world_size=world,
            timeout=start_timeout,
            config=data,
        )
        _log_failures(profiling.summaries, None)
        yield profiling
    finally:
        started = profiling.summaries
        profiling.summaries = _call_all(
            actors, "stop_profile", ranks=rank_list, world_size=world, timeout=stop_timeout
        )
        _log_failures(profiling.summaries, started)
        _log_done(profiling.summaries)


def start_profiling(
    actors: Sequence[Any],
    config: ProfileConfig | Mapping[str, Any],
    *,
    ranks: Sequence[int] | None = None,
    world_size: int | None = None,
    timeout: float = _START_TIMEOUT_S,
) -> list[dict[str, Any]]:
    """Start profiling on every actor and wait for them; returns their summaries.

    Ranks, world size and the config check as in `profile_actors`. Pair it with
    `stop_profiling` in a ``finally``.
    """
    actors = list(actors)
    data, rank_list, world = _plan(actors, config, ranks, world_size)
    _check_timeout("timeout", timeout)
    summaries = _call_all(
        actors, "start_profile", ranks=rank_list, world_size=world, timeout=timeout, config=data
    )
    _log_failures(summaries, None)
    return summaries


def step_profiling(actors: Sequence[Any]) -> list[Any]:
    """Mark the end of a training step on every actor; returns the calls' ObjectRefs.

    Does not wait: Ray runs an actor's calls from one caller in the order they were
    made, so the step lands after the training calls made before it. Call it from the
    driver or let each actor call `step_profile()` itself, not both.
    """
    refs = []
    for actor in actors:
        try:
            refs.append(actor.step_profile.remote())
        except Exception as exc:  # a handle Ray can no longer send to; stop will say so
            logger.debug("rankscope: step_profile() could not be sent: %s", exc)
    return refs


def stop_profiling(
    actors: Sequence[Any],
    *,
    ranks: Sequence[int] | None = None,
    timeout: float = _STOP_TIMEOUT_S,
) -> list[dict[str, Any]]:
    """Stop profiling on every actor and gather their summaries; never raises for an actor.

    `ranks` (as given to `start_profiling`) only label the summaries of actors that died
    or did not answer within `timeout` seconds.
    """
    actors = list(actors)
    rank_list = list(range(len(actors))) if ranks is None else list(ranks)
    if len(rank_list) != len(actors):
        raise ConfigError("ranks", ranks, f"one rank per actor ({len(actors)})")
    _check_timeout("timeout", timeout)
    summaries = _call_all(actors, "stop_profile", ranks=rank_list, world_size=None, timeout=timeout)
    _log_failures(summaries, None)
    _log_done(summaries)
    return summaries


def _plan(
    actors: list[Any],
    config: object,
    ranks: Sequence[int] | None,
    world_size: int | None,
) -> tuple[dict[str, Any], list[int], int]:
    """Check everything on the driver; return the config as plain data, the ranks and world size."""
    if isinstance(config, Mapping):
        config = ProfileConfig.from_dict(config)
    if not isinstance(config, ProfileConfig):
        raise ConfigError("config", config, "a ProfileConfig or a mapping of its fields")
    if not actors:
        raise ConfigError("actors", actors, "a non-empty list of actor handles")
    for actor in actors:
        if not hasattr(getattr(actor, "start_profile", None), "remote"):
            raise ConfigError(
                "actors",
                actor,
                "handles of Ray actors whose class mixes in rankscope.integrations.ray.RankscopeWorker",
            )
    world = len(actors) if world_size is None else world_size
    if isinstance(world, bool) or not isinstance(world, int) or world < len(actors):
        raise ConfigError("world_size", world_size, f"None or an int >= {len(actors)} (the actors)")
    rank_list = list(range(len(actors))) if ranks is None else list(ranks)
    accepted = f"{len(actors)} distinct ints in 0..{world - 1}, one per actor"
    if len(rank_list) != len(actors) or len(set(rank_list)) != len(rank_list):
        raise ConfigError("ranks", ranks, accepted)
    for rank in rank_list:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
            raise ConfigError("ranks", ranks, accepted, f"{rank!r} is not (pass world_size?)")
    config.check_world_size(world)
    return config.to_dict(), rank_list, world


def _check_timeout(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(name, value, "a number of seconds > 0")


def _call_all(
    actors: list[Any],
    method: str,
    *,
    ranks: list[int],
    world_size: int | None,
    timeout: float,
    config: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Call `method` on every actor (start_profile gets `config`, its rank and the world
    size) and gather the summaries it returns.

    An actor that cannot be called, died, or has not answered within `timeout` seconds
    gets a summary saying so; nothing here raises for an actor.
    """
    calls: list[Any] = []  # an ObjectRef, or why the call could not be made
    for actor, rank in zip(actors, ranks, strict=True):
        try:
            remote = getattr(actor, method).remote
            calls.append(remote() if config is None else remote(config, rank, world_size))
        except Exception as exc:
            calls.append(_reason(f"{method}() could not be sent", exc))
    refs = [call for call in calls if not isinstance(call, str)]
    ready: set[Any] = set()
    waited = f"no answer to {method}() within {timeout:g} s"
    if refs:
        try:
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
            ready = set(done)
        except Exception as exc:  # Ray itself failing must not hide the training's own error
            waited = _reason(f"waiting for {method}() failed", exc)
    summaries = []
    for call, rank in zip(calls, ranks, strict=True):
        if isinstance(call, str):
            summaries.append(_unreachable(rank, world_size, call))
        elif call not in ready:
            summaries.append(_unreachable(rank, world_size, waited))
        else:
            try:
                summaries.append(ray.get(call))
            except Exception as exc:  # ActorDiedError and the rest of ray.exceptions.RayError
                why = _reason(f"{method}() failed", exc)
                summaries.append(_unreachable(rank, world_size, why))
    return summaries


def _reason(what: str, exc: BaseException) -> str:
    """`what: ErrorType: first line of the message`, cut short (Ray's errors run to pages)."""
    lines = str(exc).strip().splitlines()
    return f"{what}: {type(exc).__name__}: {lines[0] if lines else ''}"[:_MAX_REASON]


def _unreachable(rank: int, world_size: int | None, why: str) -> dict[str, Any]:
    """The summary of an actor that did not give one, with the keys profile_summary() has."""
    return {
        "rank": rank,
        "world_size": world_size,
        "host": None,
        "pid": None,
        "state": f"failed: {why}",
        "run_dir": None,
        "timings_file": None,
        "trace_windows": [],
        "last_summary": None,
        "faults": [why],
        "warnings": [],
    }


def _log_failures(summaries: list[dict[str, Any]], before: list[dict[str, Any]] | None) -> None:
    """One warning per worker whose profiling failed (and had not already, as of `before`)."""
    for i, summary in enumerate(summaries):
        state = str(summary.get("state"))
        if not state.startswith("failed"):
            continue
        if before is not None and i < len(before) and before[i].get("state") == state:
            continue
        logger.warning(
            "rankscope: rank %s (actor %d): profiling %s; training goes on",
            summary.get("rank"),
            i,
            state,
        )


def _log_done(summaries: list[dict[str, Any]]) -> None:
    run_dirs = sorted({str(s["run_dir"]) for s in summaries if s.get("run_dir")})
    failed = sum(str(s.get("state")).startswith("failed") for s in summaries)
    logger.info(
        "rankscope: profiling stopped on %d actor(s), %d failed; run directory %s "
        "(next: rankscope report RUN_DIR)",
        len(summaries),
        failed,
        ", ".join(run_dirs) or "none",
    )
