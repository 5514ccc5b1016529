"""The exceptions rankscope raises.

::

    RankscopeError                 base of everything below
    ├── ConfigError (ValueError)   a config value, argument or environment variable is wrong
    └── TraceError                 a trace or run directory cannot be read

Faults inside rankscope's own machinery during training are never raised to the
training loop: they are logged once and turn the faulty component off.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ConfigError", "RankscopeError", "TraceError"]


class RankscopeError(Exception):
    """Base class of every exception rankscope raises."""


class ConfigError(RankscopeError, ValueError):
    """A config field, argument or environment variable holds a value rankscope cannot use.

    The message names the field, the value received and what is accepted; the same
    three are kept as attributes for callers that want to handle them.
    """

    def __init__(self, field: str, value: Any, accepted: str, problem: str | None = None) -> None:
        self.field = field
        self.value = value
        self.accepted = accepted
        self.problem = problem
        detail = f": {problem}" if problem else ""
        super().__init__(f"{field}={value!r} is not valid{detail}; accepted: {accepted}")

    def under(self, prefix: str) -> ConfigError:
        """The same error with its field named from an enclosing config (`trace.` + `ranks`)."""
        err = ConfigError(f"{prefix}.{self.field}", self.value, self.accepted, self.problem)
        err.__cause__ = self.__cause__
        return err


class TraceError(RankscopeError):
    """A trace file or run directory is missing, truncated or not what it claims to be."""
