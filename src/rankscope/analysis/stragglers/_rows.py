"""One (rank, phase) row of the straggler rules over the sampled steps: where its excess
began, whether it is beyond chance, and its figures from then on (analysis/stragglers/_stragglers.py
applies the rules; many rows at once are worked out here in a few numpy calls)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..core._chance import binomial_tail, steps_needed

__all__ = ["Row", "prime", "row_of", "rows_of", "sharpen"]

Matrix = npt.NDArray[np.float64]


@dataclass
class Row:
    """One (rank, phase) over the steps where it and the reference both exist."""

    valid: npt.NDArray[np.int64]
    ratio: Matrix
    excess: Matrix
    above: npt.NDArray[np.bool_]
    whole: bool = False
    """Every step is valid (so rows share their steps; see rows_of)."""
    threshold: float = math.inf
    """The ratio a slow step is above (late_starts reads it)."""
    known: dict[str, Any] = field(default_factory=dict)
    """What rows_of worked out for many rows at once: "onset"."""
    figures: dict[int, tuple[float, float, float, float]] = field(default_factory=dict)
    """Per onset, the figures from it (median ratio, median excess, share above, time
    lost) where they were worked out for many rows at once (prime)."""

    def last_at(self, last: npt.NDArray[np.int64], onset: int) -> set[int]:
        """The ranks last to arrive at the steps from `onset` on (for a whole row)."""
        seen = self.known.setdefault("last_at", {})
        if onset not in seen:
            seen[onset] = set(last[self.valid[onset:]].tolist())
        found: set[int] = seen[onset]
        return found

    def onset(self, min_persistence: float) -> int | None:
        """Where a persistent excess began (0: from the start); None where there is none.

        The split that best separates steps above the threshold after it from steps
        below before it, keeping at least a fifth of the steps (and 3) after it.
        """
        if "onset" in self.known:
            found: int | None = self.known["onset"]
            return found
        n = len(self.valid)
        if n < _shortest(n):
            return None
        best, after = _splits(self.above[None, :])
        onset = int(best[0])
        if after[0, onset] < min_persistence:
            return None
        late = late_starts(self.ratio[None, :], self.excess[None, :], best, self.threshold)
        if after[0, int(late[0])] >= min_persistence:
            best = late
            onset = int(best[0])
        sharp = int(sharpen(self.excess[None, :], best)[0])
        return sharp if after[0, sharp] >= min_persistence else onset

    def beyond_chance(self, onset: int, chance: float, tests: int) -> bool:
        """The steps above from `onset` on are too many to be noise at rate `chance`.

        A one-sided binomial test at 1% over all the (rank, phase, onset) pairs tried:
        with 64 noisy ranks, some rank is above 10% at half of some 15-step stretch.
        """
        n = len(self.valid) - onset
        k = int(np.sum(self.above[onset:]))
        return binomial_tail(k, n, max(chance, 1.0 / max(n, 1))) < 0.01 / tests

    def steps_needed(self, onset: int, chance: float, tests: int) -> int | None:
        """About how many steps at this rate would pass `beyond_chance`; None where the
        rate is too low, or it would take far more steps, for that to be worth saying."""
        n = len(self.valid) - onset
        k = int(np.sum(self.above[onset:]))
        return steps_needed(k, n, lambda m: max(chance, 1.0 / m), lambda m: tests * m / n)

    def median_ratio(self, onset: int) -> float:
        if onset in self.figures:
            return round(self.figures[onset][0], 4)
        return round(float(np.median(self.ratio[onset:])), 4)

    def share(self, onset: int) -> float:
        if onset in self.figures:
            return round(self.figures[onset][2], 4)
        return round(float(np.mean(self.above[onset:])), 4)

    def lost(self, onset: int) -> float:
        if onset in self.figures:
            return round(self.figures[onset][3], 3)
        return round(float(np.sum(np.clip(self.excess[onset:], 0, None))), 3)

    def median_excess(self, onset: int) -> float:
        if onset in self.figures:
            return self.figures[onset][1]
        return float(np.median(self.excess[onset:]))


def prime(asked: list[tuple[Row, int]]) -> None:
    """Works out each (row, onset)'s figures, for the rows that share an onset and a
    length in one numpy call each: thousands of ranks waiting for one ask the same onset,
    and a median a row took 0.5 s at 4096 ranks. The figures are Row's own, exactly."""
    groups: dict[tuple[int, int], list[Row]] = {}
    for row, onset in asked:
        if onset not in row.figures and 0 <= onset < len(row.valid):
            groups.setdefault((onset, len(row.valid)), []).append(row)
    for (onset, _), rows in groups.items():
        ratio = np.stack([row.ratio[onset:] for row in rows])
        excess = np.stack([row.excess[onset:] for row in rows])
        above = np.stack([row.above[onset:] for row in rows])
        figures = zip(
            np.median(ratio, axis=1).tolist(),
            np.median(excess, axis=1).tolist(),
            np.mean(above, axis=1).tolist(),
            np.sum(np.clip(excess, 0, None), axis=1).tolist(),
            strict=True,
        )
        for row, these in zip(rows, figures, strict=True):
            row.figures[onset] = these


def rows_of(
    ratio: Matrix,
    excess: Matrix,
    rows: npt.NDArray[np.int64],
    *,
    threshold: float,
    floor: float,
    min_persistence: float,
) -> dict[int, Row]:
    """The Row of each of `rows`. Rows valid at every step (the common case: thousands
    of ranks waiting for one) get their onset and medians in a few numpy calls for all
    of them, the same figures Row works out one row at a time."""
    out: dict[int, Row] = {}
    if not len(rows):
        return out
    whole = rows[np.isfinite(ratio[rows]).all(axis=1)]
    n = ratio.shape[1]
    if len(whole) and n >= _shortest(n):
        r, e = ratio[whole], excess[whole]
        above = (r > threshold) & (e >= floor)
        best, after = _splits(above)
        rows_i = np.arange(len(whole))
        late = late_starts(r, e, best, threshold)
        started = after[rows_i, best] >= min_persistence  # a later start only for these
        best = np.where(started & (after[rows_i, late] >= min_persistence), late, best)
        sharp = sharpen(e, best)
        best = np.where(after[rows_i, sharp] >= min_persistence, sharp, best)
        onsets = np.where(after[rows_i, best] >= min_persistence, best, -1)
        # The stragglers' figures count from the first step above the onset: work
        # them out there (a step after the onset is above, where the share after it passes).
        from_onset = above & (np.arange(n)[None, :] >= onsets[:, None])
        first = np.argmax(from_onset, axis=1)
        valid = np.arange(n)
        asked = []
        for i, index in enumerate(whole.tolist()):
            onset = int(onsets[i])
            row = Row(valid, r[i], e[i], above[i], whole=True, threshold=threshold)
            row.known["onset"] = None if onset < 0 else onset
            if onset >= 0:
                asked += [(row, at) for at in {onset, int(first[i])}]
            out[index] = row
        prime(asked)
    for index in rows.tolist():
        if index not in out:
            out[index] = row_of(ratio[index], excess[index], threshold, floor)
    return out


def late_starts(
    ratio: Matrix, excess: Matrix, best: npt.NDArray[np.int64], threshold: float
) -> npt.NDArray[np.int64]:
    """Each row's onset `best`, where a row taken to be slow from the start (0) turned
    slow part-way: moved to the split under which its excess is above its own median
    more often after than before (the count split's likelihood test), where its median
    ratio before is within `threshold` and after it is above.

    Counting steps above the threshold misses such a start where a busy machine put the
    rank above at many steps before it: a real HF job beside the test suite, its rank 1
    given 20 ms more forward from step 40, was above at 9 of its 20 sampled steps before
    (median ratio 1.06) and 2.4x the median after: "slow since step 2", priced from
    there at 6 ms against the 31 ms the job measured. By its median the rank was not slow
    before; its excess says where it turned."""
    out: npt.NDArray[np.int64] = best.copy()
    rows = np.flatnonzero(best == 0)
    if not len(rows) or not math.isfinite(threshold):
        return out
    e, r = excess[rows], ratio[rows]
    rise = _splits(e > np.median(e, axis=1)[:, None])[0]
    for at in np.unique(rise[rise > 0]).tolist():
        picked = np.flatnonzero(rise == at)
        before = np.median(r[picked, :at], axis=1)
        after = np.median(r[picked, at:], axis=1)
        turned = (before <= threshold) & (after > threshold)
        out[rows[picked[turned]]] = at
    return out


def sharpen(excess: Matrix, best: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Each row's onset `best` moved to where its excess itself changes.

    Counting steps above the threshold puts a step change at a noisy spot: a few steps
    just above it before the change (a rank 30 ms slower from step 20, 0.5 ms above the
    threshold at 17 and 19, is "slow since 17"). Taken again with the steps above the
    midpoint between the row's median excess before and after its onset, the split
    falls where the excess jumps. A row slow from the start (onset 0) stays so."""
    out: npt.NDArray[np.int64] = best.copy()
    for onset in np.unique(best[best > 0]).tolist():
        rows = np.flatnonzero(best == onset)
        e = excess[rows]
        cut = (np.median(e[:, :onset], axis=1) + np.median(e[:, onset:], axis=1)) / 2
        out[rows] = _splits(e > cut[:, None])[0]
    return out


def _shortest(n: int) -> int:
    """Steps an onset keeps after it: a fifth of them, and 3 at least."""
    return max(3, math.ceil(0.2 * n))


def _splits(above: npt.NDArray[np.bool_]) -> tuple[npt.NDArray[np.int64], Matrix]:
    """Per row of `above` (rows x steps), where the share of steps above rose: the split,
    keeping `_shortest` steps after it, under which a rate before and a higher rate after
    explain the steps best (Bernoulli likelihood), taken only where it explains them
    better than one rate throughout by more than log(steps) (0, from the start, else);
    and per row and split, the share of steps above after it.

    A rank above now and then before its fault began (a busy machine's jitter, above at
    two steps in five) is slow from the fault's step, not from the start: a split that
    only weighs the share after it against the share before favours the start there."""
    n = above.shape[1]
    cum: Matrix = np.concatenate(
        (np.zeros((len(above), 1)), np.cumsum(above, axis=1, dtype=np.float64)), axis=1
    )
    starts = np.arange(n - _shortest(n) + 1)
    k_after = cum[:, n : n + 1] - cum[:, starts]
    after: Matrix = k_after / (n - starts)
    k_before = cum[:, starts]
    before: Matrix = np.divide(
        k_before, starts, out=np.zeros((len(above), len(starts))), where=starts > 0
    )
    whole = _log_likelihood(cum[:, n : n + 1], np.full((1, 1), float(n)))
    split = _log_likelihood(k_before, starts[None, :].astype(np.float64)) + _log_likelihood(
        k_after, (n - starts)[None, :].astype(np.float64)
    )
    gain = np.where((starts > 0) & (after > before), split - whole, -np.inf)
    best: npt.NDArray[np.int64] = np.argmax(gain, axis=1)
    changed = gain[np.arange(len(above)), best] > math.log(max(n, 2))
    best = np.where(changed, best, 0)
    return best, after


def _log_likelihood(k: Matrix, m: Matrix) -> Matrix:
    """The log-likelihood of `k` steps above of `m` at the rate k/m (0 where m is 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(m > 0, k / np.maximum(m, 1), 0.0)
        up = np.where(k > 0, k * np.log(np.where(rate > 0, rate, 1.0)), 0.0)
        down = np.where(m - k > 0, (m - k) * np.log(np.where(rate < 1, 1 - rate, 1.0)), 0.0)
    out: Matrix = up + down
    return out


def row_of(ratio: Matrix, excess: Matrix, threshold: float, floor: float) -> Row:
    valid = np.flatnonzero(np.isfinite(ratio))
    r, e = ratio[valid], excess[valid]
    # A step counts as above only when the excess also matters against the step: a
    # short phase's jitter is often 10% of it and never worth a finding.
    return Row(
        valid=valid, ratio=r, excess=e, above=(r > threshold) & (e >= floor), threshold=threshold
    )
