"""How long this thread has waited for a CPU: what a phase's record says of its time kept off a core.

A rank on a busy host (its loader's workers, other ranks, another job on its cores)
is ready to run and waits in the scheduler's run queue. Its phase then takes longer
with no more work in it: the thread's CPU time ("oncpu_ms") does not grow, and its
time off the CPU looks like a sleep or a wait for I/O. Linux counts that wait per
thread (the second figure of /proc/thread-self/schedstat, "run_delay"), so a record
can say how much of its time off the CPU was a wait for a core, and the analysis
tells a rank that others kept off its cores from one that slept (analysis/stragglers/_cause.py,
analysis/stragglers/_turns.py).

The file is opened once, on the thread that times its phases, and read with one
pread (about 1 us), only on sampled steps. Where it cannot be read (not Linux, a
kernel without it) records carry no figure; a forked child reads no more (the file
is its parent's thread's).
"""

from __future__ import annotations

import contextlib
import os
import weakref

__all__ = ["RunQueueWait"]

_PATH = "/proc/thread-self/schedstat"
_OPEN: weakref.WeakSet[RunQueueWait] = weakref.WeakSet()


def _forked() -> None:
    for wait in list(_OPEN):
        wait.fd = -1  # the parent's thread's file: not this process's to read or close


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


class RunQueueWait:
    """The time the thread that made it has waited for a CPU so far, in ns: `now()` is -1
    where it cannot be read."""

    def __init__(self) -> None:
        self.fd = -1
        """The open file, -1 where there is none (read it only on the thread that made it)."""
        try:
            self.fd = os.open(_PATH, os.O_RDONLY | os.O_CLOEXEC)
        except (OSError, AttributeError):
            return
        _OPEN.add(self)
        if self.now() < 0:
            self.close()

    def now(self) -> int:
        try:
            return int(os.pread(self.fd, 96, 0).split()[1])
        except (OSError, IndexError, ValueError):
            self.close()  # read no more, time on
            return -1

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
