"""MemorySnapshots: the CUDA allocator's history on one rank, dumped where memory_viz reads it.

Recording is torch.cuda.memory._record_memory_history; a dump is
torch.cuda.memory._snapshot() pickled as torch's own _dump_snapshot pickles it, so the
files open at https://pytorch.org/memory_viz and with `python -m torch.cuda._memory_viz`.
They are written inside RUN_DIR only, never through a link there (see `_files`).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from .._log import get_logger
from .._torch import import_torch
from ..config._ranks import RankInfo
from ..rundir import _files
from ..rundir._layout import MEMORY, memory_path
from ._faults import OneFault
from ._worker import JobThread

if TYPE_CHECKING:
    from ..config._config import MemoryConfig

__all__ = [
    "MAX_OOM_DUMPS",
    "MAX_PENDING_WRITES",
    "MEMORY_DIR",
    "STOP_TIMEOUT_S",
    "MemorySnapshots",
    "SnapshotWriter",
    "oom_window_name",
    "write_atomic",
]

logger = get_logger(__name__)

MEMORY_DIR = MEMORY
"""The folder of RUN_DIR that holds one snapshot per window per rank (see memory_path)."""

MAX_OOM_DUMPS = 3
"""Out-of-memory snapshots per run, at most: a loop that catches OOM and retries would
otherwise write one large file per step."""

MAX_PENDING_WRITES = 2
"""Snapshots waiting to be written, at most; a window that closes past it is not saved."""

STOP_TIMEOUT_S = 300.0
"""How long stop() waits for snapshots still being written."""


def oom_window_name(step: int) -> str:
    """`oom-step-000012`: CUDA ran out of memory during step 12."""
    return f"oom-step-{step:06d}"


def write_atomic(
    data: bytes, final: Path, tag: str, run_dir: str | os.PathLike[str] | None = None
) -> None:
    """Write `data` to `final` through a hidden temporary sibling: `final` is complete or absent.

    No link below `run_dir` is followed (by default `final`'s own folder, made as
    needed). On failure the temporary file is removed and the error raised.
    """
    _files.write_atomic(final.parent if run_dir is None else run_dir, final, data, tag)


@dataclass(frozen=True, slots=True)
class _Write:
    data: bytes
    path: Path
    window: str
    run_dir: str


class SnapshotWriter(JobThread[_Write]):
    """Writes pickled snapshots to disk on a daemon thread, one at a time.

    Pickling happens on the caller (it holds the GIL either way); only the disk write,
    which releases it, is moved off the training thread. `on_error` is called on the
    writer thread with a one-line cause when a write fails.
    """

    def __init__(self, on_error: Callable[[str], None]) -> None:
        super().__init__("rankscope-memory", "memory snapshot(s)", on_error)

    def _work(self, job: _Write) -> None:
        began = time.perf_counter()
        write_atomic(job.data, job.path, f"w{os.getpid()}", job.run_dir)
        logger.debug(
            "rankscope: wrote %s (%.1f MB) in %.2f s",
            job.path,
            len(job.data) / 1e6,
            time.perf_counter() - began,
        )

    def _failed(self, job: _Write, exc: Exception) -> str:
        return f"writing {job.path} failed ({type(exc).__name__}: {exc})"


# -- the process's one out-of-memory observer --------------------------------------


class _OomObserver:
    """The function torch calls when CUDA runs out of memory, attached at most once.

    torch keeps every observer it is given for the life of the process and cannot detach
    one, so rankscope attaches this single object and points it at the MemorySnapshots
    that is recording (by weak reference), or at nothing.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._attached = False
        self._target: weakref.ref[MemorySnapshots] | None = None

    def point_at(self, torch: ModuleType, target: MemorySnapshots | None) -> None:
        """Aim at `target` (None: at nothing), attaching to torch on first use."""
        with self._lock:
            if target is not None and not self._attached:
                torch._C._cuda_attach_out_of_memory_observer(self)
                self._attached = True
            self._target = None if target is None else weakref.ref(target)

    def aims_at(self, target: MemorySnapshots) -> bool:
        ref = self._target
        return ref is not None and ref() is target

    def __call__(self, device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        # Called by the CUDA caching allocator, holding the GIL but not its own lock, just
        # before it raises OutOfMemoryError: anything raised here would replace that error.
        try:
            ref = self._target
            target = ref() if ref is not None else None
            if target is not None:
                target._on_oom(device, alloc, device_free)
        except Exception:
            with contextlib.suppress(Exception):
                logger.debug("rankscope: the out-of-memory observer failed", exc_info=True)


_OOM_OBSERVER = _OomObserver()


class MemorySnapshots(OneFault):
    """CUDA allocator history on one rank, dumped when a window closes and when CUDA runs out
    of memory.

    Without CUDA it logs one info line and every method does nothing. Every call is guarded:
    a fault logs one warning, stops recording and leaves snapshots off for the rest of the
    run; nothing raises into training. The snapshot is taken on the calling thread; the
    file is written in the background except after an out-of-memory error, when the process
    may be about to end.
    """

    def __init__(self, config: MemoryConfig, run_dir: str, rank_info: RankInfo) -> None:
        super().__init__()
        self._part = "memory snapshots"
        self._torch: ModuleType = import_torch("memory snapshots")
        self._config = config
        self._run_dir = run_dir
        self._rank = rank_info.rank
        self._step = 0
        self._recording = False
        self._pid = os.getpid()
        self._oom_step = -1  # the step of the latest out-of-memory dump
        self._oom_dumps = 0
        self._oom_lock = threading.Lock()
        self._failure: str | None = None  # a write failed on the writer thread
        self._skipped = 0  # windows not saved because writes fell behind
        self._writer = SnapshotWriter(self._report_failure)
        self.enabled = True
        """False once a fault turned snapshots off, or from the start without CUDA."""
        self.dumps = 0
        """Snapshots taken so far (windows and out-of-memory)."""
        if not self._torch.cuda.is_available():
            self.enabled = False
            logger.info(
                "rankscope: CUDA memory snapshots need CUDA, which this process does not have; "
                "nothing is recorded on rank %d",
                self._rank,
            )
            return
        try:
            backend = self._torch.cuda.memory.get_allocator_backend()
        except Exception as exc:
            self._fail("reading the allocator backend", exc)
            return
        if backend != "native":
            self._switch_off(
                f"CUDA memory snapshots need PyTorch's native caching allocator; this process "
                f"uses {backend!r} (PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF backend), which "
                f"cannot record history"
            )

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Record allocator history from now on; with on_oom, dump when CUDA runs out of memory."""
        if not self.enabled or self._recording:
            return
        cfg = self._config
        try:
            self._torch.cuda.memory._record_memory_history(
                enabled="all",
                context="all",
                stacks=cfg.stacks,
                max_entries=cfg.max_entries,
            )
        except Exception as exc:
            self._fail("starting to record allocator history", exc)
            return
        self._recording = True
        self._pid = os.getpid()
        if cfg.on_oom:
            try:
                _OOM_OBSERVER.point_at(self._torch, self)
            except Exception as exc:
                self._fail("attaching the out-of-memory observer", exc)

    def step(self) -> None:
        """Count a training step (names the out-of-memory dumps)."""
        self._step += 1
        if self._failure is not None:
            self.fault(self._failure)  # already warned on the writer thread

    def dump(self, window: str) -> None:
        """Snapshot now into RUN_DIR/memory/<window>/rank-NNNNN.pickle (written in the background)."""
        if self._failure is not None:
            self.fault(self._failure)
        if not self.enabled or not self._recording:
            return
        backlog = self._writer.backlog
        if backlog >= MAX_PENDING_WRITES:
            self._skipped += 1
            if self._skipped == 1:
                logger.warning(
                    "rankscope: memory snapshot %s on rank %d not saved: %d earlier snapshots "
                    "are still being written (lower memory.max_entries or capture less often); "
                    "later ones are skipped the same way",
                    window,
                    self._rank,
                    backlog,
                )
            return
        try:
            data, took = self._take()
            path = memory_path(self._run_dir, window, self._rank)
            self._writer.submit(_Write(data, path, window, self._run_dir))
        except Exception as exc:
            self._fail(f"dumping a memory snapshot for {window}", exc)
            return
        logger.info(
            "rankscope: memory snapshot %s/%s/%s: %.1f MB, taken and pickled in %.2f s "
            "on the training thread",
            MEMORY_DIR,
            window,
            path.name,
            len(data) / 1e6,
            took,
        )

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop recording, let go of the out-of-memory observer, wait for pending writes."""
        if self._recording:
            self._release()
        self._writer.drain(timeout)
        if self._failure is not None:
            self.fault(self._failure)

    # -- internals -----------------------------------------------------------------

    def _take(self) -> tuple[bytes, float]:
        """The snapshot, pickled as torch's _dump_snapshot does, and the seconds it took."""
        began = time.perf_counter()
        snapshot = self._torch.cuda.memory._snapshot()
        data = pickle.dumps(snapshot)
        self.dumps += 1
        return data, time.perf_counter() - began

    def _on_oom(self, device: int, alloc: int, device_free: int) -> None:
        """Dump synchronously: the OutOfMemoryError that follows may end the process."""
        if not self.enabled or not self._recording or os.getpid() != self._pid:
            return
        # The allocator may call this on another thread (autograd's device threads); a
        # second OOM while one is being dumped is left alone rather than waited for.
        if not self._oom_lock.acquire(blocking=False):
            return
        try:
            step = self._step
            if step == self._oom_step:
                return  # torch may retry (a smaller workspace) and fail again in one step
            if self._oom_dumps >= MAX_OOM_DUMPS:
                if self._oom_dumps == MAX_OOM_DUMPS:
                    self._oom_dumps += 1
                    logger.warning(
                        "rankscope: CUDA ran out of memory again on rank %d (step %d); "
                        "%d snapshots were written already, no more are taken this run",
                        self._rank,
                        step,
                        MAX_OOM_DUMPS,
                    )
                return
            self._oom_step = step
            self._oom_dumps += 1
            window = oom_window_name(step)
            path = memory_path(self._run_dir, window, self._rank)
            data, took = self._take()
            write_atomic(data, path, f"oom{os.getpid()}", self._run_dir)
            logger.warning(
                "rankscope: CUDA out of memory on rank %d in step %d (cuda:%d asked for %.1f MB, "
                "%.1f MB free); allocator snapshot written to %s (%.1f MB, %.2f s)",
                self._rank,
                step,
                device,
                alloc / 1e6,
                device_free / 1e6,
                path,
                len(data) / 1e6,
                took,
            )
        except Exception as exc:
            # Possibly not the training thread: that one stops recording at its next call.
            self._report_failure(
                f"dumping a memory snapshot after CUDA ran out of memory failed "
                f"({type(exc).__name__}: {exc})"
            )
        finally:
            self._oom_lock.release()

    def _release(self) -> None:
        """Stop recording and point the out-of-memory observer away from this object."""
        self._recording = False
        if _OOM_OBSERVER.aims_at(self):
            _OOM_OBSERVER.point_at(self._torch, None)
        try:
            self._torch.cuda.memory._record_memory_history(enabled=None)
        except Exception:
            logger.debug("rankscope: stopping allocator history failed", exc_info=True)

    # -- faults --------------------------------------------------------------------

    def fault(self, what: str) -> None:
        """Turn snapshots off for the rest of the run: one warning naming `what`, recording stopped."""
        self._switch_off(what)
        self._failure = None
        if self._recording:
            self._release()

    def _report_failure(self, cause: str) -> None:
        """Called by the writer thread; the training thread stops recording at its next call."""
        if self._switch_off(cause):
            self._failure = cause

    def _fail(self, where: str, exc: BaseException) -> None:
        self.fault(f"{where} failed ({type(exc).__name__}: {exc})")
