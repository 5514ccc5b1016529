"""What changed between two runs, or two trace windows: per phase, per rank, per kernel.

Each side is a run directory or one of its windows (RUN_DIR/traces/<window>): phases
from the timings (the run's one read, read/_timed.py; a window keeps its sampled steps), kernels from
the windows' summaries (as `rankscope kernels` reads them). Every change is in ms per
step (per rank and step for kernels), so all sort together by the step time they
explain. Noise is judged from the data itself: analysis.md ("rankscope diff") has the rules.
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from ..._errors import TraceError
from ..._text import format_ranks
from ..core._clocks import clock_words, same_clocks
from ..core._options import DiffOptions
from ..read._matrix import STEP
from ._noise import Z, median_of, robust_spread, shared_shift, z_for
from ._sides import KernelKind, Phases, Side

__all__ = ["FEWEST_TRACES", "Change", "RunDiff", "diff_runs"]

Matrix = npt.NDArray[np.float64]
Vector = npt.NDArray[np.float64]
Figures = dict[str, Any] | None

_ORDER = {"phase": 0, "rank": 1, "kernel": 2}
FEWEST_TRACES = 3
"""Traces of a kind each side needs for its kernels' noise to be judged (`unjudged`)."""


@dataclass(frozen=True)
class Change:
    """One figure that moved between A and B by more than its noise."""

    what: str
    """"phase" (the change most ranks share), "rank" (a rank against the others) or "kernel"."""
    name: str
    """The phase's name, or the kernel's (CPU op's)."""
    kind: str
    """The phase's kind; for a kernel, "gpu_kernels" or "cpu_ops"."""
    rank: int | None
    delta_ms: float
    """B minus A, in ms per step (per rank and step for kernels)."""
    noise_ms: float | None
    """The bar it cleared; None for a kernel too few traces cannot judge (`unjudged`)."""
    a: dict[str, Any] | None
    """A's figures (None where A has none: a phase or kernel new in B)."""
    b: dict[str, Any] | None
    sync: bool = False
    """A phase that ends in a collective: the time spent waiting there is taken out."""
    others_ms: float | None = None
    """For a rank: the change the other ranks share, which its delta is measured against."""

    @property
    def relative(self) -> float | None:
        """The delta over A's figure, None where A has none."""
        base = None if self.a is None else self.a.get("median_ms", self.a.get("ms_per_step"))
        return self.delta_ms / base if isinstance(base, float) and base > 0 else None

    def to_dict(self) -> dict[str, Any]:
        kernel = self.what == "kernel"
        return {
            "what": self.what,
            "phase": None if kernel else self.name,
            "kernel": self.name if kernel else None,
            "rank": self.rank,
            "kind": self.kind,
            "delta_ms": self.delta_ms,
            "relative": self.relative,
            "noise_ms": self.noise_ms,
            "sync": self.sync,
            "others_delta_ms": self.others_ms,
            "a": self.a,
            "b": self.b,
        }


@dataclass(eq=False)
class RunDiff:
    """The changes between A and B, biggest first, and what was compared."""

    a: dict[str, Any]
    """What side A is: path, run_dir, window, steps, ranks, sampled_steps, traces."""
    b: dict[str, Any]
    time: str
    noise: float
    min_share: float
    floor_ms: float | None = None
    """`min_share` of the shorter of A's and B's median step times: no smaller change is
    listed (the same floor whichever side is A)."""
    step: dict[str, Any] | None = None
    """The step time: a_ms, b_ms, delta_ms, noise_ms (None without step records on both)."""
    changes: list[Change] = field(default_factory=list)
    phases: list[str] = field(default_factory=list)
    """The phases compared (in both A and B)."""
    kernels: int = 0
    """Kernels (or CPU ops) compared."""
    unjudged: list[Change] = field(default_factory=list)
    """Kernel changes above the floor that too few traces cannot judge, biggest first."""
    within_noise: int = 0
    """Figures compared whose change is within their noise, so not listed."""
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    clocks: dict[str, str] = field(default_factory=dict)
    """The clock each compared phase was read on in both A and B (analysis/core/_clocks.py)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "time": self.time,
            "clocks": self.clocks,
            "clock": clock_words(self.clocks) if self.clocks else f"{self.time} time",
            "noise": {"multiplier": self.noise, "min_share": self.min_share, "z": Z},
            "floor_ms": self.floor_ms,
            "step": self.step,
            "changes": [change.to_dict() for change in self.changes],
            "unjudged": [change.to_dict() for change in self.unjudged],
            "compared": {"phases": self.phases, "kernels": self.kernels},
            "within_noise": self.within_noise,
            "notes": self.notes,
            "skipped": self.skipped,
        }


def diff_runs(
    a: str | os.PathLike[str],
    b: str | os.PathLike[str],
    options: DiffOptions | None = None,
    *,
    workers: int | None = None,
) -> RunDiff:
    """Compare run (or window) `b` against `a`: the changes above noise, biggest first.

    The options' `noise` scales the noise estimate (2: twice as strict); `min_share` is the floor,
    a share of the shorter median step time of the two. Every rule takes A and B alike,
    so B against A lists the same rows with opposite signs. A side that is neither a run directory nor one
    of its windows, or two sides with nothing in common to compare, is a TraceError
    naming why; what could not be read is said in `skipped`.
    """
    options = DiffOptions() if options is None else options
    time, noise, min_share = options.time, options.noise, options.min_share
    side_a = Side.read("A", a, time, workers)
    side_b = Side.read("B", b, time, workers)
    diff = RunDiff(
        a=side_a.describe(), b=side_b.describe(), time=time, noise=noise, min_share=min_share
    )
    diff.notes = side_a.notes + side_b.notes
    diff.skipped = [f"{side.label}: {line}" for side in (side_a, side_b) for line in side.skipped]
    # A share of one side's step time would be a higher floor one way round than the
    # other: a change could be listed A against B and not B against A.
    steps = [s.phases.step_ms() for s in (side_a, side_b) if s.phases is not None]
    step_ms = min((ms for ms in steps if ms is not None), default=None)
    diff.floor_ms = None if step_ms is None else min_share * step_ms
    if side_a.phases is not None and side_b.phases is not None:
        _compare_phases(diff, side_a.phases, side_b.phases)
    _compare_kernels(diff, side_a.kernels, side_b.kernels)
    if not diff.phases and not diff.kernels:
        said = "; ".join(diff.notes) or "neither has timings or traces"
        raise TraceError(f"nothing to compare between {a} and {b}: {said}")
    diff.changes.sort(key=_biggest_first)
    diff.unjudged.sort(key=_biggest_first)
    return diff


def _biggest_first(c: Change) -> tuple[float, int, str, int]:
    return (-abs(c.delta_ms), _ORDER[c.what], c.name, -1 if c.rank is None else c.rank)


# -- one side: a run, or a window of one ---------------------------------------------------


def _compare_phases(diff: RunDiff, a: Phases, b: Phases) -> None:
    common = [p for p in a.values if p in b.values and p != STEP]
    common, apart = same_clocks(common, a.clocks, b.clocks)
    diff.notes.extend(apart)
    diff.clocks = {p: a.clocks[p] for p in [*common, STEP] if p in a.clocks and p in b.clocks}
    if not common:
        diff.notes.append(
            f"no phase in common (A: {', '.join(p for p in a.values if p != STEP) or 'none'}; "
            f"B: {', '.join(p for p in b.values if p != STEP) or 'none'})"
        )
        return
    pair = _PhasePair(a, b, noise=diff.noise, floor=diff.floor_ms or 0.0)
    if not pair.ranks:
        diff.notes.append("no rank in both: each phase compares the ranks' typical times")
    if STEP in a.values and STEP in b.values:
        diff.step = _step(pair)
    for phase in common:
        diff.phases.append(phase)
        row = pair.phase(phase)
        # The phase's figures are those of the ranks whose change it is.
        moved = list(pair.ranks_apart(phase, row.delta_ms))
        fa, fb = pair.figures(phase, apart={change.rank for change in moved})
        for change in (replace(row, a=fa, b=fb), *moved):
            _keep(diff, change)
    for side, other, label in ((a, b, "A"), (b, a, "B")):
        alone = sorted(set(side.ranks) - set(other.ranks))
        if alone and pair.ranks:
            diff.notes.append(f"{format_ranks(alone)} only in {label}: left out of the phases")
        for phase in side.values:
            if phase != STEP and phase not in other.values:
                _keep(diff, pair.lone(phase, side, label))


def _step(pair: _PhasePair) -> dict[str, Any]:
    """The step line: A's and B's median step time over the ranks in both, and B's less A's."""
    a, b = (None if f is None else f["median_ms"] for f in pair.figures(STEP))
    delta = None if a is None or b is None else b - a
    step = {"a_ms": a, "b_ms": b, "delta_ms": delta, "noise_ms": pair.phase(STEP).noise_ms}
    return step | {"ranks": len(pair.ranks) or None}


class _PhasePair:
    """A's and B's phases, their ranks lined up: the ranks both have, in order."""

    def __init__(self, a: Phases, b: Phases, *, noise: float, floor: float) -> None:
        self.a, self.b = a, b
        self.ranks = sorted(set(a.ranks) & set(b.ranks))
        self.ia = np.searchsorted(a.ranks, self.ranks)
        self.ib = np.searchsorted(b.ranks, self.ranks)
        self.noise, self.floor = noise, floor

    def phase(self, phase: str) -> Change:
        """The change most ranks share: per rank, B's median less A's; of those, the
        median, and with an even count of ranks the middle value nearer zero (so at least
        half the ranks share it)."""
        ra, rb = self.a.per_rank(phase), self.b.per_rank(phase)
        if self.ranks:
            delta = shared_shift(rb.median[self.ib] - ra.median[self.ia])
            spread = median_of(np.fmax(ra.sigma[self.ia], rb.sigma[self.ib]))
        else:  # no rank in both: the ranks' typical times
            delta = shared_shift(rb.median) - shared_shift(ra.median)
            spread = max(median_of(ra.sigma), median_of(rb.sigma))
        error = math.hypot(self.a.errors(phase)[1], self.b.errors(phase)[1])
        figures = self.figures(phase)
        return Change(
            what="phase",
            name=phase,
            kind=self.b.kinds[phase],
            rank=None,
            delta_ms=delta,
            noise_ms=float(max(self.noise * max(spread, error), self.floor)),
            a=figures[0],
            b=figures[1],
            sync=phase in self.a.sync or phase in self.b.sync,
        )

    def figures(self, phase: str, apart: Collection[int | None] = ()) -> tuple[Figures, Figures]:
        """A's and B's figures of `phase` over the same ranks: those in both, less `apart`
        (ranks listed on their own); each side's every rank where no rank is in both."""
        a, b = self.a.values[phase], self.b.values[phase]
        if self.ranks:
            keep = np.array([rank not in apart for rank in self.ranks], np.bool_)
            a, b = a[self.ia[keep]], b[self.ib[keep]]
        return _phase_figures(a), _phase_figures(b)

    def ranks_apart(self, phase: str, shared: float) -> Iterator[Change]:
        """The ranks whose change departs from the one the others share."""
        if len(self.ranks) < 2:
            return
        ia, ib = self.ia, self.ib
        ra, rb = self.a.per_rank(phase), self.b.per_rank(phase)
        moved = rb.median[ib] - ra.median[ia]
        excess = moved - shared
        # A rank's spread from few steps is itself unsure: never below the typical rank's.
        ra, rb = ra.pooled(), rb.pooled()
        spread = np.fmax(ra.sigma[ia], rb.sigma[ib])
        error = np.hypot(self.a.errors(phase)[0][ia], self.b.errors(phase)[0][ib])
        # How far the ranks' changes scatter anyway (what few steps per rank make of noise).
        scatter = robust_spread(moved[np.isfinite(moved)]) if len(self.ranks) > 3 else 0.0
        bar = np.maximum(self.noise * np.fmax(np.fmax(spread, error), Z * scatter), self.floor)
        for i in np.flatnonzero(np.abs(excess) > bar).tolist():
            yield Change(
                what="rank",
                name=phase,
                kind=self.b.kinds[phase],
                rank=self.ranks[i],
                delta_ms=float(excess[i]),
                noise_ms=float(bar[i]),
                a=_phase_figures(self.a.values[phase][ia[i] : ia[i] + 1]),
                b=_phase_figures(self.b.values[phase][ib[i] : ib[i] + 1]),
                sync=phase in self.a.sync or phase in self.b.sync,
                others_ms=shared,
            )

    def lone(self, phase: str, side: Phases, label: str) -> Change:
        """A phase one side alone has: its whole time is the change."""
        per = side.per_rank(phase)
        time = shared_shift(per.median)
        spread, error = median_of(per.sigma), side.errors(phase)[1]
        figures = _phase_figures(side.values[phase])
        return Change(
            what="phase",
            name=phase,
            kind=side.kinds[phase],
            rank=None,
            delta_ms=time if label == "B" else -time,
            noise_ms=float(max(self.noise * max(spread, error), self.floor)),
            a=figures if label == "A" else None,
            b=figures if label == "B" else None,
            sync=phase in side.sync,
        )


def _compare_kernels(diff: RunDiff, a: dict[str, KernelKind], b: dict[str, KernelKind]) -> None:
    if not a or not b:
        if a or b:
            diff.notes.append(f"{'B' if a else 'A'} has no traces: kernels not compared")
        return
    for kind in sorted(set(a) | set(b)):
        words = kind.replace("_", " ")
        if kind not in a or kind not in b:
            held = "A" if kind in a else "B"
            diff.notes.append(f"only {held}'s traces hold {words}: not compared")
            continue
        ka, kb = a[kind], b[kind]
        floor = diff.floor_ms
        if floor is None:  # no step time: a share of the shorter of the traces' own times
            floor = diff.min_share * min(ka.total_ms_per_step(), kb.total_ms_per_step())
        judged = min(len(ka.steps), len(kb.steps)) >= FEWEST_TRACES
        if not judged:  # the spread of one or two traces says nothing of the noise
            diff.notes.append(
                f"{words}: {len(ka.steps)} trace(s) in A and {len(kb.steps)} in B, too few "
                f"({FEWEST_TRACES} a side) to judge their noise: changes listed apart, unjudged"
            )
        for name in sorted(set(ka.names) | set(kb.names)):
            diff.kernels += 1
            fa, fb = ka.figures(name), kb.figures(name)
            delta = (fb["ms_per_step"] if fb else 0.0) - (fa["ms_per_step"] if fa else 0.0)
            bar = None
            if judged:
                va, vb = ka.per_trace_ms(name), kb.per_trace_ms(name)
                sa, sb = robust_spread(va), robust_spread(vb)
                se = math.hypot(sa / math.sqrt(len(va)), sb / math.sqrt(len(vb)))
                bar = max(
                    diff.noise * max(sa, sb, float(z_for(min(len(va), len(vb)) - 1)) * se), floor
                )
            _keep(diff, Change("kernel", name, kind, None, delta, bar, fa, fb), floor)


def _keep(diff: RunDiff, change: Change, floor: float = 0.0) -> None:
    """Listed above its noise; apart (`unjudged`) with no noise judged, above `floor`."""
    delta, noise = change.delta_ms, change.noise_ms
    if noise is None and abs(delta) > floor:
        diff.unjudged.append(change)
    elif noise is not None and math.isfinite(delta) and abs(delta) > noise:
        diff.changes.append(change)
    else:
        diff.within_noise += 1


def _phase_figures(values: Matrix) -> dict[str, Any] | None:
    cells = values[np.isfinite(values)]
    if not cells.size:
        return None
    return {
        "median_ms": float(np.median(cells)),
        "p90_ms": float(np.percentile(cells, 90)),
        "ranks": int(np.sum(np.any(np.isfinite(values), axis=1))),
        "steps": int(np.sum(np.any(np.isfinite(values), axis=0))),
    }
