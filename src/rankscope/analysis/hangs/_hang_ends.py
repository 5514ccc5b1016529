"""Ranks that ended without stop(): a process that is gone, and where it was last seen.

A rank whose heartbeat says "running" while its process no longer exists did not hang:
it was killed, crashed, or its job ended with a write failing (a full disk) before its
last heartbeat. Where it was last seen is the latest of its heartbeat and its timings:
the heartbeat is written every few seconds (hang.heartbeat_s) and may be many steps
behind, while the timer's records reach the last sampled step written. A process is
known gone only on the host that reads the run (the heartbeat names the host and the
pid); on another host it is not known, and the rank is judged by its heartbeat alone.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from ..._text import format_ranks, number_ranges, printable
from ..read._watch import Heartbeat

__all__ = ["behind_note", "ended_words", "last_seen", "process_gone", "stopped_words"]

_BEHIND = 2
"""Steps a heartbeat may trail the timings by before that is said: one written every
few seconds trails by a step or two on a slow loop."""


def process_gone(beat: Heartbeat, host: str | None = None) -> bool:
    """Whether the heartbeat's process is known to be gone: it ran on this host (or
    `host`) and no process has its pid. False where that is not known."""
    here = socket.gethostname() if host is None else host
    if beat.pid is None or beat.pid <= 0 or beat.host != here:
        return False
    try:
        os.kill(beat.pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process, or no right to ask: not known to be gone
        return False
    return False


def last_seen(beat: Heartbeat, timed: Mapping[int, int]) -> int:
    """The latest step a rank is seen at: its heartbeat's, or its timings' last record."""
    return max(beat.step, timed.get(beat.rank, beat.step))


def ended_words(gone: Mapping[int, int]) -> str:
    """`rank 1 ended at step 79 without stop(): its process is gone`, grouped by step."""
    by_step: dict[int, list[int]] = {}
    for rank, step in sorted(gone.items()):
        by_step.setdefault(step, []).append(rank)
    parts = []
    for step, ranks in sorted(by_step.items()):
        their = "its process is" if len(ranks) == 1 else "their processes are"
        parts.append(f"{format_ranks(ranks)} ended at step {step} without stop(): {their} gone")
    return "; ".join(parts)


def behind_note(beats: Mapping[int, Heartbeat], timed: Mapping[int, int]) -> str | None:
    """Where heartbeats stop well before the timings do, say so: a heartbeat that could
    not be written (a full disk) leaves the rank looking stalled at an old step."""
    behind = {r: b.step for r, b in beats.items() if timed.get(r, b.step) - b.step > _BEHIND}
    if not behind:
        return None
    steps = sorted(set(behind.values()))
    reach = sorted({timed[r] for r in behind})
    one = len(behind) == 1
    return (
        f"the heartbeat{'' if one else 's'} of {format_ranks(sorted(behind))} stop"
        f"{'s' if one else ''} at step {number_ranges(steps)} while {'its' if one else 'their'} "
        f"timings reach step {number_ranges(reach)}: where {'it was' if one else 'they were'} last seen is taken from the timings (a heartbeat is written every "
        "few seconds, hang.heartbeat_s; one far behind may be one that could not be "
        "written, as on a full disk: the job's log says which write failed)"
    )


def stopped_words(stopped: list[int], errors: Mapping[int, str]) -> str:
    """`; ranks 0, 2 stopped on an error (RuntimeError: ...)`, and those that stopped
    cleanly; nothing where none stopped."""
    out = []
    by_error: dict[str, list[int]] = {}
    for rank, error in sorted(errors.items()):
        # By the error's type: its text names ports and paths that differ rank to rank.
        kind = error.split(":", 1)[0].strip() or "an error"
        by_error.setdefault(printable(kind)[:60], []).append(rank)
    for error, ranks in by_error.items():
        out.append(f"{format_ranks(ranks)} stopped on an error ({error}; --json has its text)")
    clean = [r for r in stopped if r not in errors]
    if clean:
        out.append(f"{format_ranks(clean)} stopped cleanly")
    return "".join(f"; {part}" for part in out)
