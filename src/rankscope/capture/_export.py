"""Saving a closed window: torch.profiler's export on the training thread, the rest in the
background; or, with nsys, a note of which steps the capture range covered.

Everything lands inside RUN_DIR and nothing goes through a link there (see `_files`).
torch.profiler writes its export by path, and follows links; so it writes into a
folder made for that export alone (`.rank-NNNNN.pt.trace.json.raw-PID.tmp/`, which only
this user can write in), reached through its open descriptor, and the finaliser moves
the finished files out of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
from collections.abc import Callable
from typing import Any

from .._log import get_logger
from ..rundir._files import Folder, open_folder, write_atomic
from ..rundir._layout import nsys_path, summary_path, temp_name, trace_path
from ._finalize import RAW_NAME, FinalizeJob
from ._nsys import NsysWindows
from ._worker import TraceFinalizer

__all__ = ["MAX_BACKLOG", "WindowExporter", "let_go"]

logger = get_logger(__name__)

MAX_BACKLOG = 3
"""Windows waiting to be compressed, at most; a window that ends past it is not saved."""


class WindowExporter:
    """Owns what happens to a window once it closed: export, backlog, finaliser.

    `on_error` is called on the finaliser's thread with a one-line cause when
    finishing a trace fails; an export that fails here raises to the caller, whose
    guard turns capture off.
    """

    def __init__(
        self, run_dir: str, rank: int, gzip: bool, on_error: Callable[[str], None]
    ) -> None:
        self._run_dir = run_dir
        self._rank = rank
        self._gzip = gzip
        self._finalizer = TraceFinalizer(on_error)
        self.saved = 0
        """Windows exported (or noted, with nsys) so far."""
        self._skipped = 0  # windows not saved because the finaliser fell behind

    @property
    def backlog(self) -> int:
        """Windows exported and not yet finished (compressed, summarised, renamed)."""
        return self._finalizer.backlog

    @property
    def last_summary(self) -> dict[str, Any] | None:
        return self._finalizer.last_summary

    def export_trace(self, prof: Any, window: str, why: dict[str, Any] | None) -> None:
        """Export `prof`'s window to a hidden raw file and queue it for finishing.

        `why`: who asked for the window and the figures that made them, for its summary.
        """
        backlog = self.backlog
        if backlog >= MAX_BACKLOG:
            let_go(prof)
            # Windows end faster than they are saved (repeat=0 with short cycles and big
            # traces): queueing more would grow disk use and the wait at stop() without end.
            self._skipped += 1
            if self._skipped == 1:
                logger.warning(
                    "rankscope: trace window %s on rank %d not saved: %d earlier windows are "
                    "still being compressed (windows end faster than they can be saved; raise "
                    "schedule.wait or lower schedule.repeat); later windows are skipped the same way",
                    window,
                    self._rank,
                    backlog,
                )
            return
        rank, run_dir = self._rank, self._run_dir
        trace = trace_path(run_dir, window, rank, self._gzip)
        work = temp_name(trace_path(run_dir, window, rank, False), f"raw-{os.getpid()}").name
        with open_folder(run_dir, trace.parent) as folder:
            _export_into(prof, folder, work)
        self.saved += 1
        self._finalizer.submit(
            FinalizeJob(
                raw=str(trace.parent / work / RAW_NAME),
                trace=str(trace),
                summary=str(summary_path(run_dir, window, rank)),
                rank=rank,
                window=window,
                run_dir=str(run_dir),
                why=why,
            )
        )

    def note_nsys_range(
        self, prof: NsysWindows, window: str, last: int, why: dict[str, Any] | None
    ) -> None:
        """RUN_DIR/nsys/<window>/: the steps and times a cudaProfilerApi range covered, so
        the report can say which nsys report holds which window."""
        path = nsys_path(self._run_dir, window, self._rank)
        record = {
            "rank": self._rank,
            "window": window,
            "first": prof.first_step,
            "last": last,
            "start_ns": prof.start_ns,
            "end_ns": prof.end_ns,
            "pid": os.getpid(),
            "host": socket.gethostname(),
        }
        if why is not None:
            record["captured_because"] = why
        data = json.dumps(record, indent=1).encode("utf-8")
        write_atomic(self._run_dir, path, data, str(os.getpid()))
        self.saved += 1

    def drain(self, timeout: float) -> None:
        """Wait for the windows still being finished, at most `timeout` seconds."""
        self._finalizer.drain(timeout)


def _export_into(prof: Any, folder: Folder, work: str) -> None:
    """torch.profiler's export of `prof` into a new private folder `work` in `folder`.

    Raises (and leaves nothing) when the export fails or writes nothing.
    """
    try:
        with folder.private(work) as inside:
            prof.export_chrome_trace(inside.path_of(RAW_NAME))
            let_go(prof)
            try:
                exported = inside.lstat(RAW_NAME)
            except FileNotFoundError:
                exported = None
        if exported is None or not stat.S_ISREG(exported.st_mode) or exported.st_size == 0:
            # Kineto logs a failed write and returns normally; a missing file is our signal.
            raise OSError(
                f"torch.profiler exported nothing to {folder.join(work)} "
                "(disk full or not writable?)"
            )
    except BaseException:
        with contextlib.suppress(OSError):
            folder.remove_temp(work)  # with Kineto's own partial file, if it left one
        raise


def let_go(prof: Any) -> None:
    """Drop the results a torch.profiler keeps after its window was exported.

    With record_shapes, with_stack or with_flops they hold a weak reference to every
    tensor an op received, and until the profile object is collected (a cyclic
    garbage-collector pass, whenever that comes) torch.utils.swap_tensors fails on
    those tensors: FSDP2 moving parameters, module.to() under swap-on-conversion.
    torch makes a new one at the next window's start.
    """
    if getattr(prof, "profiler", None) is not None:
        prof.profiler = None
