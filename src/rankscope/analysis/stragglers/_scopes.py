"""Collectives that ranks leave in groups, not all together: a pipeline's data-parallel
all-reduce runs once per stage, each stage's replicas together, the stages apart.

The straggler rules measure a rank's time in a collective phase against the last rank
to arrive, which waits for no one, and a rank that waits there waits for that one. Where
the ranks leave the phase in groups, a rank waits for the last to arrive among those it
leaves with, not for the last rank of the run: taken as one collective, a pipeline's
clean run had every stage's ranks "wait" for a rank of the first stage (which drains
last), and, the first stage's ranks being the only ones ever last, one of them was last
far more often than one time in the number of ranks: 20 of 54 clean simulated pipelines
were said to wait for it. At each step the ranks that leave within `_APART` of each other
(or half the collective's own time, the least any rank spent in it, the more: a rank's
wait is not its collective's) are taken as one collective. The phase is
taken in groups where the same groups, of two ranks or more each, leave it apart at half
the steps or more. Where every rank leaves together, or ranks leave apart in no steady way
(a rank a busy machine woke late after the collective, a different one each time), or one
rank leaves late at every step, it is one collective, as before. A phase that runs more
than once in a step (a pipeline's sends and recvs) is not split: its last exit in a step
says nothing of whom it met.

Host time only: on device time the timings say how long each phase took, not when a
rank left it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..read._matrix import quiet

__all__ = ["Scopes", "scopes_of"]

Matrix = npt.NDArray[np.float64]
Indices = npt.NDArray[np.int64]
_APART = 2.0
"""Ranks that leave a collective this many ms apart or more (and half its median time or
more) left two collectives."""


@dataclass(frozen=True)
class Scopes:
    """Per rank and step, the collective it left with others (see the module)."""

    last: Indices
    """The index of the last rank to arrive among those it left with; -1 where unknown."""
    size: Indices
    """How many they were."""
    late_ns: Matrix
    """That last rank's arrival less the median arrival among them."""
    made_ns: Matrix
    """How much of that it made since the ranks were last together (its own work)."""

    def times(self, d: Matrix) -> Matrix:
        """Per rank and step, the time in the phase of the last rank to arrive among those
        it left with: what a rank's time there is measured against."""
        taken = np.take_along_axis(d, np.maximum(self.last, 0), axis=0)
        return np.where(self.last >= 0, taken, np.nan)

    def members(self, r: int, cols: Indices) -> int:
        """How many ranks row `r` typically left the phase with, over the steps `cols`."""
        sizes = self.size[r, cols]
        sizes = sizes[sizes > 0]
        return int(np.median(sizes)) if len(sizes) else self.size.shape[0]


def scopes_of(arrive: Matrix, leave: Matrix, d: Matrix, since: Matrix) -> Scopes | None:
    """The collectives of a phase that ends in one, where its ranks leave it in groups at
    half the steps or more; None where every rank leaves together (one collective).
    `arrive`, `leave` (ns) and `d` (ms) are rank x step; `since`, when each rank's own work
    since the ranks were last together began."""
    n_r, n_s = d.shape
    last = np.full((n_r, n_s), -1, np.int64)
    size = np.zeros((n_r, n_s), np.int64)
    late = np.full((n_r, n_s), np.nan)
    made = np.full((n_r, n_s), np.nan)
    own = arrive - since
    judged = 0
    partitions: Counter[tuple[tuple[int, ...], ...]] = Counter()
    with quiet():
        own_ms = np.nanmin(d, axis=0)  # the last to arrive waits for no one
    for t in range(n_s):
        present = np.flatnonzero(np.isfinite(leave[:, t]) & np.isfinite(arrive[:, t]))
        if len(present) < 2:
            continue
        judged += 1
        order = present[np.argsort(leave[present, t], kind="stable")]
        gap = max(_APART, 0.5 * float(np.nan_to_num(own_ms[t]))) * 1e6
        cuts = np.flatnonzero(np.diff(leave[order, t]) > gap) + 1
        groups = np.split(order, cuts)
        partitions[tuple(sorted(tuple(sorted(g.tolist())) for g in groups))] += 1
        for group in groups:
            who = group[np.argmax(arrive[group, t])]
            last[group, t], size[group, t] = who, len(group)
            with quiet():
                late[group, t] = arrive[who, t] - np.median(arrive[group, t])
                made[group, t] = own[who, t] - np.median(own[group, t])
    if not partitions:
        return None
    common, count = partitions.most_common(1)[0]
    if len(common) < 2 or min(map(len, common)) < 2 or count < 0.5 * judged:
        # One collective; or ranks a busy machine woke late, apart at random; or one rank
        # that leaves late at every step (a collective has two ranks or more).
        return None
    return Scopes(last=last, size=size, late_ns=late, made_ns=made)
