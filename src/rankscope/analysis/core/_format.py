"""Every figure as rankscope's outputs say it, written once: durations, ratios, shares,
speedups, hours, signed deltas, and a value that is missing.

A value is missing where it is None, NaN or infinite, or not a number at all (a report
read back may hold anything). Each medium spells that one way:

    terminal tables                "-"      TERMINAL
    HTML pages                     "none"   HTML
    sentences (terminal and page)  "none"   SENTENCE
    JSON                           null     (the data as it is; nothing here)

A cell that does not apply (a waiting rank's speedup: its fix is the rank it waits for,
priced there) is left blank by its table; that is not a missing value.

The rules, the same in every medium (tests/analysis/test_format.py pins each one):

    ms           a table's ms cell, the unit in its header: 3 decimals under 100,
                 1 decimal with thousands separators from 100   0.012, 1,234.6
    signed_ms    the same, always signed                        +0.012, -1,234.6
    us           a table's µs cell: 1 decimal, thousands separated   12.5, 12,345.6
    ms_text      a duration with its unit (sentences, page cells): 3 significant
                 digits under 100 ms, whole ms with separators from 100   38.3 ms, 1,234 ms
    us_text      the same from µs: µs under 1000 µs, else ms_text   412 µs, 1.5 ms
    ratio        a time against its reference: a percentage under twice, a factor
                 from twice, whole from 10                      +41%, 2.5x, 526x
    pct_over     a ratio as the percentage above 1, whole      12%, +12%
    share        a fraction as a percentage, 3 significant digits   83.3%, 100%
    speedup      2 decimals and "x"                             1.68x
    number       any other figure: 4 significant digits, the whole number (no
                 separator, so that it can be pasted) from 10000 on   2.165, 12346
    hours_text   hours as people say them: h, min or s, one decimal; per GPU or
                 rank, GPU-hours or rank-hours                  4.8 h, 12.0 GPU-minutes
    seconds_text seconds as people say them                     45 s, 4 min, 2.5 h, 3.1 days

Pure Python: the CLI imports it at start-up, before anything pulls numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["HTML", "SENTENCE", "TERMINAL", "Medium", "finite", "hours_text", "seconds_text"]


def finite(value: object) -> float | None:
    """`value` as a float, or None where it is missing (see the module docstring)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


class Medium:
    """The figures of one medium: the rules above, with its spelling of a missing value."""

    __slots__ = ("missing",)

    def __init__(self, missing: str) -> None:
        self.missing = missing

    def __repr__(self) -> str:
        return f"Medium(missing={self.missing!r})"

    def ms(self, value: object) -> str:
        return self._figure(value, lambda n: f"{n:.3f}" if abs(n) < 100 else f"{n:,.1f}")

    def signed_ms(self, value: object) -> str:
        return self._figure(value, lambda n: f"{n:+.3f}" if abs(n) < 100 else f"{n:+,.1f}")

    def us(self, value: object) -> str:
        return self._figure(value, lambda n: f"{n:,.1f}")

    def ms_text(self, value: object) -> str:
        return self._figure(value, lambda n: f"{n:.3g} ms" if abs(n) < 100 else f"{n:,.0f} ms")

    def us_text(self, value: object) -> str:
        return self._figure(
            value, lambda n: f"{n:.3g} µs" if abs(n) < 1000 else self.ms_text(n / 1000)
        )

    def ratio(self, value: object) -> str:
        return self._figure(value, self._ratio)

    def _ratio(self, n: float) -> str:
        if n < 2:
            # A ratio a hair under 1 is no slowdown: "+0%", never "-0%".
            return self.pct_over(n, signed=True).replace("-0%", "+0%")
        return f"{n:.1f}x" if n < 10 else f"{n:,.0f}x"

    def pct_over(self, ratio: object, signed: bool = False) -> str:
        return self._figure(ratio, lambda n: f"{(n - 1) * 100:{'+' if signed else ''}.0f}%")

    def share(self, value: object) -> str:
        return self._figure(value, lambda n: f"{n * 100:.3g}%")

    def speedup(self, value: object) -> str:
        return self._figure(value, lambda n: f"{n:.2f}x")

    def number(self, value: object) -> str:
        return self._figure(value, lambda n: f"{n:.0f}" if abs(n) >= 1e4 else f"{n:.4g}")

    def _figure(self, value: object, text: Callable[[float], str]) -> str:
        """`text` of the value, or this medium's spelling of a missing one: the one rule."""
        n = finite(value)
        return self.missing if n is None else text(n)


TERMINAL = Medium("-")
"""Terminal tables: a dash, which any terminal and any log shows as it is."""
HTML = Medium("none")
"""HTML pages: the word, which a screen reader says and a reader cannot take for a minus."""
SENTENCE = Medium("none")
"""Sentences, which the terminal and the page both show: a missing figure in words."""


def hours_text(hours: float, per: str = "") -> str:
    """Hours as people say them: "4.8 h", "12.0 min", "40.0 s"; `per` "GPU": "4.8
    GPU-hours", "12.0 GPU-minutes"...; "rank": rank-hours..."""
    if hours >= 0.1:
        return f"{hours:,.1f} {per}-hours" if per else f"{hours:,.1f} h"
    if hours * 60 >= 0.1:
        return f"{hours * 60:.1f} {per}-minutes" if per else f"{hours * 60:.1f} min"
    return f"{hours * 3600:.1f} {per}-seconds" if per else f"{hours * 3600:.1f} s"


def seconds_text(seconds: float) -> str:
    """`45 s`, `4 min`, `2.5 h`, `3.1 days`: how long, as people say it."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 120 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
