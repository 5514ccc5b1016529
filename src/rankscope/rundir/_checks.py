"""What a starting rank checks of the run directory it writes into, from the files alone
(no collective): another job's files there, and rank 0's config against its own."""

from __future__ import annotations

import time
from typing import Any

from .._log import get_logger
from ._attempt import Attempt
from ._meta import differing_settings, flat_config, previous_attempt, rank_meta

__all__ = ["say_config_differs", "say_other_job", "say_rank_zero_elsewhere"]

logger = get_logger(__name__)


def say_other_job(run_dir: str, attempt: Attempt) -> None:
    """Warn when another job has written into `run_dir` before: allowed, and said."""
    earlier = previous_attempt(run_dir, 0)
    if earlier is None or earlier.get("attempt") == attempt.token or attempt.same_job(earlier):
        return
    started = earlier.get("started_ns")
    when = (
        time.strftime(" (started %Y-%m-%d %H:%M:%S)", time.localtime(started / 1e9))
        if isinstance(started, int) and not isinstance(started, bool) and 0 < started < 1 << 63
        else ""
    )
    logger.warning(
        "rankscope: %s already holds the files of an earlier job%s; this job adds to them as "
        "a new attempt. The analysis uses the latest record of each step and says so "
        "(--attempt picks one); give this job its own output_dir to keep them apart",
        run_dir,
        when,
    )


def say_config_differs(run_dir: str, attempt: Attempt, config: dict[str, Any], rank: int) -> None:
    """Warn when this rank's config differs from the one rank 0 of this job wrote: a
    setting given to one rank alone (RANKSCOPE_TIMER_EVERY on one rank) makes ranks that
    cannot be compared. Read from the run directory, no collective; where rank 0 has not
    written its meta yet (or it is another job's), nothing is said here and the analysis
    says it."""
    first = rank_meta(run_dir, 0)
    theirs = first.get("config") if first is not None else None
    started = first.get("attempt") if first is not None else None
    if not isinstance(theirs, dict) or not isinstance(started, dict):
        return
    if not _same_launch(attempt, started):
        return
    differ = differing_settings(flat_config(theirs), flat_config(config))
    if differ:
        said = "; ".join(
            f"{key} is {mine} here, {zero} on rank 0" for key, zero, mine in differ[:5]
        )
        more = f" and {len(differ) - 5} more" if len(differ) > 5 else ""
        logger.warning(
            "rankscope: rank %d's config differs from rank 0's: %s%s. Ranks configured apart "
            "are compared only where they agree (on the steps both sampled): set these the "
            "same on every rank",
            rank,
            said,
            more,
        )


_LAUNCH_SPREAD_NS = 120 * 1_000_000_000
"""How far apart the ranks of one launch start, at the most, where no launcher says."""


def _same_launch(attempt: Attempt, other: dict[str, Any]) -> bool:
    """Whether `other` (an attempt's dict from a meta file) is of this launch: the same
    launcher, job id and restart where a launcher says; else started close in time."""
    if attempt.launcher is not None and other.get("launcher") is not None:
        return (
            other.get("launcher") == attempt.launcher
            and other.get("job") == attempt.job
            and other.get("restart") == attempt.restart
        )
    started = other.get("started_ns")
    if not isinstance(started, int) or isinstance(started, bool):
        return False
    return abs(started - attempt.started_ns) <= _LAUNCH_SPREAD_NS


def say_rank_zero_elsewhere(run_dir: str, attempt: Attempt, rank: int) -> None:
    """At a timed rank's stop(), warn where rank 0 of this launch wrote no meta file into
    `run_dir` though this rank's config times it: rank 0 writes elsewhere (an output_dir
    set on one rank alone, RANKSCOPE_OUTPUT_DIR), and an analysis of either directory
    misses the other's ranks. Never raises."""
    try:
        first = rank_meta(run_dir, 0)
        started = first.get("attempt") if first is not None else None
        if isinstance(started, dict) and _same_launch(attempt, started):
            return
        logger.warning(
            "rankscope: rank %d: rank 0 of this job wrote nothing into %s, where this rank's "
            "config has it timed: its output_dir differs from this rank's (RANKSCOPE_OUTPUT_DIR "
            "set on one rank?), or it never started. An analysis of either directory misses "
            "the other's ranks: give every rank the same output_dir",
            rank,
            run_dir,
        )
    except Exception:  # a check that cannot be made is no reason to say anything
        logger.debug("rankscope: the check of rank 0's meta failed", exc_info=True)
