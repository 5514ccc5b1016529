"""On-demand windows: the trigger files `rankscope trigger` writes and the ranks answer.

::

    RUN_DIR/triggers/<id>.json                  a trigger: record steps start..start+steps-1 on ranks
    RUN_DIR/triggers/<id>/rank-00003.json       rank 3's answer: accepted (and its window) or declined

Files are the whole protocol: no collective, no daemon. A trigger names an absolute
start step, so every selected rank that sees it in time starts the same window at the
same step. Both files are written under a hidden temporary name and renamed into
place, so a reader never sees half of one, and never through a link below RUN_DIR
(see `_files`): a trigger id is a plain name. Imports no torch: the CLI uses it too.

SIGUSR2 (`trace.on_signal`) asks one process for a window on its next steps: a
`SignalHook` notes the signal, and the capture plans the window at its next step().
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import signal
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from .._log import get_logger
from ..config._config import TimerConfig, TraceConfig
from ..config._ranks import RankSet, parse_ranks
from ..rundir._files import open_folder, read_regular, write_atomic
from ..rundir._layout import (
    TRIGGER_SUFFIX,
    RunDir,
    ack_path,
    is_temp,
    step_window_name,
    trigger_path,
    trigger_tag,
)

__all__ = [
    "ID_ACCEPTED",
    "TRIGGER_VERSION",
    "SignalHook",
    "Trigger",
    "TriggerWatcher",
    "ack_path",
    "answered",
    "check_trigger_id",
    "config_in_meta",
    "install_signal_hook",
    "new_trigger_id",
    "parse_trigger",
    "rank_listens",
    "read_acks",
    "read_trigger",
    "trigger_dir",
    "trigger_path",
    "why_not_listening",
    "write_ack",
    "write_trigger",
]

logger = get_logger(__name__)

TRIGGER_VERSION = 1

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_ID_MAX = 128
ID_ACCEPTED = (
    f'a plain name: 1 to {_ID_MAX} ASCII letters, digits, "-", "_" or ".", starting with a '
    'letter or digit, without ".."'
)
_MAX_BYTES = 64 << 10  # a trigger is a few hundred bytes; anything far larger is not one
# A directory changed this recently may change again without its mtime moving (the
# filesystem's timestamp granularity, up to 2 s on some): scan it again next time.
_RACY_NS = 2_000_000_000
_O_DIRECTORY: int | None = getattr(os, "O_DIRECTORY", None)


def trigger_dir(run_dir: str | os.PathLike[str]) -> Path:
    """RUN_DIR/triggers, where triggers and the ranks' answers are."""
    return RunDir(run_dir).triggers_dir


# (what is wrong, what to say), in the order a reader would look.
_ID_RULES: tuple[tuple[Callable[[str], bool], str], ...] = (
    (lambda v: not v, "is empty"),
    (lambda v: "\0" in v, "holds a NUL"),
    (lambda v: "/" in v or "\\" in v, 'holds a "/" or "\\" (a path, not a name)'),
    (lambda v: ".." in v, 'holds ".."'),
    (lambda v: v.startswith("."), 'starts with "."'),
    (lambda v: len(v) > _ID_MAX, f"is longer than {_ID_MAX} characters"),
    (lambda v: not _ID.fullmatch(v), 'holds a character other than letters, digits, "-", "_", "."'),
)


def check_trigger_id(value: object) -> str | None:
    """What is wrong with `value` as a trigger id; None for a good one (see ID_ACCEPTED).

    An id names a file and a folder in RUN_DIR/triggers and ends the window's name, so
    it must be a plain name there: no "/", no "..", no leading ".", no NUL.
    """
    if not isinstance(value, str):
        return "is missing" if value is None else f"is a {type(value).__name__}, not a string"
    return next((why for bad, why in _ID_RULES if bad(value)), None)


def _trigger_id(name: str) -> str | None:
    """The id a trigger file's name gives; None for a name no trigger file has."""
    return name[: -len(TRIGGER_SUFFIX)] if name.endswith(TRIGGER_SUFFIX) else None


def why_not_listening(enable: object, target: object, every: object) -> str | None:
    """Why a rank with this trace config checks for no triggers; None when it checks.

    The one statement of which ranks listen, for the capture and for the CLI (which
    reads the values from each rank's meta file). Every rank listens, in trace.ranks
    or not: a trigger may name any rank.
    """
    if enable is not True:
        return "trace.enable is false"
    if target != "step":
        return f"trace.target is {target!r} (triggers record steps)"
    if not isinstance(every, int) or isinstance(every, bool) or every <= 0:
        return "trace.trigger_check_every_n_steps is 0"
    return None


_SECTIONS = {"trace": TraceConfig, "timer": TimerConfig}


def config_in_meta(meta: object, section: str) -> dict[str, Any]:
    """One section ("trace", "timer") of a rank's config as its meta file holds it, each
    field the file leaves out at the config's default: the job built its config through
    these dataclasses, so their defaults are the one statement of what it ran with."""
    config = meta.get("config") if isinstance(meta, dict) else None
    given = config.get(section) if isinstance(config, dict) else None
    defaults = dataclasses.asdict(_SECTIONS[section]())
    return {**defaults, **(given if isinstance(given, dict) else {})}


def rank_listens(meta: dict[str, Any] | None) -> str | None:
    """`why_not_listening` for a rank as its meta file (RUN_DIR/meta) describes it."""
    if meta is None:
        return "no meta file (the rank neither traces nor times, or has not started)"
    config = meta.get("config")
    if not isinstance(config, dict) or not isinstance(config.get("trace"), dict):
        return "its meta file holds no trace config"
    trace = config_in_meta(meta, "trace")
    every = trace["trigger_check_every_n_steps"]
    why = why_not_listening(trace["enable"], trace["target"], every)
    device = meta.get("device")
    if why is None and trace["tool"] == "nsys" and not str(device).startswith("cuda"):
        return f"trace.tool is 'nsys' and the rank has no CUDA device ({device})"
    return why


@dataclass(frozen=True, slots=True)
class Trigger:
    """A request to record steps start..start+steps-1 on the ranks `ranks` names."""

    id: str
    start: int
    steps: int
    ranks: str
    """A rank spec in canonical form ("all", "0-3,8")."""
    created: str | None = None
    """When it was written (UTC, ISO 8601); None in a hand-written file that omits it."""
    tag: str | None = None
    """What the window's name ends with, where not `trigger-<id>`: a peer asked by a slow
    rank (`capture/_pair.py`) records into that rank's window, `slow-<phase>`."""
    asked_by: int | None = None
    """The rank whose anomaly watch wrote this trigger for a peer; None for `rankscope trigger`."""

    def __post_init__(self) -> None:
        problem = check_trigger_id(self.id)
        if problem is not None:
            raise ConfigError("trigger id", self.id, ID_ACCEPTED, problem)
        # A tag ends a folder name, so it is held to the id's rules.
        problem = None if self.tag is None else check_trigger_id(self.tag)
        if problem is not None:
            raise ConfigError("trigger tag", self.tag, ID_ACCEPTED, problem)

    @property
    def last(self) -> int:
        return self.start + self.steps - 1

    @property
    def window(self) -> str:
        """The window directory the selected ranks write: step-AAAAAA-BBBBBB-trigger-<id>."""
        return step_window_name(self.start, self.last, self.window_tag)

    @property
    def window_tag(self) -> str:
        """What the window's name ends with: `tag`, else `trigger-<id>`."""
        return trigger_tag(self.id) if self.tag is None else self.tag

    @property
    def rank_set(self) -> RankSet:
        return parse_ranks(self.ranks, "ranks")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "v": TRIGGER_VERSION,
            "id": self.id,
            "start": self.start,
            "steps": self.steps,
            "ranks": self.ranks,
            "created": self.created,
        }
        if self.tag is not None:
            out["tag"] = self.tag
        if self.asked_by is not None:
            out["asked_by"] = self.asked_by
        return out


def new_trigger_id() -> str:
    """A name that sorts by creation time and does not collide: 20261123-113000-a1b2c3."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def parse_trigger(data: object, file_id: str | None = None) -> Trigger:
    """A Trigger from the JSON of a trigger file; ValueError says what is wrong.

    `file_id` is the id the file name gives, which the content must repeat.
    """

    def need_int(key: str, minimum: int) -> int:
        value = fields.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f'"{key}" is {value!r}; expected an int >= {minimum}')
        return value

    if not isinstance(data, dict):
        raise ValueError(f"not a JSON object but a {type(data).__name__}")
    fields: dict[str, Any] = data
    if fields.get("v") != TRIGGER_VERSION:
        raise ValueError(f'"v" is {fields.get("v")!r}; expected {TRIGGER_VERSION}')
    trigger_id = fields.get("id")
    problem = check_trigger_id(trigger_id)
    if problem is not None or not isinstance(trigger_id, str):
        raise ValueError(f'"id" is {trigger_id!r}, which {problem}; expected {ID_ACCEPTED}')
    if file_id is not None and trigger_id != file_id:
        raise ValueError(f'"id" is {trigger_id!r} but the file is named {file_id}{TRIGGER_SUFFIX}')
    start = need_int("start", 1)
    steps = need_int("steps", 1)
    try:
        ranks = parse_ranks(fields.get("ranks"), "ranks").spec()
    except ConfigError as exc:
        raise ValueError(f'"ranks": {exc}') from None
    created = fields.get("created")
    tag = fields.get("tag")
    problem = None if tag is None else check_trigger_id(tag)
    if problem is not None:
        raise ValueError(f'"tag" is {tag!r}, which {problem}; expected {ID_ACCEPTED}')
    asked_by = fields.get("asked_by")
    if asked_by is not None:
        asked_by = need_int("asked_by", 0)
    return Trigger(
        trigger_id,
        start,
        steps,
        ranks,
        created if isinstance(created, str) else None,
        tag,
        asked_by,
    )


def read_trigger(path: Path) -> Trigger:
    """Read and check one trigger file; ValueError (or OSError) says what is wrong.

    Only a regular file is read, and not through a link at its name.
    """
    raw = read_regular(path, _MAX_BYTES)
    if len(raw) > _MAX_BYTES:
        raise ValueError(f"larger than {_MAX_BYTES} bytes")
    try:
        data = json.loads(raw)
    except ValueError as exc:  # UnicodeDecodeError is a ValueError too
        raise ValueError(f"not valid JSON ({exc})") from None
    return parse_trigger(data, _trigger_id(path.name))


def _write_json(run_dir: str | os.PathLike[str], path: Path, data: dict[str, Any]) -> None:
    """Write `data` under a hidden temporary name and rename it into place, inside RUN_DIR."""
    text = json.dumps(data, indent=1) + "\n"
    write_atomic(run_dir, path, text.encode("utf-8"), str(os.getpid()))


def write_trigger(run_dir: str | os.PathLike[str], trigger: Trigger) -> Path:
    """Write RUN_DIR/triggers/<id>.json atomically; OSError propagates."""
    path = trigger_path(run_dir, trigger.id)
    _write_json(run_dir, path, trigger.to_dict())
    return path


def write_ack(
    run_dir: str | os.PathLike[str], trigger: Trigger, rank: int, answer: dict[str, Any]
) -> None:
    """Write (or replace) this rank's answer to `trigger`; OSError propagates, also when a
    link below RUN_DIR stands where the answer goes (nothing is written then)."""
    path = ack_path(run_dir, trigger.id, rank)
    data = {
        "v": TRIGGER_VERSION,
        "id": trigger.id,
        "rank": rank,
        **answer,
        "time_ns": time.time_ns(),
    }
    _write_json(run_dir, path, data)


def answered(run_dir: str | os.PathLike[str], trigger_id: str, rank: int) -> bool:
    """True when RUN_DIR/triggers/<id>/rank-NNNNN.json is a regular file in a real folder:
    a link at either is no answer (and the answer written in its place is refused)."""
    path = ack_path(run_dir, trigger_id, rank)
    try:
        folder, answer = os.lstat(path.parent), os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(folder.st_mode) and stat.S_ISREG(answer.st_mode)


def read_acks(run_dir: str | os.PathLike[str], trigger_id: str) -> dict[int, dict[str, Any]]:
    """The ranks' answers to one trigger, by rank; unreadable answers are left out."""
    out: dict[int, dict[str, Any]] = {}
    for answer in RunDir(run_dir).trigger_answers(trigger_id):
        try:
            data = json.loads(answer.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("rank") == answer.rank:
            out[answer.rank] = data
    return out


class TriggerWatcher:
    """Finds the triggers meant for one rank, cheaply enough to call every few steps.

    `poll()` costs one fstat of RUN_DIR/triggers, held open, while the directory is
    unchanged (half what a stat by path costs), and an access() check while it does
    not exist; only when its mtime moves does it list the directory and read the files
    it has not seen. Each trigger id is returned at most once, and not at all when this
    rank answered it before (an earlier run in the same directory). A file that is not
    a valid trigger, or not a regular file (a link is not followed), is warned about
    once (again only if it changes) and skipped. OSError from the directory propagates,
    also where RUN_DIR/triggers is a link: the caller decides what a fault turns off.
    `close()` lets go of the directory.
    """

    def __init__(self, run_dir: str, rank: int) -> None:
        self._run_dir = run_dir
        self._dir = trigger_dir(run_dir)
        self._path = str(self._dir)  # os functions take a str faster than a Path
        self._rank = rank
        self._fd: int | None = None  # RUN_DIR/triggers, open once it exists
        self._mtime: int | None = None
        self._seen: set[str] = set()
        self._bad: dict[str, tuple[int, int]] = {}  # file name -> (mtime_ns, size) warned about

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _folder_mtime(self) -> int | None:
        """RUN_DIR/triggers' mtime; None while it does not exist."""
        fd = self._fd
        if fd is not None:
            stat = os.fstat(fd)
            if stat.st_nlink > 0:
                return stat.st_mtime_ns
            self.close()  # removed since it was opened: look for a new one by its name
        path = self._path
        if not os.access(path, os.F_OK):
            return None  # the usual case, no one ever asked: cheaper than a stat that fails
        try:
            if _O_DIRECTORY is None:  # a platform that cannot open a directory
                return os.stat(path).st_mtime_ns
            # Not through a link: RUN_DIR/triggers must be a folder of the run directory.
            fd = open_folder(self._run_dir, self._dir, create=False).detach()
        except FileNotFoundError:
            return None
        self._fd = fd
        return os.fstat(fd).st_mtime_ns

    def poll(self) -> list[Trigger]:
        mtime = self._folder_mtime()
        if mtime is None:
            return []
        if mtime == self._mtime:
            return []
        now = time.time_ns()
        found = []
        with os.scandir(self._dir) as entries:
            for entry in entries:
                trigger = self._consider(entry)
                if trigger is not None:
                    found.append(trigger)
        self._mtime = mtime if now - mtime > _RACY_NS else None
        return sorted(found, key=lambda t: t.id)

    def _consider(self, entry: os.DirEntry[str]) -> Trigger | None:
        file_id = _trigger_id(entry.name)
        if file_id is None or is_temp(entry.name) or file_id in self._seen:
            return None  # a temporary name, an answers folder, a trigger seen before
        # Not a folder (an answers folder is named without ".json"); a link or another kind
        # of entry is read only to be refused, with its one warning (see read_trigger).
        trigger = None if entry.is_dir(follow_symlinks=False) else self._read(entry)
        if trigger is None:
            return None
        self._seen.add(file_id)
        if self._rank not in trigger.rank_set:
            return None
        if answered(self._run_dir, trigger.id, self._rank):
            return None  # answered before (an earlier run here): each trigger is honoured once
        return trigger

    def _read(self, entry: os.DirEntry[str]) -> Trigger | None:
        """The trigger in `entry`, or None: warned about once if it is not a valid one."""
        try:
            info = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            return None  # removed since the listing
        key = (info.st_mtime_ns, info.st_size)
        if self._bad.get(entry.name) == key:
            return None
        try:
            trigger = read_trigger(Path(entry.path))
        except FileNotFoundError:
            return None  # removed between the listing and the read
        except (OSError, ValueError) as exc:
            self._bad[entry.name] = key
            logger.warning(
                "rankscope: ignoring %s on rank %d: not a valid trigger file (%s)",
                entry.path,
                self._rank,
                exc,
            )
            return None
        self._bad.pop(entry.name, None)
        return trigger


class SignalHook:
    """The SIGUSR2 handler `trace.on_signal` installs: it notes the signal and nothing more.

    Python runs a handler on the main thread between two bytecodes, wherever the
    training loop happens to be, so this one sets `pending` and calls the handler that
    was installed before it (a Python callable; SIG_DFL, which would end the process,
    and SIG_IGN are not called): no I/O, no locks, no logging. The capture reads and
    clears `pending` at its next step(), which `wake` (set by the capture) makes sure
    happens. Once released, it only passes signals on.
    """

    __slots__ = ("pending", "previous", "released", "wake")

    def __init__(self, previous: Any) -> None:
        self.pending: bool = False
        self.wake: Any = None
        """Called with no argument when a signal is noted: the capture's next step() looks."""
        self.previous: Any = previous
        """What getsignal() returned before: a callable, SIG_DFL or SIG_IGN."""
        self.released: bool = False

    def __call__(self, signum: int, frame: Any) -> None:
        if not self.released:
            self.pending = True
            wake = self.wake
            if wake is not None:
                wake()
        previous = self.previous
        if callable(previous):
            previous(signum, frame)

    def release(self) -> bool:
        """Put back the handler installed before this one; False where another has replaced it since.

        A replaced hook stays in that handler's chain and only passes signals on. Hooks
        released earlier are skipped, so profilers stopped in any order leave the
        original handler in place. Raises ValueError off the main thread.
        """
        self.released = True
        number = signal.SIGUSR2
        before: Any = self.previous
        if signal.getsignal(number) is not self:
            return False
        while isinstance(before, SignalHook) and before.released:
            before = before.previous
        signal.signal(number, before)
        return True


def install_signal_hook(rank: int) -> SignalHook | None:
    """Install a SignalHook for SIGUSR2 in front of the current handler.

    None, with one warning saying why, on a thread other than the main thread (Python
    lets only that one set handlers), on a platform without SIGUSR2, or where SIGUSR2's
    handler was set outside Python (getsignal() cannot return it, so stop() could not
    put it back).
    """
    number = getattr(signal, "SIGUSR2", None)
    if number is None:
        why = "this platform has no SIGUSR2"
    elif threading.current_thread() is not threading.main_thread():
        why = (
            f"the profiler was started on thread {threading.current_thread().name!r}, and "
            "Python installs signal handlers from the main thread only"
        )
    else:
        previous = signal.getsignal(number)
        if previous is None:
            why = "SIGUSR2 has a handler installed outside Python, which could not be put back"
        else:
            hook = SignalHook(previous)
            try:
                signal.signal(number, hook)
            except (OSError, ValueError) as exc:
                why = f"installing a SIGUSR2 handler failed ({exc})"
            else:
                return hook
    logger.warning(
        "rankscope: trace.on_signal is set but %s; SIGUSR2 starts no window on rank %d "
        "(everything else works as configured)",
        why,
        rank,
    )
    return None
