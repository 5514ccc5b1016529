"""What the training thread tells the watchdog: memory only, no clock, no syscall."""

from __future__ import annotations

from typing import Any

__all__ = ["Pulse"]


class Pulse:
    """The step in progress and the phases open on the training thread.

    The training thread writes it (step() counts, phase() pushes and pops the Phase
    object itself: no tuple, no clock); the watchdog thread reads it and keeps the
    times. Phases entered on other threads are not the training thread's and are not
    pushed.
    """

    __slots__ = ("open", "owner", "step")

    def __init__(self, first_step: int, owner: int) -> None:
        self.step = first_step
        """The step in progress: step() calls so far, from the first step."""
        self.open: list[Any] = []
        """The Phase objects open on the training thread, outermost first."""
        self.owner = owner
        """The training thread's ident: the thread that started the Profiler."""
