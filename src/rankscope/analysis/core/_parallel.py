"""Reading files in parallel: the analysis's one place for worker processes.

Two shapes of work, one module:

- `ordered_map`: reading a run's timings and summarising its traces both turn a list
  of files into a list of results, in order.
- `LaneWorkers`: merging traces turns each file into a stream of messages too large to
  hold, which the caller consumes as they come, in an order that never varies, with
  each worker a bounded distance ahead. Its workers are fresh interpreters, never
  forks: the caller may hold threads and locks.

Both pay for workers only when there is enough to read; `worker_count` is that rule.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Generic, TypeVar, cast

from ..._errors import TraceError

if TYPE_CHECKING:
    import queue
    import subprocess

__all__ = [
    "PARALLEL_BYTES",
    "LaneWorkers",
    "WorkerStopped",
    "file_size",
    "ordered_map",
    "usable_cores",
    "worker_count",
]

PARALLEL_BYTES = 32 << 20
"""Inputs smaller than this in all are read in this process: a worker costs more than it saves."""
_CHUNKS_PER_WORKER = 8  # several contiguous chunks per worker, so progress moves and loads even out

T = TypeVar("T")
R = TypeVar("R")
J = TypeVar("J")
M = TypeVar("M")


def ordered_map(
    work: Callable[[T], R],
    items: Sequence[T],
    *,
    size: int,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    min_bytes: int | None = None,
) -> list[R]:
    """`[work(item) for item in items]`, by a process per core when `size` (the bytes to
    read in all) is at least `min_bytes` (default PARALLEL_BYTES).

    `work` must be a module-level function and must not raise: it returns what went
    wrong as a value. `workers` caps the processes (default: one per core).
    `progress(done, total)` is called in this process as items complete, in order.
    """
    n = len(items)
    threshold = PARALLEL_BYTES if min_bytes is None else min_bytes
    count = worker_count(n, size, min_bytes=threshold, cap=workers)
    if count < 2:
        out: list[R] = []
        for item in items:
            out.append(work(item))
            if progress is not None:
                progress(len(out), n)
        return out
    # Here, not at the top: reading a few small files needs no pool, and a one-off
    # `rankscope kernels` would pay for importing one.
    from concurrent.futures import ProcessPoolExecutor

    step = max(1, n // (count * _CHUNKS_PER_WORKER))
    chunks = [items[i : i + step] for i in range(0, n, step)]
    results: list[R] = []
    with ProcessPoolExecutor(count, mp_context=_context()) as pool:
        for chunk in pool.map(partial(_each, work), chunks):
            results.extend(chunk)
            if progress is not None:
                progress(len(results), n)
    return results


def file_size(path: Path) -> int:
    """The size of `path` in bytes; 0 where it cannot be read (its reader says why)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _each(work: Callable[[Any], Any], chunk: Sequence[Any]) -> list[Any]:
    return [work(item) for item in chunk]


def _context() -> Any:
    # fork starts a worker in milliseconds with numpy already imported; where fork is
    # unsafe (macOS) or unavailable, spawn.
    import multiprocessing
    import platform

    linux = platform.system() == "Linux"
    return multiprocessing.get_context("fork" if linux else "spawn")


# -- streamed results: a lane of jobs per worker, messages taken in turn ----------------

_RUN_AHEAD = 32
"""Messages a worker may hold ready before the reader takes them: what bounds its memory."""
# A worker takes sys.path, its work, then its jobs, as pickles on stdin and sends
# pickles back. Ctrl-C is the parent's to handle: it kills the workers.
_WORKER_BOOT = (
    "import pickle, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "sys.path[:] = pickle.load(sys.stdin.buffer); "
    "from rankscope.analysis.core._parallel import _serve; _serve()"
)
# What a worker sends: READY once started, then per job its messages and NEXT, then
# DONE, or FAILED with the exception once something raised.
_READY = ("ready",)
_MESSAGE = "message"
_NEXT = ("next",)
_DONE = ("done",)
_FAILED = "failed"


def usable_cores() -> int:
    """The cores this process may run on: its affinity mask where the system keeps one."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def worker_count(
    items: int, size: int, *, min_bytes: int = PARALLEL_BYTES, cap: int | None = None
) -> int:
    """How many workers should read `items` inputs of `size` bytes in all.

    One per usable core (or `cap`, when the caller sets one) and at most one per input;
    1 (read here, no worker) where fewer than two would run or there is less than
    `min_bytes` to read.
    """
    count = min(usable_cores() if cap is None else max(1, cap), items)
    return count if count >= 2 and size >= min_bytes else 1


class WorkerStopped(Exception):
    """A worker ended without finishing: killed, crashed, or never a worker at all.

    Internal: the caller knows what `job` was and raises its own error about it.
    """

    def __init__(self, job: Any, exit_code: int) -> None:
        super().__init__(job, exit_code)
        self.job = job
        """The job the worker was on (None if it had none)."""
        self.exit_code = exit_code


class LaneWorkers(Generic[J, M]):
    """Worker processes that run `work(job, send)` and stream what it sends, taken in turns.

    `start` them early: a fresh interpreter takes a while to import the module of
    `work`, which it does before it says it is ready. Then `stream` once, and `close`
    always. Worker i takes jobs i, i + count, ... (its lane), and the reader takes one
    message from each worker in turn, so the same jobs give the same order every time;
    a worker that gets `_RUN_AHEAD` messages ahead waits for the reader.
    """

    def __init__(self, work: Callable[[J, Callable[[M], None]], None], label: str) -> None:
        self._work = work
        self._label = label
        self._procs: list[tuple[subprocess.Popen[bytes], IO[bytes], IO[bytes]]] = []

    @classmethod
    def start(
        cls, work: Callable[[J, Callable[[M], None]], None], count: int, *, label: str = "worker"
    ) -> LaneWorkers[J, M]:
        """`count` workers for `work`; none when `count` < 2 or none can be started.

        `work` must be a module-level function; jobs and messages must pickle. `label`
        names the workers in the error that a bug in `work` raises.
        """
        workers = cls(work, label)
        if count < 2 or not sys.executable or getattr(sys, "frozen", False):
            return workers  # the jobs run here (a frozen app has no interpreter to start)
        # Here, not at the top: ordered_map's callers never start a worker this way.
        import subprocess

        # Pickled before any worker starts: work that cannot cross fails here, leaving none.
        given = pickle.dumps(sys.path) + pickle.dumps((work, label))
        try:
            for _ in range(count):
                proc = subprocess.Popen(
                    [sys.executable, "-c", _WORKER_BOOT],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                )
                to_worker, from_worker = cast(IO[bytes], proc.stdin), cast(IO[bytes], proc.stdout)
                workers._procs.append((proc, to_worker, from_worker))
                to_worker.write(given)
                to_worker.flush()
        except OSError:  # no interpreter to start: the jobs run here instead
            workers.close()
            return cls(work, label)
        return workers

    def stream(self, jobs: Sequence[J], handle: Callable[[M], None]) -> None:
        """Run the work for every job, and `handle` each message it sends, here.

        With no workers, or some that did not start (the package not importable by a
        fresh interpreter), the jobs run here, in order. What the work raises is raised
        here: a TraceError as itself, anything else as a RuntimeError that starts with
        "<label> failed" and carries the worker's traceback. A worker that ends without
        finishing raises WorkerStopped.
        """
        if not self._ready():
            for job in jobs:
                self._work(job, handle)
            return
        lanes = [jobs[lane :: len(self._procs)] for lane in range(len(self._procs))]
        for (_, to_worker, _), lane_jobs in zip(self._procs, lanes, strict=True):
            try:
                pickle.dump(lane_jobs, to_worker)
                to_worker.close()
            except OSError:
                pass  # it has died: reading from it below says so
        at = [0] * len(lanes)  # the job each lane is on
        active = list(range(len(lanes)))
        while active:
            for lane in tuple(active):
                while (frame := self._receive(lane, lanes[lane], at[lane])) == _NEXT:
                    at[lane] += 1
                if frame == _DONE:
                    active.remove(lane)
                elif frame[0] == _FAILED:
                    raise frame[1]
                else:
                    handle(frame[1])

    def close(self) -> None:
        """Stop every worker (killing any still at work) and wait for it."""
        for proc, to_worker, from_worker in self._procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for pipe in (to_worker, from_worker):
                with contextlib.suppress(OSError):
                    pipe.close()
        self._procs = []

    def _ready(self) -> bool:
        """True once every worker has said it started; else they are closed."""
        if not self._procs:
            return False
        for _, _, from_worker in self._procs:
            try:
                ready = pickle.load(from_worker)
            except (EOFError, OSError, pickle.UnpicklingError):
                ready = None
            if ready != _READY:
                self.close()
                return False
        return True

    def _receive(self, lane: int, jobs: Sequence[J], at: int) -> tuple[Any, ...]:
        proc, _, from_worker = self._procs[lane]
        try:
            frame: tuple[Any, ...] = pickle.load(from_worker)
        except (EOFError, OSError, pickle.UnpicklingError):
            proc.kill()
            job = jobs[min(at, len(jobs) - 1)] if jobs else None
            raise WorkerStopped(job, proc.wait()) from None
        return frame


def _serve() -> None:
    """A worker process: run the jobs sent on stdin, send their messages on stdout."""
    # Here: only a worker needs them.
    import queue
    import threading

    channel = sys.stdout.buffer
    sys.stdout = sys.stderr  # the pipe carries messages alone
    # Loading the work imports its module: one this worker cannot import never says
    # it is ready, and the caller does the work itself.
    work, label = pickle.load(sys.stdin.buffer)
    pickle.dump(_READY, channel)
    channel.flush()
    try:
        jobs = pickle.load(sys.stdin.buffer)
    except EOFError:
        return  # the caller ended (or failed) before it needed this worker
    pending: queue.Queue[tuple[Any, ...] | None] = queue.Queue(_RUN_AHEAD)

    def send(message: Any) -> None:
        pending.put((_MESSAGE, message))

    # A thread writes while this one works on: the reader takes messages in turns.
    thread = threading.Thread(target=_pump, args=(pending, channel), daemon=True)
    thread.start()
    try:
        for job in jobs:
            work(job, send)
            pending.put(_NEXT)
        pending.put(_DONE)
    except BaseException as exc:  # every failure goes back to the reader
        pending.put((_FAILED, _portable(exc, label)))
    pending.put(None)
    thread.join()


def _pump(pending: queue.Queue[tuple[Any, ...] | None], channel: IO[bytes]) -> None:
    try:
        while (frame := pending.get()) is not None:
            pickle.dump(frame, channel, pickle.HIGHEST_PROTOCOL)
            channel.flush()
    except BaseException:  # the reader is gone: nothing left to work for
        os._exit(1)


def _portable(exc: BaseException, label: str) -> BaseException:
    """`exc` in a form that crosses to the reader.

    A TraceError (a file that cannot be read) stays one; anything else carries its
    worker-side traceback in its message, so that a bug is found where it happened.
    """
    if isinstance(exc, TraceError):
        return TraceError(*exc.args)
    import traceback

    text = "".join(traceback.format_exception(exc)).rstrip()
    return RuntimeError(f"{label} failed: {type(exc).__name__}: {exc}\n{text}")
