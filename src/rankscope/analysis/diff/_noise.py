"""How far a figure strays by noise alone, for `rankscope diff`: robust spreads of few
values, the standard errors of medians, and how far a window's steps stray from the run
they belong to (analysis.md, "rankscope diff", has the rules)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..read._matrix import nanmedian, quiet

__all__ = [
    "BLOCK_MARGIN",
    "FEW",
    "FEWEST_BLOCKS",
    "MAD_SD",
    "MAX_BLOCKS",
    "MEDIAN_SE",
    "PerRank",
    "Z",
    "median_of",
    "robust_spread",
    "shared_shift",
    "small_sample",
    "strays",
    "z_for",
]

Matrix = npt.NDArray[np.float64]
Vector = npt.NDArray[np.float64]


Z = 4.0
"""Standard errors of the difference a change must exceed, with many steps (see `z_for`)."""


MAD_SD = 1.4826
"""A normal spread's standard deviation over its median absolute deviation."""


MEDIAN_SE = 1.2533
"""A median's standard error over the mean's (sqrt(pi / 2)), for normal spreads."""


MAX_BLOCKS = 200
"""Blocks of steps a window is judged against, at most (evenly spread over the run)."""


BLOCK_MARGIN = 1.5
"""The most that a run's blocks stray is about their 97th percentile; a window is held to
1.5 times that, as far out as `Z` standard errors reach (no clean pair of synthetic
windows, 1 to 4 steps, 2 to 8 ranks, with spikes, crossed it)."""


FEWEST_BLOCKS = 8
"""Blocks a window's run must hold for them to judge it (else the standard errors do)."""


# The MAD of few values falls short of the spread: Croux and Rousseeuw's (1992) factors
# for 2 to 9 values, then n / (n - 0.8).
FEW = np.array([1.0, 1.0, 1.196, 1.495, 1.363, 1.206, 1.200, 1.140, 1.129, 1.107])


@dataclass(frozen=True)
class PerRank:
    """Per rank (rows of a [rank, step] matrix): median, spread from step to step, steps."""

    median: Vector
    sigma: Vector
    steps: Vector
    basis: Vector
    """The steps the spread was judged on."""

    @classmethod
    def of(cls, values: Matrix, whole: Matrix) -> PerRank:
        """The medians of `values`, the spread of `whole` (the same, or more steps)."""
        with quiet():
            median = nanmedian(values, 1)
            middle = median if whole is values else nanmedian(whole, 1)
            mad = nanmedian(np.abs(whole - middle[:, None]), 1)
        steps = np.sum(np.isfinite(values), axis=1).astype(np.float64)
        basis = np.sum(np.isfinite(whole), axis=1).astype(np.float64)
        return cls(median, MAD_SD * mad * small_sample(basis), steps, basis)

    def pooled(self) -> PerRank:
        """Each rank's spread at least the median rank's."""
        sigma = np.fmax(self.sigma, median_of(self.sigma))
        return PerRank(self.median, sigma, self.steps, self.basis)

    def se(self) -> Vector:
        """The standard error of each rank's median (0 where it has one step: no spread)."""
        return MEDIAN_SE * self.sigma / np.sqrt(np.maximum(self.steps, 1))


def shared_shift(values: Vector) -> float:
    """The median; of two middle values the one nearer zero (at least half the values are
    as far from zero), and 0 where they are as near on either side: the answer for the
    values negated is this one negated, so B against A mirrors A against B."""
    finite = np.sort(values[np.isfinite(values)])
    n = len(finite)
    if not n:
        return math.nan
    low, high = float(finite[(n - 1) // 2]), float(finite[n // 2])  # one value for odd n
    if abs(low) == abs(high):
        return low if low == high else 0.0
    return low if abs(low) < abs(high) else high


def median_of(values: Any) -> float:
    finite = np.asarray(values, np.float64)[np.isfinite(values)]
    return float(np.median(finite)) if finite.size else 0.0


def robust_spread(values: Vector) -> float:
    """The robust standard deviation of `values`: the median absolute deviation, scaled."""
    if not values.size:
        return 0.0
    mad = float(np.median(np.abs(values - np.median(values))))
    return MAD_SD * mad * float(small_sample(np.asarray([values.size], np.float64))[0])


def strays(whole: Matrix, width: int) -> tuple[Vector, float] | None:
    """(per rank, shared): how far the medians of `width` consecutive sampled steps stray
    from the whole run's, at most over the run's blocks; None for a run too short."""
    steps = whole.shape[1]
    if steps - width + 1 < FEWEST_BLOCKS:
        return None
    starts = range(0, steps - width + 1, max(1, (steps - width + 1) // MAX_BLOCKS))
    with quiet():
        typical = nanmedian(whole, 1)
        moved = np.stack([nanmedian(whole[:, s : s + width], 1) for s in starts])
    moved -= typical[None, :]
    shared = np.array([shared_shift(row) for row in moved])
    with quiet():
        apart = np.nanmax(np.abs(moved - shared[:, None]), axis=0)
    apart = np.nan_to_num(apart)
    most = float(np.nanmax(np.abs(shared), initial=0.0))
    return BLOCK_MARGIN * np.fmax(apart, median_of(apart)), BLOCK_MARGIN * most


def z_for(freedom: float) -> float:
    """`Z` for a spread judged with `freedom` degrees of freedom: larger with few (a
    first-order Student's t, as the spread of few values is itself unsure)."""
    return Z * (1 + (Z**2 + 1) / (4 * max(freedom, 1.0)))


def small_sample(n: Vector) -> Vector:
    many = n / np.maximum(n - 0.8, 1.0)
    return np.where(n < len(FEW), FEW[np.clip(n, 0, len(FEW) - 1).astype(np.int64)], many)
