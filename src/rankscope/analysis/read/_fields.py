"""A JSON object's fields checked one by one, as the watch layer's files are read: the
type, the range, the length, null or absent, each failure a `Bad` that names the field
and what it held (_watch.py reads heartbeats and hang files with these)."""

from __future__ import annotations

from typing import Any, TypeVar

from ..._text import one_line, shown

__all__ = [
    "MAX_NS",
    "MAX_SECONDS",
    "MAX_STEP",
    "MAX_TEXT",
    "Bad",
    "boolean",
    "entry",
    "get",
    "integer",
    "listed",
    "must",
    "name",
    "no_constant",
    "ns",
    "seconds",
    "step",
    "text",
]

_T = TypeVar("_T")
MAX_NS = (1 << 63) - 1
MAX_STEP = 1 << 62
MAX_SECONDS = 1e12
MAX_TEXT = 4096
"""A name (phase, kind, host, attempt) longer than this is no name."""


class Bad(ValueError):
    """A field that is not what the schema says."""


def no_constant(name: str) -> float:
    raise Bad(f"{name} is not a JSON number")


_ABSENT = object()


def get(data: dict[str, Any], key: str, null: bool, optional: bool) -> Any:
    value = data.get(key, _ABSENT)
    if value is _ABSENT:
        if optional:
            return None
        raise Bad(f"no {key}")
    if value is None and not null:
        raise Bad(f"{key} is null")
    return value


def integer(
    data: dict[str, Any],
    key: str,
    *,
    lo: int = 0,
    hi: int = MAX_NS,
    null: bool = False,
    optional: bool = False,
) -> int | None:
    value = get(data, key, null, optional)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        nullable = " or null" if null else ""
        raise Bad(f"{key} is {shown(value)}, expected an integer from {lo} to {hi}{nullable}")
    return value


def ns(data: dict[str, Any], key: str, null: bool = False, optional: bool = False) -> int | None:
    """An epoch time in nanoseconds: an integer from 0 to 2^63 - 1."""
    return integer(data, key, hi=MAX_NS, null=null, optional=optional)


def step(data: dict[str, Any], key: str, null: bool = False, optional: bool = False) -> int | None:
    return integer(data, key, hi=MAX_STEP, null=null, optional=optional)


def must(value: _T | None) -> _T:
    """A field read as required: never None (the reader raised for a null already)."""
    if value is None:
        raise Bad("a required field is null")
    return value


def seconds(
    data: dict[str, Any],
    key: str,
    null: bool = False,
    optional: bool = False,
    positive: bool = False,
) -> float | None:
    value = get(data, key, null, optional)
    if value is None:
        return None
    number = (
        float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    )
    low_ok = number is not None and (number > 0 if positive else number >= 0)
    if number is None or not low_ok or not number <= MAX_SECONDS:  # NaN fails <=
        low = "above 0" if positive else "from 0"
        nullable = " or null" if null else ""
        raise Bad(f"{key} is {shown(value)}, expected seconds {low} to {MAX_SECONDS:g}{nullable}")
    return number


def text(
    data: dict[str, Any],
    key: str,
    null: bool = False,
    optional: bool = False,
    limit: int = MAX_TEXT,
) -> str | None:
    value = get(data, key, null, optional)
    if value is None:
        return None
    if not isinstance(value, str):
        raise Bad(f"{key} is {shown(value)}, expected a string")
    if len(value) > limit:
        raise Bad(f"{key} is a string of {len(value)} characters, expected at most {limit}")
    return one_line(value)  # shown, never acted on: a name's newline or escape written out


def name(data: dict[str, Any], key: str) -> str:
    value = text(data, key)
    if not value:
        raise Bad(f"{key} is empty")
    return value


def listed(data: dict[str, Any], key: str, limit: int, optional: bool = False) -> list[Any]:
    value = get(data, key, null=False, optional=optional)
    if value is None:
        return []
    if not isinstance(value, list):
        raise Bad(f"{key} is {shown(value)}, expected a list")
    if len(value) > limit:
        raise Bad(f"{key} holds {len(value)} entries, expected at most {limit}")
    return value


def entry(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Bad(f"{where} is {shown(value)}, expected an object")
    return value


def boolean(data: dict[str, Any], key: str, null: bool = False) -> bool | None:
    value = data.get(key, False)
    if not isinstance(value, bool) and not (null and value is None):
        raise Bad(f"{key} is {shown(value)}, expected true or false{' or null' if null else ''}")
    return value
