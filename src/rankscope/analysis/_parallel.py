"""The one ordered parallel map that the analysis reads files with.

Reading a run's timings and summarising its traces both turn a list of files into a
list of results, in order, and both pay for worker processes only when there is
enough to read. The rule for when, how many and how they start lives here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["PARALLEL_BYTES", "file_size", "ordered_map"]

PARALLEL_BYTES = 32 << 20
"""Inputs smaller than this in all are read in this process: a worker costs more than it saves."""
_CHUNKS_PER_WORKER = 8  # several contiguous chunks per worker, so progress moves and loads even out

T = TypeVar("T")
R = TypeVar("R")


def ordered_map(
    work: Callable[[T], R],
    items: Sequence[T],
    *,
    size: int,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    min_bytes: int | None = None,
) -> list[R]:
    """`[work(item) for item in items]`, by a process per core when `size` (the bytes to
    read in all) is at least `min_bytes` (default PARALLEL_BYTES).

    `work` must be a module-level function and must not raise: it returns what went
    wrong as a value. `workers` caps the processes (default: one per core).
    `progress(done, total)` is called in this process as items complete, in order.
    """
    cores = os.cpu_count() or 1
    n = len(items)
    count = min(cores, n) if workers is None else max(1, min(workers, n))
    threshold = PARALLEL_BYTES if min_bytes is None else min_bytes
    if count < 2 or size < threshold:
        out: list[R] = []
        for item in items:
            out.append(work(item))
            if progress is not None:
                progress(len(out), n)
        return out
    # Here, not at the top: reading a few small files needs no pool, and a one-off
    # `rankscope kernels` would pay for importing one.
    from concurrent.futures import ProcessPoolExecutor

    step = max(1, n // (count * _CHUNKS_PER_WORKER))
    chunks = [items[i : i + step] for i in range(0, n, step)]
    results: list[R] = []
    with ProcessPoolExecutor(count, mp_context=_context()) as pool:
        for chunk in pool.map(partial(_each, work), chunks):
            results.extend(chunk)
            if progress is not None:
                progress(len(results), n)
    return results


def file_size(path: Path) -> int:
    """The size of `path` in bytes; 0 where it cannot be read (its reader says why)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _each(work: Callable[[Any], Any], chunk: Sequence[Any]) -> list[Any]:
    return [work(item) for item in chunk]


def _context() -> Any:
    # fork starts a worker in milliseconds with numpy already imported; where fork is
    # unsafe (macOS) or unavailable, spawn.
    import multiprocessing
    import platform

    linux = platform.system() == "Linux"
    return multiprocessing.get_context("fork" if linux else "spawn")
