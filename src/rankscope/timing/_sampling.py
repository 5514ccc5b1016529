"""Which steps the timer samples: pure functions of the config, table-testable."""

from __future__ import annotations

from ..config._config import TimerConfig

__all__ = ["is_sampled", "sampled_steps"]


def is_sampled(config: TimerConfig, step: int) -> bool:
    """True when `step` (counting step() calls from 0) is timed."""
    if step < config.start_step:
        return False
    if config.end_step is not None and step >= config.end_step:
        return False
    return (step - config.start_step) % config.every_n_steps == 0


def sampled_steps(config: TimerConfig, stop_step: int) -> list[int]:
    """The steps timed in a run whose last step is `stop_step - 1`."""
    end = stop_step if config.end_step is None else min(stop_step, config.end_step)
    return list(range(config.start_step, end, config.every_n_steps))
