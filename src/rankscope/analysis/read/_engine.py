"""DuckDB over a run's timings: every rank's records, read in parallel, by phase.

A run of 4096 ranks x 200 sampled steps is 5M lines; parsing them in Python takes tens
of seconds and a GB. DuckDB parses the JSONL in C++ on every core and hands back, per
(file, phase, kind), the steps and times as arrays: the matrices the analyzers compare
are built from those (analysis/read/_matrix.py) without a Python object per record.

DuckDB reads what it can; it is not the judge of what a file means. Its fast path takes
a file only when every line is one it reads exactly as the line-by-line reader
(read/_timings.py) would: a record with integers where integers belong, names that are
strings, finite times, the file's own rank, and one attempt. Any other file (a bad
line, a torn last line, an unknown schema version, a restart's several attempts, a
value DuckDB would cast where the reader refuses) is read by that reader instead, which
names each line it leaves out. Both ways give the same records (tests/analysis/read/test_engine.py),
but for four kinds of line no rankscope writes, which DuckDB reads as it reads them: a
trailing comma, a key given twice (DuckDB keeps the first value, json the last),
`"v": null` (read as no "v"), and nesting past json's recursion limit.

The scan itself is read/_scan.py: files in batches of about `_BATCH_BYTES`, so DuckDB's
working memory is bounded by a batch, not by the run. This module puts the two readers
together into a run's records (read/_records.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ..._errors import ConfigError, TraceError
from ...rundir._layout import TIMINGS_FILES
from ...rundir._listing import RunDir
from ..core._options import TIME, TIME_BASES
from ..core._parallel import file_size, ordered_map
from ._attempts import resolve_attempts
from ._rank_timings import RankTimings
from ._records import PhaseRecords, RunRecords
from ._run import run_root
from ._scan import Scan, WholeFile
from ._timings import claim_ranks, read_rank_timings

__all__ = [
    "PhaseRecords",
    "RunRecords",
    "read_line_by_line",
    "read_run_records",
]


def read_run_records(
    run_dir: str | os.PathLike[str],
    *,
    time: str = TIME,
    attempt: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    workers: int | None = None,
) -> RunRecords:
    """Read every rank's timings (RUN_DIR/timings) into records by phase.

    The promises of `read_timings` hold: a file or line that cannot be used is skipped
    and said in `skipped`; two files that claim one rank are both skipped; a run written
    by several attempts keeps the latest record of each (rank, step, phase), or only
    attempt `attempt` (1-based); a run with nothing usable is a TraceError naming why.
    `progress(files_done, files)` is called as files are read; `workers` caps DuckDB's
    threads and the processes of the line-by-line reader (default: one per core).
    """
    if time not in TIME_BASES:
        raise ConfigError("time", time, " or ".join(TIME_BASES))
    if attempt is not None and (isinstance(attempt, bool) or attempt < 1):
        raise ConfigError("attempt", attempt, "an attempt number >= 1")
    root = run_root(run_dir)
    run = RunDir(root)
    found = {entry.path: entry.rank for entry in run.timings()}
    misnamed = run.misnamed_timings()
    if not found and not misnamed:
        said = "".join(f"; {line}" for line in run.left_out)
        raise TraceError(f"{root}: no timings (no {TIMINGS_FILES}; was the timer on?){said}")
    out = RunRecords(run_dir=root, time=time, skipped=list(run.left_out))
    scan = Scan(found, time, workers)
    scan.read_all(progress, extra=len(misnamed))
    slow = scan.slow + misnamed
    held = scan.fast | dict(zip(slow, read_line_by_line(slow, workers), strict=True))
    if progress is not None:
        progress(len(found) + len(misnamed), len(found) + len(misnamed))
    ranks = claim_ranks(held, out.skipped)
    if not ranks:
        raise TraceError(f"{root}: no usable timings ({'; '.join(out.skipped)})")
    out.attempts = resolve_attempts(ranks, attempt)
    if attempt is not None and attempt > out.attempts.count:
        count = out.attempts.count
        many = "1 attempt" if count == 1 else f"{count} attempts"
        raise ConfigError("attempt", attempt, f"1 to {count}", f"the timings hold {many}")
    scan.into(out, {rank for rank, held in ranks.items() if isinstance(held, WholeFile)})
    for rank in sorted(ranks):
        timings = ranks[rank]
        if isinstance(timings, RankTimings):
            out.add_rank(timings)
    return out


def read_line_by_line(files: list[Path], workers: int | None) -> list[RankTimings | str]:
    size = sum(file_size(path) for path in files)
    return ordered_map(_read_or_say, files, size=size, workers=workers)


def _read_or_say(path: Path) -> RankTimings | str:
    try:
        return read_rank_timings(path)
    except TraceError as exc:
        return str(exc)
