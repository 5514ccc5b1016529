"""What the framework callbacks share: checking their arguments, and hooks that cannot fail training."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from .._config import ProfileConfig
from .._errors import ConfigError
from .._profiler import _as_config

__all__ = ["Interrupted", "check_rank_args", "guarded", "load_config"]

logger = logging.getLogger(__name__)

Hook = TypeVar("Hook", bound=Callable[..., None])


class Interrupted(Exception):
    """Marks a phase that the end of a run cut short (passed to Phase.__exit__)."""


def guarded(hook: Hook) -> Hook:
    """Run a callback hook so that a fault inside rankscope never reaches the training loop.

    The callback has `_run` (the Profiler of the run in progress, None when there is
    none: the hook does nothing) and `_fault(where, exc)`, which logs and turns it off.
    """

    @functools.wraps(hook)
    def run(self: Any, *args: Any, **kwargs: Any) -> None:
        if self._run is None:
            return
        try:
            hook(self, *args, **kwargs)
        except Exception as exc:
            self._fault(hook.__name__, exc)

    return run  # type: ignore[return-value]


def load_config(config: object) -> ProfileConfig:
    """A ProfileConfig from one, a mapping of its fields, a YAML path, or None (the defaults)."""
    return _as_config(config)


def check_rank_args(rank: object, world_size: object) -> None:
    """Explicit rank and world size overrides: None, or ints that fit each other."""
    for name, value, minimum in (("rank", rank, 0), ("world_size", world_size, 1)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < minimum
        ):
            raise ConfigError(name, value, f"None or an int >= {minimum}")
    if isinstance(rank, int) and isinstance(world_size, int) and rank >= world_size:
        raise ConfigError("rank", rank, f"a rank below world_size={world_size}")
