"""The timer's background thread: reads the device times the GPU has passed and writes their records."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from ._clock import DeviceClock
from ._record import Span

__all__ = ["DeviceTimeWriter"]

FLUSH_RECORDS = 8192  # records held in memory before they are written early

Ready = list[tuple[Span, "float | None"]]


class DeviceTimeWriter:
    """Resolves finished spans on a daemon thread of its own, and writes their records.

    On a GPU host, asking an event whether the device passed it, reading its elapsed
    time, formatting and writing cost the training thread more than the phase's two
    event records themselves (22 us of a sampled phase, measured on an H200). Here the
    training thread only hands finished spans over; this thread makes every other
    device call (`done`, `elapsed_ms`, `release`) and writes.

    A hand-over with `write=True` is a flush point: what the device has passed is
    written, the rest waits for the next one. One with `write=False` comes when the
    pending bound is reached: what the device passed is resolved and the oldest beyond
    the bound are given up, as PhaseTimer's docstring promises, but nothing is written
    yet, so one record says how many were dropped.
    """

    def __init__(
        self,
        clock: DeviceClock,
        max_pending: int,
        write: Callable[[Ready, int], None],
        fault: Callable[[str, BaseException], None],
    ) -> None:
        self._clock = clock
        self._max_pending = max_pending
        self._write = write
        self._fault = fault
        self._cond = threading.Condition()
        self._inbox: list[Span] = []
        self._discard: list[Any] = []  # marks of spans never finished, to go back to the clock
        self._write_asked = False
        self._closing = False
        self._abandoned = False
        self._handed = 0  # hand-overs so far (each wakes the thread once)
        self._handled = 0  # hand-overs the thread has finished with
        self._pending: deque[Span] = deque()  # this thread's only
        self._ready: Ready = []  # this thread's only
        self._dropped = 0
        self.waiting = 0
        """Spans handed over whose device time is not known yet (read without the lock: an int)."""
        # A daemon: a loop that never calls stop() must still be able to exit.
        self._thread = threading.Thread(target=self._run, name="rankscope-timer", daemon=True)
        self._thread.start()

    # -- the training thread -------------------------------------------------------

    def hand(self, spans: list[Span], write: bool) -> None:
        """Take finished spans; `write`: a flush point (write what the device has passed)."""
        with self._cond:
            self._inbox.extend(spans)
            self.waiting += len(spans)
            self._write_asked = self._write_asked or write
            self._handed += 1
            self._cond.notify()

    def discard(self, mark: Any) -> None:
        """Give back a mark whose span never ended (with the next hand-over)."""
        with self._cond:
            self._discard.append(mark)

    def wait(self, timeout: float) -> bool:
        """Wait until every hand-over so far is handled; False if `timeout` passed first."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._handled >= self._handed or not self._thread.is_alive(), timeout
            )

    def close(self, timeout: float) -> bool:
        """Handle what was handed over, then end the thread; False if it is still busy after
        `timeout` seconds (a stuck disk), in which case it is left behind as a daemon."""
        with self._cond:
            self._closing = True
            self._handed += 1
            self._cond.notify()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def abandon(self) -> None:
        """End the thread without writing anything more (after a fault); never waits."""
        with self._cond:
            self._abandoned = self._closing = True
            self._inbox.clear()
            self._handed += 1
            self._cond.notify()

    # -- the thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._handle_one():
                pass
        except Exception as exc:
            self._fault("reading device times or writing records in the background failed", exc)
        finally:
            with self._cond:
                self._handled = self._handed
                self._cond.notify_all()

    def _handle_one(self) -> bool:
        """Handle what was handed over since the last time; False once closed."""
        with self._cond:
            self._cond.wait_for(lambda: self._handled < self._handed)
            if self._abandoned:
                return False
            handed, closing = self._handed, self._closing
            inbox, self._inbox = self._inbox, []
            discard, self._discard = self._discard, []
            write, self._write_asked = self._write_asked or closing, False
        for mark in discard:
            self._clock.release(mark)
        self._pending.extend(inbox)
        self._resolve()
        self._shed()
        if (write or len(self._ready) >= FLUSH_RECORDS) and self._ready:
            ready, self._ready = self._ready, []
            dropped, self._dropped = self._dropped, 0
            self._write(ready, dropped)
        with self._cond:
            self.waiting = len(self._inbox) + len(self._pending)
            self._handled = handed
            self._cond.notify_all()
        return not closing

    def _resolve(self) -> None:
        """Move every span whose marks the device has passed to the ready list."""
        clock = self._clock
        waiting: deque[Span] = deque()
        for span in self._pending:
            if clock.done(span.dev_end) and clock.done(span.dev_start):
                gpu_ms = clock.elapsed_ms(span.dev_start, span.dev_end)
                clock.release(span.dev_start)
                clock.release(span.dev_end)
                self._ready.append((span, gpu_ms))
            else:
                waiting.append(span)
        self._pending = waiting

    def _shed(self) -> None:
        """Past the bound, write the oldest pending spans without device time."""
        clock = self._clock
        while 2 * len(self._pending) > self._max_pending:
            span = self._pending.popleft()
            # Re-recording an event the device has not reached yet is allowed; the old
            # record simply no longer matters.
            clock.release(span.dev_start)
            clock.release(span.dev_end)
            self._ready.append((span, None))
            self._dropped += 1
