"""On-demand windows on a rank: the poller that reads trigger files and answers them (the
files' format: rundir/_trigger.py), and the SIGUSR2 hook.

SIGUSR2 (`trace.on_signal`) asks one process for a window on its next steps: a
`SignalHook` notes the signal, and the capture plans the window at its next step().
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from .._log import get_logger
from ..rundir._files import open_folder
from ..rundir._layout import (
    is_temp,
)
from ..rundir._trigger import (
    Trigger,
    answered,
    read_trigger,
    trigger_dir,
    trigger_id_of,
)

__all__ = ["SignalHook", "TriggerPoller", "install_signal_hook"]

# A directory changed this recently may change again without its mtime moving (the
# filesystem's timestamp granularity, up to 2 s on some): scan it again next time.
_RACY_NS = 2_000_000_000
_O_DIRECTORY: int | None = getattr(os, "O_DIRECTORY", None)

logger = get_logger(__name__)


class TriggerPoller:
    """Finds the triggers meant for one rank, cheaply enough to call every few steps.

    `poll()` costs one fstat of RUN_DIR/triggers, held open, while the directory is
    unchanged (half what a stat by path costs), and an access() check while it does
    not exist; only when its mtime moves does it list the directory and read the files
    it has not seen. Each trigger id is returned at most once, and not at all when this
    rank answered it before (an earlier run in the same directory). A file that is not
    a valid trigger, or not a regular file (a link is not followed), is warned about
    once (again only if it changes) and skipped. OSError from the directory propagates,
    also where RUN_DIR/triggers is a link: the caller decides what a fault turns off.
    `close()` lets go of the directory.
    """

    def __init__(self, run_dir: str, rank: int) -> None:
        self._run_dir = run_dir
        self._dir = trigger_dir(run_dir)
        self._path = str(self._dir)  # os functions take a str faster than a Path
        self._rank = rank
        self._fd: int | None = None  # RUN_DIR/triggers, open once it exists
        self._mtime: int | None = None
        self._seen: set[str] = set()
        self._bad: dict[str, tuple[int, int]] = {}  # file name -> (mtime_ns, size) warned about

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _folder_mtime(self) -> int | None:
        """RUN_DIR/triggers' mtime; None while it does not exist."""
        fd = self._fd
        if fd is not None:
            stat = os.fstat(fd)
            if stat.st_nlink > 0:
                return stat.st_mtime_ns
            self.close()  # removed since it was opened: look for a new one by its name
        path = self._path
        if not os.access(path, os.F_OK):
            return None  # the usual case, no one ever asked: cheaper than a stat that fails
        try:
            if _O_DIRECTORY is None:  # a platform that cannot open a directory
                return os.stat(path).st_mtime_ns
            # Not through a link: RUN_DIR/triggers must be a folder of the run directory.
            fd = open_folder(self._run_dir, self._dir, create=False).detach()
        except FileNotFoundError:
            return None
        self._fd = fd
        return os.fstat(fd).st_mtime_ns

    def poll(self) -> list[Trigger]:
        mtime = self._folder_mtime()
        if mtime is None:
            return []
        if mtime == self._mtime:
            return []
        now = time.time_ns()
        found = []
        with os.scandir(self._dir) as entries:
            for entry in entries:
                trigger = self._consider(entry)
                if trigger is not None:
                    found.append(trigger)
        self._mtime = mtime if now - mtime > _RACY_NS else None
        return sorted(found, key=lambda t: t.id)

    def _consider(self, entry: os.DirEntry[str]) -> Trigger | None:
        file_id = trigger_id_of(entry.name)
        if file_id is None or is_temp(entry.name) or file_id in self._seen:
            return None  # a temporary name, an answers folder, a trigger seen before
        # Not a folder (an answers folder is named without ".json"); a link or another kind
        # of entry is read only to be refused, with its one warning (see read_trigger).
        trigger = None if entry.is_dir(follow_symlinks=False) else self._read(entry)
        if trigger is None:
            return None
        self._seen.add(file_id)
        if self._rank not in trigger.rank_set:
            return None
        if answered(self._run_dir, trigger.id, self._rank):
            return None  # answered before (an earlier run here): each trigger is honoured once
        return trigger

    def _read(self, entry: os.DirEntry[str]) -> Trigger | None:
        """The trigger in `entry`, or None: warned about once if it is not a valid one."""
        try:
            info = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            return None  # removed since the listing
        key = (info.st_mtime_ns, info.st_size)
        if self._bad.get(entry.name) == key:
            return None
        try:
            trigger = read_trigger(Path(entry.path))
        except FileNotFoundError:
            return None  # removed between the listing and the read
        except (OSError, ValueError) as exc:
            self._bad[entry.name] = key
            logger.warning(
                "rankscope: ignoring %s on rank %d: not a valid trigger file (%s)",
                entry.path,
                self._rank,
                exc,
            )
            return None
        self._bad.pop(entry.name, None)
        return trigger


class SignalHook:
    """The SIGUSR2 handler `trace.on_signal` installs: it notes the signal and nothing more.

    Python runs a handler on the main thread between two bytecodes, wherever the
    training loop happens to be, so this one sets `pending` and calls the handler that
    was installed before it (a Python callable; SIG_DFL, which would end the process,
    and SIG_IGN are not called): no I/O, no locks, no logging. The capture reads and
    clears `pending` at its next step(), which `wake` (set by the capture) makes sure
    happens. Once released, it only passes signals on.
    """

    __slots__ = ("pending", "previous", "released", "wake")

    def __init__(self, previous: Any) -> None:
        self.pending: bool = False
        self.wake: Any = None
        """Called with no argument when a signal is noted: the capture's next step() looks."""
        self.previous: Any = previous
        """What getsignal() returned before: a callable, SIG_DFL or SIG_IGN."""
        self.released: bool = False

    def __call__(self, signum: int, frame: Any) -> None:
        if not self.released:
            self.pending = True
            wake = self.wake
            if wake is not None:
                wake()
        previous = self.previous
        if callable(previous):
            previous(signum, frame)

    def release(self) -> bool:
        """Put back the handler installed before this one; False where another has replaced it since.

        A replaced hook stays in that handler's chain and only passes signals on. Hooks
        released earlier are skipped, so profilers stopped in any order leave the
        original handler in place. Raises ValueError off the main thread.
        """
        self.released = True
        number = signal.SIGUSR2
        before: Any = self.previous
        if signal.getsignal(number) is not self:
            return False
        while isinstance(before, SignalHook) and before.released:
            before = before.previous
        signal.signal(number, before)
        return True


def install_signal_hook(rank: int) -> SignalHook | None:
    """Install a SignalHook for SIGUSR2 in front of the current handler.

    None, with one warning saying why, on a thread other than the main thread (Python
    lets only that one set handlers), on a platform without SIGUSR2, or where SIGUSR2's
    handler was set outside Python (getsignal() cannot return it, so stop() could not
    put it back).
    """
    number = getattr(signal, "SIGUSR2", None)
    if number is None:
        why = "this platform has no SIGUSR2"
    elif threading.current_thread() is not threading.main_thread():
        why = (
            f"the profiler was started on thread {threading.current_thread().name!r}, and "
            "Python installs signal handlers from the main thread only"
        )
    else:
        previous = signal.getsignal(number)
        if previous is None:
            why = "SIGUSR2 has a handler installed outside Python, which could not be put back"
        else:
            hook = SignalHook(previous)
            try:
                signal.signal(number, hook)
            except (OSError, ValueError) as exc:
                why = f"installing a SIGUSR2 handler failed ({exc})"
            else:
                return hook
    logger.warning(
        "rankscope: trace.on_signal is set but %s; SIGUSR2 starts no window on rank %d "
        "(everything else works as configured)",
        why,
        rank,
    )
    return None
