"""On-demand windows: the trigger files `rankscope trigger` writes and the ranks answer.

::

    RUN_DIR/triggers/<id>.json                  a trigger: record steps start..start+steps-1 on ranks
    RUN_DIR/triggers/<id>/rank-00003.json       rank 3's answer: accepted (and its window) or declined

Files are the whole protocol: no collective, no daemon. A trigger names an absolute
start step, so every selected rank that sees it in time starts the same window at the
same step. Both files are written under a hidden temporary name and renamed into
place, so a reader never sees half of one. Imports no torch: the CLI uses it too.

SIGUSR2 (`trace.on_signal`) asks one process for a window on its next steps: a
`SignalHook` notes the signal, and the capture plans the window at its next step().
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from .._layout import (
    TRIGGER_SUFFIX,
    RunDir,
    ack_path,
    is_temp,
    step_window_name,
    temp_name,
    trigger_path,
    trigger_tag,
)
from .._ranks import RankSet, parse_ranks

__all__ = [
    "TRIGGER_VERSION",
    "SignalHook",
    "Trigger",
    "TriggerWatcher",
    "ack_path",
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

logger = logging.getLogger(__name__)

TRIGGER_VERSION = 1

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_MAX_BYTES = 64 << 10  # a trigger is a few hundred bytes; anything far larger is not one
# A directory changed this recently may change again without its mtime moving (the
# filesystem's timestamp granularity, up to 2 s on some): scan it again next time.
_RACY_NS = 2_000_000_000
_O_DIRECTORY: int | None = getattr(os, "O_DIRECTORY", None)


def trigger_dir(run_dir: str | os.PathLike[str]) -> Path:
    """RUN_DIR/triggers, where triggers and the ranks' answers are."""
    return RunDir(run_dir).triggers_dir


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


def rank_listens(meta: dict[str, Any] | None) -> str | None:
    """`why_not_listening` for a rank as its meta file (RUN_DIR/meta) describes it."""
    if meta is None:
        return "no meta file (the rank neither traces nor times, or has not started)"
    config = meta.get("config")
    trace = config.get("trace") if isinstance(config, dict) else None
    if not isinstance(trace, dict):
        return "its meta file holds no trace config"
    every = trace.get("trigger_check_every_n_steps", 0)
    why = why_not_listening(trace.get("enable"), trace.get("target"), every)
    device = meta.get("device")
    if why is None and trace.get("tool") == "nsys" and not str(device).startswith("cuda"):
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

    @property
    def last(self) -> int:
        return self.start + self.steps - 1

    @property
    def window(self) -> str:
        """The window directory the selected ranks write: step-AAAAAA-BBBBBB-trigger-<id>."""
        return step_window_name(self.start, self.last, trigger_tag(self.id))

    @property
    def rank_set(self) -> RankSet:
        return parse_ranks(self.ranks, "ranks")

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": TRIGGER_VERSION,
            "id": self.id,
            "start": self.start,
            "steps": self.steps,
            "ranks": self.ranks,
            "created": self.created,
        }


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
    if not isinstance(trigger_id, str) or not _ID.fullmatch(trigger_id):
        raise ValueError(f'"id" is {trigger_id!r}; expected letters, digits, "-", "_" or "."')
    if file_id is not None and trigger_id != file_id:
        raise ValueError(f'"id" is {trigger_id!r} but the file is named {file_id}{TRIGGER_SUFFIX}')
    start = need_int("start", 1)
    steps = need_int("steps", 1)
    try:
        ranks = parse_ranks(fields.get("ranks"), "ranks").spec()
    except ConfigError as exc:
        raise ValueError(f'"ranks": {exc}') from None
    created = fields.get("created")
    return Trigger(trigger_id, start, steps, ranks, created if isinstance(created, str) else None)


def read_trigger(path: Path) -> Trigger:
    """Read and check one trigger file; ValueError (or OSError) says what is wrong."""
    with open(path, "rb") as fh:
        raw = fh.read(_MAX_BYTES + 1)
    if len(raw) > _MAX_BYTES:
        raise ValueError(f"larger than {_MAX_BYTES} bytes")
    try:
        data = json.loads(raw)
    except ValueError as exc:  # UnicodeDecodeError is a ValueError too
        raise ValueError(f"not valid JSON ({exc})") from None
    return parse_trigger(data, _trigger_id(path.name))


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Write `data` under a hidden temporary name and rename it into place."""
    tmp = temp_name(path, str(os.getpid()))
    try:
        tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_trigger(run_dir: str | os.PathLike[str], trigger: Trigger) -> Path:
    """Write RUN_DIR/triggers/<id>.json atomically; OSError propagates."""
    path = trigger_path(run_dir, trigger.id)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_json(path, trigger.to_dict())
    return path


def write_ack(
    run_dir: str | os.PathLike[str], trigger: Trigger, rank: int, answer: dict[str, Any]
) -> None:
    """Write (or replace) this rank's answer to `trigger`; OSError propagates."""
    path = ack_path(run_dir, trigger.id, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "v": TRIGGER_VERSION,
        "id": trigger.id,
        "rank": rank,
        **answer,
        "time_ns": time.time_ns(),
    }
    _write_json(path, data)


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
    a valid trigger is warned about once (again only if it changes) and skipped.
    OSError from the directory propagates: the caller decides what a fault turns off.
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
            fd = os.open(path, os.O_RDONLY | _O_DIRECTORY)
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
        trigger = self._read(entry) if entry.is_file() else None
        if trigger is None:
            return None
        self._seen.add(file_id)
        if self._rank not in trigger.rank_set:
            return None
        if ack_path(self._run_dir, trigger.id, self._rank).exists():
            return None  # answered before (an earlier run here): each trigger is honoured once
        return trigger

    def _read(self, entry: os.DirEntry[str]) -> Trigger | None:
        """The trigger in `entry`, or None: warned about once if it is not a valid one."""
        stat = entry.stat()
        key = (stat.st_mtime_ns, stat.st_size)
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
