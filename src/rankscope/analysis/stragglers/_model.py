"""The straggler analysis's findings as data: a slow or waiting rank, a slow group,
uneven data, the evidence from traces, and the report that holds them, with what each
costs and why. The rules that find them (_stragglers.py, _groups.py, _imbalance.py,
_evidence.py) and the words said of them (_findings.py) import this module; it imports
none of them, and no renderer."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from ..core._clocks import clock_words

__all__ = [
    "ROUGH_FIT",
    "Cause",
    "Cost",
    "Evidence",
    "HostCost",
    "Imbalance",
    "OpDelta",
    "RankPhase",
    "SlowGroup",
    "StragglerFinding",
    "StragglerReport",
    "Undecided",
    "model_fit",
    "rounded",
]

Vector = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Cost:
    """What a fix would save, from the step model (analysis/stragglers/_cost.py)."""

    step_ms_saved: float
    """Step time saved per step, mean over the steps every finding holds (the same steps
    for every cost of one report, so that the lines add up)."""
    run_hours_saved: float
    """Over the run so far: the saving at each sampled step from the finding's start on,
    times the steps each stands for."""
    rank_hours_saved: float
    """`run_hours_saved` on every rank: ranks x hours."""
    gpu_hours_saved: float | None
    """`rank_hours_saved` where the ranks ran on GPUs (their meta files say so); None on a
    run that used none, or where no meta file says."""
    speedup: float
    """The step time now over the step time with the fix."""
    step_ms: float
    """The step time now (measured), mean over the same steps as `step_ms_saved`."""
    steps_from: int
    """The first sampled step `step_ms_saved` and `step_ms` are taken over."""

    def to_dict(self) -> dict[str, float | None]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Cause:
    """Why a rank is slow (analysis/stragglers/_cause.py): its class and the evidence, in words."""

    kind: str
    """"data-driven", "partitioning", "machine" (the GPU's own health: a throttled clock),
    "persistent", "intermittent" or "unclear"."""
    text: str
    could_be: tuple[str, ...] = ()
    """Where the evidence does not tell them apart: the classes that fit."""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "could_be": list(self.could_be)}


@dataclass(frozen=True)
class HostCost:
    """What fixing the findings of one host's ranks would save."""

    host: str
    ranks: tuple[int, ...]
    cost: Cost

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "ranks": list(self.ranks), "cost": self.cost.to_dict()}


@dataclass(frozen=True)
class OpDelta:
    """One op's time a step on the slow rank and on its peer (ms)."""

    name: str
    slow_ms: float
    peer_ms: float
    delta_ms: float
    peer_rank: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "slow_ms": round(self.slow_ms, 4),
            "peer_ms": round(self.peer_ms, 4),
            "delta_ms": round(self.delta_ms, 4),
            "peer_rank": self.peer_rank,
        }


@dataclass(frozen=True)
class Evidence:
    """What the traces show of one slow finding, or why they show nothing."""

    window: str | None
    peer_rank: int | None
    ops: tuple[OpDelta, ...] = ()
    steps: tuple[int, int] | None = None
    """The window's first and last step."""
    kind: str | None = None
    """"gpu_kernels" or "cpu_ops": what `ops` are."""
    scope: str | None = None
    """Where in the steps the ops were summed: "phase forward", or "whole steps" where
    the traces mark no range of the phase."""
    asked: dict[str, Any] | None = None
    """For an anomaly window: the peer its rank asked, why, and what the peer answered."""
    missing: str | None = None
    """Why there is no evidence (no window holds the pair, a trace cannot be read)."""
    command: str | None = None
    """Where no window holds the pair: the `rankscope trigger` command that captures one."""
    problems: list[str] = field(default_factory=list)
    """Traces that could not be read, named."""
    phase_ms: tuple[float, float] | None = None
    """The phase's own time a step in the window, on the slow rank and on its peer (its
    ranges in the traces), so the ops can be read against the whole of its growth."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "peer_rank": self.peer_rank,
            "steps": None if self.steps is None else list(self.steps),
            "kind": self.kind,
            "scope": self.scope,
            "ops": [op.to_dict() for op in self.ops],
            "asked": self.asked,
            "missing": self.missing,
            "command": self.command,
            "problems": self.problems,
            "phase_ms": None if self.phase_ms is None else [round(v, 4) for v in self.phase_ms],
        }


@dataclass(frozen=True)
class StragglerFinding:
    """One (rank, phase) that is persistently above the others."""

    rank: int
    phase: str
    kind: str
    role: str
    """"slow": the rank itself is slow here; "waits": it waits here for `waits_for`."""
    median_ratio: float
    """Its time over the reference, median over the steps from `since_step` on."""
    share_above: float
    """The share of those steps above the threshold."""
    lost_ms: float
    """Time above the reference, summed over those steps."""
    steps: int
    since_step: int
    waits_for: tuple[int, ...] = ()
    """For "waits": the ranks that arrived last, most often first."""
    ratios: tuple[float | None, ...] = ()
    """The ratio at every sampled step (None where the rank has no record)."""
    median_excess_ms: float | None = None
    """Its time above the reference at the typical step from `since_step` on (the
    median; lost_ms / steps is the mean, a burst of a few steps included)."""
    cost: Cost | None = None
    """What fixing it would save (analysis/stragglers/_cost.py). None for "waits" where the rank it
    waits for has a slow finding: its lost time is that finding's cost (`cost_of`)."""
    cost_of: tuple[int, str] | str | None = None
    """For "waits": the (rank, phase) of the slow finding whose cost its waiting is, or
    the name of the slow group ("pipeline_stage=1") whose cost it is."""
    cause: Cause | None = None
    """Why it is slow (analysis/stragglers/_cause.py); None for "waits"."""
    evidence: Evidence | None = None
    """For "slow" over a whole run: the ops that grew against a healthy peer in a trace
    window holding both, or why there are none (analysis/stragglers/_evidence.py)."""

    def to_dict(self) -> dict[str, Any]:
        # Field by field: asdict deep-copies every ratio, seconds for thousands of ranks.
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["waits_for"] = list(self.waits_for)
        out["ratios"] = list(self.ratios)
        out["cost"] = None if self.cost is None else self.cost.to_dict()
        of = self.cost_of
        out["cost_of"] = (
            None
            if of is None
            else {"group": of}
            if isinstance(of, str)
            else {"rank": of[0], "phase": of[1]}
        )
        out["cause"] = None if self.cause is None else self.cause.to_dict()
        out["evidence"] = None if self.evidence is None else self.evidence.to_dict()
        return out


@dataclass(frozen=True)
class Undecided:
    """A (rank, phase) that looks like a finding but has too few sampled steps to tell
    from chance: with about `needed_steps` at the same rate it would be one."""

    rank: int
    phase: str
    role: str
    """"slow" (above at `hits` of `steps`) or "waits" (`waits_for` arrived last at `hits`)."""
    median_ratio: float
    hits: int
    steps: int
    needed_steps: int
    waits_for: tuple[int, ...] = ()


@dataclass(frozen=True)
class RankPhase:
    """Every (rank, phase) over the whole run: the table behind the findings."""

    rank: int
    phase: str
    median_ratio: float
    share_above: float
    lost_ms: float


@dataclass(frozen=True)
class SlowGroup:
    """One parallel group whose ranks are slow together in one phase."""

    field: str
    """The group's name as the ranks gave it ("pipeline_stage")."""
    value: int | str
    ranks: tuple[int, ...]
    """Every rank of the group (the slow ones and any that are not)."""
    slow: tuple[int, ...]
    """Its ranks with a slow finding in one of its phases."""
    phases: tuple[str, ...]
    """The phases it is slow in, as a group (a slow stage: its forward and its backward)."""
    ratio: float
    """Its slow ranks' time over the time of the ranks outside the group, in its phases
    (the median over steps and phases; from the median rank's ratio where no rank is
    outside it in the matrices): a stage of two slow ranks among four is not measured
    against a median that holds them."""
    since_step: int
    cost: Cost | None = None
    waiting: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """(phase, ranks): in a phase that ends in a collective or a send/recv, the ranks of
    other groups that spend `threshold` times as long there as the group's own ranks, at
    most steps: they wait for it (a pipeline's earlier stages, in their recv)."""

    @property
    def name(self) -> str:
        return f"{self.field}={self.value}"

    @property
    def phase_words(self) -> str:
        return " and ".join(self.phases)

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.name,
            "field": self.field,
            "value": self.value,
            "ranks": list(self.ranks),
            "slow": list(self.slow),
            "phases": list(self.phases),
            "ratio": self.ratio,
            "since_step": self.since_step,
            "waiting": [{"phase": phase, "ranks": list(ranks)} for phase, ranks in self.waiting],
            "cost": None if self.cost is None else self.cost.to_dict(),
        }


@dataclass(frozen=True)
class Imbalance:
    """One phase whose slowest rank changes from step to step."""

    phase: str
    kind: str
    ratio: float
    """The most loaded rank's load against the median rank's, median over the steps since
    the onset."""
    share: float
    """The share of those steps where the most loaded rank is above the threshold."""
    changes: float
    """The share of uneven steps whose slowest rank is not the previous uneven step's."""
    ranks_slowest: int
    """How many ranks were the slowest at some uneven step."""
    top_share: float
    """The most any one rank was the slowest, as a share of the uneven steps."""
    lost_ms: float
    """The ms the most loaded rank is above the median load at its pace, median over the
    steps since the onset."""
    since_step: int
    steps: int
    evidence: str
    """Why the spread is the data's (the value that follows it, or the phase it is wider than)."""
    cause: Cause
    reference: str | None = None
    """The work phase whose ranks spread least: how far ranks spread from noise alone.
    Balancing keeps that spread (analysis/stragglers/_cost.py); without one, every rank is priced
    at the mean load, which takes its noise out too (a little more than balancing saves)."""
    cost: Cost | None = None
    stages: tuple[tuple[int, ...], ...] = field(default=(), repr=False, compare=False)
    """The rank indices that do the same work (a pipeline's stages; else every rank): a
    rank's load is its time over their pooled typical time (see _loads)."""
    own_pace: tuple[int, ...] = field(default=(), repr=False, compare=False)
    """Rank indices with a slow finding in the phase: their loads are against their own
    typical time (balancing the data keeps a straggler's pace)."""
    summary: str = ""
    """In words (analysis/stragglers/_findings.py imbalance_sentence, from the run's step 0)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "kind": self.kind,
            "ratio": self.ratio,
            "share": self.share,
            "changes": self.changes,
            "ranks_slowest": self.ranks_slowest,
            "top_share": self.top_share,
            "lost_ms": self.lost_ms,
            "since_step": self.since_step,
            "steps": self.steps,
            "evidence": self.evidence,
            "cause": self.cause.to_dict(),
            "cost": None if self.cost is None else self.cost.to_dict(),
            "summary": self.summary,
        }


@dataclass
class StragglerReport:
    """What `find_stragglers` found, and with which settings."""

    threshold: float
    min_persistence: float
    min_share: float
    reference: str
    """"median" (the cross-rank median) or "faster rank" (two ranks)."""
    time: str
    """The basis asked for: "auto" (each phase on the clock of its work), "host", "device"."""
    ranks: list[int]
    steps: list[int]
    phases: list[str]
    sync_phases: list[str]
    """Phases found to end in a collective (or declared comm)."""
    clocks: dict[str, str] = field(default_factory=dict)
    """The clock each phase (and the step) was read on: "host" or "device"."""
    untimed: list[str] = field(default_factory=list)
    """Phases asked for on device time whose records carry none."""
    findings: list[StragglerFinding] = field(default_factory=list)
    """Slow ranks first (the cause), then the ranks that wait; by time lost within each."""
    table: list[RankPhase] = field(default_factory=list)
    undecided: list[Undecided] = field(default_factory=list)
    """What more sampled steps could turn into findings (said in `summary` too)."""
    summary: list[str] = field(default_factory=list)
    """The findings in words, one sentence per slow rank (or group of waiting ranks)."""
    cost: Cost | None = None
    """What fixing every finding at once would save (None without findings)."""
    host_costs: list[HostCost] = field(default_factory=list)
    """Per host that holds a finding, what fixing its ranks' findings would save."""
    notes: list[str] = field(default_factory=list)
    """What the causes could not use (per-step values left out), said."""
    model_step_ms: float | None = None
    """The step time the cost model gives for the run as it is (against `cost.step_ms`,
    measured): how far to trust the costs."""
    imbalance: list[Imbalance] = field(default_factory=list)
    """Phases whose slowest rank changes from step to step (analysis/stragglers/_imbalance.py)."""
    groups: list[SlowGroup] = field(default_factory=list)
    """Parallel groups slow together in a phase (analysis/stragglers/_groups.py)."""

    @property
    def clock(self) -> str:
        """Which clock was read for what, as one phrase ("host time", "device time; host
        time for data")."""
        return clock_words(self.clocks, self.untimed)

    def to_dict(self, table: bool = True) -> dict[str, Any]:
        out = {
            "threshold": self.threshold,
            "min_persistence": self.min_persistence,
            "min_share": self.min_share,
            "reference": self.reference,
            "time": self.time,
            "clocks": self.clocks,
            "clock": self.clock,
            "untimed": self.untimed,
            "ranks": self.ranks,
            "steps": self.steps,
            "phases": self.phases,
            "sync_phases": self.sync_phases,
            "summary": self.summary,
            "findings": [f.to_dict() for f in self.findings],
            "undecided": [{**asdict(u), "waits_for": list(u.waits_for)} for u in self.undecided],
            "cost": None if self.cost is None else self.cost.to_dict(),
            "host_costs": [h.to_dict() for h in self.host_costs],
            "model_step_ms": self.model_step_ms,
            "model_fit": model_fit(self),
            "notes": self.notes,
            "imbalance": [i.to_dict() for i in self.imbalance],
            "groups": [g.to_dict() for g in self.groups],
        }
        if table:
            # Strict JSON: a ratio with no step to compare (a phase one rank alone has) is null.
            out["table"] = [
                {f.name: _finite(getattr(row, f.name)) for f in fields(row)} for row in self.table
            ]
        return out


def rounded(values: Vector) -> tuple[float | None, ...]:
    """To 4 decimals, None where NaN (numpy's rounding: one pass for thousands of ranks)."""
    out: list[float | None] = np.round(values, 4).tolist()
    for i in np.flatnonzero(np.isnan(values)).tolist():
        out[i] = None
    return tuple(out)


def _finite(value: object) -> object:
    """`value`, or None for a float that is not finite (strict JSON)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


ROUGH_FIT = 0.15
"""The cost model's step further than this share from the measured step: its savings are rough."""


def model_fit(report: StragglerReport) -> float | None:
    """The cost model's step over the measured one, over the same steps (None without costs)."""
    if report.cost is None or report.model_step_ms is None or report.cost.step_ms <= 0:
        return None
    return round(report.model_step_ms / report.cost.step_ms, 4)
