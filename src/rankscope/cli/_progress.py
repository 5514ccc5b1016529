"""A progress bar on stderr while a command reads, where there is a terminal to draw it on."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ["Progress", "progress", "stage"]

Progress = Callable[[str, int, int], None]


def stage(progress: Progress | None, name: str) -> Callable[[int, int], None] | None:
    """A (done, total) callback for one stage of a progress display, if there is one."""
    if progress is None:
        return None
    return lambda done, total: progress(name, done, total)


class progress:
    """`with progress(render, "reading") as update:` a bar while reading, or None."""

    def __init__(self, render: Any, what: str) -> None:
        self._bar = render.Progress(what) if render is not None and sys.stderr.isatty() else None

    def __enter__(self) -> Progress | None:
        if self._bar is None:
            return None
        self._bar.__enter__()
        return self._bar.update  # type: ignore[no-any-return]

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
