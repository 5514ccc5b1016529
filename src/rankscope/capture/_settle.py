"""Before a trace window stops: let gloo's worker threads end the collectives they are ending.

torch's gloo backend completes a collective's future before it ends the collective's
profiled range: its worker thread marks the future done, then finishes the Work, and
that ends the range (torch 2.x, ProcessGroupGloo's AsyncWork). DDP waits on the future,
so a step can end, and a window's profiler stop, while a worker thread is still between
the two. The stop collects the worker's events and frees them; the worker then writes
the range's end into the freed memory. The heap is corrupt from then on, and the job
dies later: "malloc(): unsorted double linked list corrupted", or a segfault freeing a
later profile. Measured here on 2 ranks of a DDP job with a window every 6 steps, under
glibc's checking allocator: 3 of 60 and 2 of 80 jobs died (47 of 80 with the window's
results kept alive), none of 80 with the profiler off or with every all-reduce waited on
by its Work (which returns after the range ended).

So before a profiler stops, on a process with a gloo group, the stopping thread sleeps,
letting go of the GIL, until no other thread of this process is runnable, for SETTLE_S at
most. A worker caught in that gap is runnable (state R in /proc/self/task/*/stat on
Linux): it has work left and no lock to wait for. Where /proc cannot say, it sleeps once.
The cost is one scan of the process's threads a window (0.35 ms here, beside a
0.27 ms stop of a tiny window: bench/window_settle.py), up to SETTLE_S where other
threads keep running (an OpenMP pool that spins after its work, a Python thread that
holds the GIL).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from types import ModuleType
from typing import Any

from .._log import get_logger

__all__ = ["SETTLE_S", "runnable_threads", "settle_gloo_workers", "settling_profile"]

logger = get_logger(__name__)

SETTLE_S = 0.01
"""The longest a window's stop waits for the other threads: more than a preempted
thread's usual wait for a core, and little beside the export that follows."""
_NAP_S = 0.0002
"""One sleep between scans: long enough for a thread waiting on the GIL to take it."""
_CONTENDED_S = 0.002
"""A nap this much longer than asked for: the GIL came back late, another thread holds it."""
_TASKS = "/proc/self/task"


def settling_profile(torch: ModuleType) -> Any:
    """torch.profiler.profile, whose every stop (a window's end, stop(), a fault's) first
    settles the gloo workers; torch's own where it is not a class to extend."""
    base = torch.profiler.profile
    return _extend(base, torch) if isinstance(base, type) else base


@functools.cache
def _extend(base: type, torch: ModuleType) -> Any:

    class SettlingProfile(base):  # type: ignore[misc]
        def stop_trace(self) -> None:
            try:
                settle_gloo_workers(torch)
            except Exception:  # waiting is a courtesy: the stop itself must happen
                logger.debug("rankscope: settling gloo's workers failed", exc_info=True)
            super().stop_trace()

    return SettlingProfile


def settle_gloo_workers(torch: ModuleType, limit_s: float = SETTLE_S) -> None:
    """Wait until this process's other threads are idle, at most `limit_s`, where a gloo
    group exists (nothing to wait for otherwise)."""
    if not _has_gloo_group(torch):
        return
    deadline = time.monotonic() + limit_s
    me = str(threading.get_native_id())
    while True:
        napped = time.monotonic()
        time.sleep(_NAP_S)
        now = time.monotonic()
        if now >= deadline:
            return
        if now - napped > _CONTENDED_S:
            # Another thread keeps the GIL busy: it is runnable itself, and each file read
            # below would let go of the GIL and wait a switch interval (5 ms) to get it back.
            continue
        if not runnable_threads(me):
            return


def _has_gloo_group(torch: ModuleType) -> bool:
    dist = getattr(torch, "distributed", None)
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return False
        return any(
            "gloo" in str(dist.get_backend(group)).lower()
            for group in list(dist.distributed_c10d._world.pg_map)
        )
    except Exception:  # private torch API moved: assume gloo may be there
        return True


def runnable_threads(me: str) -> set[str]:
    """The other threads of this process (their ids) that are running or waiting for a
    core; none where /proc cannot say (after the one sleep already taken)."""
    try:
        tasks = os.listdir(_TASKS)
    except OSError:
        return set()
    busy = set()
    for tid in tasks:
        if tid == me:
            continue
        try:
            with open(f"{_TASKS}/{tid}/stat", "rb") as stat:
                text = stat.read()
        except OSError:
            continue  # the thread ended
        # "tid (comm) S ...": comm may hold spaces and parentheses; the state follows the last ")".
        end = text.rfind(b")")
        if text[end + 2 : end + 3] == b"R":
            busy.add(tid)
    return busy
