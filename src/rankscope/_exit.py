"""What the process does at exit once a Profiler ran in a process group."""

from __future__ import annotations

import atexit
import gc
import os
import sys
import time

from ._log import get_logger

__all__ = ["SettleAtExit"]

logger = get_logger(__name__)


class SettleAtExit:
    """At interpreter exit, collect reference cycles while threads may still take the GIL.

    A DDP model left alive at exit is a reference cycle: the interpreter's last
    collection frees it while finalizing, and a gloo worker thread that then drops a
    finished work (which holds the Python context backward ran in) asks for the GIL, is
    refused, and aborts the process: SIGABRT, "terminate called without an active
    exception" (torch 2.13, CPU; 5 of 50 two-rank jobs, and as often without a
    profiler). Collected from an exit handler instead, with a moment for those threads,
    none of 100 aborted. Registered once per process, by the first Profiler that starts
    in a process group (torch.distributed initialized); it costs a collection and 0.2 s
    at exit there, and nothing in a process that never joined one.
    """

    registered_in: int | None = None

    @classmethod
    def register(cls) -> None:
        if cls.registered_in != os.getpid() and _in_process_group():
            cls.registered_in = os.getpid()
            atexit.register(cls.run)

    @staticmethod
    def run() -> None:
        try:
            gc.collect()
            time.sleep(_SETTLE_S)  # the worker threads drop what the collection released
        except Exception:  # nothing from rankscope may change how the job ends
            logger.debug("rankscope: collecting at exit failed", exc_info=True)


_SETTLE_S = 0.2  # 0.05 s still let 1 exit in 50 abort; 0.2 s none of 100


def _in_process_group() -> bool:
    dist = sys.modules.get("torch.distributed")
    try:
        return dist is not None and bool(dist.is_available() and dist.is_initialized())
    except Exception:
        return False
