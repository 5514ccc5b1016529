"""What the straggler analysis finds (analysis/stragglers/_stragglers.py), what fixing it would save
(analysis/stragglers/_cost.py), and the findings in words."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..._text import format_ranks
from ..core._chance import FEWEST_STEPS
from ..core._clocks import clock_words
from ..core._format import SENTENCE, finite, hours_text
from ..core._values import as_list, as_map

if TYPE_CHECKING:
    from ._evidence import Evidence
    from ._groups import SlowGroup
    from ._imbalance import Imbalance

__all__ = [
    "Cause",
    "Cost",
    "HostCost",
    "RankPhase",
    "StragglerFinding",
    "StragglerReport",
    "Undecided",
    "cost_lines",
    "cost_text",
    "ratio_text",
    "rounded",
    "sentences",
]

Vector = npt.NDArray[np.float64]


ratio_text = SENTENCE.ratio
"""A time against its reference as people say it: "+41%" below twice, "2.5x", "526x"
(core/_format.py has the rule)."""


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


def _verb(ranks: list[int], singular: str, plural: str) -> str:
    return f"{format_ranks(ranks)} {singular if len(ranks) == 1 else plural}"


def sentences(report: StragglerReport) -> list[str]:
    versus = "vs median" if report.reference == "median" else "vs the faster rank"
    waiting = [f for f in report.findings if f.role == "waits"]
    unsure = [u for u in report.undecided if u.role == "waits"]
    told: set[int] = set()
    told_unsure: set[int] = set()
    out = []
    if len(report.ranks) >= 2 and 0 < len(report.steps) < FEWEST_STEPS:
        n = len(report.steps)
        out.append(
            f"{n} sampled step{'' if n == 1 else 's'} are too few to find a straggler: "
            f"it takes {FEWEST_STEPS} or more"
        )
    fit = model_fit(report)
    grouped = {(r, p) for g in report.groups for r in g.slow for p in g.phases}
    for group in report.groups:
        out.append(_group_sentence(group, waiting, told, report.steps[0]))
    for f in report.findings:
        if f.role != "slow" or (f.rank, f.phase) in grouped:  # its group's sentence says it
            continue
        since = "" if f.since_step == report.steps[0] else f" since step {f.since_step}"
        text = (
            f"rank {f.rank} is slow in {f.phase} ({ratio_text(f.median_ratio)} {versus} "
            f"at {f.share_above:.0%} of sampled steps{since})"
        )
        waiters: dict[str, list[int]] = {}
        for i, w in enumerate(waiting):
            if w.waits_for and w.waits_for[0] == f.rank and i not in told:
                waiters.setdefault(w.phase, []).append(w.rank)
                told.add(i)
        for phase, ranks in waiters.items():
            text += f"; {_verb(ranks, 'waits', 'wait')} for it in {phase}"
        maybe: dict[str, list[Undecided]] = {}
        for i, u in enumerate(unsure):
            if u.waits_for[0] == f.rank and i not in told_unsure:
                maybe.setdefault(u.phase, []).append(u)
                told_unsure.add(i)
        for phase, rows in maybe.items():
            who = _verb([u.rank for u in rows], "seems", "seem")
            text += f"; {who} to wait for it in {phase}, {_too_few(rows)}"
        out.append(text)
    # Waiting with no slow phase to blame: the late rank is slow across phases, or unsampled.
    rest: dict[tuple[str, tuple[int, ...]], list[int]] = {}
    for i, w in enumerate(waiting):
        if i not in told:
            rest.setdefault((w.phase, w.waits_for[:1]), []).append(w.rank)
    for (phase, late), ranks in rest.items():
        whom = f"rank {late[0]}, the last to arrive there" if late else "the last rank to arrive"
        out.append(f"{_verb(ranks, 'waits', 'wait')} in {phase} for {whom}")
    for u in report.undecided:
        if u.role == "slow":
            out.append(
                f"rank {u.rank} may be slow in {u.phase} ({ratio_text(u.median_ratio)} {versus} "
                f"at {u.hits} of {u.steps} sampled steps), {_too_few([u])}"
            )
    left: dict[tuple[str, int], list[Undecided]] = {}
    for i, u in enumerate(unsure):
        if i not in told_unsure:
            left.setdefault((u.phase, u.waits_for[0]), []).append(u)
    for (phase, last), rows in left.items():
        who = _verb([u.rank for u in rows], "seems", "seem")
        out.append(f"{who} to wait in {phase} for rank {last}, {_too_few(rows)}")
    for uneven in report.imbalance:
        out.append(uneven.sentence(report.steps[0]))
        out.append(f"why {uneven.phase} is uneven: {uneven.cause.text}")
    if fit is not None and abs(fit - 1) > ROUGH_FIT and report.cost is not None:
        out.append(
            f"the cost model gives a {SENTENCE.ms_text(report.model_step_ms)} step against "
            f"{SENTENCE.ms_text(report.cost.step_ms)} measured ({fit:.2f}x): the savings it "
            "prices are rough here (docs/analysis.md, Cost, says what the model cannot see)"
        )
    return out


ROUGH_FIT = 0.15
"""The cost model's step further than this share from the measured step: its savings are rough."""


def model_fit(report: StragglerReport) -> float | None:
    """The cost model's step over the measured one, over the same steps (None without costs)."""
    if report.cost is None or report.model_step_ms is None or report.cost.step_ms <= 0:
        return None
    return round(report.model_step_ms / report.cost.step_ms, 4)


def _group_sentence(
    group: SlowGroup, waiting: list[StragglerFinding], told: set[int], first_step: int
) -> str:
    """A slow group's sentence with the ranks that wait for it: those a finding names
    (marked `told`), and those that wait in a send/recv no finding judges."""
    text = group.sentence(first_step)
    for_group: dict[str, list[int]] = {}
    for i, w in enumerate(waiting):
        if w.waits_for and w.waits_for[0] in group.slow and i not in told:
            for_group.setdefault(w.phase, []).append(w.rank)
            told.add(i)
    for phase, more in group.waiting:
        known = set(for_group.get(phase, []))
        for_group.setdefault(phase, []).extend(r for r in more if r not in known)
    for phase, ranks in for_group.items():
        text += f"; {_verb(sorted(ranks), 'waits', 'wait')} for it in {phase}"
    return text


def _too_few(rows: list[Undecided]) -> str:
    """Why an undecided row is not a finding, in words: it needs more samples."""
    steps = min(u.steps for u in rows)
    needed = max(u.needed_steps for u in rows)
    return (
        f"but {steps} sampled step{'' if steps == 1 else 's'} are too few to tell that from "
        f"chance (needs more samples: about {needed} at this rate)"
    )


def in_groups(report: Mapping[str, Any]) -> set[tuple[Any, Any]]:
    """The (rank, phase) pairs of a straggler report's (its to_dict()) slow groups: the
    slow findings a group's one finding stands for."""
    return {
        (r, phase)
        for g in as_list(report.get("groups"))
        if isinstance(g, Mapping)
        for r in as_list(g.get("slow"))
        for phase in as_list(g.get("phases"))
    }


def cost_lines(report: Mapping[str, Any], limit: int = 5) -> list[str]:
    """What fixing the findings of a straggler report (its to_dict()) would save, in
    words: each slow group, each slow finding (the first `limit` of each; a rank that
    waits gains what fixing the rank or group it waits for saves, said there), balancing
    each uneven phase, every finding at once, then each host (the first `limit`). A line
    that would say what the line before it said is left out: one slow finding, group or
    uneven phase is every finding, and one host that holds them all is too."""
    findings = [f for f in as_list(report.get("findings")) if isinstance(f, Mapping)]
    every = as_map(report.get("cost"))
    hosts = [h for h in as_list(report.get("host_costs")) if isinstance(h, Mapping)]
    groups = [g for g in as_list(report.get("groups")) if isinstance(g, Mapping)]
    uneven = [u for u in as_list(report.get("imbalance")) if isinstance(u, Mapping)]
    lines: list[tuple[str, Mapping[str, Any]]] = []
    units: list[Mapping[str, Any]] = []  # the fixes "every finding" is made of
    grouped = in_groups(report)
    for g in groups[:limit]:
        if g.get("cost"):
            what = f"fixing {g.get('group')} in {' and '.join(map(str, as_list(g.get('phases'))))}"
            lines.append((cost_text(g["cost"], what) + _waiting_for_group(findings, g), g["cost"]))
    units += [g["cost"] for g in groups if g.get("cost")]
    # A slow group's ranks are its one finding: their own rows price about nothing alone.
    slow = [
        f
        for f in findings
        if f.get("role") == "slow"
        and f.get("cost")
        and (f.get("rank"), f.get("phase")) not in grouped
    ]
    for f in slow[:limit]:
        what = f"fixing rank {f.get('rank')} in {f.get('phase')}"
        lines.append((cost_text(f["cost"], what) + _waiting(findings, f), f["cost"]))
    if len(slow) > limit:
        more = f"... {len(slow) - limit} more slow findings (--json has each one's cost)"
        lines.append((more, {}))
    units += [f["cost"] for f in slow if (f.get("rank"), f.get("phase")) not in grouped]
    for u in uneven:
        if u.get("cost"):
            what = f"balancing {u.get('phase')} across ranks"
            lines.append((cost_text(u["cost"], what), u["cost"]))
            units.append(u["cost"])
    if every and not (len(units) == 1 and _same_saving(units[0], every)):
        apart = sum(finite(u.get("step_ms_saved")) or 0.0 for u in units)
        both = finite(every.get("step_ms_saved")) or 0.0
        # Two slow ranks in one stretch of work hide each other: fixing one leaves the
        # other the slowest there, so together they save more than the two apart.
        hides = len(units) > 1 and both > 1.05 * apart
        more = "; more than the findings apart: each hides the other" if hides else ""
        lines.append((cost_text(every, "fixing every finding") + more, every))
    said = {f.get("rank") for f in slow[:limit]}
    alone = {r for r, n in Counter(f.get("rank") for f in slow).items() if n == 1}
    for entry in hosts[:limit]:
        cost = entry.get("cost") or {}
        ranks = list(entry.get("ranks") or [])
        if any(_same_saving(said_cost, cost) for _, said_cost in lines if said_cost):
            continue  # the host's fix is one said above (every finding, or its one group)
        if len(ranks) == 1 and ranks[0] in alone and ranks[0] in said:
            continue  # the host's one slow finding, said above
        what = f"fixing host {entry.get('host')} ({format_ranks(ranks)})"
        lines.append((cost_text(cost, what), cost))
    return [text for text, _ in lines]


def _waiting_for_group(findings: Sequence[Mapping[str, Any]], group: Mapping[str, Any]) -> str:
    """The ranks whose waiting is this group's cost (they wait for one of its ranks)."""
    cause = {"group": group.get("group")}
    by_phase: dict[str, list[int]] = {}
    for f in findings:
        if f.get("role") == "waits" and f.get("cost_of") == cause:
            by_phase.setdefault(str(f.get("phase")), []).append(int(f.get("rank", -1)))
    return _lose(by_phase)


def _waiting(findings: Sequence[Mapping[str, Any]], slow: Mapping[str, Any]) -> str:
    """The ranks whose waiting is this slow finding's cost, said beside it, so that
    their lost time is not read as a second cause."""
    cause = {"rank": slow.get("rank"), "phase": slow.get("phase")}
    by_phase: dict[str, list[int]] = {}
    for f in findings:
        if f.get("role") == "waits" and f.get("cost_of") == cause:
            by_phase.setdefault(str(f.get("phase")), []).append(int(f.get("rank", -1)))
    return _lose(by_phase)


def _lose(by_phase: Mapping[str, list[int]]) -> str:
    said = [f"{format_ranks(sorted(r))} in {phase}" for phase, r in by_phase.items()]
    if not said:
        return ""
    return (
        f"; {' and '.join(said)} lose this time waiting for it: the same cost, not a second cause"
    )


def _same_saving(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Two costs that would read alike: savings within 1% of each other (two fixes of
    one rank can differ in the last digit when one also fixes its other phases)."""
    x, y = finite(a.get("step_ms_saved")), finite(b.get("step_ms_saved"))
    return x is not None and y is not None and abs(x - y) <= 0.01 * max(abs(x), abs(y), 1e-9)


def cost_text(cost: Mapping[str, Any], what: str = "fixing it") -> str:
    """A cost (Cost.to_dict()) in words: "fixing it saves 38 ms of a 95 ms step (1.68x as
    fast): 1.2 h over the run so far, 4.8 GPU-hours" (rank-hours on a run with no GPU)."""
    saved, step = finite(cost.get("step_ms_saved")), finite(cost.get("step_ms"))
    speedup = finite(cost.get("speedup"))
    hours = finite(cost.get("run_hours_saved"))
    gpu, ranks = finite(cost.get("gpu_hours_saved")), finite(cost.get("rank_hours_saved"))
    if saved is None or step is None:
        return f"{what}: no estimate"
    ms = SENTENCE.ms_text
    text = f"{what} saves {ms(saved)} of a {ms(step)} step"
    since = cost.get("steps_from")
    if isinstance(since, int) and not isinstance(since, bool) and since > 0:
        text += f" since step {since}"
    if speedup is not None and speedup > 1:
        text += f" ({SENTENCE.speedup(speedup)} as fast)"
    if hours is not None and gpu is not None:
        text += f": {hours_text(hours)} over the run so far, {hours_text(gpu, 'GPU')}"
    elif hours is not None and ranks is not None:
        text += f": {hours_text(hours)} over the run so far, {hours_text(ranks, 'rank')}"
    return text
