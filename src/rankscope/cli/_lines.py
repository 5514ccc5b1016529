"""What every terminal line goes through: names made printable (a byte of a file name that
is not UTF-8 is written `\\xff`), and long lists of skipped input summed up."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from .._text import for_terminal, printable

__all__ = ["SHOWN_SKIPPED", "ReaderGone", "SafeStdout", "skipped_lines"]


class ReaderGone(Exception):
    """stdout's reader went away (`| head -1`). Raised in place of BrokenPipeError, which
    rich turns into `SystemExit(1)` itself; `main` ends the command quietly on either."""


class SafeStdout:
    """sys.stdout (whichever it is at the time) for the terminal renderers: every text
    goes through `printable`, so no file's name can end a command in UnicodeEncodeError
    (a byte that is not UTF-8 is written `\\xff`), and through `for_terminal`, so no
    name's escape sequence acts on the terminal. A closed pipe is a ReaderGone."""

    def write(self, text: str) -> int:
        try:
            out = sys.stdout
            # A name's control characters written out (no name clears the screen or
            # sets the window title); rich's colours kept where they reach a terminal.
            return out.write(for_terminal(printable(text), styles=_is_terminal(out)))
        except BrokenPipeError:
            raise ReaderGone from None

    def flush(self) -> None:
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            raise ReaderGone from None

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding
        return getattr(sys.stdout, name)


def _is_terminal(out: Any) -> bool:
    try:
        return bool(out.isatty())
    except (AttributeError, ValueError, OSError):
        return False


SHOWN_SKIPPED = 5
"""Skipped files or lines a terminal lists; `--json` lists them all."""
_SKIPPED_WIDTH = 150
"""A skipped line past this is cut (to stay one line of a 160-column terminal): one can
name a thousand files, or a name of 4 KB."""


def skipped_lines(lines: Sequence[str], shown: int = SHOWN_SKIPPED) -> list[str]:
    """What was skipped, summed up for a terminal: how many, then the first `shown`, each
    on one line cut to a readable length; where more were skipped, how many more.
    Nothing for nothing skipped."""
    if not lines:
        return []
    n = len(lines)
    more = f" (the first {shown} below; --json lists all)" if n > shown else ""
    out = [f"Skipped input: {n} file{'s' if n != 1 else ''} or line{'s' if n != 1 else ''}{more}:"]
    for line in lines[:shown]:
        one = " ".join(printable(line).split())  # one line, whatever a name held
        out.append(f"  {one if len(one) <= _SKIPPED_WIDTH else one[: _SKIPPED_WIDTH - 3] + '...'}")
    if n > shown:
        out.append(f"  ... and {n - shown} more")
    return out
