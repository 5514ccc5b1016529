"""The terminal every command's rendering writes to (rich, from the `cli` extra): the
console, a wrapped sentence, a cut name, the skipped-input lines."""

from __future__ import annotations

import shutil
import sys
from typing import IO, Any, cast

from rich.console import Console
from rich.padding import Padding
from rich.text import Text

from ._columns import cut
from ._lines import SafeStdout, skipped_lines

__all__ = ["NAME_WIDTH", "console", "name", "out", "sentence", "skipped"]


def console(**options: Any) -> Console:
    """A console for stdout whose sentences wrap between words at the terminal's width.

    Piped output (a log, `| less`) has no terminal to ask: it takes the width COLUMNS
    says, else 160, wide enough that kernel names stay readable. Left at 160 where
    COLUMNS is narrower, the terminal would cut each long line mid-word instead.
    """
    width = None if sys.stdout.isatty() else shutil.get_terminal_size((160, 24)).columns
    # What rich writes to: write() and flush(), with names that are not UTF-8 escaped.
    out = cast("IO[str]", SafeStdout())
    return Console(file=out, highlight=False, width=width, **options)


out = console(soft_wrap=False)
"""The console every command's rendering prints to."""


def sentence(text: str, indent: int = 2, style: str = "") -> None:
    """One sentence, wrapped between words, its next lines indented under its first."""
    out.print(Padding(Text(text, style=style), (0, 0, 0, indent)))


NAME_WIDTH = 60


def name(text: str, width: int = NAME_WIDTH) -> Text:
    return cut(text, width)


def skipped(lines: list[str]) -> None:
    summed = skipped_lines(lines)
    if summed:
        out.print(Text(f"\n{summed[0]}", style="yellow"))
    for line in summed[1:]:
        out.print(Text(line))
