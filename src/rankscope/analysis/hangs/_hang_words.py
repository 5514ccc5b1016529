"""The hang analysis's words: the summary sentence, the notes under it, and where a
stalled rank is, named."""

from __future__ import annotations

from ..._text import format_ranks, number_ranges
from ..core._format import seconds_text
from ..core._options import HangOptions
from ..read._watch import Heartbeat
from ._hang_ends import ended_words, stopped_words
from ._hang_model import (
    FROM_DUMPS,
    IN_PENDING,
    LATER_PHASE,
    LATER_STEP,
    NS_PER_S,
    STUCK,
    WAITS,
    GroupCollectives,
    HangFinding,
    HangReport,
)

__all__ = ["notes_of", "state_of", "summary_of"]

_SUMMARY_GROUPS = 3  # groups of one role named in the summary sentence; the table has all


def state_of(report: HangReport, beats: dict[int, Heartbeat]) -> str:
    if report.findings or any(g.state != "done" for g in report.collectives):
        return "hung"
    if not beats:
        return "no heartbeats"
    if report.gone and not report.running:
        return "ended"
    if not report.running:
        return "finished"
    return "running"


def _where(phase: str | None, kind: str | None) -> str:
    return "outside any phase" if phase is None else f"in {phase} ({kind})"


def summary_of(report: HangReport) -> str:
    if report.state == "no heartbeats":
        if report.files_read == 0:
            return "no heartbeats or hang files: the watch was off, or the run predates it"
        return "no heartbeat of the run's latest launch; nothing to judge against"
    if report.state in ("finished", "ended"):
        return _ended_summary(report)
    if report.state == "running":
        n = len(report.running)
        text = (
            f"no rank is stalled: {n} rank{'s' if n != 1 else ''} running "
            f"({number_ranges(report.running)})"
        )
        longest = report.longest_unmoved
        if longest is not None:
            text += (
                f"; the longest any had gone without moving at its last heartbeat is "
                f"{seconds_text(longest[0])} (rank {longest[1]})"
            )
        return text
    said, parts = _collectives_said(report)
    groups = report.groups(leave_out=said)
    stuck = [g for g in groups if g["role"] == STUCK]
    waits = [g for g in groups if g["role"] == WAITS]
    if report.gone:
        parts.insert(0, ended_words(report.gone))
    for g in stuck[:_SUMMARY_GROUPS]:
        parts.append(
            f"{format_ranks(g['ranks'])} {'has' if g['count'] == 1 else 'have'} been stuck "
            f"{_where(g['phase'], g['kind'])} at step {g['step']} for {seconds_text(g['for_s'])}"
        )
    if not stuck and not report.gone and not said:
        parts.append("no stalled rank is outside a collective")
    for g in waits[:_SUMMARY_GROUPS]:
        parts.append(
            f"{format_ranks(g['ranks'])} {'waits' if g['count'] == 1 else 'wait'} "
            f"{_where(g['phase'], g['kind'])} at step {g['step']}"
        )
    rest = sum(g["count"] for g in stuck[_SUMMARY_GROUPS:] + waits[_SUMMARY_GROUPS:])
    if rest:
        parts.append(f"{rest} more stalled rank{'s' if rest > 1 else ''} elsewhere (see the table)")
    if not stuck and not report.gone and not said:
        parts.extend(_suspects(report))
    return "; ".join(parts)


def _collectives_said(report: HangReport) -> tuple[set[int], list[str]]:
    """What the Flight Recorder dumps say of the groups that hang, one clause a group,
    with where each rank named is by its heartbeat; and the ranks so said (the summary
    does not name them a second time)."""
    hung = [g for g in report.collectives if g.state != "done"]
    by_rank = {f.rank: f for f in report.findings}
    said: set[int] = set()
    parts = []
    for g in hung[:_SUMMARY_GROUPS]:
        parts.append(_group_words(g, by_rank))
        said.update(g.entered + g.absent)
    rest = len(hung) - _SUMMARY_GROUPS
    if rest > 0:
        parts.append(f"{rest} more process group{'s' if rest > 1 else ''} hang (see the table)")
    return said, parts


def collective_name(op: str | None, seq: int | None) -> str:
    """`all_reduce #6`; `collective #6` where no dump still holds its call."""
    return f"{op or 'collective'} #{seq}"


def group_name(g: GroupCollectives) -> str:
    """`process group 0 (default_pg, ranks 0-3)`."""
    about = [g.desc] if g.desc and g.desc != "undefined" else []
    if g.ranks:
        inferred = ", inferred" if g.members_from == FROM_DUMPS else ""
        about.append(f"rank{'s' if len(g.ranks) > 1 else ''} {number_ranges(g.ranks)}{inferred}")
    return f"process group {g.name}" + (f" ({', '.join(about)})" if about else "")


def _group_words(g: GroupCollectives, by_rank: dict[int, HangFinding]) -> str:
    pending = collective_name(g.pending_op, g.pending)
    inside = format_ranks(g.entered) if g.entered else "no rank with a dump"
    verb = "waits" if len(g.entered) == 1 else "wait"
    missing = (
        f"; {format_ranks(g.missing)} left no dump, so what {'it' if len(g.missing) == 1 else 'they'} "
        "did there is not known"
        if g.missing
        else ""
    )
    if g.state == "waits":
        who = [f"rank {r}{_heartbeat_where(by_rank.get(r))}" for r in g.absent]
        lasts = [
            f"rank {r}'s last: {collective_name(g.last_entered_op[r], g.last_entered[r])}"
            if g.last_entered[r]
            else f"rank {r} entered none"
            for r in g.absent
        ]
        return (
            f"{_join(who)} never entered {pending} of {group_name(g)}, in which {inside} "
            f"{verb} ({'; '.join(lasts)})" + missing
        )
    if g.state == "mismatched":
        first = next(m for m in g.mismatches if m.seq == g.pending)
        ways = ", ".join(f"{format_ranks(list(rs))} {v}" for v, rs in first.ways.items())
        return (
            f"{group_name(g)}: collective #{g.pending} does not match across its ranks "
            f"({first.what}: {ways}); {inside} {verb} in it" + missing
        )
    if g.state == "stalled":
        return (
            f"{group_name(g)}: every rank entered {pending} and none completed it: the "
            "collective itself stalls (a network fault, a peer's device), no rank stayed away"
        )
    return f"{group_name(g)}: {inside} {verb} in {pending}" + missing


def _heartbeat_where(f: HangFinding | None) -> str:
    if f is None:
        return ""
    if f.role == STUCK:
        return f", stuck {_where(f.phase, f.kind)} at step {f.step} for {seconds_text(f.for_s)},"
    return f", {_where(f.phase, f.kind)} at step {f.step},"


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _ended_summary(report: HangReport) -> str:
    """A run no rank of which is running: how each ended."""
    stopped = stopped_words(report.stopped, report.errors)
    if report.gone:
        return f"not hung: {ended_words(report.gone)}{stopped}"
    if report.errors:
        return f"not hung: every rank's stop() ran{stopped}"
    return f"the run finished: every rank's stop() ran ({_ranks(report.stopped)})"


def _suspects(report: HangReport) -> list[str]:
    """When every stalled rank waits in a collective: the ranks that are not there."""
    out = []
    if report.stopped:
        steps = sorted(set(report.stopped_steps))
        at = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
        out.append(
            f"{format_ranks(report.stopped)} stopped at {at} (stop() ran: it left the loop early?)"
        )
    if report.running:
        out.append(f"{format_ranks(report.running)} still moving, below the threshold")
    if report.missing:
        out.append(f"{format_ranks(report.missing)} wrote no heartbeat")
    if not out:
        out.append(
            "a collective that never completes (mismatched calls, a network fault): "
            "see the Flight Recorder dump beside the hang files, where NCCL is in use"
        )
    return out


def _ranks(ranks: list[int]) -> str:
    """`1 rank: 0`, `4 ranks: 0-3`."""
    return f"{len(ranks)} rank{'s' if len(ranks) != 1 else ''}: {number_ranges(ranks)}"


def notes_of(report: HangReport, options: HangOptions) -> list[str]:
    notes = []
    unwatched = [
        f.rank
        for f in report.findings
        if f.hang is None
        and (report.now_ns - f.moved_ns) / NS_PER_S > f.threshold_s + options.grace_s
    ]
    if unwatched:
        their = "its" if len(unwatched) == 1 else "their"
        notes.append(
            f"{format_ranks(unwatched)}: stalled past {their} "
            "threshold with no hang file, so the watchdog did not write one: it is off "
            "(hang.enable), or the process is gone (killed, crashed without stop(), or its "
            "host down) and this is where it was when it went"
        )
    hidden = _hidden_collective(report)
    if hidden:
        notes.append(hidden)
    if report.earlier_launch:
        notes.append(
            f"{format_ranks(report.earlier_launch)}: heartbeats of an earlier launch of the job "
            "(they did not start again in the latest), left out"
        )
    if report.older_hang_files:
        n = report.older_hang_files
        notes.append(f"{n} hang file{'s' if n > 1 else ''} of an earlier attempt left out")
    if report.missing and report.state != "hung":
        notes.append(f"{format_ranks(report.missing)}: no heartbeat")
    for g in report.stalls_ended:
        longest = g["longest_s"]
        how = f", the longest for {seconds_text(longest)}" if longest is not None else ""
        notes.append(
            f"a stall that ended: {format_ranks(g['ranks'])} at step "
            f"{number_ranges(g['steps'])}{how}"
        )
    return notes


_TIME_IT = 'time the collective as its own phase (kind="comm") to see where each rank waits'


def _hidden_collective(report: HangReport) -> str | None:
    """Where no stalled rank is in a comm phase, the collective they wait in is inside
    another phase (DDP's gradient all-reduce inside backward): say how the waiting ranks
    were told, and how to see the wait itself."""
    found = report.findings
    if len(found) < 2 or any(f.kind == "comm" for f in found):
        return None
    stuck = [f.rank for f in found if f.role == STUCK]
    waits = [f for f in found if f.role == WAITS]
    phases = [p for p in dict.fromkeys(f.phase for f in waits or found) if p is not None]
    named = ", ".join(phases)
    if not waits:
        told = (
            "without the run's timings their order in the step is not known"
            if report.order is None
            else "the step's phase order does not tell them apart"
        )
        return (
            f"every stalled rank is {'in ' + named if phases else 'outside any phase'}, not "
            f"a comm phase, and {told}: where a "
            f"collective runs inside (DDP's gradient all-reduce inside backward), {_TIME_IT} "
            "and to tell the stuck rank from its waiters"
        )
    how = []
    if any(f.why == IN_PENDING for f in waits):
        how.append(
            "their Flight Recorder dumps show them inside a collective that "
            f"{format_ranks(stuck) if stuck else 'another rank'} never entered"
        )
    if any(f.why in (LATER_STEP, LATER_PHASE) for f in waits):
        how.append(f"further along than {format_ranks(stuck) if stuck else 'the others'}")
    synced = [p for p in phases if report.order is not None and p in report.order.sync]
    if synced:
        how.append(
            f"the run's timings show {', '.join(synced)} to end in a collective (its ranks "
            "leave it together though they enter it apart)"
        )
    return (
        f"no stalled rank is in a comm phase: {format_ranks([f.rank for f in waits])} "
        f"{'is' if len(waits) == 1 else 'are'} taken to wait "
        f"{'in ' + named if phases else 'outside any phase'} as "
        f"{' and '.join(how)}; where a collective runs inside a phase (DDP's gradient "
        f"all-reduce inside backward), {_TIME_IT}"
    )
