"""A report's values as the page shows them: the report may come from anywhere, so any
value may be absent or of the wrong type, and every string is escaped before it is markup."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

__all__ = [
    "as_float",
    "as_int",
    "as_ints",
    "as_list",
    "as_map",
    "as_text",
    "esc",
    "int_of",
    "ms_text",
    "pct_over",
    "plural",
    "share_text",
    "us_text",
]


def as_map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def as_list(value: object) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else []


def as_float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


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


# ---------------------------------------------------------------------------- number text


def _short(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"


def ms_text(value: float | None) -> str:
    if value is None:
        return "none"
    return f"{_short(value)} ms" if abs(value) < 1e3 else f"{_short(value / 1e3)} s"


def us_text(value: float | None) -> str:
    if value is None:
        return "none"
    if abs(value) < 1e3:
        return f"{_short(value)} µs"
    return ms_text(value / 1e3)


def share_text(value: float | None) -> str:
    return "none" if value is None else f"{value * 100:.3g}%"


def pct_over(ratio: float | None, signed: bool = False) -> str:
    if ratio is None:
        return "none"
    return f"{(ratio - 1) * 100:{'+' if signed else ''}.0f}%"
