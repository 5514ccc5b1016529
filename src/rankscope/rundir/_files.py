"""Writing inside the run directory and nowhere else.

A running rank writes only under RUN_DIR and follows no symbolic link there (the promise
docs/run-directory.md makes to users): a link planted at `triggers/<id>` or
`traces/<window>` would otherwise carry a rank's writes into any folder its user may
write. Every file the capture side writes goes through here:

- a folder below RUN_DIR is opened one name at a time, each relative to the folder
  above it (`O_DIRECTORY | O_NOFOLLOW`, `dir_fd`), and made where it is missing;
- a file is created by name in its opened folder with `O_CREAT | O_EXCL | O_NOFOLLOW`,
  or opened for appending with `O_NOFOLLOW` and checked to be a regular file with one
  link; a complete file is renamed into place in that same folder;
- a name that is not a plain name ("", ".", "..", a "/" or a NUL in it) is refused.

No path below RUN_DIR is resolved twice, so a link put in place between a check and a
write is not followed either. RUN_DIR itself is the user's choice: its own path may
pass through links. Only the write paths pay for this (an open per folder level); the
step() path never does.

A write refused for any of these reasons raises OSError naming the path and why, which
callers treat as any other write fault (one warning, the part turned off, training goes
on). Files are created with mode 0o666 and folders with 0o777, what open() and mkdir()
ask for by default: the process umask takes away what it says, and rankscope never
asks for more. Only the folder torch.profiler exports into is made 0o700 (see
`Folder.private`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import time
from pathlib import Path
from typing import Any, BinaryIO

from .._log import get_logger
from ._layout import AUTO, MEMORY, META, NSYS, TIMINGS, TRACES, TRIGGERS, rank_name, temp_name

__all__ = [
    "Folder",
    "append",
    "is_plain_name",
    "open_append",
    "open_folder",
    "read_json_object",
    "read_regular",
    "remove_stale_temps",
    "write_all",
    "write_atomic",
]

logger = get_logger(__name__)

_NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY: int = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC: int = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK: int = getattr(os, "O_NONBLOCK", 0)  # never block on a FIFO planted at a name
_DIR_FLAGS = os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
# Read too: the timer looks at the last byte (a torn line) through the same descriptor.
_APPEND_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _CLOEXEC | _NONBLOCK
_READ_FLAGS = os.O_RDONLY | _NOFOLLOW | _CLOEXEC | _NONBLOCK
_FILE_MODE = 0o666  # what open() asks for: the umask decides
_DIR_MODE = 0o777  # what mkdir() asks for: the umask decides
_PRIVATE_MODE = 0o700

# Where every call below takes a folder's descriptor (Linux, macOS, the BSDs); elsewhere
# names resolve by path, each checked with lstat first.
_AT = {os.open, os.mkdir, os.stat, os.unlink, os.rmdir, os.rename} <= os.supports_dir_fd
# A path that reaches an open folder by its descriptor, for writers that only take a path.
_PROC_FD = "/proc/self/fd"
_HAS_PROC_FD = _AT and os.path.isdir(_PROC_FD)

_LINK_ERRNOS = frozenset({errno.ELOOP, errno.EMLINK, errno.ENOTDIR})  # O_NOFOLLOW met a link
_WHY = "rankscope writes only inside the run directory and follows no symbolic link there"


def is_plain_name(name: str) -> bool:
    """A name of one entry in a folder: not "", "." or "..", no separator, no NUL."""
    return (
        name not in ("", ".", "..")
        and "/" not in name
        and "\0" not in name
        and os.sep not in name
        and (os.altsep is None or os.altsep not in name)
    )


def _check_name(name: str) -> None:
    if not is_plain_name(name):
        raise OSError(errno.EINVAL, f"refusing {name!r}: not a plain file name; {_WHY}")


class Folder:
    """A folder of the run directory, held open: names in it are made, replaced and removed
    relative to it, never through a link. Close it (or use `with`)."""

    __slots__ = ("fd", "path")

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        """Its descriptor; -1 where the platform has no dir_fd calls, or once closed."""
        self.path = path
        """Its path, for messages (and on a platform without dir_fd calls)."""

    def __repr__(self) -> str:
        return f"Folder({self.path!r})"

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def detach(self) -> int:
        """Hand over the descriptor: the caller closes it."""
        fd, self.fd = self.fd, -1
        return fd

    def join(self, name: str) -> str:
        return os.path.join(self.path, name)

    def _at(self, name: str) -> tuple[str, int | None]:
        """(what to pass, dir_fd) for `name`: relative to the folder where the platform can."""
        _check_name(name)
        return (name, self.fd) if _AT else (self.join(name), None)

    def _not_a_link(self, name: str) -> None:
        """Where opening cannot refuse a link itself (no O_NOFOLLOW), refuse it first."""
        if not _NOFOLLOW:
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISLNK(self.lstat(name).st_mode):
                    raise self._refusal(name, "file")

    def _refusal(self, name: str, expected: str) -> OSError:
        """The error for `name`, which is not the `expected` kind of entry ("folder", "file")."""
        try:
            mode = self.lstat(name).st_mode
        except OSError:
            mode = 0
        where = self.join(name)
        if stat.S_ISLNK(mode):
            return OSError(errno.ELOOP, f"refusing to write through a symbolic link; {_WHY}", where)
        kind = (
            "a folder"
            if stat.S_ISDIR(mode)
            else "a file"
            if stat.S_ISREG(mode)
            else "another kind of entry"
        )
        code = errno.ENOTDIR if expected == "folder" else errno.EEXIST
        return OSError(code, f"not a {expected} but {kind}", where)

    def lstat(self, name: str) -> os.stat_result:
        _check_name(name)
        if _AT:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        return os.lstat(self.join(name))

    def names(self) -> list[str]:
        """The names in this folder, unsorted."""
        return os.listdir(self.fd if _AT else self.path)

    # -- folders -----------------------------------------------------------------------

    def folder(self, name: str, create: bool = True) -> Folder:
        """The folder `name` in this one, opened without following a link; made if missing
        and `create`. FileNotFoundError when it is missing and not `create`."""
        where, fd = self._at(name)
        try:
            return self._open(name, where, fd)
        except FileNotFoundError:
            if not create:
                raise
        with contextlib.suppress(FileExistsError):  # another rank made it meanwhile
            os.mkdir(where, _DIR_MODE, dir_fd=fd)
        return self._open(name, where, fd)

    def _open(self, name: str, where: str, fd: int | None) -> Folder:
        try:
            if fd is None:
                if not stat.S_ISDIR(os.lstat(where).st_mode):
                    raise NotADirectoryError(errno.ENOTDIR, "not a folder", where)
                return Folder(-1, where)
            return Folder(os.open(where, _DIR_FLAGS, dir_fd=fd), self.join(name))
        except FileNotFoundError:
            raise
        except OSError as exc:
            if exc.errno in _LINK_ERRNOS:
                raise self._refusal(name, "folder") from None
            raise

    def private(self, name: str) -> Folder:
        """A new folder `name` only this process's user can write in, replacing a temporary left
        there; for a writer that takes a path (torch.profiler's export), given `path_of`.

        Made 0o700 and checked to be ours once opened: no one else can put a link inside it,
        and `path_of` reaches it through its descriptor, not its name.
        """
        where, fd = self._at(name)
        try:
            os.mkdir(where, _PRIVATE_MODE, dir_fd=fd)
        except FileExistsError:
            self.remove_temp(name)  # a leftover under this process's own temporary name
            os.mkdir(where, _PRIVATE_MODE, dir_fd=fd)
        made = self.folder(name, create=False)
        info = os.fstat(made.fd) if made.fd >= 0 else os.lstat(made.path)
        if info.st_uid != os.geteuid() or info.st_mode & 0o077:
            made.close()
            raise OSError(errno.EPERM, "refusing a folder that others may write in", made.path)
        return made

    def path_of(self, name: str) -> str:
        """A path to `name` in this folder that reaches it through the open descriptor where
        the platform has /proc/self/fd (so no link on the way is followed), else by path."""
        _check_name(name)
        if _HAS_PROC_FD and self.fd >= 0:
            return f"{_PROC_FD}/{self.fd}/{name}"
        return self.join(name)

    # -- files -------------------------------------------------------------------------

    def create(self, name: str) -> int:
        """A new, empty file `name` open for writing (its descriptor), replacing a leftover
        of that name; never a file reached through a link."""
        where, fd = self._at(name)
        try:
            return os.open(where, _NEW_FLAGS, _FILE_MODE, dir_fd=fd)
        except FileExistsError:
            self.unlink(name)  # removes a link itself, never what it points at
            return os.open(where, _NEW_FLAGS, _FILE_MODE, dir_fd=fd)

    def append(self, name: str) -> int:
        """`name` open for appending (its descriptor), made if missing: a regular file with
        one link, so that what is appended lands in this folder."""
        where, fd = self._at(name)
        self._not_a_link(name)
        try:
            out = os.open(where, _APPEND_FLAGS, _FILE_MODE, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK):
                raise self._refusal(name, "file") from None
            raise
        info = os.fstat(out)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
            os.close(out)
            what = (
                "a file with another link" if stat.S_ISREG(info.st_mode) else "not a regular file"
            )
            raise OSError(errno.EEXIST, f"refusing to append to {what}; {_WHY}", self.join(name))
        os.set_blocking(out, True)  # O_NONBLOCK was for a FIFO planted at the name only
        return out

    def read(self, name: str) -> int:
        """`name` open for reading (its descriptor): a regular file, not reached through a link."""
        where, fd = self._at(name)
        self._not_a_link(name)
        out = os.open(where, _READ_FLAGS, dir_fd=fd)
        if not stat.S_ISREG(os.fstat(out).st_mode):
            os.close(out)
            raise OSError(errno.EINVAL, "not a regular file", self.join(name))
        os.set_blocking(out, True)
        return out

    def replace(self, name: str, final: str, into: Folder | None = None) -> None:
        """Rename `name` to `final` (in `into`, by default this folder), replacing a regular
        file; a link, folder or other entry at `final` is refused, not replaced."""
        dest = self if into is None else into
        dest.check_replaceable(final)
        src, src_fd = self._at(name)
        dst, dst_fd = dest._at(final)
        os.replace(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd)

    def check_replaceable(self, final: str) -> None:
        """Raise unless `final` is missing or a regular file (what `replace` may replace)."""
        try:
            mode = self.lstat(final).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISREG(mode):
            raise self._refusal(final, "file")

    def write(self, name: str, data: bytes, tag: str) -> None:
        """Write `data` to `name` through a hidden temporary (`temp_name` with `tag`) in this
        folder: `name` is complete or as it was. On failure the temporary is removed."""
        temp = temp_name(Path(name), tag).name
        out = self.create(temp)
        try:
            with os.fdopen(out, "wb") as fh:
                fh.write(data)
            self.replace(temp, name)
        except BaseException:
            with contextlib.suppress(OSError):
                self.unlink(temp)
            raise

    def unlink(self, name: str) -> None:
        """Remove the entry `name` (a link itself, never its target); nothing if missing."""
        where, fd = self._at(name)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(where, dir_fd=fd)

    def remove_temp(self, name: str) -> None:
        """Remove `name`: a file, or a folder of files (what `private` made), never following
        a link. A folder holding folders is left alone (OSError)."""
        try:
            mode = self.lstat(name).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(mode):
            self.unlink(name)
            return
        with self.folder(name, create=False) as inner:
            for entry in inner.names():
                inner.unlink(entry)
        where, fd = self._at(name)
        os.rmdir(where, dir_fd=fd)


def _parts_below(run_dir: str, folder: str) -> tuple[str, ...]:
    """The names from `run_dir` down to `folder`, each a plain name."""
    try:
        parts = Path(folder).relative_to(Path(run_dir)).parts
    except ValueError:
        raise OSError(
            errno.EINVAL, f"refusing a folder outside the run directory {run_dir}", folder
        ) from None
    for part in parts:
        _check_name(part)
    return parts


def open_folder(
    run_dir: str | os.PathLike[str], folder: str | os.PathLike[str], create: bool = True
) -> Folder:
    """`folder` (RUN_DIR or a folder under it), opened without following a link below
    RUN_DIR; the folders on the way are made if missing and `create`."""
    root, target = os.fspath(run_dir), os.fspath(folder)
    parts = _parts_below(root, target)
    if create:
        os.makedirs(root, exist_ok=True)  # RUN_DIR is the user's: its own path may hold links
    if _AT:
        current = Folder(os.open(root, os.O_RDONLY | _DIRECTORY | _CLOEXEC), root)
    elif os.path.isdir(root):
        current = Folder(-1, root)
    else:
        raise NotADirectoryError(errno.ENOTDIR, "not a folder", root)
    for part in parts:
        try:
            below = current.folder(part, create)
        finally:
            current.close()
        current = below
    return current


def write_atomic(
    run_dir: str | os.PathLike[str], final: str | os.PathLike[str], data: bytes, tag: str
) -> None:
    """Write `data` to `final` (under RUN_DIR) through a hidden temporary in its folder."""
    path = Path(final)
    with open_folder(run_dir, path.parent) as folder:
        folder.write(path.name, data, tag)


def open_append(run_dir: str | os.PathLike[str], path: str | os.PathLike[str]) -> BinaryIO:
    """`path` (under RUN_DIR) open for appending, unbuffered; see `Folder.append`."""
    final = Path(path)
    with open_folder(run_dir, final.parent) as folder:
        fd = folder.append(final.name)
    return os.fdopen(fd, "ab", buffering=0)


def write_all(out: BinaryIO, data: bytes) -> None:
    """Write all of `data` to an unbuffered file: a short write is written on from where
    it stopped (one append of a whole payload, so that two writers interleave by whole
    writes)."""
    view = memoryview(data)
    while view:
        view = view[out.write(view) :]


def append(run_dir: str | os.PathLike[str], path: str | os.PathLike[str], data: bytes) -> None:
    """Append `data` to `path` (under RUN_DIR) in one append."""
    with open_append(run_dir, path) as out:
        write_all(out, data)


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """At most `limit` + 1 bytes of `path`, a regular file reached without a link at its name."""
    target = Path(path)
    folder = Folder(-1, str(target.parent))
    if _AT:
        folder.fd = os.open(target.parent, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    with folder, os.fdopen(folder.read(target.name), "rb") as fh:
        return fh.read(limit + 1)


def read_json_object(path: str | os.PathLike[str], limit: int) -> dict[str, Any] | None:
    """The JSON object in `path` (read as `read_regular` does); None where the file cannot
    be read, is over `limit` bytes, or holds anything but one JSON object."""
    try:
        raw = read_regular(path, limit)
        data = json.loads(raw) if len(raw) <= limit else None
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


# -- what an earlier process of a rank left behind ---------------------------------------

# The writer's pid in a temporary's tag (`temp_name`): "123", "raw-123", "w123", "oom123";
# torch.profiler's own temporary adds one more ".tmp".
_TAG_PID = re.compile(r"\.(?:raw-|w|oom)?(\d+)\.tmp(?:\.tmp)?")
_FLAT = (META, TIMINGS, AUTO)
_BY_WINDOW = (TRACES, NSYS, MEMORY, TRIGGERS)
_CLEANED: set[tuple[str, int, int]] = set()  # (run dir, rank, pid) looked at already


def _writer_pid(name: str) -> int | None:
    found = _TAG_PID.search(name)
    return int(found.group(1)) if found is not None and found.end() == len(name) else None


def remove_stale_temps(run_dir: str | os.PathLike[str], rank: int) -> list[str]:
    """Remove the temporaries an earlier process of `rank` left in the run directory (an
    export or write cut short by a kill); the paths removed.

    A temporary is this rank's by its name (`.rank-NNNNN.*.tmp`), whichever host wrote
    it: a process id from another host means nothing here, and a rank's earlier process
    is gone when the rank starts again. Those whose tag holds this process's id may be
    being written now and are left alone; so are those changed in the last minute (a
    second job writing into the directory at the same time, which is allowed, writes
    them now), other ranks' and everything else; the analysis names what stays. Never
    raises: what cannot be removed stays.
    """
    mine = os.getpid()
    key = (os.path.abspath(run_dir), rank, mine)
    if key in _CLEANED:
        return []  # what earlier processes left is gone; this process's own is kept anyway
    _CLEANED.add(key)
    try:
        removed = _remove_stale(run_dir, f".{rank_name(rank)}.", mine)
    except Exception:  # this runs as a Profiler is made: nothing may reach the job
        logger.debug("rankscope: looking for stale temporaries failed", exc_info=True)
        return []
    if removed:
        logger.info(
            "rankscope: removed %d temporary file(s) an earlier process of rank %d left: %s",
            len(removed),
            rank,
            ", ".join(removed),
        )
    return removed


def _remove_stale(run_dir: str | os.PathLike[str], prefix: str, mine: int) -> list[str]:
    removed: list[str] = []
    try:
        root = open_folder(run_dir, run_dir, create=False)
    except OSError:
        return removed
    with root:
        for top in (*_FLAT, *_BY_WINDOW):
            try:
                folder = root.folder(top, create=False)
            except OSError:
                continue
            with folder:
                if top in _FLAT:
                    removed += _remove_in(folder, prefix, mine)
                    continue
                for name in sorted(_names(folder)):
                    try:
                        inner = folder.folder(name, create=False)  # links and files fail here
                    except OSError:
                        continue
                    with inner:
                        removed += _remove_in(inner, prefix, mine)
    return removed


def _names(folder: Folder) -> list[str]:
    try:
        return folder.names()
    except OSError:
        return []


_IN_USE_S = 60.0  # a temporary changed this recently may be another process's, being written


def _remove_in(folder: Folder, prefix: str, mine: int) -> list[str]:
    removed = []
    for name in _names(folder):
        if not name.startswith(prefix) or _writer_pid(name) == mine or not name.endswith(".tmp"):
            continue
        try:
            if time.time() - folder.lstat(name).st_mtime < _IN_USE_S:
                continue
            folder.remove_temp(name)
        except OSError:
            continue
        removed.append(folder.join(name))
    return removed
