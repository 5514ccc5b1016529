"""The hang analysis's findings as data: a stalled rank's finding, the report that holds
them, and the names of the roles and places a finding is given (analysis/hangs/_hangs.py
has the rules, _hang_words.py the sentences)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...config._config import HangConfig
from ..read._flight import FlightEntry, FlightFrame
from ..read._watch import Frame, HangFile, OpenPhase
from ._step_order import StepOrder

__all__ = [
    "EARLIEST",
    "FOR_ENDED",
    "FROM_DUMPS",
    "FROM_PG_CONFIG",
    "FROM_WATCHDOG",
    "HANGS_VERSION",
    "IN_COMM",
    "IN_PENDING",
    "IN_SYNC",
    "LATER_PHASE",
    "LATER_STEP",
    "NOT_ENTERED",
    "NS_PER_S",
    "STALL_FACTOR",
    "STALL_FLOOR_S",
    "STUCK",
    "WAITS",
    "CallMismatch",
    "GroupCollectives",
    "HangFinding",
    "HangReport",
]

HANGS_VERSION = 1


_DEFAULTS = HangConfig()


STALL_FACTOR = _DEFAULTS.factor
"""Median step times a rank may go unmoved (hang.factor), where its meta does not say..."""


STALL_FLOOR_S = _DEFAULTS.after_s
"""...and never less than this many seconds (hang.after_s)."""


NS_PER_S = 1_000_000_000
"""Nanoseconds a second: heartbeats and hang files are in epoch ns."""


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


IN_PENDING = "in a collective that a rank of its group never entered"


NOT_ENTERED = "never entered a collective its group waits in"


# How a process group's members are known (GroupCollectives.members_from).
FROM_WATCHDOG = "recorded"
"""rankscope's watchdog wrote them beside its dump, from torch's own table."""


FROM_PG_CONFIG = "dump"
"""The dump's pg_config (NCCL's dumps)."""


FROM_DUMPS = "inferred"
"""Neither says: the default group holds every rank, any other the ranks whose dumps name it."""


@dataclass(frozen=True, slots=True)
class CallMismatch:
    """One collective (by sequence number) called differently by the ranks: what differs
    ("ops", "dtypes" or "sizes") and which ranks called it each way."""

    seq: int
    what: str
    ways: dict[str, tuple[int, ...]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "what": self.what,
            "ways": [{"value": v, "ranks": list(r)} for v, r in self.ways.items()],
        }


@dataclass(frozen=True)
class GroupCollectives:
    """A process group's collectives as its members' Flight Recorder dumps show them
    (analysis/hangs/_flight.py has the rules)."""

    name: str
    """The group's name in the dumps ("0": the default group)."""
    desc: str
    ranks: tuple[int, ...]
    """Its members (global ranks), as `members_from` says they are known."""
    members_from: str
    dumped: tuple[int, ...]
    missing: tuple[int, ...]
    """Members with no dump: what they did is not known."""
    last_done: int | None
    """The last collective every dumped member completed (sequence number)."""
    last_done_op: str | None
    pending: int | None
    """The next, where some member entered it: the collective the group hangs in."""
    pending_op: str | None
    entered: tuple[int, ...]
    """Members that entered `pending` and wait in it."""
    absent: tuple[int, ...]
    """Dumped members that never entered `pending`."""
    last_entered: dict[int, int]
    """Of `absent`: the last collective each entered."""
    last_entered_op: dict[int, str | None]
    calls: dict[int, FlightEntry]
    """Of `entered`: each one's call of `pending`, where its ring buffer still holds it."""
    mismatches: tuple[CallMismatch, ...]
    p2p: int = 0
    """Sends and receives in the dumps, not matched."""

    @property
    def state(self) -> str:
        """ "waits" (some member never entered `pending`), "mismatched" (all entered, the
        calls differ), "stalled" (all entered, none of them differ), "unknown" (members
        without a dump may be the ones missing) or "done" (nothing pending)."""
        if self.pending is None:
            return "done"
        if self.absent:
            return "waits"
        if any(m.seq == self.pending for m in self.mismatches):
            return "mismatched"
        return "unknown" if self.missing else "stalled"

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.name,
            "desc": self.desc,
            "state": self.state,
            "ranks": list(self.ranks),
            "members_from": self.members_from,
            "dumped": list(self.dumped),
            "missing": list(self.missing),
            "last_completed": self.last_done,
            "last_completed_op": self.last_done_op,
            "pending": self.pending,
            "pending_op": self.pending_op,
            "entered": list(self.entered),
            "never_entered": [
                {"rank": r, "last": self.last_entered[r], "last_op": self.last_entered_op[r]}
                for r in self.absent
            ],
            "calls": {
                str(r): {
                    "op": e.op,
                    "input_sizes": [list(s) for s in e.input_sizes],
                    "input_dtypes": list(e.input_dtypes),
                    "frames": [_flight_frame_dict(f) for f in e.frames],
                }
                for r, e in sorted(self.calls.items())
            },
            "mismatches": [m.to_dict() for m in self.mismatches],
            "p2p_not_matched": self.p2p,
        }


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
    """Why it has its role: EARLIEST or NOT_ENTERED (stuck), IN_COMM, IN_SYNC, LATER_STEP,
    LATER_PHASE, IN_PENDING."""

    @property
    def phase(self) -> str | None:
        return self.open[-1].phase if self.open else None

    @property
    def kind(self) -> str | None:
        return self.open[-1].kind if self.open else None

    @property
    def for_s(self) -> float:
        return max(0, self.now_ns - self.since_ns) / NS_PER_S

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
            else round(max(0, self.now_ns - self.written_ns) / NS_PER_S, 3),
            "moved_ago_s": round(max(0, self.now_ns - self.moved_ns) / NS_PER_S, 3),
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
    collectives: list[GroupCollectives] = field(default_factory=list)
    """Per process group, what the ranks' Flight Recorder dumps say; empty without dumps."""
    dumps: dict[int, str] = field(default_factory=dict)
    """The Flight Recorder dumps read, by rank."""

    def groups(self, leave_out: set[int] | frozenset[int] = frozenset()) -> list[dict[str, Any]]:
        """The findings by (role, phase, kind, step): stuck first, then the largest;
        without the ranks in `leave_out`."""
        by_key: dict[tuple[str, str | None, str | None, int], list[HangFinding]] = {}
        for f in self.findings:
            if f.rank in leave_out:
                continue
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
            else round(max(0, self.now_ns - newest) / NS_PER_S, 3),
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
            "flight_recorder": {
                "dumps": {str(r): p for r, p in sorted(self.dumps.items())},
                "groups": [g.to_dict() for g in self.collectives],
            },
            "notes": self.notes,
            "skipped": self.skipped,
        }


def _epoch_s(ns: int) -> float:
    return round(ns / NS_PER_S, 3)


def _open_dict(phase: OpenPhase) -> dict[str, Any]:
    return {
        "phase": phase.phase,
        "kind": phase.kind,
        "since": _epoch_s(phase.since_ns),
        "depth": phase.depth,
    }


def _flight_frame_dict(frame: FlightFrame) -> dict[str, Any]:
    return {"file": frame.file, "line": frame.line, "function": frame.function}


def _frame_dict(frame: Frame) -> dict[str, Any]:
    return {"file": frame.file, "line": frame.line, "function": frame.function, "code": frame.code}
