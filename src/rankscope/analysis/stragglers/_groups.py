"""A parallel group slow as one: a pipeline stage, a tensor-parallel group, a host's ranks.

Where ranks name their parallel groups (`Profiler(groups={"pipeline_stage": 3})`, kept in
the meta files), ranks slow together in one group are one finding: fixing one rank of a
slow stage leaves its stage-mates the slowest there, so each of them alone saves next to
nothing, and only the group fixed as a whole says what the stage costs. A group is slow
in a phase when `GROUP_SHARE` of its ranks or more (two at least) have a slow finding
there, and it is not every rank of the run; one finding holds every phase it is slow in
(a slow stage is slow in its forward and its backward). Its price is the step model's for
every member's slow finding in those phases fixed at once (analysis/stragglers/_cost.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from ..read._matrix import PhaseMatrices, nanmedian, quiet
from ._model import SlowGroup, StragglerFinding

__all__ = ["GROUP_SHARE", "slow_groups", "waiting_for_groups"]

GROUP_SHARE = 0.75
"""A group is slow together when this share of its ranks, or more, are slow there."""


def slow_groups(
    findings: list[StragglerFinding],
    ranks: list[int],
    groups: Mapping[int, Mapping[str, object]] | None,
) -> list[SlowGroup]:
    """The groups of `groups` (rank -> its named groups) slow together in a phase of
    `findings`; one group per set of ranks and phase (the first name, sorted, where two
    names hold the same ranks)."""
    if not groups:
        return []
    slow_in: dict[str, dict[int, StragglerFinding]] = {}
    for f in findings:
        if f.role == "slow":
            slow_in.setdefault(f.phase, {}).setdefault(f.rank, f)
    present = set(ranks)
    members: dict[tuple[str, int | str], list[int]] = {}
    for rank, named in groups.items():
        if rank not in present:
            continue
        for field, value in named.items():
            if isinstance(value, int | str) and not isinstance(value, bool):
                members.setdefault((str(field), value), []).append(rank)
    out: list[SlowGroup] = []
    said: set[tuple[int, ...]] = set()
    for (field, value), held in sorted(members.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        group = tuple(sorted(held))
        if len(group) < 2 or len(group) >= len(present) or group in said:
            continue
        hits: list[StragglerFinding] = []
        phases = []
        for phase, slow in sorted(slow_in.items()):
            hit = [slow[r] for r in group if r in slow]
            if len(hit) >= 2 and len(hit) >= GROUP_SHARE * len(group):
                phases.append(phase)
                hits += hit
        if not phases:
            continue
        said.add(group)
        out.append(
            SlowGroup(
                field=field,
                value=value,
                ranks=group,
                slow=tuple(sorted({f.rank for f in hits})),
                phases=tuple(phases),
                ratio=round(float(np.median([f.median_ratio for f in hits])), 4),
                since_step=min(f.since_step for f in hits),
            )
        )
    return out


def waiting_for_groups(
    found: list[SlowGroup],
    m: PhaseMatrices,
    sync: set[str],
    *,
    threshold: float,
    min_persistence: float,
    floor: float,
) -> list[SlowGroup]:
    """Each group with the ranks that wait for it (see SlowGroup.waiting): in each phase of
    `sync`, a rank outside the group whose time there is above `threshold` times the
    group's ranks' median, and by `floor` ms or more (the straggler floor: a stage that
    sends twice as often is not waiting), at `min_persistence` of the steps or more, from
    the group's onset. The ranks that arrive last at a collective spend least in it."""
    out = []
    after = np.asarray(m.steps)
    for g in found:
        inside = [m.ranks.index(r) for r in g.slow if r in m.ranks]
        cols = after >= g.since_step
        waiting = []
        for p, phase in enumerate(m.phases):
            if phase not in sync or m.depths[p] != 0 or not inside:
                continue
            d = m.ms[p][:, cols]
            with quiet():
                theirs = nanmedian(d[inside], axis=0)
                above = (d > threshold * theirs[None, :]) & (d - theirs[None, :] >= floor)
                judged = np.isfinite(d) & np.isfinite(theirs)[None, :]
                share = np.sum(above & judged, axis=1) / np.maximum(np.sum(judged, axis=1), 1)
            ranks = tuple(
                m.ranks[i]
                for i in np.flatnonzero(share >= min_persistence).tolist()
                if m.ranks[i] not in g.ranks
            )
            if ranks:
                waiting.append((phase, ranks))
        ratio = _against_the_others(g, m, cols)
        out.append(replace(g, waiting=tuple(waiting), ratio=g.ratio if ratio is None else ratio))
    return out


def _against_the_others(g: SlowGroup, m: PhaseMatrices, cols: Any) -> float | None:
    """The group's slow ranks' median time over the median time of the ranks outside the
    group, per step of `cols`, in each of its phases: the median of those ratios."""
    inside = [i for i, r in enumerate(m.ranks) if r in g.slow]
    outside = [i for i, r in enumerate(m.ranks) if r not in g.ranks]
    if not inside or not outside:
        return None
    ratios = []
    for phase in g.phases:
        d = m.ms[m.index(phase)][:, cols]
        with quiet():
            ours, theirs = nanmedian(d[inside], axis=0), nanmedian(d[outside], axis=0)
            r = ours / np.where(theirs > 0, theirs, np.nan)
        ratios.append(r[np.isfinite(r)])
    every = np.concatenate(ratios) if ratios else np.zeros(0)
    return round(float(np.median(every)), 4) if every.size else None
