"""A config as the Profiler takes it: made from what the user gave, said once where it is
bad, and warned about where it would do nothing or cannot work with this torch."""

from __future__ import annotations

import os
from collections.abc import Mapping

from ._errors import ConfigError
from ._log import get_logger
from .config._config import ProfileConfig
from .config._ranks import detect_rank_info

__all__ = ["as_config", "say_bad_config", "warn_incompatible", "warn_unused"]

logger = get_logger(__name__)


def warn_unused(config: ProfileConfig) -> None:
    """Say so when trace options are set that trace.enable=False leaves doing nothing."""
    trace = config.trace
    if trace.enable:
        return
    unused = [
        name
        for name, on in (
            ("trace.on_signal", trace.on_signal),
            ("trace.auto.enable", trace.auto.enable),
            ("trace.tool='nsys'", trace.tool == "nsys"),
        )
        if on
    ]
    if unused:
        logger.warning(
            "rankscope: %s set, but trace.enable is False, so no window is ever recorded "
            "(set trace.enable, or RANKSCOPE_TRACE=1)",
            " and ".join(unused),
        )


def warn_incompatible(config: ProfileConfig) -> None:
    """Log the known-incompatible combinations of this config and this process's torch."""
    from ._torch import import_torch
    from .capture._compat import incompatibilities

    try:
        problems = incompatibilities(config, import_torch("trace capture"))
    except Exception:  # a check that fails must not stop the job it was meant to help
        logger.debug("rankscope: checking for incompatible settings failed", exc_info=True)
        return
    for problem in problems:
        logger.warning("rankscope: %s", problem)


def as_config(config: object) -> ProfileConfig:
    if config is None:
        return ProfileConfig()
    if isinstance(config, ProfileConfig):
        return config
    if isinstance(config, Mapping):
        return ProfileConfig.from_dict(config)
    if isinstance(config, (str, os.PathLike)):
        return ProfileConfig.from_yaml(config)
    raise ConfigError(
        "config",
        config,
        "a ProfileConfig, a mapping of its fields, a path to a YAML file, or None",
    )


def say_bad_config(
    exc: ConfigError, rank: int | None, world_size: int | None, environ: Mapping[str, str] | None
) -> None:
    """Say a bad config in one plain line, on the job's rank 0 alone, before it raises.

    Every rank reads the same config and raises the same error, and a launcher prints
    each rank's traceback (torchrun: four ranks, 130 lines): the reason is said once
    where it is easy to find. Every rank still raises; the job stops at once.
    """
    try:
        info = detect_rank_info(rank, world_size, environ)
    except ConfigError:  # the rank variables themselves are wrong: no rank 0 to speak
        return
    if info.world_size > 1 and info.rank == 0:
        logger.error(
            "rankscope: bad config, so every rank of this job stops: %s (said by rank 0 alone)",
            exc,
        )
