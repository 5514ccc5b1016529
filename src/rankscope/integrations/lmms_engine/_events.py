"""lmms-engine's own timings, the files its CUDA-event profiler already wrote, as a run
directory every `rankscope` command reads.

lmms-engine's FSDP2 trainer (`trainer_args.enable_cuda_event_profiler`) times three
phases of a recorded step with CUDA events, `host_to_device`, `training_step` and
`training_metrics`, and appends one JSON line per phase and micro-batch to
OUTPUT_DIR/cuda_event_profiler/cuda_events_rank_{r}.jsonl:
`{"duration_ms": 37.1, "name": "training_step", "rank": 0, "step": 0}`. The lines carry
no time of day, no host and no world size. `import_cuda_events` (and `rankscope import
lmms-engine`) turns those files into a run directory:

- each line is one record of its rank (`gpu_ms` and `cpu_ms` its duration: the events
  time the GPU's stream), a rank's phases of a step laid one after another from the same
  instant on every rank, in the order the file holds them (micro-batches of one step
  under gradient accumulation stay apart, as a phase that runs more than once a step);
- a `step` record per rank and step spans its phases;
- `host_to_device` is of kind "io", the rest "compute". No record says whether a
  collective ran in it (`coll`): lmms-engine does not count them, and what the analysis
  would weigh against such a count, when ranks left the phase, is laid out here rather
  than measured. The analysis reads a phase as ending in a collective where the ranks
  enter it apart and leave it together (`training_step` ends in the loss's all-reduce);
- every rank is on one host (the lines name none), and the meta files say the world
  size is the number of rank files, or one past the highest rank.

What it cannot give: where inside `training_step` a rank is slow (the events time it
whole), and the time between recorded phases (the data loader is not timed). A line
that is not such a row is skipped and counted, per file, with the first reason.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..._errors import RankscopeError
from ...config._ranks import RankInfo
from ...rundir._attempt import current_attempt
from ...rundir._files import append, read_regular
from ...rundir._layout import timing_path
from ...rundir._meta import write_meta
from ...timing._record import STEP_PHASE, Span, format_attempt, format_record

__all__ = ["EVENTS_FOLDER", "KINDS", "ImportedRun", "import_cuda_events"]

EVENTS_FOLDER = "cuda_event_profiler"
"""The folder lmms-engine writes its CUDA-event files to, under its `output_dir`."""

HOST = "lmms-engine"
"""The host every imported rank is given: the lines name none, and one host means no
clock offset is taken between ranks (their steps are laid from one instant)."""

_FILE = re.compile(r"^cuda_events_rank_(\d{1,7})\.jsonl$")
KINDS = {"host_to_device": "io"}
"""The kind of each lmms-engine phase that is not "compute"."""
_MAX_BYTES = 2 << 30  # one rank's file, at most
_MAX_LINE = 64 << 10
_MAX_MS = 86_400_000.0  # a phase of over a day is no timing


@dataclass
class ImportedRun:
    """What `import_cuda_events` wrote, and what it left out."""

    run_dir: Path
    ranks: list[int] = field(default_factory=list)
    world_size: int = 0
    records: int = 0
    steps: int = 0
    skipped: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Per file name: lines left out, and the first one's reason."""

    def summary(self) -> str:
        said = (
            f"imported {self.records} records of {self.steps} steps from "
            f"{len(self.ranks)} rank(s) into {self.run_dir}"
        )
        for name, (count, why) in sorted(self.skipped.items()):
            said += f"\n  {name}: {count} line(s) left out (first: {why})"
        return said


@dataclass(frozen=True)
class _Row:
    name: str
    step: int
    ms: float


def import_cuda_events(
    source: str | os.PathLike[str], run_dir: str | os.PathLike[str]
) -> ImportedRun:
    """Write the run directory `run_dir` from lmms-engine's CUDA-event files under
    `source` (its output_dir, or the cuda_event_profiler folder itself).

    A RankscopeError names what is wrong where there is nothing to import, or where
    `run_dir` already holds timings (nothing there is overwritten)."""
    folder = Path(source)
    if (folder / EVENTS_FOLDER).is_dir():
        folder = folder / EVENTS_FOLDER
    if not folder.is_dir():
        raise RankscopeError(
            f"{source}: no such folder (lmms-engine's output_dir, or its {EVENTS_FOLDER}/)"
        )
    files = {}
    for path in sorted(folder.iterdir()):
        match = _FILE.match(path.name)
        if match and path.is_file():
            files[int(match.group(1))] = path
    if not files:
        raise RankscopeError(
            f"{folder}: no cuda_events_rank_N.jsonl file (lmms-engine writes them with "
            "trainer_args.enable_cuda_event_profiler: true, on its fsdp2 trainers)"
        )
    out = ImportedRun(Path(run_dir))
    if timing_path(out.run_dir, 0).parent.exists():
        raise RankscopeError(f"{run_dir} already holds timings: import into a new folder")
    read = {rank: _by_step(_rows(path, rank, out)) for rank, path in files.items()}
    ranks = {rank: steps for rank, steps in read.items() if steps}
    if not ranks:
        raise RankscopeError(f"{folder}: no line of any file is a timing row ({out.summary()})")
    out.ranks = sorted(ranks)
    out.world_size = max(len(files), max(files) + 1)
    steps = sorted({step for by_step in ranks.values() for step in by_step})
    out.steps = len(steps)
    # Each step begins where the longest rank's previous one ended, on every rank.
    length = dict.fromkeys(steps, 0)
    for by_step in ranks.values():
        for step, rows in by_step.items():
            length[step] = max(length[step], sum(_ns(row.ms) for row in rows))
    begin: dict[int, int] = {}
    at = 1_700_000_000_000_000_000  # a fixed instant: the lines hold no time of day
    for step in steps:
        begin[step] = at
        at += length[step] + 1_000_000  # 1 ms apart: the steps' order is never in doubt
    out.run_dir.mkdir(parents=True, exist_ok=True)
    attempt = current_attempt().to_dict()
    config = {"imported_from": "lmms-engine cuda_event_profiler", "source": str(folder)}
    for rank, by_step in ranks.items():
        info = RankInfo(
            rank=rank,
            local_rank=rank,
            world_size=out.world_size,
            local_world_size=out.world_size,
            host=HOST,
        )
        write_meta(str(out.run_dir), info, config, attempt)
        lines = [format_attempt(rank, attempt, HOST, out.world_size)]
        lines += _records(rank, by_step, begin)
        out.records += sum(len(rows) for rows in by_step.values())
        append(str(out.run_dir), timing_path(out.run_dir, rank), "".join(lines).encode())
    return out


def _by_step(rows: list[_Row]) -> dict[int, list[_Row]]:
    """A rank's rows by step, each step's in the file's order (its micro-batches apart)."""
    by_step: dict[int, list[_Row]] = {}
    for row in rows:
        by_step.setdefault(row.step, []).append(row)
    return by_step


def _records(rank: int, by_step: dict[int, list[_Row]], begin: dict[int, int]) -> Iterator[str]:
    """The rank's records, step by step: its phases one after another, then the step."""
    for step in sorted(by_step):
        at = begin[step]
        for row in by_step[step]:
            span = Span(step, row.name, KINDS.get(row.name, "compute"), None, 0, None)
            span.start_ns, span.cpu_ns = at, _ns(row.ms)
            at += span.cpu_ns
            yield format_record(rank, span, row.ms, 0)
        whole = Span(step, STEP_PHASE, STEP_PHASE, None, 0, None)
        whole.start_ns, whole.cpu_ns = begin[step], at - begin[step]
        yield format_record(rank, whole, whole.cpu_ns / 1e6, 0)


def _ns(ms: float) -> int:
    return round(ms * 1e6)


def _rows(path: Path, rank: int, out: ImportedRun) -> list[_Row]:
    """The file's timing rows; each other line counted with the first reason."""
    try:
        data = read_regular(path, _MAX_BYTES)
    except (OSError, ValueError) as exc:
        out.skipped[path.name] = (1, f"the file cannot be read: {exc}")
        return []
    if len(data) > _MAX_BYTES:
        out.skipped[path.name] = (1, f"the file is over {_MAX_BYTES >> 30} GiB")
        return []
    found, bad, first = [], 0, ""
    for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        if not line.strip():
            continue
        row, why = _row(line, rank)
        if row is None:
            bad += 1
            first = first or f"line {number}: {why}"
        else:
            found.append(row)
    if bad:
        out.skipped[path.name] = (bad, first)
    return found


class _NotARow(ValueError):
    """Why a line is not a timing row."""


def _row(line: str, rank: int) -> tuple[_Row | None, str]:
    try:
        return _parse(line, rank), ""
    except _NotARow as exc:
        return None, str(exc)


def _parse(line: str, rank: int) -> _Row:
    if len(line) > _MAX_LINE:
        raise _NotARow(f"over {_MAX_LINE // 1024} KB")
    try:
        data: Any = json.loads(line)
    except ValueError:
        raise _NotARow("not JSON") from None
    if not isinstance(data, dict):
        raise _NotARow("not a JSON object")
    name, step, ms, of = (data.get(k) for k in ("name", "step", "duration_ms", "rank"))
    if not isinstance(name, str) or not name or len(name) > 200 or name == STEP_PHASE:
        raise _NotARow(f"name {name!r} is not a phase name")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise _NotARow(f"step {step!r} is not an integer >= 0")
    if isinstance(of, bool) or of != rank:
        raise _NotARow(f"rank {of!r} is not the file's ({rank})")
    if isinstance(ms, bool) or not isinstance(ms, (int, float)):
        raise _NotARow(f"duration_ms {ms!r} is not a number")
    if not math.isfinite(ms) or not 0 <= ms < _MAX_MS:
        raise _NotARow(f"duration_ms {ms!r} is not a duration")
    return _Row(name, step, float(ms))
