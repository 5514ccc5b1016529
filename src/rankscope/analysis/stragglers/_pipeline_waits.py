"""Who waits in a pipeline's send and recv calls, and for whom.

The wait rule for a phase that ends in a collective (analysis/stragglers/_arrivals.py) measures
each rank against the last to arrive, and names that rank. A pipeline's p2p calls join two
ranks, not all: the last rank to reach a recv says nothing of whom the others wait for, and
a stage's wait for a slow rank upstream lies in every call it makes (on a real Megatron
trace, over six call names, in none of which the collective rule saw a wait).

Where the pipeline was replayed (analysis/pipeline/_replay.py), its roles say which phases are sends
and recvs, and which ranks make up one replica of the pipeline (one rank per stage). A
rank waits in such a phase where it spends longer in it than its stage's other replicas at
the same step (their median; the faster of two) by the rules of a finding (threshold,
floor, persistence), and its own replica holds a slow rank: it waits for that rank. A
stage with one replica has nothing to be held against here; a whole stage slow is a group
(analysis/stragglers/_groups.py).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ..pipeline._replay import Replay
from ..read._matrix import PhaseMatrices, nanmedian, quiet
from ._model import StragglerFinding, rounded
from ._rows import Row, row_of

__all__ = ["waiting_in_pipeline"]

Matrix = npt.NDArray[np.float64]


def waiting_in_pipeline(
    m: PhaseMatrices,
    replay: Replay,
    findings: list[StragglerFinding],
    *,
    threshold: float,
    min_persistence: float,
    floor: float,
) -> list[tuple[StragglerFinding, Row]]:
    """The "waits" findings of `replay`'s p2p phases (see the module), with their rows;
    none for a (rank, phase) that `findings` already holds."""
    index = {rank: i for i, rank in enumerate(m.ranks)}
    slow: dict[int, set[int]] = {}  # replica -> its slow ranks
    for f in findings:
        where = replay.stage_of.get(index.get(f.rank, -1))
        if f.role == "slow" and where is not None:
            slow.setdefault(where[1], set()).add(f.rank)
    if not slow:
        return []
    known = {(f.rank, f.phase) for f in findings}
    p2p = sorted({op.phase for ops in replay.ops for op in ops if op.role in ("recv", "send")})
    out = []
    for ranks in replay.stages():
        if len(ranks) < 2:
            continue
        rows = np.asarray(ranks)
        for p in p2p:
            d = m.ms[p][rows]
            for i, r in enumerate(ranks):
                rank, replica = m.ranks[r], replay.stage_of[r][1]
                cause = sorted(slow.get(replica, set()) - {rank})
                if not cause or (rank, m.phases[p]) in known:
                    continue
                ratio, excess = _against_the_others(d, i)
                row = row_of(ratio, excess, threshold, floor)
                onset = row.onset(min_persistence)
                if onset is None or row.median_excess(onset) < floor:
                    continue
                finding = StragglerFinding(
                    rank=rank,
                    phase=m.phases[p],
                    kind=m.kinds[p],
                    role="waits",
                    median_ratio=row.median_ratio(onset),
                    share_above=row.share(onset),
                    lost_ms=row.lost(onset),
                    steps=len(row.valid) - onset,
                    since_step=m.steps[int(row.valid[onset])],
                    waits_for=tuple(cause),
                    ratios=rounded(ratio),
                    median_excess_ms=round(row.median_excess(onset), 3),
                )
                out.append((finding, row))
    return out


def _against_the_others(d: Matrix, i: int) -> tuple[npt.NDArray[np.float64], Matrix]:
    """Row `i` of `d` (a stage's replicas x steps): its (ratio, excess) over the other
    rows' median at each step (the other's time, with two)."""
    with quiet():
        ref = nanmedian(np.delete(d, i, axis=0), 0)
        ok = np.isfinite(ref) & (ref > 0)
        ratio = np.where(ok, d[i] / np.where(ok, ref, 1.0), np.nan)
    return ratio, d[i] - ref
