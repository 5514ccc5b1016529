"""A stand-in device clock for hosts without a GPU (the timer's DeviceClock protocol,
timing/_clock.py)."""

from __future__ import annotations

import threading
import time
from collections import Counter

__all__ = ["CountingClock"]


class CountingClock:
    """A stand-in device clock that counts the calls made to it, per method and thread.

    For hosts without a GPU: tests/timing/test_timer.py and `bench/timer_overhead.py
    --device stand-in` check with it which device calls a sampled phase makes on the
    training thread. Its device is never behind: a mark is done as soon as it is made,
    and holds the host clock at that moment.
    """

    def __init__(self) -> None:
        self.calls: Counter[tuple[str, int]] = Counter()
        """(method, thread ident) -> calls; each thread adds to its own keys only."""

    def mark(self) -> int:
        self.calls["mark", threading.get_ident()] += 1
        return time.perf_counter_ns()

    def done(self, mark: int) -> bool:
        self.calls["done", threading.get_ident()] += 1
        return True

    def elapsed_ms(self, start: int, end: int) -> float:
        self.calls["elapsed_ms", threading.get_ident()] += 1
        return (end - start) / 1e6

    def release(self, mark: int) -> None:
        self.calls["release", threading.get_ident()] += 1

    def synchronize(self) -> None:
        self.calls["synchronize", threading.get_ident()] += 1

    def on(self, thread: int) -> dict[str, int]:
        """Calls made on `thread` (a threading.get_ident()), by method."""
        return {method: n for (method, ident), n in sorted(self.calls.items()) if ident == thread}

    def off(self, thread: int) -> dict[str, int]:
        """Calls made on every other thread, by method."""
        out: Counter[str] = Counter()
        for (method, ident), n in self.calls.items():
            if ident != thread:
                out[method] += n
        return dict(sorted(out.items()))
