"""Short texts that several outputs share (log lines, the terminal, the reports): written once."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable

__all__ = [
    "closest",
    "for_terminal",
    "format_ranks",
    "format_steps",
    "number_ranges",
    "one_line",
    "printable",
    "shown",
]


def number_ranges(numbers: Iterable[int], fold: int = 2, among: Iterable[int] | None = None) -> str:
    """`0-3, 5, 7-9` for [0, 1, 2, 3, 5, 7, 8, 9]: 1024 ranks stay one short line.

    A run of `fold` or more consecutive numbers is written as a range; shorter runs
    are listed. `among` holds every number that could be listed (the steps the timer
    sampled: 0, 2, 4, ...): numbers next to each other in it count as consecutive, so
    0, 2, ..., 78 read `0-78`.
    """
    ordered = sorted(set(numbers))
    place = None if among is None else {n: i for i, n in enumerate(sorted(set(among)))}

    def next_to(a: int, b: int) -> bool:
        if place is None or a not in place or b not in place:
            return b == a + 1
        return place[b] == place[a] + 1

    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and next_to(ordered[j], ordered[j + 1]):
            j += 1
        if j > i and j - i + 1 >= fold:
            parts.append(f"{ordered[i]}-{ordered[j]}")
        else:
            parts.extend(str(n) for n in ordered[i : j + 1])
        i = j + 1
    return ", ".join(parts)


def format_ranks(ranks: Iterable[int]) -> str:
    """'rank 3', 'ranks 0, 1, 3' or 'ranks 0-6, 8-15': runs of three or more folded."""
    ordered = sorted(set(ranks))
    if len(ordered) == 1:
        return f"rank {ordered[0]}"
    return "ranks " + number_ranges(ordered, fold=3)


def format_steps(steps: list[int]) -> str:
    """ "11-13" for a run of consecutive steps, "10, 20, 30" otherwise."""
    if steps and steps == list(range(steps[0], steps[0] + len(steps))):
        return f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else str(steps[0])
    return ", ".join(map(str, steps))


def shown(value: object, width: int = 40) -> str:
    """`value` as a file wrote it (JSON), cut short for a message: a file may hold a value
    of any size, a number of 4000 digits among them."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"a number of about {int(value.bit_length() * 0.30103) + 1} digits"
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = f"a {type(value).__name__}"
    return text if len(text) <= width else f"{text[: width - 3]}..."


def printable(text: str) -> str:
    """`text` safe to write as UTF-8: a byte of a file name that is not valid UTF-8 (which
    Python holds as a lone surrogate, U+DC80-U+DCFF) reads as `\\xff`, any other lone
    surrogate (a trace may hold one) as `\\ud800`. Names come from the files present:
    written as they are, one such byte made the output end in UnicodeEncodeError."""
    if _SURROGATE.search(text) is None:  # nearly always: the text as it is
        return text
    return _SURROGATE.sub(_escaped, text)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _escaped(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f]")
"""C0 and C1 control characters and DEL: a terminal acts on them (clear the screen, move
the cursor, set the window title, begin a line), where a name should only be read."""
_TERMINAL = re.compile("\x1b\\[[0-9;]*m|[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _control(found: re.Match[str]) -> str:
    char = found.group()
    return _NAMED.get(char) or f"\\x{ord(char):02x}"


def one_line(text: str) -> str:
    """`text` with every control character written out (`\\n`, `\\x1b`): a name from a
    file (a phase, a host) shown as one line of plain text, which no terminal acts on and
    no newline in it can make into a line of its own."""
    if _CONTROLS.search(text) is None:  # nearly always
        return text
    return _CONTROLS.sub(_control, text)


def for_terminal(text: str, styles: bool) -> str:
    """Rendered output made safe for a terminal: control characters written out but the
    line breaks and tabs of the layout, and, where `styles` (rich colours a terminal),
    the colour sequences (ESC [ ... m) it writes."""
    if _TERMINAL.search(text) is None:
        return text

    def escaped(found: re.Match[str]) -> str:
        if styles and len(found.group()) > 1:
            return found.group()  # a colour: nothing a terminal does but paint
        return _control(found) if len(found.group()) == 1 else "\\x1b" + found.group()[1:]

    return _TERMINAL.sub(escaped, text)


def closest(word: str, names: Iterable[str]) -> str | None:
    """The name `word` most likely misspells ("did you mean"), or None where none is close.

    One rule for every misspelling rankscope answers: a RANKSCOPE_* variable, a config field.
    """
    close = difflib.get_close_matches(word, list(names), n=1, cutoff=0.6)
    return close[0] if close else None
