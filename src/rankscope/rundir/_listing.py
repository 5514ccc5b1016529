"""Reading a run directory: which files it holds, each kind with its rank (`RunDir`),
the runs under a folder, the traces under a path, and opening one of its files without
following a link or reading a device. The names themselves are _layout.py's.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .._errors import TraceError
from ._layout import (
    ACK_SUFFIX,
    AUTO,
    AUTO_SUFFIX,
    HANG_SUFFIX,
    HANGS,
    HEALTH,
    HEALTH_SUFFIX,
    LIVE,
    LIVE_SUFFIX,
    MEMORY,
    MEMORY_SUFFIX,
    META,
    META_SUFFIX,
    NSYS,
    NSYS_SUFFIX,
    RANK_PREFIX,
    REPORT,
    SUMMARY_SUFFIX,
    TEMP_SUFFIX,
    TIMINGS,
    TIMINGS_SUFFIX,
    TRACES,
    TRIGGER_SUFFIX,
    TRIGGERS,
    is_temp,
    is_trace_name,
    rank_of_file,
    window_key,
)

__all__ = [
    "RankFile",
    "RunDir",
    "TraceFile",
    "is_run_dir",
    "is_window_folder",
    "leftovers",
    "not_regular",
    "open_regular",
    "runs_in",
    "traces_under",
]


@dataclass(frozen=True, slots=True)
class RankFile:
    """A file rankscope wrote into the run directory, and the rank its name gives."""

    rank: int
    path: Path
    folder: str | None = None
    """The window (nsys, memory, summaries) or trigger id (answers) whose folder holds it."""


@dataclass(frozen=True, slots=True)
class TraceFile:
    """A trace under RUN_DIR/traces: capture's own, or one a user put there."""

    rank: int | None
    """From its name (`rank_of_file`); None for a name that gives none."""
    path: Path
    window: str
    """The folder that holds it."""


class _Listing:
    """Folders of one run directory listed safely: regular files only (links to them
    too), hidden names never, sorted; what is passed over is noted with why."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.left_out: dict[Path, str] = {}

    def note(self, path: Path, why: str) -> None:
        self.left_out.setdefault(path, why)

    def entries(self, folder: Path) -> list[Path]:
        """Every listed entry of `folder` (files and folders)."""
        return _entries(folder, self.note)

    def regular(self, path: Path) -> bool:
        """True for a regular file (or a link to one); anything else is noted."""
        why = not_regular(path)
        if why is not None:
            self.note(path, why)
        return why is None

    def files(self, folder: Path, wanted: Callable[[str], bool]) -> list[Path]:
        """The regular files in `folder` whose name is `wanted`."""
        return [p for p in self.entries(folder) if wanted(p.name) and self.regular(p)]

    def ranked(self, folder: Path, suffix: str, within: str | None = None) -> list[RankFile]:
        """The regular files in `folder` named rank-NNNNN`suffix`, with their rank."""
        out = []
        for path in self.entries(folder):
            rank = rank_of_file(path.name, suffix)
            if rank is not None and self.regular(path):
                out.append(RankFile(rank, path, within))
        return out

    def in_windows(self, top: str, suffix: str, only: str | None = None) -> list[RankFile]:
        """The ranked files of each window folder under `top` (of `only`, if given)."""
        folders = self.entries(self.root / top) if only is None else [self.root / top / only]
        out: list[RankFile] = []
        for folder in folders:
            if folder.is_dir():
                out.extend(self.ranked(folder, suffix, folder.name))
        return out


class RunDir:
    """The reader's view of a run directory: each kind of file, with its rank.

    Lists names only; reading a file and judging its content is the caller's. Files
    being written (hidden names) are never listed, and listings are sorted, so ranks
    come in order. A missing folder lists as empty. Only regular files (links to them
    too) are listed: an entry named like a file that is something else (a FIFO, a
    folder, a link that leads nowhere or in a loop), and a folder that cannot be
    listed, is passed over and kept in `left_out` for the caller to say.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._list = _Listing(self.root)

    def __repr__(self) -> str:
        return f"RunDir({str(self.root)!r})"

    @property
    def left_out(self) -> list[str]:
        """What the listings so far passed over, one line each: "PATH: why"."""
        return [f"{path}: {why}" for path, why in self._list.left_out.items()]

    @property
    def timings_dir(self) -> Path:
        return self.root / TIMINGS

    @property
    def triggers_dir(self) -> Path:
        return self.root / TRIGGERS

    @property
    def report_path(self) -> Path:
        return self.root / REPORT

    def meta(self) -> list[RankFile]:
        """meta/rank-NNNNN.json."""
        return self._list.ranked(self.root / META, META_SUFFIX)

    def timings(self) -> list[RankFile]:
        """timings/rank-NNNNN.jsonl."""
        return self._list.ranked(self.timings_dir, TIMINGS_SUFFIX)

    def misnamed_timings(self) -> list[Path]:
        """Files in timings/ named like a rank's (`rank-*.jsonl`) whose name gives no rank."""
        return self._list.files(
            self.timings_dir,
            lambda name: (
                name.startswith(RANK_PREFIX)
                and name.endswith(TIMINGS_SUFFIX)
                and rank_of_file(name, TIMINGS_SUFFIX) is None
            ),
        )

    def auto_records(self) -> list[RankFile]:
        """auto/rank-NNNNN.jsonl."""
        return self._list.ranked(self.root / AUTO, AUTO_SUFFIX)

    def health(self) -> list[RankFile]:
        """health/rank-NNNNN.jsonl: each rank's GPU health readings."""
        return self._list.ranked(self.root / HEALTH, HEALTH_SUFFIX)

    def windows(self) -> list[str]:
        """The names of the windows that traces/ holds a folder for."""
        return [path.name for path in self._list.entries(self.root / TRACES) if path.is_dir()]

    def traces(self, window: str | None = None) -> list[TraceFile]:
        """Every trace under traces/ (those of `window` alone, if given), rank from its name.

        Capture's own `rank-NNNNN.pt.trace.json[.gz]`, and any other `*.json[.gz]` that
        is not a summary: a trace a user put there, ranked by `rank_of_file`.
        """
        top = self.root / TRACES if window is None else self.root / TRACES / window
        return traces_under(top, window, self._list.note)

    def summaries(self, window: str | None = None) -> list[RankFile]:
        """traces/<window>/rank-NNNNN.summary.json."""
        return self._list.in_windows(TRACES, SUMMARY_SUFFIX, window)

    def nsys_ranges(self) -> list[RankFile]:
        """nsys/<window>/rank-NNNNN.json."""
        return self._list.in_windows(NSYS, NSYS_SUFFIX)

    def memory_snapshots(self) -> list[RankFile]:
        """memory/<window>/rank-NNNNN.pickle."""
        return self._list.in_windows(MEMORY, MEMORY_SUFFIX)

    def triggers(self) -> list[Path]:
        """triggers/<id>.json."""
        return self._list.files(self.triggers_dir, lambda name: name.endswith(TRIGGER_SUFFIX))

    def trigger_answers(self, trigger_id: str | None = None) -> list[RankFile]:
        """triggers/<id>/rank-NNNNN.json: every rank's answer (to one trigger, if given)."""
        return self._list.in_windows(TRIGGERS, ACK_SUFFIX, trigger_id)

    def saved(self, window: str, rank: int) -> list[Path]:
        """What `rank` saved for a window announced as `window` (its trace, or nsys range),
        which stop() may have cut short and so named after an earlier last step."""
        key = window_key(window)
        named = [
            name
            for name in {
                folder.name
                for top in (TRACES, NSYS)
                for folder in self._list.entries(self.root / top)
            }
            if name == window or (key is not None and window_key(name) == key)
        ]
        found = [t.path for name in sorted(named) for t in self.traces(name) if t.rank == rank]
        found += [
            f.path
            for name in sorted(named)
            for f in self._list.in_windows(NSYS, NSYS_SUFFIX, name)
            if f.rank == rank
        ]
        return found

    def heartbeats(self) -> list[RankFile]:
        """live/rank-NNNNN.json: each rank's heartbeat, rewritten while it runs."""
        return self._list.ranked(self.root / LIVE, LIVE_SUFFIX)

    def hangs(self) -> list[RankFile]:
        """hangs/<stall>/rank-NNNNN.json: what a rank's watchdog saw when it stalled."""
        return self._list.in_windows(HANGS, HANG_SUFFIX)


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    """True when `path` holds a folder that only a run directory has."""
    root = Path(path)
    return any((root / part).is_dir() for part in (TRACES, TIMINGS, META, LIVE))


def runs_in(folder: str | os.PathLike[str]) -> list[Path]:
    """The run directories right inside `folder` when it is not one itself (`runs/`, a
    folder that holds runs), sorted; none for a run directory or any other folder.

    One level only: a folder of runs is given where one run is meant, and a deeper
    search of a large folder (/tmp) would cost more than the mistake it tells.
    """
    root = Path(folder)
    if is_run_dir(root):
        return []
    try:
        with os.scandir(root) as entries:
            folders = [
                Path(entry.path)
                for entry in entries
                if not is_temp(entry.name) and _is_folder(entry)
            ]
    except OSError:  # not a folder, or one that cannot be listed: the reader says which
        return []
    return sorted(path for path in folders if is_run_dir(path))


def _is_folder(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def leftovers(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Hidden temporaries (`*.tmp`) under meta/, timings/, auto/ and each window: a write
    in progress, or one a killed process left that no start of its rank removed yet."""
    root = Path(run_dir)
    folders = [root / top for top in (META, TIMINGS, AUTO)]
    for top in (TRACES, NSYS, MEMORY):
        folders += [path for path in _entries(root / top) if path.is_dir()]
    out: list[Path] = []
    for folder in folders:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        out += [folder / name for name in names if is_temp(name) and name.endswith(TEMP_SUFFIX)]
    return out


def is_window_folder(folder: str | os.PathLike[str]) -> bool:
    """A window's folder in a run directory (traces/<window>): one trace per rank there.
    A folder of traces gathered from elsewhere may hold several jobs' rank 0."""
    return Path(folder).parent.name == TRACES


def traces_under(
    folder: str | os.PathLike[str],
    window: str | None = None,
    note: Callable[[Path, str], None] | None = None,
) -> list[TraceFile]:
    """Every trace at any depth under `folder` (in a folder named `window` alone, if given).

    A name `is_trace_name` accepts that is not a regular file, a link in a loop, and a
    folder that cannot be listed, is told to `note` (path, why) and not listed. Links
    are followed, each folder read once however many links lead to it.
    """
    out = []
    seen: set[tuple[int, int]] = set()
    pending = deque([Path(folder)])  # breadth first: the first name in order reads a folder
    while pending:
        top = pending.popleft()
        with contextlib.suppress(OSError):
            info = os.stat(top)
            if (info.st_dev, info.st_ino) in seen:
                continue
            seen.add((info.st_dev, info.st_ino))
        for path in _entries(top, note):
            try:
                mode = os.stat(path).st_mode
            except OSError:
                mode = 0  # a link in a loop or to nothing: not_regular says which
            if stat.S_ISDIR(mode):
                pending.append(path)
            named = is_trace_name(path.name) and (window is None or path.parent.name == window)
            if named and stat.S_ISREG(mode):
                out.append(TraceFile(rank_of_file(path.name), path, path.parent.name))
            elif named or mode == 0:
                why = not_regular(path)
                # A loop is never meant: said whatever its name (a window's, most likely),
                # but for a summary's, which the reader of summaries says.
                loop = why == _LOOP and not path.name.endswith(SUMMARY_SUFFIX)
                if why is not None and note is not None and (named or loop):
                    note(path, why)
    return sorted(out, key=lambda trace: trace.path)


def not_regular(path: str | os.PathLike[str]) -> str | None:
    """What is wrong with reading `path` as a file ("not a regular file (a FIFO)", "a
    symlink loop", ...); None for a regular file, or a link to one."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a broken symlink" if os.path.islink(path) else "no such file"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return _LOOP
        return f"cannot read ({exc.strerror or exc})"
    return _not_regular_mode(mode)


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """`path` open for binary reading when it is a regular file (or a link to one).

    Anything else is a TraceError naming it ("PATH: not a regular file (a FIFO)"),
    found without blocking: a FIFO is opened non-blocking and looked at, never read.
    OSError where it cannot be opened at all (missing, no permission, a link loop).
    """
    fd = os.open(path, os.O_RDONLY | _NONBLOCK | _CLOEXEC)
    try:
        why = _not_regular_mode(os.fstat(fd).st_mode)
        if why is not None:
            raise TraceError(f"{os.fspath(path)}: {why}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


_LOOP = "a symlink loop"
_NONBLOCK: int = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC: int = getattr(os, "O_CLOEXEC", 0)
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _not_regular_mode(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    kind = next((what for test, what in _KINDS if test(mode)), "another kind of entry")
    return f"not a regular file ({kind})"


def _entries(folder: Path, note: Callable[[Path, str], None] | None = None) -> list[Path]:
    """The entries of `folder` that are not being written, sorted; none if it is missing.

    A folder that is there but cannot be listed (a file, a link in a loop, no
    permission) lists as empty too, and is told to `note`.
    """
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        if note is not None and os.path.islink(folder):
            note(folder, "a broken symlink")
        return []
    except NotADirectoryError:
        if note is not None and os.path.isfile(folder):  # not when a folder above is a file
            note(folder, "not a directory (a regular file)")
        return []
    except OSError as exc:
        if note is not None:
            why = "a symlink loop" if exc.errno == errno.ELOOP else f"cannot list ({exc.strerror})"
            note(folder, why)
        return []
    return [folder / name for name in names if not is_temp(name)]
