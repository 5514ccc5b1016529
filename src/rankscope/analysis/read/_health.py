"""The GPU's and the host's health at each rank's sampled steps (RUN_DIR/health/, written
by timing/_health.py), read line by line as untrusted input.

A line that is no health sample (not JSON, another rank's, a step that is no step, a
figure that is not a finite number >= 0) is skipped and counted, per file, with the
first reason; a file that cannot be read is named. An attempt line says whose samples
follow: where the analysis uses one attempt, the samples of its tokens alone are kept;
else the latest sample of a step wins, as the latest record does in the timings.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..._errors import TraceError
from ...rundir._health import FIGURES, HEALTH_VERSION, THROTTLE_REASONS
from ...rundir._listing import RunDir, open_regular
from ._attempts import Attempts

__all__ = ["RankHealth", "RunHealth", "read_health", "reason_bits", "tokens_of"]

_LINE_MAX = 4096
"""Bytes in one health line at most: the sampler writes about 350."""
_REASONS_MAX = 16
"""Throttle reasons in one line at most: NVML has nine."""
_WORD_MAX = 64
_BIT = {word: bit for bit, word in THROTTLE_REASONS}
_COLUMN = {name: i for i, name in enumerate(FIGURES)}


def reason_bits(words: Collection[str]) -> int:
    """The THROTTLE_REASONS bits of `words` (a word no rankscope writes counts for none)."""
    bits = 0
    for word in words:
        bits |= _BIT.get(word, 0)
    return bits


@dataclass(frozen=True)
class RankHealth:
    """One rank's samples as columns, one row per sampled step (ascending): a run of many
    ranks and steps holds numbers, not an object per sample."""

    steps: npt.NDArray[np.int64]
    figures: npt.NDArray[np.float64]
    """[row, FIGURES index]; NaN where the line gave no figure."""
    reasons: npt.NDArray[np.int64]
    """THROTTLE_REASONS bits set at each row; -1 where the reasons were not read."""

    def __len__(self) -> int:
        return len(self.steps)

    def figure(self, name: str) -> npt.NDArray[np.float64]:
        return self.figures[:, _COLUMN[name]]

    def between(self, first: int, last: int) -> RankHealth:
        """The rows of steps `first`..`last`."""
        keep = (self.steps >= first) & (self.steps <= last)
        return RankHealth(self.steps[keep], self.figures[keep], self.reasons[keep])


_NONE = RankHealth(np.zeros(0, np.int64), np.zeros((0, len(FIGURES))), np.zeros(0, np.int64))


@dataclass
class RunHealth:
    """Per rank, its samples; and what the reading skipped."""

    ranks: dict[int, RankHealth] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    def of(self, rank: int) -> RankHealth:
        return self.ranks.get(rank, _NONE)


def tokens_of(attempts: Attempts) -> dict[int, set[str] | None] | None:
    """Per rank of the attempt the figures use, its token (None for a rank whose records
    no attempt line opens, an older rankscope's: its samples cannot be told apart); None
    where the figures use the latest record of each step (no attempt picked)."""
    if attempts.used is None or not 0 < attempts.used <= len(attempts.marks):
        return None
    marks = attempts.marks[attempts.used - 1]
    return {rank: None if mark.token is None else {mark.token} for rank, mark in marks.items()}


def read_health(
    run_dir: str | os.PathLike[str],
    tokens: Mapping[int, Collection[str] | None] | None = None,
) -> RunHealth:
    """Every rank's health samples under `run_dir` (none where it has no health/ folder).
    `tokens`: per rank, the attempt tokens whose samples to keep (None: every attempt's);
    a rank it does not hold keeps none."""
    out = RunHealth()
    run = RunDir(run_dir)
    for entry in sorted(run.health(), key=lambda e: e.rank):
        wanted = None if tokens is None else tokens.get(entry.rank, ())
        try:
            samples, bad, first = _read_file(entry.path, entry.rank, wanted)
        except (OSError, TraceError) as exc:
            out.skipped.append(f"{entry.path}: cannot be read ({exc})")
            continue
        if samples is not None:
            out.ranks[entry.rank] = samples
        if bad:
            lines = "line" if bad == 1 else "lines"
            out.skipped.append(f"{entry.path}: {bad} {lines} skipped ({first})")
    out.skipped.extend(run.left_out)
    return out


def _read_file(
    path: Path, rank: int, wanted: Collection[str] | None
) -> tuple[RankHealth | None, int, str | None]:
    samples: dict[int, tuple[list[float], int]] = {}
    bad, first = 0, None
    token: str | None = None
    number = 0
    with open_regular(path) as fh:
        while raw := fh.readline(_LINE_MAX + 1):  # bounded: a line may never end
            number += 1
            if len(raw) > _LINE_MAX:
                why: str | None = f"line {number}: over {_LINE_MAX} bytes"
                while raw and not raw.endswith(b"\n"):
                    raw = fh.readline(_LINE_MAX + 1)
            elif not raw.strip():
                continue
            else:
                why = None
                try:
                    line = json.loads(raw)
                except (ValueError, RecursionError):
                    if not raw.endswith(b"\n"):
                        continue  # the torn last line of a rank that died mid-write
                    why = f"line {number}: not JSON"
                else:
                    if isinstance(line, dict) and "attempt" in line:
                        said = line.get("attempt")
                        token = said if isinstance(said, str) else None
                        continue
                    parsed = _sample(line, rank)
                    if isinstance(parsed, str):
                        why = f"line {number}: {parsed}"
                    elif wanted is None or token in wanted:
                        samples[parsed[0]] = parsed[1]  # the latest of a step wins
            if why is not None:
                bad += 1
                first = first or why
    if not samples:
        return None, bad, first
    steps = sorted(samples)
    return (
        RankHealth(
            np.asarray(steps, np.int64),
            np.asarray([samples[s][0] for s in steps], np.float64),
            np.asarray([samples[s][1] for s in steps], np.int64),
        ),
        bad,
        first,
    )


def _sample(line: Any, rank: int) -> tuple[int, tuple[list[float], int]] | str:  # noqa: PLR0911 - a return per rule
    """(step, (its FIGURES, NaN where none; its reason bits, -1 where not read)), or why
    the line is no sample."""
    if not isinstance(line, dict):
        return "not a JSON object"
    if line.get("v") != HEALTH_VERSION:
        return f"schema version {line.get('v')!r}, not 1"
    if line.get("rank") != rank or isinstance(line.get("rank"), bool):
        return f"rank {line.get('rank')!r} in the file of rank {rank}"
    step = line.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 1 << 63:
        return f"step {step!r} is not an integer >= 0"
    figures = [math.nan] * len(FIGURES)
    for i, name in enumerate(FIGURES):
        value = line.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{name} {value!r} is not a number"
        try:
            number = float(value)
        except OverflowError:  # an integer past any float
            return f"{name} is a number past any float"
        if not math.isfinite(number) or number < 0:
            return f"{name} {value!r} is not a finite number >= 0"
        figures[i] = number
    reasons = line.get("throttle")
    if reasons is not None and not (
        isinstance(reasons, list)
        and len(reasons) <= _REASONS_MAX
        and all(isinstance(r, str) and 0 < len(r) <= _WORD_MAX for r in reasons)
    ):
        return "throttle is not a list of reasons"
    return step, (figures, -1 if reasons is None else reason_bits(reasons))
