"""A report's values as the page shows them: the report may come from anywhere, so any
value may be absent or of the wrong type, and every string is escaped before it is markup."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from ._format import finite

__all__ = [
    "as_float",
    "as_int",
    "as_ints",
    "as_list",
    "as_map",
    "as_text",
    "esc",
    "int_of",
    "plural",
]


def as_map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def as_list(value: object) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else []


as_float = finite
"""A number from the report, or None where it is missing (core/_format.py)."""


def as_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def int_of(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def as_ints(value: object) -> list[int]:
    return [i for i in (as_int(v) for v in as_list(value)) if i is not None]


def as_text(value: object) -> str:
    return "" if value is None else str(value)


def esc(text: str) -> str:
    return html.escape(text, quote=True)


def plural(n: int) -> str:
    return "" if n == 1 else "s"
