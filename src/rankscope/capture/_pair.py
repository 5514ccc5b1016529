"""A healthy peer for a slow rank's window: the same steps, recorded on a rank that is not slow.

When a rank's anomaly detector fires, it picks one peer from what the run directory says
of the other ranks (meta files, heartbeats, auto records) and writes that peer a trigger
(`_trigger.py`) for steps far enough ahead that the peer, which looks for triggers every
trace.trigger_check_every_n_steps, reaches them after reading it. The peer records them
into the slow rank's window, so the analysis compares the two traces step for step. No
collective: a file, as `rankscope trigger` writes one.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._text import format_ranks
from ..rundir._files import read_json_object, read_regular
from ..rundir._layout import auto_path, live_path, meta_path
from ..rundir._listing import RunDir
from ..rundir._trigger import Trigger, config_in_meta, rank_listens, write_trigger

__all__ = ["CANDIDATES", "Peer", "ask_peer", "choose_peer", "peer_trigger_id"]

CANDIDATES = 64
"""Ranks read to choose from, the nearest in number (a host's ranks, and a tensor- or
pipeline-parallel group's, are numbered together). On a busy 2-core machine, choosing
among all of 1024 ranks took 340 ms (their meta files and heartbeats read), among the
nearest 64 of them 35 ms, once per firing."""

_MAX_BYTES = 1 << 20  # a meta file or heartbeat is a few kB; anything far larger is not one
# Steps past the peer's next trigger check: the check's own step, the warm-up step before
# the window, and one for the peer having run ahead since its heartbeat was written.
_MARGIN = 3


@dataclass(frozen=True, slots=True)
class Peer:
    """The rank asked to record the slow rank's steps, or None with why no rank was."""

    rank: int | None
    why: str
    """Why this rank ("same host h1, same pipeline_stage=3, ..."), or why none."""
    lead: int = 0
    """How many steps past the current one the pair's window must begin for the peer to see
    its trigger in time."""

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "why": self.why}


def choose_peer(run_dir: str, rank: int, step: int) -> Peer:
    """The peer for `rank`, slow at `step`: one that listens for triggers and is not itself
    slow (no window of its own in auto/, no stall or stop in its heartbeat); among those,
    the one sharing most of `Profiler(groups=...)`, then the same host, then the nearest rank.

    Only the CANDIDATES ranks nearest in number are read: this runs on the training thread.
    """
    layout = RunDir(run_dir)
    near = sorted((f for f in layout.meta() if f.rank != rank), key=lambda f: abs(f.rank - rank))
    near = near[:CANDIDATES]
    metas = {f.rank: read_json_object(f.path, _MAX_BYTES) for f in near}
    beats = {f.rank: read_json_object(live_path(run_dir, f.rank), _MAX_BYTES) for f in near}
    fired = {f.rank for f in near if _holds_a_line(auto_path(run_dir, f.rank))}
    mine = read_json_object(meta_path(run_dir, rank), _MAX_BYTES) or {}
    host = mine.get("host")
    groups = _groups(mine)
    passed: dict[str, list[int]] = {}
    best: tuple[tuple[int, int, int, int], int, list[str], int] | None = None
    for other, meta in sorted(metas.items()):
        beat = beats.get(other)
        problem = _why_not(meta, beat, mine, other in fired)
        if problem is not None or meta is None:
            passed.setdefault(problem or "", []).append(other)
            continue
        theirs = _groups(meta)
        shared = [f"{k}={v}" for k, v in groups.items() if theirs.get(k) == v]
        same_host = host is not None and meta.get("host") == host
        reasons = [f"same {g}" for g in shared]
        if same_host:
            reasons.append(f"same host {host}")
        peer_step = beat.get("step") if beat is not None else None
        if isinstance(peer_step, int) and not isinstance(peer_step, bool):
            reasons.append(
                f"not slow (no slow window of its own; its last heartbeat, written every "
                f"hang.heartbeat_s when its step changes, said step {peer_step})"
            )
        else:
            reasons.append("not slow (no slow window of its own)")
            peer_step = step
        every = int(config_in_meta(meta, "trace")["trigger_check_every_n_steps"])
        lead = every + max(0, peer_step - step) + _MARGIN
        key = (-len(shared), 0 if same_host else 1, abs(other - rank), other)
        if best is None or key < best[0]:
            best = (key, other, reasons, lead)
    if best is not None:
        _, other, reasons, lead = best
        return Peer(other, ", ".join(reasons), lead)
    if not passed:
        return Peer(None, "no other rank has a meta file in this run directory")
    said = "; ".join(f"{format_ranks(r)}: {why}" for why, r in passed.items())
    return Peer(None, f"no rank can be asked ({said})")


def _why_not(  # noqa: PLR0911 - a return per check
    meta: dict[str, Any] | None, beat: dict[str, Any] | None, mine: dict[str, Any], fired: bool
) -> str | None:
    """Why a rank cannot be the peer; None when it can."""
    if meta is None:
        return "its meta file cannot be read"
    ours, theirs = _rendezvous(mine), _rendezvous(meta)
    if ours is not None and theirs is not None and ours != theirs:
        return "another job's (another rendezvous)"
    unheard = rank_listens(meta)
    if unheard is not None:
        return f"checks for no triggers ({unheard})"
    if fired:
        return "slow itself (it asked for a window of its own)"
    if beat is not None:
        if beat.get("hang"):
            return "stalled (its heartbeat names a hang)"
        if beat.get("state") == "stopped":
            return "stopped"
    return None


def _groups(meta: dict[str, Any]) -> dict[str, Any]:
    groups = meta.get("groups")
    return groups if isinstance(groups, dict) else {}


def _rendezvous(meta: dict[str, Any]) -> object:
    attempt = meta.get("attempt")
    return attempt.get("rendezvous") if isinstance(attempt, dict) else None


def peer_trigger_id(rank: int, capture: int) -> str:
    """A fresh id for the trigger of `rank`'s `capture`-th slow window: a peer never takes it
    for a trigger it answered in an earlier run in the same directory."""
    return f"auto-rank{rank}-{capture}-{secrets.token_hex(3)}"


def ask_peer(
    run_dir: str, trigger_id: str, *, rank: int, peer: int, tag: str, first: int, steps: int
) -> Trigger:
    """Write the trigger that asks `peer` for steps first..first+steps-1 into `rank`'s window
    (`tag`); OSError propagates."""
    trigger = Trigger(trigger_id, first, steps, str(peer), None, tag, rank)
    write_trigger(run_dir, trigger)
    return trigger


def _holds_a_line(path: Path) -> bool:
    try:
        return bool(read_regular(path, 1).strip())
    except OSError:
        return False
