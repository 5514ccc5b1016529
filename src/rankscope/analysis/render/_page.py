"""Writing a page (the report, the diff) whole or not at all: the one writer of HTML files."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ...rundir._layout import temp_name

__all__ = ["write_page"]

_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


def write_page(path: str | os.PathLike[str], page: str) -> None:
    """Write `page` to `path` through a hidden temporary beside it, renamed into place:
    `path` holds the whole page or what it held before, never part of a page (a full
    disk, an interrupt), and the temporary is removed. An OSError names `path`."""
    final = Path(path)
    data = page.encode("utf-8", "backslashreplace")  # a page holds no lone surrogate
    temp = temp_name(final, str(os.getpid()))
    try:
        try:
            # O_EXCL: a link planted at the temporary's name is not written through.
            fd = os.open(temp, _NEW, 0o666)
        except FileExistsError:  # left by an earlier process of the same pid
            os.unlink(temp)
            fd = os.open(temp, _NEW, 0o666)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temp, final)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        if isinstance(exc, OSError) and exc.errno is not None:  # the file named, not its temporary
            raise OSError(exc.errno, exc.strerror, os.fspath(final)) from exc
        raise
