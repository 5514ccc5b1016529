"""Who is stuck, and where: a run's heartbeats and hang files, the stuck rank told apart
from the ranks that wait for it (docs/hangs.md says these rules for users).

- Attempts. A rank's heartbeat is rewritten by each start of that rank, so it is the
  rank's latest attempt. A hang file counts only when its attempt token is the one in
  its rank's heartbeat (without a heartbeat: the one in its meta file; without either,
  the token of its newest hang file); the others are an earlier attempt's, left out
  and counted. Heartbeats of ranks that did not start again in the run's latest launch
  (a job restarted with fewer ranks) are left out too: their starts, from the meta
  files, are matched into launches as the timings' are (`run_attempts`).
- Stalled. A rank whose heartbeat says "running" is stalled when it has an open stall
  (a hang file of its attempt with no `ended_ns`, and its heartbeat still at that
  step), or when it has not moved (no step(), no phase entered or left) for longer
  than its threshold, judged against now: the hang file's `threshold_s`, else the
  heartbeat's, else max(hang.factor x its median step time, hang.after_s), from the
  rank's config in its meta file (the watchdog's own rule and defaults).
- Stuck or waiting. A stalled rank whose innermost open phase is of kind "comm" waits.
  Of the others, those at the earliest place (the lowest step; in it, the earliest
  phase, in the order the run's timings show a step runs its phases) are stuck, and
  those further along wait for them. A stuck candidate in a phase that the timings show
  to end in a collective (its ranks leave it together though they enter apart: a DDP
  backward, analysis/stragglers/_arrivals.py's rule) waits there instead when no stalled rank is
  further along: the rank it waits for is one that is not stalled. Without timings the
  order within a step is unknown: the ranks at the lowest step are stuck.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..._errors import ConfigError
from ..._text import format_ranks, number_ranges
from ...config._config import HangConfig
from ..core._format import seconds_text
from ..core._options import HangOptions
from ..read._run import RunMeta, read_run_meta
from ..read._watch import Frame, HangFile, Heartbeat, OpenPhase, read_watch
from ._hang_ends import behind_note, ended_words, last_seen, process_gone, stopped_words
from ._hang_launches import current_hangs, latest_launch, world_size_of
from ._step_order import StepOrder, StepOrders

if TYPE_CHECKING:
    from ..read._timed import TimedRun

__all__ = [
    "HANGS_VERSION",
    "STALL_FACTOR",
    "STALL_FLOOR_S",
    "HangFinding",
    "HangReport",
    "StepOrder",
    "find_hangs",
    "hangs_of",
]

HANGS_VERSION = 1
_DEFAULTS = HangConfig()
STALL_FACTOR = _DEFAULTS.factor
"""Median step times a rank may go unmoved (hang.factor), where its meta does not say..."""
STALL_FLOOR_S = _DEFAULTS.after_s
"""...and never less than this many seconds (hang.after_s)."""
_NS = 1_000_000_000
_SUMMARY_GROUPS = 3  # groups of one role named in the summary sentence; the table has all

STUCK = "stuck"
WAITS = "waits"

# Why a rank has its role (a finding's `why`).
EARLIEST = "earliest"
"""Stuck: at the earliest step and phase of the stalled ranks outside a collective."""
IN_COMM = "in a comm phase"
IN_SYNC = "in a phase that ends in a collective"
LATER_STEP = "at a later step"
LATER_PHASE = "at a later phase of the step"
FOR_ENDED = "for a rank that ended (its process is gone)"


@dataclass(frozen=True, slots=True)
class HangFinding:
    """A stalled rank: stuck (the cause) or waiting, where, since when."""

    rank: int
    role: str
    """"stuck" or "waits"."""
    host: str | None
    step: int
    open: tuple[OpenPhase, ...]
    """The phases it is inside, outermost first."""
    since_ns: int
    """When it entered its innermost phase; in none, when it last moved."""
    now_ns: int
    moved_ns: int
    written_ns: int | None
    """When its heartbeat was last written; None without one."""
    threshold_s: float
    hang: HangFile | None
    """Its open stall's hang file, where its watchdog wrote one."""
    why: str = ""
    """Why it has its role: EARLIEST (stuck), IN_COMM, IN_SYNC, LATER_STEP, LATER_PHASE."""

    @property
    def phase(self) -> str | None:
        return self.open[-1].phase if self.open else None

    @property
    def kind(self) -> str | None:
        return self.open[-1].kind if self.open else None

    @property
    def for_s(self) -> float:
        return max(0, self.now_ns - self.since_ns) / _NS

    def to_dict(self) -> dict[str, Any]:
        hang = self.hang
        out: dict[str, Any] = {
            "rank": self.rank,
            "host": self.host,
            "role": self.role,
            "why": self.why,
            "phase": self.phase,
            "kind": self.kind,
            "step": self.step,
            "since": _epoch_s(self.since_ns),
            "for_s": round(self.for_s, 3),
            "heartbeat_age_s": None
            if self.written_ns is None
            else round(max(0, self.now_ns - self.written_ns) / _NS, 3),
            "moved_ago_s": round(max(0, self.now_ns - self.moved_ns) / _NS, 3),
            "threshold_s": self.threshold_s,
            "open": [_open_dict(p) for p in self.open],
            "hang_file": None if hang is None else str(hang.path),
            "detected": None if hang is None else _epoch_s(hang.detected_ns),
            "flight_recorder": None if hang is None else hang.flight_recorder,
            "flight_recorder_skipped": None if hang is None else hang.flight_recorder_skipped,
        }
        if self.role == STUCK:
            out["thread"] = None if hang is None else hang.thread
            out["frames"] = [] if hang is None else [_frame_dict(f) for f in hang.frames]
        return out


@dataclass
class HangReport:
    """What `find_hangs` found: the state, the stalled ranks, and what else was seen."""

    run_dir: Path
    state: str
    """"hung", "running", "finished" (every heartbeat stopped), "ended" (no rank running
    and some ended without stop(): their processes are gone) or "no heartbeats"."""
    summary: str
    now_ns: int
    world_size: int | None
    findings: list[HangFinding] = field(default_factory=list)
    heartbeats: int = 0
    newest_heartbeat_ns: int | None = None
    """When the newest heartbeat of a running rank was written."""
    running: list[int] = field(default_factory=list)
    stopped: list[int] = field(default_factory=list)
    stopped_steps: list[int] = field(default_factory=list)
    """The step each stopped rank was at, in the order of `stopped`."""
    errors: dict[int, str] = field(default_factory=dict)
    """Stopped ranks whose loop left on an error, and the error (their last heartbeat's)."""
    gone: dict[int, int] = field(default_factory=dict)
    """Ranks whose process is gone without stop() (_hang_ends.py): where last seen."""
    missing: list[int] = field(default_factory=list)
    earlier_launch: list[int] = field(default_factory=list)
    longest_unmoved: tuple[float, int] | None = None
    """(seconds, rank): the running rank, not stalled, that had gone longest without moving
    when its last heartbeat was written."""
    stalls_ended: list[dict[str, Any]] = field(default_factory=list)
    older_hang_files: int = 0
    files_listed: int = 0
    """Heartbeat and hang file names found, readable or not."""
    files_read: int = 0
    """Heartbeats and hang files that passed their checks (of any attempt)."""
    order: StepOrder | None = None
    """The step's phases as the run's timings show them; None without timings, or where
    every stalled rank is in a comm phase (the timings are then not read)."""
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def groups(self) -> list[dict[str, Any]]:
        """The findings by (role, phase, kind, step): stuck first, then the largest."""
        by_key: dict[tuple[str, str | None, str | None, int], list[HangFinding]] = {}
        for f in self.findings:
            by_key.setdefault((f.role, f.phase, f.kind, f.step), []).append(f)
        ordered = sorted(
            by_key.items(),
            key=lambda item: (item[0][0] != STUCK, -len(item[1]), item[0][3], item[1][0].rank),
        )
        return [
            {
                "role": role,
                "phase": phase,
                "kind": kind,
                "step": step,
                "ranks": [f.rank for f in found],
                "count": len(found),
                "for_s": round(max(f.for_s for f in found), 3),
                "since": _epoch_s(min(f.since_ns for f in found)),
            }
            for (role, phase, kind, step), found in ordered
        ]

    def to_dict(self) -> dict[str, Any]:
        newest = self.newest_heartbeat_ns
        longest = self.longest_unmoved
        return {
            "v": HANGS_VERSION,
            "run_dir": str(self.run_dir),
            "state": self.state,
            "summary": self.summary,
            "as_of": _epoch_s(self.now_ns),
            "newest_heartbeat_age_s": None
            if newest is None
            else round(max(0, self.now_ns - newest) / _NS, 3),
            "rules": {"stall_factor": STALL_FACTOR, "stall_floor_s": STALL_FLOOR_S},
            "ranks": {
                "world_size": self.world_size,
                "heartbeats": self.heartbeats,
                "stuck": [f.rank for f in self.findings if f.role == STUCK],
                "waiting": [f.rank for f in self.findings if f.role == WAITS],
                "running": self.running,
                "stopped": self.stopped,
                "ended": sorted(self.gone),
                "missing": self.missing,
                "earlier_launch": self.earlier_launch,
            },
            "groups": self.groups(),
            "findings": [f.to_dict() for f in self.findings],
            "longest_unmoved": None
            if longest is None
            else {"rank": longest[1], "s": round(longest[0], 3)},
            "stalls_ended": self.stalls_ended,
            "ended_at": {str(rank): step for rank, step in sorted(self.gone.items())},
            "errors": {str(rank): error for rank, error in sorted(self.errors.items())},
            "older_hang_files": self.older_hang_files,
            "phases": None if self.order is None else self.order.to_dict(),
            "notes": self.notes,
            "skipped": self.skipped,
        }


def find_hangs(
    run_dir: str | os.PathLike[str],
    options: HangOptions | None = None,
    *,
    now_ns: int | None = None,
    orders: StepOrders | None = None,
) -> HangReport:
    """Read a run's heartbeats (RUN_DIR/live) and hang files (RUN_DIR/hangs) and say
    who is stuck where, and who waits for it.

    `now_ns` (epoch ns) is the time to judge against; the clock by default. `orders`:
    where a caller asks again and again (`rankscope top`), the reader of the step order
    it holds, which reads the timings again only when they changed. A path that is not a
    run directory is a TraceError; a run without heartbeats or hang files is a report
    whose state is "no heartbeats". Bad files are named in `skipped`.
    """
    if now_ns is not None and (
        isinstance(now_ns, bool) or not isinstance(now_ns, int) or now_ns < 0
    ):
        raise ConfigError("now_ns", now_ns, "epoch nanoseconds, an integer >= 0")
    meta = read_run_meta(run_dir)
    report = hangs_of(meta, time.time_ns() if now_ns is None else now_ns, options, orders=orders)
    report.skipped[:0] = meta.skipped
    return report


def hangs_of(
    meta: RunMeta,
    now_ns: int,
    options: HangOptions | None = None,
    *,
    run: TimedRun | None = None,
    orders: StepOrders | None = None,
) -> HangReport:
    """`find_hangs` for a run whose meta files are read already; what the meta files
    could not give is the caller's to say (not in `skipped`). `run`: its timings, where
    the caller read them on host time, so that they are not read a second time."""
    files = read_watch(meta.root)
    beats, earlier = latest_launch(files.heartbeats, meta)
    open_hangs, ended, older = current_hangs(files.hangs, beats, set(earlier), meta)
    world = world_size_of(meta, beats, earlier)
    running = [b.written_ns for b in beats.values() if not b.stopped]
    report = HangReport(
        run_dir=meta.root.resolve(),
        state="",
        summary="",
        now_ns=now_ns,
        world_size=world,
        heartbeats=len(beats),
        newest_heartbeat_ns=max(running) if running else None,
        earlier_launch=earlier,
        older_hang_files=older,
        files_listed=files.listed,
        files_read=len(files.heartbeats) + len(files.hangs),
        skipped=files.skipped,
    )
    present = set(beats) | set(open_hangs) | {h.rank for h in ended}
    size = world if world is not None else max(present, default=-1) + 1
    report.missing = [r for r in range(size) if r not in present]
    stalled = _judge(report, beats, open_hangs, meta)
    if report.gone or any(f.kind != "comm" for f in stalled):  # else no need of the timings
        report.order = (orders or StepOrders())(meta, report.skipped, run)
    timed = report.order.last_step if report.order is not None else {}
    report.gone = {rank: last_seen(beats[rank], timed) for rank in report.gone}
    report.findings = _roles(stalled, report.order)
    if report.gone:  # the ranks still there wait for the ones that ended
        report.findings = [
            dataclasses.replace(f, role=WAITS, why=FOR_ENDED) for f in report.findings
        ]
    report.stalls_ended = _ended(ended)
    report.state = _state(report, beats)
    report.summary = _summary(report)
    report.notes = _notes(report, HangOptions() if options is None else options)
    behind = behind_note({r: b for r, b in beats.items() if r not in report.running}, timed)
    if behind is not None:
        report.notes.append(behind)
    return report


# -- judging each rank -----------------------------------------------------------------


def _judge(
    report: HangReport,
    beats: dict[int, Heartbeat],
    open_hangs: dict[int, HangFile],
    meta: RunMeta,
) -> list[HangFinding]:
    """The stalled ranks (roles not yet given); fills running, stopped and longest_unmoved."""
    now = report.now_ns
    stalled: list[HangFinding] = []
    for rank in sorted(set(beats) | set(open_hangs)):
        beat, hang = beats.get(rank), open_hangs.get(rank)
        if beat is not None and beat.stopped:
            report.stopped.append(rank)
            report.stopped_steps.append(beat.step)
            if beat.error is not None:
                report.errors[rank] = beat.error
            continue
        if beat is not None and hang is None and process_gone(beat):
            report.gone[rank] = beat.step  # where last seen: set once the timings are read
            continue
        if beat is not None:
            step, phases, moved = beat.step, beat.open, beat.moved_ns
        elif hang is not None:  # no heartbeat: the last it moved is when its phases began
            step, phases = hang.step, hang.open
            moved = max([hang.step_started_ns or 0, *(p.since_ns for p in hang.open)])
        else:
            continue
        threshold = _threshold(beat, hang, meta.meta.get(rank, {}))
        host = (beat.host if beat else None) or (hang.host if hang else None)
        unmoved = max(0, now - moved) / _NS
        if hang is None and beat is not None and unmoved <= threshold:
            report.running.append(rank)
            # How long it had not moved when its heartbeat was written: past that nothing
            # is known. A job of 30 steps a second moves between two heartbeats, and now
            # less moved_ns would be the heartbeat's age, not a pause of the rank's.
            known = max(0, min(now, beat.written_ns) - moved) / _NS
            if report.longest_unmoved is None or known > report.longest_unmoved[0]:
                report.longest_unmoved = (known, rank)
            continue
        stalled.append(
            HangFinding(
                rank=rank,
                role=WAITS,
                host=host or meta.hosts.get(rank),
                step=step,
                open=phases,
                since_ns=phases[-1].since_ns if phases else moved,
                now_ns=now,
                moved_ns=moved,
                written_ns=beat.written_ns if beat else None,
                threshold_s=threshold,
                hang=hang,
            )
        )
    return stalled


def _threshold(beat: Heartbeat | None, hang: HangFile | None, meta: dict[str, Any]) -> float:
    """The rank's watchdog threshold: as its hang file or heartbeat states it, else by
    the watchdog's rule from the rank's config (its meta file), else from the defaults."""
    if hang is not None:
        return hang.threshold_s
    if beat is not None and beat.threshold_s is not None:
        return beat.threshold_s
    config = meta.get("config")
    rule = config.get("hang") if isinstance(config, dict) else None
    after = _positive(rule, "after_s", STALL_FLOOR_S)
    factor = _positive(rule, "factor", STALL_FACTOR)
    median = beat.median_step_s if beat is not None else None
    return max(factor * median, after) if median else after


def _positive(rule: object, key: str, default: float) -> float:
    value = rule.get(key) if isinstance(rule, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    return float(value) if math.isfinite(value) and 0 < value <= 1e9 else default


# A rank's place: its step, and the places of its open phases, outermost first, up to
# the first the timings do not know.
_Place = tuple[int, tuple[int, ...]]


def _roles(stalled: list[HangFinding], order: StepOrder | None) -> list[HangFinding]:
    """Stuck: outside a collective, at the earliest place of such ranks; the rest wait
    (the module's docstring says the rule)."""
    places = {f.rank: _place_of(f, order) for f in stalled}
    outside = {places[f.rank] for f in stalled if f.kind != "comm"}
    low = min((step for step, _ in outside), default=None)
    # Within a step, places are few (the step's phases): comparing each pair is cheap.
    first = [p for p in outside if p[0] == low]
    last = max(step for step, _ in places.values()) if places else None
    at_last = {p for p in places.values() if p[0] == last}
    sync = order.sync if order is not None else frozenset()
    out = []
    for f in stalled:
        place = places[f.rank]
        if f.kind == "comm":
            why = IN_COMM
        elif place[0] != low:
            why = LATER_STEP
        elif any(_before(p, place) for p in first):
            why = LATER_PHASE
        elif f.phase in sync and place[0] == last and not any(_before(place, p) for p in at_last):
            why = IN_SYNC  # no stalled rank is past it: it waits for one that is not stalled
        else:
            why = EARLIEST
        out.append(dataclasses.replace(f, role=STUCK if why == EARLIEST else WAITS, why=why))
    return out


def _place_of(finding: HangFinding, order: StepOrder | None) -> _Place:
    places: list[int] = []
    for p in finding.open:
        place = None if order is None else order.places.get(p.phase)
        if place is None:
            break
        places.append(place)
    return finding.step, tuple(places)


def _before(a: _Place, b: _Place) -> bool:
    """`a` is strictly earlier than `b`. Within a step, places are compared as far as
    both are known: a rank in `train` and one in `train > forward` are at one place."""
    if a[0] != b[0]:
        return a[0] < b[0]
    for x, y in zip(a[1], b[1], strict=False):
        if x != y:
            return x < y
    return False


# -- the step's order, from the timings ----------------------------------------------------


def _ended(ended: list[HangFile]) -> list[dict[str, Any]]:
    by_stall: dict[str, list[HangFile]] = {}
    for hang in ended:
        by_stall.setdefault(hang.stall, []).append(hang)
    out = []
    for stall, files in sorted(by_stall.items()):
        lengths = [h.stalled_s for h in files if h.stalled_s is not None]
        out.append(
            {
                "stall": stall,
                "steps": sorted({h.step for h in files}),
                "ranks": sorted({h.rank for h in files}),
                "longest_s": max(lengths) if lengths else None,
            }
        )
    return out


def _state(report: HangReport, beats: dict[int, Heartbeat]) -> str:
    if report.findings:
        return "hung"
    if not beats:
        return "no heartbeats"
    if report.gone and not report.running:
        return "ended"
    if not report.running:
        return "finished"
    return "running"


# -- words -----------------------------------------------------------------------------


def _where(phase: str | None, kind: str | None) -> str:
    return "outside any phase" if phase is None else f"in {phase} ({kind})"


def _summary(report: HangReport) -> str:
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
    groups = report.groups()
    stuck = [g for g in groups if g["role"] == STUCK]
    waits = [g for g in groups if g["role"] == WAITS]
    parts = [ended_words(report.gone)] if report.gone else []
    for g in stuck[:_SUMMARY_GROUPS]:
        parts.append(
            f"{format_ranks(g['ranks'])} {'has' if g['count'] == 1 else 'have'} been stuck "
            f"{_where(g['phase'], g['kind'])} at step {g['step']} for {seconds_text(g['for_s'])}"
        )
    if not stuck and not report.gone:
        parts.append("no stalled rank is outside a collective")
    for g in waits[:_SUMMARY_GROUPS]:
        parts.append(
            f"{format_ranks(g['ranks'])} {'waits' if g['count'] == 1 else 'wait'} "
            f"{_where(g['phase'], g['kind'])} at step {g['step']}"
        )
    rest = sum(g["count"] for g in stuck[_SUMMARY_GROUPS:] + waits[_SUMMARY_GROUPS:])
    if rest:
        parts.append(f"{rest} more stalled rank{'s' if rest > 1 else ''} elsewhere (see the table)")
    if not stuck and not report.gone:
        parts.extend(_suspects(report))
    return "; ".join(parts)


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


def _notes(report: HangReport, options: HangOptions) -> list[str]:
    notes = []
    unwatched = [
        f.rank
        for f in report.findings
        if f.hang is None and (report.now_ns - f.moved_ns) / _NS > f.threshold_s + options.grace_s
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


def _epoch_s(ns: int) -> float:
    return round(ns / _NS, 3)


def _open_dict(phase: OpenPhase) -> dict[str, Any]:
    return {
        "phase": phase.phase,
        "kind": phase.kind,
        "since": _epoch_s(phase.since_ns),
        "depth": phase.depth,
    }


def _frame_dict(frame: Frame) -> dict[str, Any]:
    return {"file": frame.file, "line": frame.line, "function": frame.function, "code": frame.code}
