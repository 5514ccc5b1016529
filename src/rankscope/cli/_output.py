"""What every command prints through: strict JSON in pieces, the terminal renderer, the
exit code of bad input, what was skipped summed up."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .._errors import RankscopeError
from .._text import printable
from ..rundir._layout import (
    AUTO,
    HANGS,
    HEALTH,
    LIVE,
    MEMORY,
    MERGED,
    META,
    NSYS,
    REPORT,
    TIMINGS,
    TRACES,
    TRIGGERS,
)
from ..rundir._listing import is_run_dir
from ._progress import Progress, progress

__all__ = ["EXIT_BAD_INPUT", "answer", "not_over_run_data", "print_json", "terminal"]

EXIT_BAD_INPUT = 2


_DATA = (META, TIMINGS, TRACES, TRIGGERS, LIVE, HANGS, HEALTH, AUTO, NSYS, MEMORY)
"""A run directory's folders of data: what the job wrote, which no command writes over."""
_OUTPUTS = (REPORT, MERGED)
"""Files in a run directory's root that the commands write (and write again)."""


def run_data_under(path: str | os.PathLike[str]) -> Path | None:
    """The run directory whose data writing `path` would replace, or None: a file in one
    of its data folders (timings, meta, traces, ...), or any file already in its root but
    the pages the commands write there (report.html, the merged trace). `path` is
    followed through links, as a write would be."""
    target = Path(os.path.realpath(path))
    for up in target.parents:
        if not is_run_dir(up):
            continue
        inside = target.relative_to(up).parts
        if inside[0] in _DATA and len(inside) > 1:
            return up
        if len(inside) == 1 and inside[0] not in _OUTPUTS and target.exists():
            return up
        return None
    return None


def not_over_run_data(path: Path, flag: str, inputs: list[Path] | None = None) -> None:
    """Refuse an output `path` (given as `flag`) that would write over a run's data: the
    job's records, meta files or traces are not rewritten by a command that reads them."""
    run = run_data_under(path)
    if run is not None and not any(_same_file(path, given) for given in inputs or []):
        raise RankscopeError(
            f"{flag} {path} would write over the data of the run {run} (what the job "
            "wrote there): write it outside the run's folders, or as its report.html"
        )


def _same_file(a: Path, b: Path) -> bool:
    """`a` is `b` (the command's own check of its inputs says so in its words)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def print_json(data: Any) -> None:
    # One line: reports of 1000 ranks are large, and scripts read them with a parser.
    # Strict JSON: a value that is not a finite number is written as null. Encoded
    # first as it is (the common case, at no cost), and walked only where that fails.
    text = _encoded(data)
    if text is None:
        try:
            text = json.dumps(data, separators=(",", ":"), allow_nan=False)
        except ValueError:
            text = json.dumps(_strict(data), separators=(",", ":"), allow_nan=False)
    if "\\ud" in text:  # a lone surrogate's escape, or (rarely) a name that holds "\\ud"
        text = json.dumps(_strict(data, printable), separators=(",", ":"), allow_nan=False)
    # In pieces, as json.dump writes: a reader that goes away (`| head`) is then noticed
    # at the next piece, where one large write would leave it to the exit.
    for start in range(0, len(text), _PIECE):
        sys.stdout.write(text[start : start + _PIECE])
    sys.stdout.write("\n")


_PIECE = 1 << 16


def _encoded(data: Any) -> str | None:
    """`data` as strict JSON by msgspec (the analysis extra): 5x json's speed on a
    4096-rank report, and it writes NaN and infinities as null itself. None where
    msgspec is missing or refuses a value (json then writes it)."""
    try:
        import msgspec
    except ImportError:
        return None
    try:
        return msgspec.json.encode(data).decode()
    except (TypeError, ValueError, OverflowError):
        return None


def _strict(value: Any, text: Any = None) -> Any:
    """`value` with every float that JSON cannot hold (NaN, infinities) made None, and
    with `text` (str -> str) applied to every string, keys too, where given."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value if text is None else text(value)
    if isinstance(value, dict):
        return {_strict(key, text): _strict(item, text) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(item, text) for item in value]
    return value


def terminal(command: str) -> Any:
    """The rich renderer, or an ImportError that says which extra brings it."""
    try:
        from . import _render
    except ImportError as exc:
        raise ImportError(
            f"terminal output needs rich: pip install 'rankscope[cli]' (or use --json) ({exc})"
        ) from None
    return _render


Found = TypeVar("Found")


def answer(
    scripts: bool,
    name: str,
    work: Callable[[Progress | None], Found],
    as_json: Callable[[Found], Any],
    show: Callable[[Any, Found], None],
    *,
    doing: str = "reading",
) -> int:
    """A command's answer: `work` (given a progress callback where a terminal shows one),
    then JSON on stdout for scripts, or `show(renderer, found)` for people."""
    render = None if scripts else terminal(name)
    with progress(render, doing) as update:
        found = work(update)
    if render is None:
        print_json(as_json(found))
    else:
        show(render, found)
    return 0
