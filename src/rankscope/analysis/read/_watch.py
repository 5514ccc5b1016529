"""The watch layer's files: each rank's heartbeat (RUN_DIR/live) and the hang files its
watchdog wrote (RUN_DIR/hangs/<stall>), read and checked field by field.

Every file is untrusted: only regular files are opened (RunDir lists no other), a file
larger than any the capture writes is not read, and a field of the wrong type or out
of range (a string for a step, NaN, a number of 400 digits, a negative time) makes the
file skipped with the field named. Unknown fields are ignored. Two files that claim one
rank (`rank-3.json` beside `rank-00003.json`) are both skipped: neither is trusted over
the other.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..._errors import TraceError
from ..._text import shown
from ...rundir._files import is_plain_name
from ...rundir._listing import RankFile, RunDir, open_regular
from ._fields import MAX_NS as _MAX_NS
from ._fields import MAX_STEP as _MAX_STEP
from ._fields import Bad as _Bad
from ._fields import boolean as _bool
from ._fields import entry as _entry
from ._fields import integer as _int
from ._fields import listed as _list
from ._fields import must as _must
from ._fields import name as _name
from ._fields import no_constant as _no_constant
from ._fields import ns as _ns
from ._fields import seconds as _seconds
from ._fields import step as _step
from ._fields import text as _text

__all__ = [
    "FRAMES_KEPT",
    "Frame",
    "HangFile",
    "Heartbeat",
    "OpenPhase",
    "ProcessGroup",
    "WatchFiles",
    "read_watch",
]

_VERSIONS = (1,)
_HEARTBEAT_MAX = 1 << 20
"""A heartbeat is a few hundred bytes; one past 1 MiB is not one."""
_HANG_MAX = 64 << 20
"""A hang file holds every thread's stack: megabytes at most."""
_MAX_CODE = 1 << 16
_MAX_OPEN = 1024
"""Open phases nest; more than this many at once is not a training loop."""
_MAX_GROUPS = 4096
"""Process groups a hang file lists at most (the watchdog's own limit)."""
FRAMES_KEPT = 12
"""The innermost frames kept of a hang file's training thread."""


@dataclass(frozen=True, slots=True)
class OpenPhase:
    """A phase a rank was inside: entered at `since_ns` (epoch ns), at nesting `depth`."""

    phase: str
    kind: str
    since_ns: int
    depth: int


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame of a thread's stack, as the watchdog saw it."""

    file: str
    line: int | None
    function: str
    code: str | None


@dataclass(frozen=True, slots=True)
class ProcessGroup:
    """A process group a rank was in when its watchdog declared a hang."""

    name: str
    """As torch's Flight Recorder names it ("0": the default group)."""
    desc: str
    ranks: tuple[int, ...]
    """Its global ranks."""
    backend: str | None


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A rank's heartbeat (RUN_DIR/live/rank-NNNNN.json), checked."""

    path: Path
    rank: int
    host: str | None
    pid: int | None
    attempt: str
    written_ns: int
    moved_ns: int
    step: int
    step_started_ns: int | None
    median_step_s: float | None
    open: tuple[OpenPhase, ...]
    """Outermost first."""
    stopped: bool
    """The rank's stop() ran: a clean end."""
    stopped_ns: int | None
    hang: str | None
    """The stall folder while the rank's watchdog sees a stall."""
    threshold_s: float | None = None
    """The watchdog's threshold, where the heartbeat states it (optional)."""
    started_ns: int | None = None
    """When this attempt started, where the heartbeat states it (optional)."""
    error: str | None = None
    """The error its training loop left on, where its last heartbeat says (optional)."""


@dataclass(frozen=True, slots=True)
class HangFile:
    """What a rank's watchdog wrote when its steps stopped (RUN_DIR/hangs/<stall>/rank-NNNNN.json)."""

    path: Path
    stall: str
    """The folder that holds it (`step-012034`)."""
    rank: int
    host: str | None
    pid: int | None
    attempt: str
    step: int
    last_completed_step: int | None
    step_started_ns: int | None
    detected_ns: int
    threshold_s: float
    median_step_s: float | None
    open: tuple[OpenPhase, ...]
    thread: str | None
    """The name of the thread whose frames are kept: the training thread."""
    frames: tuple[Frame, ...]
    """That thread's innermost `FRAMES_KEPT` frames, outermost first."""
    threads: int
    flight_recorder: str | None
    """The path of torch's Flight Recorder dump beside this file, where one was saved."""
    flight_recorder_skipped: str | None
    """Why none was saved, where the file says."""
    process_groups: tuple[ProcessGroup, ...]
    """The process groups the rank was in (empty where the file does not say)."""
    ended_ns: int | None
    stalled_s: float | None


@dataclass
class WatchFiles:
    """Every heartbeat and hang file that passed its checks, and what did not."""

    heartbeats: dict[int, Heartbeat] = field(default_factory=dict)
    hangs: list[HangFile] = field(default_factory=list)
    listed: int = 0
    """Heartbeat and hang file names found, read or not (those that are no regular file too)."""
    skipped: list[str] = field(default_factory=list)


def read_watch(run_dir: str | os.PathLike[str]) -> WatchFiles:
    """Read RUN_DIR/live and RUN_DIR/hangs; what cannot be used is said in `skipped`."""
    run = RunDir(run_dir)
    out = WatchFiles()
    beats = run.heartbeats()
    hangs = run.hangs()
    out.listed = len(beats) + len(hangs)
    for found in _unclaimed(beats, out.skipped):
        beat = _read(found, _HEARTBEAT_MAX, _heartbeat, out.skipped)
        if beat is not None:
            out.heartbeats[found.rank] = beat
    for found in _unclaimed(hangs, out.skipped):
        hang = _read(found, _HANG_MAX, _hang, out.skipped)
        if hang is not None:
            out.hangs.append(hang)
    out.skipped.extend(run.left_out)  # a FIFO or a folder under a heartbeat's name
    out.listed += len(run.left_out)
    return out


def _unclaimed(files: list[RankFile], skipped: list[str]) -> Iterable[RankFile]:
    """`files` less those whose rank (in one folder) another file claims too."""
    claims: dict[tuple[str | None, int], list[RankFile]] = {}
    for found in files:
        claims.setdefault((found.folder, found.rank), []).append(found)
    for (_, rank), group in claims.items():
        if len(group) == 1:
            yield group[0]
        else:
            names = ", ".join(str(f.path) for f in group)
            skipped.append(f"{names}: rank {rank} is claimed by {len(group)} files; none is used")


def _read(found: RankFile, limit: int, check: Any, skipped: list[str]) -> Any:
    path = found.path
    what = "heartbeat" if check is _heartbeat else "hang file"
    try:
        with open_regular(path) as fh:
            raw = fh.read(limit + 1)
        if len(raw) > limit:
            raise _Bad(f"over {limit} bytes, larger than any {what} rankscope writes")
        data = json.loads(raw, parse_constant=_no_constant)
    except TraceError as exc:  # not a regular file after all (replaced since listed)
        skipped.append(str(exc))
        return None
    except _Bad as exc:
        skipped.append(f"{path}: not a {what} ({exc})")
        return None
    except (OSError, ValueError, RecursionError) as exc:
        skipped.append(f"{path}: not a readable {what} ({type(exc).__name__}: {exc})")
        return None
    try:
        if not isinstance(data, dict):
            raise _Bad(f"a JSON {type(data).__name__}, not an object")
        version = data.get("v")
        if version not in _VERSIONS:
            if isinstance(version, int) and not isinstance(version, bool):
                skipped.append(
                    f"{path}: {what} schema version {shown(version)} left out (this rankscope "
                    f"reads version {', '.join(map(str, _VERSIONS))}; a newer rankscope wrote it?)"
                )
                return None
            raise _Bad(f"v is {shown(version)}, expected a schema version")
        if _int(data, "rank", hi=_MAX_STEP) != found.rank:
            raise _Bad(f"rank is {shown(data.get('rank'))} in a file named for rank {found.rank}")
        return check(data, found)
    except _Bad as exc:
        skipped.append(f"{path}: not a {what} ({exc})")
        return None


def _heartbeat(data: dict[str, Any], found: RankFile) -> Heartbeat:
    state = data.get("state")
    if state not in ("running", "stopped"):
        raise _Bad(f'state is {shown(state)}, expected "running" or "stopped"')
    return Heartbeat(
        path=found.path,
        rank=found.rank,
        host=_text(data, "host", null=True),
        pid=_int(data, "pid", hi=_MAX_NS, null=True, optional=True),
        attempt=_name(data, "attempt"),
        written_ns=_must(_ns(data, "written_ns")),
        moved_ns=_must(_ns(data, "moved_ns")),
        step=_must(_step(data, "step")),
        step_started_ns=_ns(data, "step_started_ns", null=True),
        median_step_s=_seconds(data, "median_step_s", null=True),
        open=_open(data),
        stopped=state == "stopped",
        stopped_ns=_ns(data, "stopped_ns", null=True, optional=True),
        hang=_text(data, "hang", null=True, optional=True),
        threshold_s=_seconds(data, "threshold_s", null=True, optional=True, positive=True),
        started_ns=_ns(data, "started_ns", null=True, optional=True),
        error=_text(data, "error", null=True, optional=True),
    )


def _hang(data: dict[str, Any], found: RankFile) -> HangFile:
    thread, frames, count = _training_thread(data)
    recorder, recorder_skipped = _flight_recorder(data, found.path)
    return HangFile(
        path=found.path,
        stall=found.folder or "",
        rank=found.rank,
        host=_text(data, "host", null=True, optional=True),
        pid=_int(data, "pid", hi=_MAX_NS, null=True, optional=True),
        attempt=_name(data, "attempt"),
        step=_must(_step(data, "step")),
        last_completed_step=_step(data, "last_completed_step", null=True, optional=True),
        step_started_ns=_ns(data, "step_started_ns", null=True, optional=True),
        detected_ns=_must(_ns(data, "detected_ns")),
        threshold_s=_must(_seconds(data, "threshold_s", positive=True)),
        median_step_s=_seconds(data, "median_step_s", null=True, optional=True),
        open=_open(data),
        thread=thread,
        frames=frames,
        threads=count,
        flight_recorder=recorder,
        flight_recorder_skipped=recorder_skipped,
        process_groups=_process_groups(data),
        ended_ns=_ns(data, "ended_ns", null=True, optional=True),
        stalled_s=_seconds(data, "stalled_s", null=True, optional=True),
    )


# -- fields ------------------------------------------------------------------------------


def _open(data: dict[str, Any]) -> tuple[OpenPhase, ...]:
    out = []
    for i, item in enumerate(_list(data, "open", _MAX_OPEN)):
        entry = _entry(item, f"open[{i}]")
        try:
            out.append(
                OpenPhase(
                    phase=_name(entry, "phase"),
                    kind=_name(entry, "kind"),
                    since_ns=_must(_ns(entry, "since_ns")),
                    depth=_int(entry, "depth", hi=_MAX_OPEN, optional=True) or 0,
                )
            )
            _seconds(entry, "open_s", null=True, optional=True)
        except _Bad as exc:
            raise _Bad(f"open[{i}]: {exc}") from None
    return tuple(out)


def _training_thread(data: dict[str, Any]) -> tuple[str | None, tuple[Frame, ...], int]:
    """(name, innermost frames, thread count) of the thread that runs the training loop:
    the one marked `training`, else MainThread, else the first.

    Every thread's name, flags and stack are checked to be what they say; the frames
    are checked where they are used, the kept ones of the chosen thread. The others are
    never shown, and checking each frame of each thread of 4096 ranks would cost seconds.
    """
    threads = _list(data, "threads", 1 << 20)
    checked: list[tuple[str, bool, list[Any]]] = []
    for i, item in enumerate(threads):
        entry = _entry(item, f"threads[{i}]")
        try:
            name = _text(entry, "name", null=True, optional=True) or ""
            _int(entry, "ident", hi=(1 << 64) - 1, null=True, optional=True)
            training = _bool(entry, "training") is True
            _bool(entry, "daemon", null=True)  # null: a thread threading does not know
            stack = _list(entry, "stack", 1 << 20)
        except _Bad as exc:
            raise _Bad(f"threads[{i}]: {exc}") from None
        checked.append((name, training, stack))
    if not checked:
        return None, (), 0
    chosen = next(
        (i for i, t in enumerate(checked) if t[1]),
        next((i for i, t in enumerate(checked) if t[0] == "MainThread"), 0),
    )
    name, _, stack = checked[chosen]
    first = max(0, len(stack) - FRAMES_KEPT)
    try:
        frames = tuple(
            _frame(_entry(frame, f"stack[{first + j}]"), first + j)
            for j, frame in enumerate(stack[first:])
        )
    except _Bad as exc:
        raise _Bad(f"threads[{chosen}]: {exc}") from None
    return name or None, frames, len(checked)


def _frame(entry: dict[str, Any], index: int) -> Frame:
    try:
        return Frame(
            file=_text(entry, "file") or "",
            line=_int(entry, "line", hi=1 << 31, null=True, optional=True),
            function=_text(entry, "function") or "",
            code=_text(entry, "code", null=True, optional=True, limit=_MAX_CODE),
        )
    except _Bad as exc:
        raise _Bad(f"stack[{index}]: {exc}") from None


def _flight_recorder(data: dict[str, Any], path: Path) -> tuple[str | None, str | None]:
    """(the dump's path, why there is none)."""
    value = data.get("flight_recorder")
    if value is None:
        return None, None
    entry = _entry(value, "flight_recorder")
    if "path" in entry:
        name = _text(entry, "path")
        # A name beside the hang file, never a path that leads elsewhere.
        if name is None or not is_plain_name(name):
            raise _Bad(f"flight_recorder.path is {shown(name)}, expected a file name beside it")
        return str(path.with_name(name)), None
    return None, _text(entry, "skipped", null=True, optional=True)


def _process_groups(data: dict[str, Any]) -> tuple[ProcessGroup, ...]:
    out = []
    for i, item in enumerate(_list(data, "process_groups", _MAX_GROUPS, optional=True)):
        entry = _entry(item, f"process_groups[{i}]")
        try:
            ranks = _list(entry, "ranks", 1 << 24)
            out.append(
                ProcessGroup(
                    name=_text(entry, "name") or "",
                    desc=_text(entry, "desc", null=True, optional=True) or "",
                    ranks=tuple(_must(_int({"rank": r}, "rank", hi=_MAX_STEP)) for r in ranks),
                    backend=_text(entry, "backend", null=True, optional=True),
                )
            )
        except _Bad as exc:
            raise _Bad(f"process_groups[{i}]: {exc}") from None
    return tuple(out)
