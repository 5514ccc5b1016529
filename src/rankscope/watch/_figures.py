"""rankscope's figures for a trainer's logs (`Profiler.metrics()`), from the steps the peer
view read: pure functions, table-tested (tests/watch/test_figures.py).

Every figure is a float named ``rankscope/...``; docs/timer.md lists them. The
straggler finding here is a live estimate of its own, cheap enough to redo every
couple of seconds on the training job's side: `rankscope stragglers` reads the whole
run and refines it (which ranks wait for which, on which clock, over which steps).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from ._tails import StepTimes

__all__ = [
    "COMPARED_STEPS",
    "FINDING_SHARE",
    "MAX_PHASES",
    "STALE_NS",
    "across_figures",
    "health_figures",
    "own_figures",
]

PREFIX = "rankscope/"
COMPARED_STEPS = 8
"""Ranks are compared on the latest this many sampled steps that most of them have."""
FINDING_SHARE = 0.05
"""A straggler finding costs at least this share of the median step; less is noise."""
MAX_PHASES = 64
"""Phases named in the figures at most (the first by name): the figures' count stays bounded."""
STALE_NS = 150 * 10**9
"""A running rank whose heartbeat is older than this is stale: a live rank's watchdog
rewrites it at least once a minute (watch/_watchdog.py), a killed one's never again."""
COMM = "comm"  # the kind of a phase that waits for other ranks (docs/timer.md)

Figures = dict[str, float]
RankSteps = Mapping[int, StepTimes]


def own_figures(steps: RankSteps, after: int) -> tuple[Figures, int]:
    """This rank's medians over its sampled steps after step `after`; and the latest
    step they cover (`after` when there is none: then no figure)."""
    done = sorted(s for s, t in steps.items() if s > after and t.step_ms is not None)
    if not done:
        return {}, after
    times = [steps[s] for s in done]
    out: Figures = {
        f"{PREFIX}step_ms": _median(t.step_ms for t in times),
        f"{PREFIX}sampled_steps": float(len(done)),
    }
    for phase, values in _by_phase(times).items():
        out[f"{PREFIX}phase_ms/{phase}"] = _median(values)
    return out, done[-1]


def across_figures(ranks: Mapping[int, RankSteps]) -> Figures:
    """The across-rank view: the slowest rank, the median, and the straggler finding.

    Ranks are compared on the latest `COMPARED_STEPS` sampled steps that more than half
    of them have; a rank without all of them (behind the others, or ended) is left out
    and counted, and a step only some ranks have written yet waits. A rank's busy time is its step time less its phases of kind "comm" (time
    waiting for the others in a collective): where every rank waits for the slowest,
    step times are alike and busy times are not.
    """
    done = {r: {s for s, t in steps.items() if t.step_ms is not None} for r, steps in ranks.items()}
    done = {r: s for r, s in done.items() if s}
    held = Counter(s for steps in done.values() for s in steps)
    if not held:
        return {}
    window = sorted(s for s, n in held.items() if 2 * n > len(done))[-COMPARED_STEPS:]
    compared = sorted(r for r, steps in done.items() if window and steps.issuperset(window))
    out: Figures = {
        f"{PREFIX}ranks/compared": float(len(compared)),
        f"{PREFIX}ranks/left_out": float(len(done) - len(compared)),
    }
    if len(compared) < 2:
        return out
    step, busy, phases = {}, {}, {}
    for rank in compared:
        times = [ranks[rank][s] for s in window]
        step[rank] = _median(t.step_ms for t in times)
        busy[rank] = _median(max(0.0, (t.step_ms or 0.0) - _waiting(t)) for t in times)
        phases[rank] = _by_phase(times, skip_comm=True)
    median_step = _median(step.values())
    slowest = max(compared, key=lambda r: (busy[r], -r))
    median_busy = _median(busy.values())
    out.update(
        {
            f"{PREFIX}ranks/step_ms": median_step,
            f"{PREFIX}ranks/slowest_rank": float(slowest),
            f"{PREFIX}ranks/slowest_busy_ms": busy[slowest],
            f"{PREFIX}ranks/median_busy_ms": median_busy,
        }
    )
    if median_busy > 0:
        out[f"{PREFIX}ranks/slowest_ratio"] = busy[slowest] / median_busy
    out.update(_straggler(phases, median_step))
    return out


def _straggler(phases: Mapping[int, Mapping[str, list[float]]], median_step: float) -> Figures:
    """The rank and phase furthest above that phase's median across ranks, and by how
    much (the ms a step it costs: the others wait that long for it); rank -1 when the
    largest excess is under `FINDING_SHARE` of the median step."""
    per_phase: dict[str, dict[int, float]] = {}
    for rank, mine in phases.items():
        for phase, values in mine.items():
            per_phase.setdefault(phase, {})[rank] = _median(values)
    best: tuple[float, str, int] | None = None  # (excess, phase, rank); ties: first phase, rank
    for phase in sorted(per_phase):
        by_rank = per_phase[phase]
        if len(by_rank) < 2:
            continue
        middle = _median(by_rank.values())
        for rank in sorted(by_rank):
            excess = by_rank[rank] - middle
            if best is None or excess > best[0]:
                best = (excess, phase, rank)
    if best is not None and (best[0] <= 0 or best[0] < FINDING_SHARE * median_step):
        best = None
    out: Figures = {
        f"{PREFIX}straggler/rank": -1.0 if best is None else float(best[2]),
        f"{PREFIX}straggler/ms": 0.0 if best is None else best[0],
    }
    for phase in sorted(per_phase):
        out[f"{PREFIX}straggler/phase/{phase}"] = float(best is not None and phase == best[1])
    return out


def health_figures(beats: Iterable[Mapping[str, Any]], now_ns: int, since_ns: int) -> Figures:
    """How many ranks are in a stall (their watchdog's hang), and how many went stale.

    A heartbeat last written before `since_ns` (about this launch's start) is an earlier
    start's, left in the directory: it is not counted. Before any heartbeat of this launch
    was read there are no figures (none, not 0: 0 ranks with a heartbeat reads as every
    rank gone).
    """
    hung = stale = seen = 0
    for beat in beats:
        written = beat.get("written_ns")
        if not isinstance(written, int) or isinstance(written, bool) or written < since_ns:
            continue
        seen += 1
        if beat.get("state") != "running":
            continue
        if isinstance(beat.get("hang"), str):
            hung += 1
        elif now_ns - written > STALE_NS:
            stale += 1
    if not seen:
        return {}
    return {
        f"{PREFIX}ranks/heartbeats": float(seen),
        f"{PREFIX}ranks/hung": float(hung),
        f"{PREFIX}ranks/stale": float(stale),
    }


def _waiting(times: StepTimes) -> float:
    return sum(ms for kind, ms in times.phases.values() if kind == COMM)


def _by_phase(times: Iterable[StepTimes], skip_comm: bool = False) -> dict[str, list[float]]:
    """Each phase's ms per step, over the steps it ran in; the first `MAX_PHASES` by name."""
    out: dict[str, list[float]] = {}
    for t in times:
        for phase, (kind, ms) in t.phases.items():
            if not (skip_comm and kind == COMM):
                out.setdefault(_name(phase), []).append(ms)
    return {name: out[name] for name in sorted(out)[:MAX_PHASES]}


_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")
_NAME_CHARS = 64


def _name(phase: str) -> str:
    """A phase name as a logger takes it in a figure's name: from a file, so bounded and
    plain (other characters become "_")."""
    return _UNSAFE.sub("_", phase[:_NAME_CHARS]) or "_"


def _median(values: Iterable[float | None]) -> float:
    """statistics.median's answer, without its cost (it runs for every rank and phase)."""
    ordered = sorted(v for v in values if v is not None)
    half = len(ordered) // 2
    return float(ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2)
