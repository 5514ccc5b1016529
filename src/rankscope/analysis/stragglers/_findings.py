"""The straggler analysis's findings in words: the summary's sentences and the cost lines
that the terminal and the HTML report share (the findings as data: _model.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ..._text import format_ranks
from ..core._chance import FEWEST_STEPS
from ..core._format import SENTENCE, finite, hours_text
from ..core._values import as_list, as_map
from ._model import (
    ROUGH_FIT,
    Imbalance,
    SlowGroup,
    StragglerFinding,
    StragglerReport,
    Undecided,
    model_fit,
)

__all__ = [
    "cost_lines",
    "cost_text",
    "group_sentence",
    "imbalance_sentence",
    "ratio_text",
    "sentences",
]


ratio_text = SENTENCE.ratio
"""A time against its reference as people say it: "+41%" below twice, "2.5x", "526x"
(core/_format.py has the rule)."""


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
        out.append(imbalance_sentence(uneven, report.steps[0]))
        out.append(f"why {uneven.phase} is uneven: {uneven.cause.text}")
    if fit is not None and abs(fit - 1) > ROUGH_FIT and report.cost is not None:
        out.append(
            f"the cost model gives a {SENTENCE.ms_text(report.model_step_ms)} step against "
            f"{SENTENCE.ms_text(report.cost.step_ms)} measured ({fit:.2f}x): the savings it "
            "prices are rough here (docs/analysis.md, Cost, says what the model cannot see)"
        )
    return out


def left_out_note(left: int, floor_ms: float, min_saving: float) -> str:
    """What drop_the_cheap left out: `left` findings whose fix saves under `floor_ms` a
    step (--min-saving, `min_saving` of the median step)."""
    each = "it" if left == 1 else "each"
    return (
        f"{left} finding{'' if left == 1 else 's'} left out, as fixing {each} would save under "
        f"{SENTENCE.ms_text(floor_ms)} a step (--min-saving, {SENTENCE.share(min_saving)} of "
        "the median step)"
    )


def _group_sentence(
    group: SlowGroup, waiting: list[StragglerFinding], told: set[int], first_step: int
) -> str:
    """A slow group's sentence with the ranks that wait for it: those a finding names
    (marked `told`), and those that wait in a send/recv no finding judges."""
    text = group_sentence(group, first_step)
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
    one = len(by_phase) == 1 and len(next(iter(by_phase.values()))) == 1
    return (
        f"; {' and '.join(said)} {'loses' if one else 'lose'} this time waiting for it: "
        "the same cost, not a second cause"
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


def group_sentence(group: SlowGroup, first_step: int) -> str:
    """A slow group in words; "since step N" unless it began at `first_step`."""
    since = "" if group.since_step == first_step else f" since step {group.since_step}"
    which = format_ranks(group.ranks)
    if group.slow != group.ranks:
        which += f", {format_ranks(group.slow)} of them slow"
    return (
        f"{group.name} ({which}) is slow in {group.phase_words} as a group "
        f"({ratio_text(group.ratio)} vs the other ranks{since}): one finding for its ranks "
        "(each rank's own row: --all, --json), as only fixing the group frees the step"
    )


def imbalance_sentence(uneven: Imbalance, first_step: int = 0) -> str:
    """Uneven data in words; "since step N" unless it began at `first_step`, the run's
    first sampled step."""
    since = "" if uneven.since_step == first_step else f" since step {uneven.since_step}"
    return (
        f"ranks are unevenly loaded in {uneven.phase} from step to step{since}: the "
        f"slowest rank changes at {uneven.changes:.0%} of the uneven steps ({uneven.ranks_slowest} "
        f"ranks were the slowest at some step, none at more than {uneven.top_share:.0%}), "
        f"{uneven.ratio:.2f}x the median rank at {uneven.share:.0%} of sampled steps"
    )
