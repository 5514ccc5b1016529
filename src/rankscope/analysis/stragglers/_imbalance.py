"""Step-to-step imbalance: no rank is slow for long, but the step waits for a different one
each time.

Uneven data (sequence lengths, expert routing) loads ranks unevenly from step to step.
At every step the ranks leave the next collective together, so the step waits for that
step's slowest rank; no rank is slow at most steps, so no straggler finding names one.
A rank's load at a step is its time there over the typical time of the ranks that do
the same work (_Paces: a pipeline's stage; else every rank). A phase holds imbalance
when, since some step (found by the straggler rules' onset rule, analysis/stragglers/_rows.py):

- at `min_persistence` of the steps or more, its most loaded rank is above `threshold`
  times the median rank's load, by at least the straggler floor at its pace;
- no one rank is that slowest rank at half of those steps or more (else it is a
  straggler's case, and the straggler rules judge it);
- and the spread is the data's, not the machines': a per-step value recorded with the
  phase (`prof.phase("forward", tokens=n)`) follows it (its slowest rank holds one of
  the larger values), or, without one, the phase's ranks spread from step to step at
  least `_WIDER` times as much as in another work phase of the same steps, whose work
  does not follow the data (the optimizer's does not). Noise spreads every phase alike,
  so a clean noisy run is not called uneven. Or, where every comparable work phase
  spreads as much (the forward and the backward both follow the data), the ranks that
  share the slowest rank's data are slow with it: the ranks of one named group (a
  pipeline's replica: `dp`, the same data through every stage) are all above their
  typical time at `_TOGETHER` of the uneven steps, a different group from step to step.
  Machines' noise does not fall on a group's ranks together. A run with neither cannot
  be told from noise and is not judged.

Its price is the step model's (analysis/stragglers/_cost.py; a pipeline's replay where there is
one): every rank's time in the phase set to its typical time times the ranks' mean load
at each step from the onset (the step's work spread evenly), never slower than it was.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from ..read._matrix import STEP, PhaseMatrices, nanmedian, quiet
from ..read._values import PhaseValues
from ._findings import imbalance_sentence
from ._model import Cause, Imbalance
from ._rows import Row, row_of

__all__ = ["balanced", "find_imbalance", "imbalance_cells"]

Matrix = npt.NDArray[np.float64]
Vector = npt.NDArray[np.float64]

_MOST = 0.5
"""A rank that is the slowest at this share of the uneven steps, or more, is a straggler."""
_WIDER = 2.0
"""Without a value: the phase's ranks spread at least this many times as much as another
work phase's, step by step (the spread: the interquartile range of log times)."""
_COMPARABLE = 0.2
"""A phase tells how far the machines spread ranks only when at least this share as long:
a machine's hiccups (a preempted process, a page fault) land on a long phase more often
than on a short one, so a 0.5 ms phase beside a 3 ms one on four ranks sharing two cores
looked 3x quieter with no data in play (the demo's clean run)."""
_FOLLOWS = 0.5
"""A value follows the spread when the slowest rank holds one of the top quarter of the
values at this share of the uneven steps, or more."""
_FEWEST_RANKS = 3
"""A step's median rank needs three ranks or more."""
_TOGETHER = 0.75
"""A group shares the slowest rank's data when all its other ranks are above their own
typical time at this share of the uneven steps, or more (by chance, at a step: a half for
each of them; a group needs three ranks or more)."""


def find_imbalance(
    m: PhaseMatrices,
    sync: set[str],
    *,
    threshold: float,
    min_persistence: float,
    floor: float,
    slow: Collection[tuple[int, str]] = (),
    values: Callable[[set[str]], PhaseValues] | None = None,
    groups: Mapping[int, Mapping[str, object]] | None = None,
    hosts: Mapping[int, str] | None = None,
    stages: Sequence[Sequence[int]] | None = None,
    shared_cores: bool = False,
) -> list[Imbalance]:
    """The phases of `m` whose slowest rank changes from step to step (see the module).

    `sync`: the phases that end in a collective (a rank's time there is its wait, not
    its load); `floor`: the least excess in ms that counts (the straggler floor); `slow`:
    the (rank, phase) pairs of the slow findings (ranks slow together, a slow group, are
    the slowest in turn; they are theirs, not imbalance); `values(phases)`: the per-step
    values recorded with those phases; `groups`: rank -> its named parallel groups;
    `hosts`: rank -> its host (a group whose ranks share a host shares its noise);
    `stages`: the rank indices of each pipeline stage (analysis/pipeline/_replay.py), whose
    ranks do the same work."""
    if len(m.ranks) < _FEWEST_RANKS or len(m.steps) < 3:
        return []
    work = [
        p
        for p, phase in enumerate(m.phases)
        if phase != STEP and m.depths[p] == 0 and phase not in sync and m.kinds[p] != "comm"
    ]
    same = tuple(tuple(s) for s in stages) if stages else (tuple(range(len(m.ranks))),)
    paces = {
        p: _Paces(same, tuple(i for i, rank in enumerate(m.ranks) if (rank, m.phases[p]) in slow))
        for p in work
    }
    # A phase run n times a step sums n runs' noise: its ranks spread about 1/sqrt(n) as
    # much as once-run noise would; held against another, each is taken per run (a 2 ms
    # optimizer with 20% noise spread twice as much as a four-microbatch forward, and
    # was called uneven).
    spreads = {
        p: _spread(paces[p].loads(m.ms[p])[0]) * math.sqrt(m.runs.get(m.phases[p], 1.0))
        for p in work
    }
    candidates: dict[int, tuple[Vector, int]] = {}  # phase -> (uneven steps, onset)
    for p in work:
        row = _uneven(m.ms[p], paces[p], threshold, floor)
        onset = None if row is None else row.onset(min_persistence)
        if row is not None and onset is not None:
            uneven = np.full(len(m.steps), np.nan)
            uneven[row.valid] = row.above
            candidates[p] = (uneven, int(row.valid[onset]))
    recorded = values({m.phases[p] for p in candidates}) if values and candidates else None
    found = []
    data_groups = _data_groups(m.ranks, groups or {}, hosts or {})
    for p, (uneven, onset) in candidates.items():
        got = _judge(
            m, p, uneven[onset:], onset, spreads, recorded, paces[p], data_groups, shared_cores
        )
        if got is not None:
            found.append(got)
    found.sort(key=lambda i: -i.lost_ms)
    return found


def imbalance_cells(m: PhaseMatrices, found: Imbalance) -> set[tuple[int, int, int]]:
    """The step model's fix of `found`: every rank's phase from its onset."""
    p = m.index(found.phase)
    return {(r, p, found.since_step) for r in range(len(m.ranks))}


def balanced(m: PhaseMatrices, found: Imbalance) -> Matrix:
    """The phase's times with its load made even: each rank at its typical time times the
    ranks' mean load at each step (the step's work spread evenly: what balancing the data
    does), spread across ranks as the reference phase's ranks' loads spread at that step
    (their noise alone). Without a reference, every rank at the mean load. The median
    load kept the luck of the middle rank's draw: a pipeline's uneven replicas were
    priced 5-38% low against the same draws spread evenly."""
    paces = _Paces(found.stages or (tuple(range(len(m.ranks))),), found.own_pace)
    load, typical = paces.loads(m.ms[m.index(found.phase)])
    with quiet():
        out: Matrix = typical[:, None] * np.nanmean(load, axis=0)[None, :]
        if found.reference is not None:
            theirs, _ = paces.loads(m.ms[m.index(found.reference)])
            noise = theirs / nanmedian(theirs, axis=0)[None, :]
            out = np.where(np.isfinite(noise), out * noise, out)
    return out


@dataclass(frozen=True)
class _Paces:
    """Whose steady pace a rank's load is taken against."""

    stages: tuple[tuple[int, ...], ...]
    """Rank indices that do the same work: a pipeline's stages; else every rank."""
    own: tuple[int, ...] = ()
    """Rank indices with a slow finding in the phase: taken against the pace of the slow
    ranks of their stage (a straggler alone, its own)."""

    def loads(self, d: Matrix) -> tuple[Matrix, Vector]:
        """Each rank's time over its typical time (the median over the steps and the ranks
        of its stage), and that typical time: its load at a step. A pipeline's stages do
        unequal work, and a slow stage is the straggler rules' to judge: measured by their
        times, a stage slower than the others held the slowest place at every step, and
        the uneven data beside it was not seen. A rank's own median alone would keep the
        luck of its data's draw (over 30 steps a replica's median load strays by 4%, and
        balancing kept that: priced 5-38% low)."""
        typical = np.full(d.shape[0], np.nan)
        own = set(self.own)
        with quiet():
            for members in self.stages:
                # A stage's slow ranks are slow alike (a slow stage): pooled apart.
                for rows in (
                    [r for r in members if r not in own],
                    [r for r in members if r in own],
                ):
                    if rows:
                        typical[rows] = float(np.nanmedian(d[rows]))
            load: Matrix = d / np.where(typical > 0, typical, np.nan)[:, None]
        return load, typical


def _tops(load: Matrix, typical: Vector) -> tuple[npt.NDArray[np.intp], Vector, Vector, Vector]:
    """Per step: the rank with the highest load, that load, the median rank's, and the ms
    the highest is above the median at that rank's pace (NaN where there is no load)."""
    with quiet():
        top = np.argmax(np.where(np.isfinite(load), load, -np.inf), axis=0)
        high = load[top, np.arange(load.shape[1])]
        med = nanmedian(load, axis=0)
        excess = (high - med) * typical[top]
    return top, high, med, excess


def _uneven(d: Matrix, paces: _Paces, threshold: float, floor: float) -> Row | None:
    """The phase as one row of the straggler rules (analysis/stragglers/_rows.py): at each step, the
    rank with the highest load against the median rank's load, and the ms it is above at
    its pace; a step is uneven where that is above the threshold and the floor. Steps
    with fewer than three ranks are left out. Its onset is found as a straggler's is, so
    "since step N" means one thing in every finding."""
    counted = np.sum(np.isfinite(d), axis=0)
    if not np.any(counted >= _FEWEST_RANKS):
        return None
    _, high, med, excess = _tops(*paces.loads(d))
    with quiet():
        ratio: Vector = np.where(med > 0, high / med, np.nan)
    ratio[counted < _FEWEST_RANKS] = np.nan
    return row_of(ratio, excess, threshold, floor)


def _spread(load: Matrix) -> float:
    """How far a phase's ranks spread at a typical step: the median over steps of the
    interquartile range of the ranks' log loads (NaN where it cannot be told)."""
    with quiet():
        logs = np.log(np.where(load > 0, load, np.nan))
        q75, q25 = np.nanpercentile(logs, [75, 25], axis=0)
        iqr = q75 - q25
    iqr = iqr[np.isfinite(iqr)]
    return float(np.median(iqr)) if len(iqr) else float("nan")


def _judge(  # noqa: PLR0917 - one phase's verdict from what find_imbalance found
    m: PhaseMatrices,
    p: int,
    hits: Vector,
    onset: int,
    spreads: dict[int, float],
    recorded: PhaseValues | None,
    paces: _Paces,
    groups: Mapping[int, Mapping[str, object]],
    shared_cores: bool = False,
) -> Imbalance | None:
    """Phase `p`'s imbalance, given its uneven steps (`hits`) from the `onset` index on."""
    load, typical = paces.loads(m.ms[p])
    d = m.ms[p][:, onset:]
    found_slow = list(paces.own)
    tops, high, med, excess = _tops(load[:, onset:], typical)
    at = np.flatnonzero(hits == 1)
    slowest = tops[at]
    counts = np.bincount(slowest, minlength=len(m.ranks))
    top_share = float(counts.max() / len(at))
    if top_share >= _MOST or counts[found_slow].sum() >= _MOST * len(at):
        # One rank, or the ranks with slow findings together, are the slowest at most of
        # them: the straggler rules' case (ranks slow together take the slowest in turn).
        return None
    phase = m.phases[p]
    values = recorded.of(phase) if recorded is not None else {}
    follows = _values_follow(slowest, {k: v[:, onset:][:, at] for k, v in values.items()})
    # Ranks taking turns on a host's cores spread a phase by when each got one: its
    # spread against another's says the scheduler, not the data (a clean 4-rank DDP job
    # on two cores: its 1 ms forward 5x as spread as its backward, at 88% of the steps).
    quietest = None if shared_cores else _quietest(m, p, spreads)
    wider = quietest if quietest is not None and quietest[1] >= _WIDER else None
    shared = None if wider is not None else _shared_data(m, d, at, slowest, groups)
    if follows is None and wider is None and shared is None:
        return None
    judged = np.isfinite(hits)
    ratio = high[judged] / med[judged]
    evidence, cause = _evidence_and_cause(phase, follows, wider, shared, values)
    uneven = Imbalance(
        phase=phase,
        kind=m.kinds[p],
        ratio=round(float(np.median(ratio)), 4),
        share=round(float(np.nanmean(hits)), 4),
        changes=round(float(np.mean(slowest[1:] != slowest[:-1])) if len(at) > 1 else 0.0, 4),
        ranks_slowest=int(np.count_nonzero(counts)),
        top_share=round(top_share, 4),
        lost_ms=round(float(np.median(excess[judged])), 3),
        since_step=int(m.steps[onset]),
        steps=int(judged.sum()),
        evidence=evidence,
        cause=cause,
        reference=None if wider is None else wider[0],
        stages=paces.stages,
        own_pace=paces.own,
    )
    return replace(uneven, summary=imbalance_sentence(uneven))


def _values_follow(
    slowest: npt.NDArray[np.intp], values: dict[str, Matrix]
) -> tuple[str, float, float] | None:
    """The first value (by name) whose top quarter, above its median, holds the slowest
    rank at `_FOLLOWS` of the uneven steps where the ranks' values differ: (name, that
    share, the slowest rank's value over the median). Values alike on every rank follow
    nothing: with every batch 1024 tokens, each rank is in the top quarter of a tie, and
    every clean run of a DDP job was called uneven, "data-driven"."""
    for name, v in sorted(values.items()):
        cols = np.arange(v.shape[1])
        mine = v[slowest, cols]
        with quiet():
            q75 = np.nanpercentile(v, 75, axis=0)
            median = nanmedian(v, axis=0)
            differ = np.nanmax(v, axis=0) > np.nanmin(v, axis=0)
        judged = np.isfinite(mine) & np.isfinite(q75) & (median > 0) & differ
        if int(judged.sum()) < 3:
            continue
        share = float(np.mean((mine >= q75)[judged] & (mine > median)[judged]))
        if share >= _FOLLOWS:
            more = float(np.median(mine[judged] / median[judged]))
            return name, share, more
    return None


def _quietest(m: PhaseMatrices, p: int, spreads: dict[int, float]) -> tuple[str, float] | None:
    """The other work phase of `p`'s kind whose ranks spread least, among those at least
    `_COMPARABLE` as long as `p`, and how many times as much `p`'s ranks spread; None
    where no other phase can tell.

    Of its kind: a busy machine spreads work that runs on its cores, not a wait. A data
    phase waiting on a loader or a sleep spread 4.8x less than a clean DDP job's 1.5 ms
    forward on 4 ranks sharing 2 cores with a test run, and every batch the same size."""
    with quiet():
        typical = {q: float(np.nanmedian(m.ms[q])) for q in spreads}
    others = [
        (s, q)
        for q, s in spreads.items()
        if q != p
        and m.kinds[q] == m.kinds[p]
        and np.isfinite(s)
        and typical[q] >= _COMPARABLE * typical[p]
    ]
    if not others or not np.isfinite(spreads[p]):
        return None
    least, q = min(others)
    # In milliseconds too: a busy machine's delays are as long in any phase, so a short
    # phase spreads more in ratio than a long one (a 1.5 ms forward spread 5x as much as
    # a 10 ms backward on a clean 4-rank job sharing two cores, in ms about as much).
    ms_p, ms_q = _ms_spread(m.ms[p]), _ms_spread(m.ms[q])
    if not np.isfinite(ms_p) or not np.isfinite(ms_q):
        return None
    return m.phases[q], min(spreads[p] / max(least, 1e-9), ms_p / max(ms_q, 1e-9))


def _ms_spread(ms: Matrix) -> float:
    """How far a phase's ranks spread at a typical step, in ms: the median over steps of
    the interquartile range of the ranks' times (NaN where it cannot be told)."""
    with quiet():
        q75, q25 = np.nanpercentile(ms, [75, 25], axis=0)
    iqr = (q75 - q25)[np.isfinite(q75 - q25)]
    return float(np.median(iqr)) if len(iqr) else float("nan")


def _data_groups(
    ranks: list[int], groups: Mapping[int, Mapping[str, object]], hosts: Mapping[int, str]
) -> dict[int, dict[str, object]]:
    """`groups` less the fields whose every group lies on one host, where the ranks run on
    more than one: its ranks share a machine's noise (a node's jitter at one step falls on
    all of its ranks), so their being slow together says nothing of their data. A
    clean job of 16 ranks on 4 hosts, whose ranks named their node, was said to be
    unevenly loaded by its nodes' jitter."""
    on = {hosts[r] for r in ranks if r in hosts}
    if len(on) < 2:
        return {r: dict(groups.get(r, {})) for r in ranks}
    local = set()
    for name in {str(f) for named in groups.values() for f in named}:
        where: dict[object, set[str]] = {}
        for r in ranks:
            value = groups.get(r, {}).get(name)
            if value is not None:
                where.setdefault(value, set()).add(hosts.get(r, f"rank {r}"))
        if where and all(len(h) == 1 for h in where.values()):
            local.add(name)
    return {r: {f: v for f, v in groups.get(r, {}).items() if f not in local} for r in ranks}


def _shared_data(
    m: PhaseMatrices,
    d: Matrix,
    at: npt.NDArray[np.intp],
    slowest: npt.NDArray[np.intp],
    groups: Mapping[int, Mapping[str, object]],
) -> tuple[str, float] | None:
    """The named group (by field) whose ranks are slow with the slowest rank, all above
    their own typical time, at `_TOGETHER` of the uneven steps (`at`, columns of `d`, the
    phase since its onset): (the field, that share). Groups of three ranks or more, fewer
    than every rank."""
    with quiet():
        above = d[:, at] > nanmedian(d, axis=1)[:, None]  # each rank against its own typical
    for name in sorted({str(f) for named in groups.values() for f in named}):
        value = [groups.get(rank, {}).get(name) for rank in m.ranks]
        together = []
        for col, r in enumerate(slowest.tolist()):
            mates = [i for i, v in enumerate(value) if v == value[r] and i != r]
            if value[r] is None or len(mates) < 2 or len(mates) + 1 >= len(m.ranks):
                break
            together.append(bool(above[mates, col].all()))
        else:
            share = float(np.mean(together)) if together else 0.0
            if share >= _TOGETHER:
                return name, share
    return None


def _evidence_and_cause(
    phase: str,
    follows: tuple[str, float, float] | None,
    wider: tuple[str, float] | None,
    shared: tuple[str, float] | None,
    values: dict[str, Matrix],
) -> tuple[str, Cause]:
    if follows is not None:
        name, share, more = follows
        evidence = (
            f"the slowest rank held one of the largest {name} (top quarter) at {share:.0%} "
            f"of the uneven steps, {more:.2f}x the median rank's"
        )
        text = (
            f"data-driven: {evidence}: the work each rank is given changes from step to step "
            f"(balance the data: pack or bucket by {name})"
        )
        return evidence, Cause("data-driven", text)
    if wider is not None:
        reference, times = wider
        evidence = (
            f"{phase}'s ranks spread {times:.1f}x as much from step to step as {reference}'s, "
            "whose work does not follow the data"
        )
    else:
        assert shared is not None
        name, share = shared
        evidence = (
            f"the ranks that share the slowest rank's {name} are slow with it at {share:.0%} "
            f"of the uneven steps, a different {name} from step to step: they share its data"
        )
    if values:
        names = ", ".join(sorted(values))
        text = (
            f"unclear: {evidence}, but its recorded {names} do not follow the slowest rank: "
            "the ranks' machines vary from step to step, or the value is not the work's measure"
        )
        return evidence, Cause("unclear", text, ("data-driven", "intermittent"))
    text = (
        f"likely the data: {evidence}; no per-step value is recorded with {phase}, so the "
        f'data cannot be confirmed: record one, e.g. prof.phase("{phase}", tokens=n)'
    )
    return evidence, Cause("data-driven", text, ("data-driven", "intermittent"))
