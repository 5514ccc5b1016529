"""The checks a config field's value passes at construction, each raising a ConfigError
that names the field, the value and what it accepts."""

from __future__ import annotations

import math

from .._errors import ConfigError

__all__ = ["check_bool", "check_int", "check_seconds"]


def check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(name, value, "True or False")


def check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(name, value, f"an int >= {minimum}")
    if value < minimum:
        raise ConfigError(name, value, f"an int >= {minimum}")


def check_seconds(name: str, value: object, least: float) -> float:
    """`value` as a float, where it is a finite number >= `least`."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < least
    ):
        raise ConfigError(name, value, f"a number >= {least}")
    return float(value)
