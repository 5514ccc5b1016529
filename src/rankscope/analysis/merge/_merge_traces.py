"""`merge_traces`: check the arguments, read the headers, plan, write; again after a misread."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..._errors import ConfigError, TraceError
from ...rundir._listing import not_regular, open_regular
from ..core._parallel import LaneWorkers, worker_count
from ._events import _read_input
from ._header import _is_int, _read_header
from ._plan import _RANK_LIMIT, _Job, _plan
from ._result import MergeResult
from ._writer import _Misread, _write

__all__ = ["merge_traces"]

_PARALLEL_MIN_BYTES = 8 << 20  # of JSON; below this a worker's start-up costs more than it saves
_GZIP_RATIO = 8  # about what Kineto's JSON shrinks by: enough to guess the JSON's size


def merge_traces(
    inputs: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    ranks: Sequence[int] | None = None,
    progress: Callable[[int], None] | None = None,
) -> MergeResult:
    """Merge per-rank Kineto traces into one Perfetto-ready timeline at `output`.

    `output` is gzip-compressed when its name ends in `.gz`; its directory must exist.
    `ranks` gives each input's rank (overriding what the file says). `progress` is
    called with the input bytes read so far (as stored; the total is the sum of the
    files' sizes). A bad or missing input, two inputs of one rank, or an input whose
    rank cannot be told raise TraceError naming the file; nothing is written then. So
    does an input that is not a regular file (a FIFO is never opened), and an `output`
    that is one of the inputs under any name (a link, a hard link): it is left as it is.
    """
    sources = _check_inputs(inputs, ranks)
    final = _check_output(Path(output), sources)
    lanes = _lane_count(sources)
    workers = _start_workers(lanes)  # they start up while the headers are read
    try:
        with ThreadPoolExecutor(max_workers=lanes) as pool:
            # zlib lets go of the GIL, so the cheap first reads share the cores.
            headers = list(pool.map(_read_header, sources))
        corrected: set[int] = set()
        while True:
            jobs, base = _plan(sources, headers, ranks)
            try:
                return _write(
                    jobs=jobs,
                    base=base,
                    headers=headers,
                    final=final,
                    progress=progress,
                    workers=workers,
                )
            except _Misread as exc:
                if exc.index in corrected:
                    raise TraceError(f"{sources[exc.index]}: changed while it was read") from None
                corrected.add(exc.index)
                headers[exc.index] = exc.header
                workers.close()
                workers = _start_workers(lanes)
    finally:
        workers.close()


def _check_inputs(
    inputs: Sequence[str | os.PathLike[str]], ranks: Sequence[int] | None
) -> list[str]:
    if isinstance(inputs, (str, bytes, os.PathLike)):
        raise ConfigError("inputs", inputs, "a list of trace paths", "a single path, not a list")
    sources = [os.fspath(path) for path in inputs]
    if not sources:
        raise ConfigError("inputs", [], "one or more trace paths", "nothing to merge")
    if ranks is not None:
        given = list(ranks)
        if len(given) != len(sources):
            raise ConfigError(
                "ranks", given, f"one rank per input ({len(sources)})", f"{len(given)} given"
            )
        for rank in given:
            if not _is_int(rank) or not 0 <= rank < _RANK_LIMIT:
                raise ConfigError("ranks", given, f"whole numbers in 0..{_RANK_LIMIT - 1}")
    for source in sources:
        why = not_regular(source)
        if why is not None:
            raise TraceError(f"{source}: {why}")
    return sources


def _check_output(final: Path, sources: list[str]) -> Path:
    """`final`, where the merge may write it: a new name, or a file that no input is."""
    if not final.parent.is_dir():
        raise TraceError(f"{final}: cannot write: directory {final.parent} does not exist")
    if final.is_dir():
        raise TraceError(f"{final}: cannot write: it is a directory")
    try:
        out = final.stat()
    except OSError:
        return final  # not there yet (or a broken link, which the merge replaces)
    for source in sources:
        with contextlib.suppress(OSError):
            info = os.stat(source)
            if (info.st_dev, info.st_ino) == (out.st_dev, out.st_ino):
                raise TraceError(
                    f"{final}: is the input {source} (the same file); the merge will not "
                    "overwrite its input: choose another output"
                )
    return final


def _lane_count(sources: list[str]) -> int:
    """How many processes read inputs: one per core, when there is enough to read."""
    return worker_count(len(sources), _json_bytes(sources), min_bytes=_PARALLEL_MIN_BYTES)


def _json_bytes(sources: list[str]) -> int:
    """About how much JSON the inputs hold, from their sizes alone."""
    json_bytes = 0
    for source in sources:
        with contextlib.suppress(OSError, TraceError), open_regular(source) as raw:
            packed = raw.read(2) == b"\x1f\x8b"
            json_bytes += os.fstat(raw.fileno()).st_size * (_GZIP_RATIO if packed else 1)
    return json_bytes


def _start_workers(lanes: int) -> LaneWorkers[_Job, tuple[Any, ...]]:
    """Processes to read the inputs, started before they are needed: they take a while."""
    return LaneWorkers.start(_read_input, lanes, label="merge worker")
