"""The per-step values users record with a phase (`prof.phase("forward", tokens=n)`: the
record's "meta"), as rank x step matrices beside the phase times.

Read only when the analysis asks (a finding to explain), with DuckDB over the same
checked lines the timings engine takes (read/_duck.py). A value is a number a record's
meta holds at its top level; a phase that runs several times in a step gets the sum of
its values there, as its time is the sum of its times. A file that holds several
attempts is left out (which attempt's value belongs to a step is what the line order
says, and DuckDB does not give it) and said in `notes`; a record whose rank is not its
file's is left out too (the timings reader has said it among the skipped lines).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ...rundir._listing import RunDir
from ._duck import COLUMNS, connect, lines_sql, name_of
from ._health import RunHealth
from ._run import run_root

__all__ = ["CpuTimes", "PhaseValues", "read_cpu_times", "read_phase_values"]

Matrix = npt.NDArray[np.float64]

_PER_FILE = """, per_file AS (
    SELECT filename, count(DISTINCT attempt::VARCHAR) FILTER (WHERE known AND opens) AS attempts
    FROM lines GROUP BY filename
)"""
_QUERY = f"""
WITH {lines_sql(extra=", meta")}{_PER_FILE}
SELECT filename, rank, step, phase, CAST(meta AS VARCHAR) AS meta, per_file.attempts
FROM lines JOIN per_file USING (filename)
WHERE known AND record AND NOT error AND meta IS NOT NULL
    AND list_contains($phases, phase->>'$')
"""
_TIMES = f"""
WITH {lines_sql()}{_PER_FILE}
SELECT filename, rank, step, phase, oncpu_ms, runq_ms, per_file.attempts
FROM lines JOIN per_file USING (filename)
WHERE known AND record AND NOT error AND oncpu_ms IS NOT NULL
    AND list_contains($phases, phase->>'$')
"""
_PEERS = 16
"""Other ranks' files read beside a slow rank's for its CPU times: their median is what
its own is held against, and reading every rank's file for it took 1.2 s more of a 1.9 s
analysis of 1024 ranks."""
_MAX_FIELDS = 16
"""Value names kept per phase: a few (tokens, samples, sequence length), not free text."""


@dataclass
class PhaseValues:
    """Per phase, per value name, a [rank index, step index] matrix (NaN: none recorded)."""

    values: dict[str, dict[str, Matrix]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    health: RunHealth | None = None
    """The ranks' GPU and host health at their sampled steps (read/_health.py), where the
    caller read it: per-step figures the causes weigh beside these."""

    def of(self, phase: str) -> dict[str, Matrix]:
        return self.values.get(phase, {})


def read_phase_values(
    run_dir: str | os.PathLike[str],
    ranks: list[int],
    steps: list[int],
    phases: Collection[str],
) -> PhaseValues:
    """The numeric meta values of `phases` at `ranks` x `steps` (those of the matrices the
    analysis holds)."""
    root = run_root(run_dir)
    out = PhaseValues()
    if not phases:  # no phase to explain holds values (RunRecords.valued says which do)
        return out
    rank_of = {str(entry.path): entry.rank for entry in RunDir(root).timings()}
    try:
        rows = _query(_QUERY, rank_of, phases)
    except Exception as exc:  # DuckDB's own errors: the values are extra, the rest stands
        out.notes.append(f"{root}: per-step values not read ({type(exc).__name__}: {exc})")
        return out
    row_of = {rank: i for i, rank in enumerate(ranks)}
    col_of = {step: i for i, step in enumerate(steps)}
    restarted: set[str] = set()
    for filename, rank, step, raw_phase, meta, attempts in rows:
        phase = name_of(raw_phase)
        if phase is None or phase not in phases or rank != rank_of.get(filename):
            continue
        if attempts > 1:
            restarted.add(filename)
            continue
        r, s = row_of.get(rank), col_of.get(step)
        if r is None or s is None:
            continue
        for name, value in _numbers(meta):
            matrices = out.values.setdefault(phase, {})
            if name not in matrices:
                if len(matrices) >= _MAX_FIELDS:
                    continue
                matrices[name] = np.full((len(ranks), len(steps)), np.nan)
            cell = matrices[name][r, s]
            matrices[name][r, s] = value if math.isnan(cell) else cell + value
    if restarted:
        out.notes.append(
            f"per-step values of {len(restarted)} file(s) that hold several attempts left out "
            f"(e.g. {Path(min(restarted)).name})"
        )
    return out


@dataclass
class CpuTimes:
    """Per phase, ranks x steps (NaN where not read): where a phase's time went."""

    oncpu: dict[str, Matrix] = field(default_factory=dict)
    """The thread's time on a CPU ("oncpu_ms")."""
    runq: dict[str, Matrix] = field(default_factory=dict)
    """The thread's wait for a CPU ("runq_ms"): ready to run, its cores busy."""


def read_cpu_times(
    run_dir: str | os.PathLike[str],
    ranks: list[int],
    steps: list[int],
    phases: Collection[str],
    of: Collection[int],
) -> CpuTimes:
    """Per phase of `phases`, the thread CPU time and wait for a CPU its records say
    ("oncpu_ms", "runq_ms", summed over its runs in a step) at `ranks` x `steps`: of the
    ranks `of` and up to `_PEERS` others, spread over the run (NaN elsewhere). A file of
    several attempts, or a DuckDB error, gives none: the analysis then says nothing of
    CPU time."""
    rank_of = {str(entry.path): entry.rank for entry in RunDir(run_root(run_dir)).timings()}
    others = sorted({r for r in rank_of.values() if r not in of})
    picked = set(of) | set(others[:: max(1, math.ceil(len(others) / _PEERS))])
    out = CpuTimes()
    try:
        rows = _query(_TIMES, {f: r for f, r in rank_of.items() if r in picked}, phases)
    except Exception:  # the CPU times are extra
        return out
    row_of = {rank: i for i, rank in enumerate(ranks)}
    col_of = {step: i for i, step in enumerate(steps)}
    shape = (len(ranks), len(steps))
    for filename, rank, step, raw_phase, oncpu, runq, attempts in rows:
        phase = name_of(raw_phase)
        r, s = row_of.get(rank), col_of.get(step)
        if phase is None or phase not in phases or rank != rank_of.get(filename):
            continue
        if attempts > 1 or r is None or s is None:
            continue
        _add(out.oncpu.setdefault(phase, np.full(shape, np.nan)), r, s, oncpu)
        if runq is not None:
            _add(out.runq.setdefault(phase, np.full(shape, np.nan)), r, s, runq)
    return out


def _add(times: Matrix, r: int, s: int, value: float) -> None:
    times[r, s] = value if math.isnan(times[r, s]) else times[r, s] + value


def _query(sql: str, rank_of: dict[str, int], phases: Collection[str]) -> list[tuple[Any, ...]]:
    """`sql`'s rows over the timings files `rank_of` names, for `phases`."""
    if not rank_of:
        return []
    con = connect()
    try:
        params = {
            "files": sorted(rank_of),
            "columns": {**COLUMNS, "meta": "JSON"},
            "phases": sorted(phases),
        }
        rows: list[tuple[Any, ...]] = con.execute(sql, params).fetchall()
        return rows
    finally:
        con.close()


def _numbers(meta: str) -> list[tuple[str, float]]:
    """The top-level numbers (not booleans) of a record's meta, finite ones only."""
    try:
        data = json.loads(meta)
    except (ValueError, RecursionError):
        return []
    if not isinstance(data, dict):
        return []
    out = []
    for name, value in data.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        try:
            number = float(value)
        except OverflowError:  # an integer past any float
            continue
        if math.isfinite(number):
            out.append((name, number))
    return out
