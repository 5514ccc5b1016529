"""A trace window its caller opens and closes: trace.target "caller".

A framework that picks its own profiled steps (verl's `global_profiler.steps`, reached
in each worker as `start_profile` and `stop_profile` calls) opens a window where it
starts and closes it where it stops; `Profiler.trace_window` hands out one of these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .._log import get_logger

if TYPE_CHECKING:
    from ._capture import TraceCapture

__all__ = ["CallerWindow"]

logger = get_logger(__name__)


class CallerWindow:
    """Entering it opens a window on the capture `live()` gives then (None: this rank holds
    no capture, or the run is not started), leaving it saves the window. Entering returns None where it opened, else why not, which it
    also logs once; neither ever raises into training (a fault turns capture off)."""

    __slots__ = ("_capture", "_live", "_open", "_tag")

    def __init__(self, live: Callable[[], TraceCapture | None], tag: str) -> None:
        self._live, self._tag, self._open = live, tag, False
        self._capture: TraceCapture | None = None

    def __enter__(self) -> str | None:
        capture = self._capture = self._live()
        if capture is None:
            return "no trace capture here: the run is not started, trace.enable is off, or this rank is not in trace.ranks"
        try:
            why = capture.open_window(self._tag)
        except Exception as exc:  # its own faults are turned into a word, never raised
            capture.fault(f"trace capture failed in trace_window ({type(exc).__name__}: {exc})")
            why = "capture failed"
        self._open = why is None
        if why is not None:
            logger.info("rankscope: no %s trace window: %s", self._tag, why)
        return why

    def __exit__(self, *exc: object) -> None:
        if self._open and self._capture is not None:
            self._open = False
            self._capture.phase_exit((None, True))  # guarded: saves the window
