"""The background worker that finalises exported traces off the training thread."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

from .._log import get_logger
from ..rundir._files import read_json_object
from ._finalize import FinalizeJob, discard, finalize

__all__ = ["JobThread", "TraceFinalizer"]

logger = get_logger(__name__)

# Where `rankscope` itself lives, so the child finds the same copy even when it was
# imported through a sys.path entry rather than installed.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])

J = TypeVar("J")


class JobThread(Generic[J]):
    """Runs jobs one at a time on a daemon thread and counts the unfinished ones, so the
    training thread can bound them (`backlog`) and wait for them (`drain`).

    A subclass says what a job is (`_work`). `on_error` is called on the worker thread
    with a one-line cause when a job raises; the thread goes on with the next.
    """

    def __init__(self, name: str, what: str, on_error: Callable[[str], None]) -> None:
        self._name = name
        self._what = what  # what the jobs leave behind, for the give-up warning
        self._on_error = on_error
        self._jobs: queue.Queue[J] = queue.Queue()
        self._pending: list[J] = []
        self._idle = threading.Condition()
        self._thread: threading.Thread | None = None

    def submit(self, job: J) -> None:
        """Queue a job; raises (RuntimeError) if no worker thread can be started."""
        if self._thread is None:
            thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            thread.start()  # before the job counts as pending: a failed start leaves no wait
            self._thread = thread
        with self._idle:
            self._pending.append(job)
        self._jobs.put(job)

    @property
    def backlog(self) -> int:
        """Jobs submitted and not finished yet."""
        with self._idle:
            return len(self._pending)

    def drain(self, timeout: float) -> bool:
        """Wait until every submitted job is done; False if `timeout` ran out first."""
        deadline = time.monotonic() + timeout
        with self._idle:
            if self._pending:
                self._waiting(list(self._pending))
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    logger.warning(
                        "rankscope: gave up after %.0f s waiting for %d %s; they keep "
                        "temporary names until the work finishes",
                        timeout,
                        len(self._pending),
                        self._what,
                    )
                    return False
                self._idle.wait(left)
        return True

    def _waiting(self, jobs: list[J]) -> None:
        """Called once when drain() has jobs to wait for."""

    def _work(self, job: J) -> None:
        raise NotImplementedError

    def _failed(self, job: J, exc: Exception) -> str:
        """The one-line cause passed to on_error when `_work(job)` raised `exc`."""
        return f"{type(exc).__name__}: {exc}"

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                self._work(job)
            except Exception as exc:  # never let the worker thread die with work queued
                self._on_error(self._failed(job, exc))
            finally:
                with self._idle:
                    self._pending.remove(job)
                    self._idle.notify_all()


class TraceFinalizer(JobThread[FinalizeJob]):
    """Runs FinalizeJobs one at a time on a daemon thread, each in a child process.

    `on_error` is called (on the worker thread) with a one-line cause when a job
    fails; the job's files are then absent under their final names.
    """

    def __init__(self, on_error: Callable[[str], None]) -> None:
        super().__init__("rankscope-finalize", "trace file(s)", on_error)
        self.last_summary: dict[str, Any] | None = None

    def _waiting(self, jobs: list[FinalizeJob]) -> None:
        logger.info(
            "rankscope: waiting for %d trace file(s) to be compressed and summarised: %s",
            len(jobs),
            ", ".join(Path(j.trace).parent.name + "/" + Path(j.trace).name for j in jobs),
        )

    def _work(self, job: FinalizeJob) -> None:
        error = self._finalize(job)
        if error is None:
            self.last_summary = read_json_object(job.summary, _SUMMARY_MAX)  # never through a link
        else:
            discard(job)  # a child that died before finalising leaves the raw export behind
            self._on_error(error)

    @staticmethod
    def _finalize(job: FinalizeJob) -> str | None:
        # Put this copy of rankscope first on the child's path: `-m` would put the working
        # directory first, where another `rankscope/` may stand.
        code = (
            f"import sys; sys.path.insert(0, {_PACKAGE_ROOT!r}); "
            "from rankscope.capture._finalize import main; sys.exit(main())"
        )
        command = [sys.executable, "-c", code, job.to_json()]
        try:
            done = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                check=False,
                start_new_session=True,  # a Ctrl-C at the terminal must not cut a write short
            )
        except OSError as exc:
            logger.debug("rankscope: no child process (%s); finalising on the worker thread", exc)
            try:
                finalize(job)
            except Exception as inner:
                return f"{type(inner).__name__}: {inner}"
            return None
        if done.returncode != 0:
            lines = done.stderr.decode(errors="replace").strip().splitlines()
            return lines[-1] if lines else f"finaliser exited with code {done.returncode}"
        return None


_SUMMARY_MAX = 64 << 20  # a summary is a few hundred KB at most
