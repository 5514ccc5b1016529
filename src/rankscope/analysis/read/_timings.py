"""Reading the timer's JSONL files: every rank of a run, column by column.

A run of 1024 ranks x 200 sampled steps x 7 records is 1.4M lines; keeping each as a
Python object would take hundreds of MB and most of the time, so a rank's records are
held as numpy columns, with phase and kind names interned.

Lines the timer wrote itself (its fixed key order, no meta) are read by one regular
expression per file and converted a column at a time, about 2 us a line. Any file with
a line that does not fit (meta, another writer's layout, a bad line) is read line by
line through json instead (_any_lines.py), which takes any key order and says what it
skipped; both ways give the same columns (_rank_timings.py). Large runs are read by a
process per core.
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..._errors import ConfigError, TraceError
from ...rundir._layout import TIMINGS_FILES, TIMINGS_SUFFIX, rank_of_file, timing_path
from ...rundir._listing import RunDir, open_regular
from ..core._parallel import file_size, ordered_map
from ._any_lines import read_any_lines
from ._attempts import AttemptMark, Attempts, mark_of, resolve_attempts
from ._rank_timings import INT_MAX, MAX_MS, Int32s, RankTimings, interleaved
from ._run import run_root

__all__ = ["RankTimings", "RunTimings", "claim_ranks", "read_rank_timings", "read_timings"]


_UINT = rb"(0|[1-9][0-9]*)"
_NUM = rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"
# The timer's own layout (timing/_record.py format_record, without the optional keys).
# A JSON string cannot hold an unescaped quote, so `","kind":"` can only be the real
# boundary and the lazy groups stop there; each distinct name is still checked by json.
_TIMER_LINE = re.compile(
    rb'^\{"v":1,"rank":' + _UINT + rb',"step":' + _UINT + rb',"phase":"(.*?)","kind":"(.*?)",'
    rb'"start_ns":' + _UINT + rb',"cpu_ms":(' + _NUM + rb'),"gpu_ms":(null|' + _NUM + rb"),"
    rb'"depth":' + _UINT + rb',"error":(true|false)(?:,"coll":' + _UINT + rb")?"
    rb'(?:,"oncpu_ms":(' + _NUM + rb"))?"
    rb'(?:,"runq_ms":(' + _NUM + rb"))?\}\n",
    re.MULTILINE,
)
# The line that opens an attempt (timing/_record.py format_attempt).
_ATTEMPT_LINE = re.compile(rb'^\{"v":1,"rank":([0-9]+),"attempt":[^\n]*\n', re.MULTILINE)


@dataclass(eq=False)
class RunTimings:
    """Every rank's timings in a run directory."""

    run_dir: Path
    ranks: dict[int, RankTimings]
    skipped: list[str] = field(default_factory=list)
    """What was left out of the run and why (whole files, and each file's own skips)."""
    attempts: Attempts = field(default_factory=Attempts)
    """The attempts the files hold, and which records the columns kept."""


def read_timings(
    run_dir: str | os.PathLike[str],
    *,
    attempt: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    workers: int | None = None,
) -> RunTimings:
    """Read every rank's timing file (RUN_DIR/timings).

    A file or line that cannot be used is skipped and said in `skipped`, and so are
    two files that claim one rank (both: neither can be trusted); a run with nothing
    usable is a TraceError naming why. A run written by several attempts (restarts) keeps
    the latest record of each (rank, step, phase), or only attempt `attempt` (1-based);
    `attempts` says what was seen. `progress(files_done, files)` is called as files are
    read; `workers` caps the reading processes (default: one per core, for large runs).
    """
    if attempt is not None and (isinstance(attempt, bool) or attempt < 1):
        raise ConfigError("attempt", attempt, "an attempt number >= 1")
    root = run_root(run_dir)
    run = RunDir(root)
    files = sorted([found.path for found in run.timings()] + run.misnamed_timings())
    if not files:
        said = "".join(f"; {line}" for line in run.left_out)
        raise TraceError(f"{root}: no timings (no {TIMINGS_FILES}; was the timer on?){said}")
    skipped: list[str] = list(run.left_out)  # a FIFO or a folder under a timings name
    read = _read_all(files, progress, workers)
    ranks = claim_ranks(dict(zip(files, read, strict=True)), skipped)
    if not ranks:
        raise TraceError(f"{root}: no usable timings ({'; '.join(skipped)})")
    attempts = resolve_attempts(ranks, attempt)
    if attempt is not None and attempt > attempts.count:
        many = "1 attempt" if attempts.count == 1 else f"{attempts.count} attempts"
        raise ConfigError("attempt", attempt, f"1 to {attempts.count}", f"the timings hold {many}")
    return RunTimings(
        run_dir=root, ranks=dict(sorted(ranks.items())), skipped=skipped, attempts=attempts
    )


def claim_ranks(held: dict[Path, Any], skipped: list[str]) -> dict[int, Any]:
    """Each rank's records (a RankTimings, or the engine's WholeFile; a str: why a file
    could not be read), by the one file that holds them; in the order of the files, what
    could not be used is said in `skipped` (both files where two claim one rank)."""
    ranks: dict[int, Any] = {}
    claimed: dict[int, list[Path]] = {}
    for path in sorted(held):
        result = held[path]
        if isinstance(result, str):
            skipped.append(result)
            continue
        skipped.extend(result.skipped)
        if len(result) == 0:
            skipped.append(f"{path}: no records")
            continue
        ranks[result.rank] = result
        claimed.setdefault(result.rank, []).append(path)
    for rank, paths in claimed.items():
        if len(paths) > 1:
            del ranks[rank]
            names = ", ".join(str(p) for p in paths)
            skipped.append(f"rank {rank} is claimed by {len(paths)} files ({names}); all skipped")
    return ranks


def read_rank_timings(path: str | os.PathLike[str]) -> RankTimings:
    """Read one rank's file. Its rank comes from its name (`timing_path`); records that
    claim another rank, and lines that are not records, are skipped and said in `skipped`."""
    path = Path(path)
    rank = rank_of_file(path.name, TIMINGS_SUFFIX)
    if rank is None:
        example = timing_path("", 3).name
        raise TraceError(f"{path}: not a timings file (expected a name like {example})")
    try:
        with open_regular(path) as fh:  # never blocks on a FIFO passed by name
            data = fh.read()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    end = data.rfind(b"\n") + 1
    body, torn = data[:end], data[end:]  # what follows the last newline was cut short
    body, overlong = _without_overlong(body, path)
    split = None if overlong else _split_attempts(body, rank)
    out = None if split is None else _read_timer_lines(split[0], rank, path)
    if out is not None and split is not None:
        _, out.attempts, chunks, counts = split
        out.attempt = np.repeat(np.asarray(chunks, np.int32), counts)
        out.interleaved = interleaved(chunks)
    else:
        out = read_any_lines(body, rank, path)
        out.skipped[:0] = overlong
    if torn.strip():
        line = body.count(b"\n") + 1
        out.skipped.append(
            f"{path}:{line}: the last line is cut short (a write that did not finish: a crash, or a full disk)"
        )
    return out


MAX_LINE = 64 << 20
"""The longest line read as a record: a record is a few hundred bytes, a few KB with its
values. A longer line is skipped unparsed, said by its size: parsed, a 1 GB line took
6 GB. Past DuckDB's own bound (it refuses a file with an object over 16-32 MB), so a
line DuckDB reads the line-by-line reader reads too: the answers agree."""


def _without_overlong(body: bytes, path: Path) -> tuple[bytes, list[str]]:
    """`body` with each line longer than MAX_LINE made blank (line numbers stay), and what
    was skipped. One pass in numpy over the newlines; nearly always nothing found and
    `body` as it was."""
    if len(body) <= MAX_LINE:
        return body, []
    ends = np.flatnonzero(np.frombuffer(body, np.uint8) == 10)  # a line ends at each
    starts = np.concatenate(([0], ends[:-1] + 1))
    long = np.flatnonzero(ends - starts > MAX_LINE)
    if not len(long):
        return body, []
    parts: list[bytes] = []
    said: list[str] = []
    at = 0
    for i in long.tolist():
        start, end = int(starts[i]), int(ends[i])
        parts.append(body[at:start])
        said.append(
            f"{path}:{i + 1}: a line of {end - start} bytes, longer than any record "
            f"({MAX_LINE >> 20} MB); skipped unread"
        )
        at = end  # the newline stays: the line is blank now
    parts.append(body[at:])
    return b"".join(parts), said


# -- reading many files ------------------------------------------------------------


def _read_all(
    files: list[Path], progress: Callable[[int, int], None] | None, workers: int | None
) -> list[RankTimings | str]:
    size = sum(file_size(path) for path in files)
    return ordered_map(_read_or_say, files, size=size, workers=workers, progress=progress)


def _read_or_say(path: Path) -> RankTimings | str:
    try:
        return read_rank_timings(path)
    except TraceError as exc:
        return str(exc)


# -- the timer's own lines, a column at a time -------------------------------------


def _attempt_lines(body: bytes) -> list[re.Match[bytes]]:
    """The attempt lines in `body`. A search for the key first: a scan of every line start
    with the pattern costs a quarter of reading the file."""
    found = []
    at = body.find(b',"attempt":')
    while at >= 0:
        start = body.rfind(b"\n", 0, at) + 1
        line = _ATTEMPT_LINE.match(body, start)
        if line is not None and b'"step":' not in line.group(0):  # a record may name its attempt
            found.append(line)
        end = body.find(b"\n", at)
        at = body.find(b',"attempt":', end) if end >= 0 else -1
    return found


def _split_attempts(
    body: bytes, rank: int
) -> tuple[bytes, list[AttemptMark], list[int], list[int]] | None:
    """(the record lines, the attempts, each chunk's attempt (an index into them), how
    many lines each chunk has), the attempt lines taken out; None where an attempt line
    is not as the timer writes it (read line by line). A chunk is the lines after an
    attempt line: an attempt is known by its token, so its chunks are its records
    wherever they lie (another job's between them), and the same process starting
    again adds none."""
    found = _attempt_lines(body)
    if not found:
        return body, [AttemptMark()], [0], [body.count(b"\n")]
    lead = body[: found[0].start()]
    parts, marks, chunks, counts = [lead], [], [], []
    index: dict[str | None, int] = {}
    if lead.strip():  # records before the first attempt line (an older version's)
        marks.append(AttemptMark())
        index[None] = 0
        chunks.append(0)
        counts.append(lead.count(b"\n"))
    for i, line in enumerate(found):
        try:
            mark = mark_of(json.loads(line.group(0)))
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None
        if isinstance(mark, str) or int(line.group(1)) != rank:
            return None
        part = body[line.end() : found[i + 1].start() if i + 1 < len(found) else len(body)]
        parts.append(part)
        if mark.token not in index:
            index[mark.token] = len(marks)
            marks.append(mark)
        chunks.append(index[mark.token])
        counts.append(part.count(b"\n"))
    return b"".join(parts), marks, chunks, counts


def _read_timer_lines(body: bytes, rank: int, path: Path) -> RankTimings | None:  # noqa: PLR0911 - a return per check
    """Columns of a file whose every line is in the timer's layout; None if one is not."""
    rows = _TIMER_LINE.findall(body)
    if len(rows) != body.count(b"\n"):
        return None
    out = RankTimings(rank=rank, path=path)
    if not rows:
        return out
    ranks, steps, phases, kinds, starts, cpu, gpu, depths, errors, coll, oncpu, runq = zip(
        *rows, strict=True
    )
    if set(ranks) != {str(rank).encode()}:
        return None  # the line-by-line reader says which lines
    if not (_fits(steps) and _fits(starts) and _fits(depths)):
        return None
    names, phase = _intern(phases)
    kind_names, kind = _intern(kinds)
    if names is None or kind_names is None:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", DeprecationWarning
        )  # fromstring's text mode is not deprecated
        cpu_ms = np.fromstring(b" ".join(cpu), np.float64, sep=" ")
        gpu_ms = np.fromstring(b" ".join(gpu).replace(b"null", b"nan"), np.float64, sep=" ")
        out.step = np.fromstring(b" ".join(steps), np.int64, sep=" ")
        out.start_ns = np.fromstring(b" ".join(starts), np.int64, sep=" ")
        out.depth = np.fromstring(b" ".join(depths), np.int64, sep=" ")
    if not all(len(column) == len(rows) for column in (cpu_ms, gpu_ms, out.step, out.start_ns)):
        return None
    # A number too large for a double (1e999) is read as infinity: not a time. (NaN in
    # gpu_ms can only come from null: the pattern admits no other word.)
    if not (np.isfinite(cpu_ms).all() and (np.isfinite(gpu_ms) | np.isnan(gpu_ms)).all()):
        return None
    if (
        (cpu_ms < 0).any()
        or (gpu_ms < 0).any()
        or (cpu_ms > MAX_MS).any()
        or (gpu_ms > MAX_MS).any()
    ):
        return None  # a time below zero: the line-by-line reader says which lines
    out.names, out.kinds = names, kind_names
    out.phase, out.kind = phase, kind
    out.cpu_ms, out.gpu_ms = cpu_ms, gpu_ms
    out.error = np.fromiter(map(len, errors), np.int8, len(errors)) == 4  # b"true"
    out.coll = np.fromiter((_count(c) for c in coll), np.int64, len(coll))
    out.oncpu_ms = np.fromiter((_time(c) for c in oncpu), np.float64, len(oncpu))
    out.runq_ms = np.fromiter((_time(c) for c in runq), np.float64, len(runq))
    return out


def _time(text: bytes) -> float:
    """An "oncpu_ms" or "runq_ms" time from the timer's layout (b"" where the line has none); one that
    is no finite time is none (NaN), and the record stands without it."""
    if not text:
        return math.nan
    value = float(text)
    return value if math.isfinite(value) and value >= 0 else math.nan


def _count(text: bytes) -> int:
    """A "coll" count from the timer's layout (b"" where the line has none: -1); one too
    large for an int64 is no count either."""
    return int(text) if text and len(text) < 19 else -1


def _fits(values: Sequence[bytes]) -> bool:
    """Every decimal in `values` fits an int64 (the regex has already made them digits)."""
    longest = max(map(len, values))
    if longest != 19:
        return longest < 19
    if max(values)[:1] < b"9":
        return True  # no 19-digit value starts with 9, so none passes 9223372036854775807
    limit = str(INT_MAX).encode()
    return all(len(v) < 19 or v <= limit for v in values)


def _intern(raw: Sequence[bytes]) -> tuple[list[str] | None, Int32s]:
    """(names in first-seen order, index of each value); None where one is not a JSON string.

    Spellings of one name (`"z"` and `"\\u007a"`) are one name."""
    index = dict.fromkeys(raw, 0)  # first-seen order
    names: dict[str, int] = {}
    for value in index:
        try:
            name = json.loads(b'"' + value + b'"')
        except (ValueError, UnicodeDecodeError):
            return None, np.zeros(0, np.int32)
        index[value] = names.setdefault(name, len(names))
    return list(names), np.fromiter(map(index.__getitem__, raw), np.int32, len(raw))
