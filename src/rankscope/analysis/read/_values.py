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

import numpy as np
import numpy.typing as npt

from ...rundir._layout import RunDir
from ._duck import COLUMNS, connect, lines_sql, name_of
from ._health import RunHealth
from ._run import run_root

__all__ = ["PhaseValues", "read_phase_values"]

Matrix = npt.NDArray[np.float64]

_QUERY = f"""
WITH {lines_sql(extra=", meta")}, per_file AS (
    SELECT filename, count(DISTINCT attempt::VARCHAR) FILTER (WHERE known AND opens) AS attempts
    FROM lines GROUP BY filename
)
SELECT filename, rank, step, phase, CAST(meta AS VARCHAR) AS meta, oncpu_ms, per_file.attempts
FROM lines JOIN per_file USING (filename)
WHERE known AND record AND NOT error AND (meta IS NOT NULL OR oncpu_ms IS NOT NULL)
    AND list_contains($phases, phase->>'$')
"""
_MAX_FIELDS = 16
"""Value names kept per phase: a few (tokens, samples, sequence length), not free text."""


@dataclass
class PhaseValues:
    """Per phase, per value name, a [rank index, step index] matrix (NaN: none recorded)."""

    values: dict[str, dict[str, Matrix]] = field(default_factory=dict)
    oncpu: dict[str, Matrix] = field(default_factory=dict)
    """Per phase asked for, the ranks' CPU time in it ("oncpu_ms", summed over its runs in
    a step; NaN where a record does not say)."""
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
    timed: Collection[str] = (),
) -> PhaseValues:
    """The numeric meta values of `phases` at `ranks` x `steps` (those of the matrices the
    analysis holds), and the CPU time of `timed` (the phases of the slow findings)."""
    root = run_root(run_dir)
    out = PhaseValues()
    if not phases and not timed:  # no phase to explain holds values (RunRecords.valued)
        return out
    rank_of = {str(entry.path): entry.rank for entry in RunDir(root).timings()}
    if not rank_of:
        return out
    con = connect()
    try:
        asked = sorted(set(phases) | set(timed))
        rows = con.execute(
            _QUERY,
            {"files": sorted(rank_of), "columns": {**COLUMNS, "meta": "JSON"}, "phases": asked},
        ).fetchall()
    except Exception as exc:  # DuckDB's own errors: the values are extra, the rest stands
        out.notes.append(f"{root}: per-step values not read ({type(exc).__name__}: {exc})")
        return out
    finally:
        con.close()
    row_of = {rank: i for i, rank in enumerate(ranks)}
    col_of = {step: i for i, step in enumerate(steps)}
    restarted: set[str] = set()
    for filename, rank, step, raw_phase, meta, oncpu, attempts in rows:
        phase = name_of(raw_phase)
        if phase is None or rank != rank_of.get(filename):
            continue
        if attempts > 1:  # (the CPU times go unsaid: the causes say nothing of them then)
            if meta is not None and phase in phases:
                restarted.add(filename)
            continue
        r, s = row_of.get(rank), col_of.get(step)
        if r is None or s is None:
            continue
        if phase in timed and oncpu is not None:
            times = out.oncpu.setdefault(phase, np.full((len(ranks), len(steps)), np.nan))
            times[r, s] = oncpu if math.isnan(times[r, s]) else times[r, s] + oncpu
        if phase not in phases or meta is None:
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
