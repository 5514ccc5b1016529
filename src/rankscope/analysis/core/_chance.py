"""How likely a count is by chance: the binomial test the straggler rules use, and how
many sampled steps a count at its rate would need to pass it."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

__all__ = ["FEWEST_STEPS", "binomial_tail", "steps_needed"]

# A row that fails a count test only for want of steps is said ("needs more samples")
# when it was above at this share of its steps at least, and this many times its steps
# at the same rate would pass: a clean run's noise is neither.
_UNDECIDED_SHARE = 0.8
_UNDECIDED_REACH = 4
# Fewer sampled steps than this and no row can hold a finding (see _stragglers._Row.onset).
FEWEST_STEPS = 3


def binomial_tail(k: int, n: int, q: float) -> float:
    """P(X >= k) for X ~ Binomial(n, q)."""
    if k <= 0:
        return 1.0
    if q >= 1.0:
        return 1.0
    i = np.arange(k, n + 1, dtype=np.float64)
    log_pmf = (
        math.lgamma(n + 1)
        - np.array([math.lgamma(x + 1) + math.lgamma(n - x + 1) for x in i.tolist()])
        + i * math.log(q)
        + (n - i) * math.log1p(-q)
    )
    top = float(log_pmf.max())
    return float(math.exp(top) * np.sum(np.exp(log_pmf - top)))


def steps_needed(
    k: int, n: int, q_at: Callable[[int], float], tests_at: Callable[[int], float]
) -> int | None:
    """The fewest steps (searched in 10% strides) at which `k` of `n` at the same rate
    passes the binomial test at 1% over `tests_at(steps)` rows; None where the rate is
    below _UNDECIDED_SHARE or that takes over _UNDECIDED_REACH times `n`."""
    if n <= 0 or k < _UNDECIDED_SHARE * n:
        return None
    more = max(n + 1, FEWEST_STEPS)
    while more <= _UNDECIDED_REACH * max(n, FEWEST_STEPS):
        hits = math.ceil(k / n * more)
        if binomial_tail(hits, more, q_at(more)) < 0.01 / tests_at(more):
            return more
        more = max(more + 1, math.ceil(more * 1.1))
    return None
