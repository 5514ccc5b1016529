"""A run's timings as one rank x sampled-step matrix per phase: what the analyzers compare."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from .._errors import ConfigError
from .read._timings import RunTimings

__all__ = ["STEP", "TIME_BASES", "PhaseMatrices", "phase_matrices"]

STEP = "step"
"""The phase name (and kind) of the timer's per-step record."""

TIME_BASES = ("host", "device")

Matrix = npt.NDArray[np.float64]


@dataclass(eq=False)
class PhaseMatrices:
    """Per phase, [rank index, step index] matrices; NaN where a rank has no record."""

    ranks: list[int]
    steps: list[int]
    phases: list[str]
    """In the order a step runs them (by median start), the step record last."""
    kinds: list[str]
    depths: list[int]
    """The smallest nesting depth each phase was recorded at."""
    time: str
    """"host" (cpu_ms) or "device" (gpu_ms) durations."""
    ms: list[Matrix]
    """Time spent in the phase, summed over its invocations in the step."""
    start_ns: list[Matrix]
    """Wall clock at its first entry in the step (ns after `origin_ns`)."""
    end_ns: list[Matrix]
    """Wall clock at its last exit in the step (host time, ns after `origin_ns`)."""
    origin_ns: int

    def index(self, phase: str) -> int:
        return self.phases.index(phase)


def phase_matrices(timings: RunTimings, time: str = "host") -> PhaseMatrices:
    """Gather every rank's records into per-phase matrices (errored phases left out).

    `time` chooses the durations compared: "host" (cpu_ms, every record has it) or
    "device" (gpu_ms; records without it count as missing).
    """
    if time not in TIME_BASES:
        raise ConfigError("time", time, " or ".join(TIME_BASES))
    flat = _Flat.gather(timings, time)
    steps = np.unique(flat.step)
    n_r, n_s = len(flat.ranks), len(steps)
    cell = flat.rank * n_s + np.searchsorted(steps, flat.step)
    origin = int(flat.start.min()) if len(flat.start) else 0
    start = (flat.start - origin).astype(np.float64)
    end = start + flat.host_ms * 1e6
    order = np.argsort(flat.phase, kind="stable")
    bounds = np.searchsorted(flat.phase[order], np.arange(len(flat.names) + 1))
    ms: list[Matrix] = []
    starts: list[Matrix] = []
    ends: list[Matrix] = []
    for p in range(len(flat.names)):
        sel = order[bounds[p] : bounds[p + 1]]
        ms.append(_sum(cell[sel], flat.ms[sel], n_r, n_s))
        starts.append(_extreme(np.minimum, cell[sel], start[sel], n_r, n_s))
        ends.append(_extreme(np.maximum, cell[sel], end[sel], n_r, n_s))
    # Steps run their phases in start order; the step record (which spans them all) goes last.
    began = np.fmin.reduce(np.stack(starts), axis=0) if starts else np.zeros((n_r, n_s))
    typical = [_median(s - began) for s in starts]
    ranked = sorted(
        range(len(flat.names)),
        key=lambda p: (flat.names[p] == STEP, typical[p], flat.names[p]),
    )
    return PhaseMatrices(
        ranks=flat.ranks,
        steps=[int(s) for s in steps],
        phases=[flat.names[p] for p in ranked],
        kinds=[flat.kind_of(flat.names[p]) for p in ranked],
        depths=[flat.depth[flat.names[p]] for p in ranked],
        time=time,
        ms=[ms[p] for p in ranked],
        start_ns=[starts[p] for p in ranked],
        end_ns=[ends[p] for p in ranked],
        origin_ns=origin,
    )


@dataclass(eq=False)
class _Flat:
    """Every usable record of the run, one entry per record, with run-wide phase indexes."""

    ranks: list[int]
    rank: npt.NDArray[np.int64]
    step: npt.NDArray[np.int64]
    phase: npt.NDArray[np.int64]
    ms: Matrix
    start: npt.NDArray[np.int64]
    host_ms: Matrix
    names: list[str] = field(default_factory=list)
    depth: dict[str, int] = field(default_factory=dict)
    kinds: dict[str, Counter[str]] = field(default_factory=dict)

    def kind_of(self, name: str) -> str:
        votes = self.kinds.get(name)
        return votes.most_common(1)[0][0] if votes else "compute"

    @classmethod
    def gather(cls, timings: RunTimings, time: str) -> _Flat:
        ranks = sorted(timings.ranks)
        index: dict[str, int] = {}
        depth: dict[str, int] = {}
        kinds: dict[str, Counter[str]] = {}
        parts = []
        for row, rt in enumerate(timings.ranks[r] for r in ranks):
            local = np.array([index.setdefault(n, len(index)) for n in rt.names], np.int64)
            # Each rank votes once for every (phase, kind) pair it recorded.
            width = max(1, len(rt.kinds))
            for pair in np.unique(rt.phase.astype(np.int64) * width + rt.kind).tolist():
                name = rt.names[pair // width]
                kinds.setdefault(name, Counter())[rt.kinds[pair % width]] += 1
            shallowest = np.full(len(rt.names), np.iinfo(np.int64).max)
            np.minimum.at(shallowest, rt.phase, rt.depth)
            for name, d in zip(rt.names, shallowest.tolist(), strict=True):
                depth[name] = min(depth.get(name, d), d)
            keep = ~rt.error
            dur = rt.cpu_ms if time == "host" else rt.gpu_ms
            parts.append(
                (
                    np.full(int(keep.sum()), row, np.int64),
                    rt.step[keep],
                    local[rt.phase[keep]],
                    dur[keep],
                    rt.start_ns[keep],
                    rt.cpu_ms[keep],
                )
            )
        rank, step, phase, ms, start, host_ms = (
            np.concatenate(column) for column in zip(*parts, strict=True)
        )
        return cls(ranks, rank, step, phase, ms, start, host_ms, list(index), depth, kinds)


def _sum(cell: npt.NDArray[np.int64], values: Matrix, n_r: int, n_s: int) -> Matrix:
    valid = ~np.isnan(values)
    total: Matrix = np.bincount(cell[valid], weights=values[valid], minlength=n_r * n_s).astype(
        np.float64, copy=False
    )
    count = np.bincount(cell[valid], minlength=n_r * n_s)
    total[count == 0] = np.nan
    return total.reshape(n_r, n_s)


def _extreme(
    ufunc: np.ufunc, cell: npt.NDArray[np.int64], values: Matrix, n_r: int, n_s: int
) -> Matrix:
    fill = np.inf if ufunc is np.minimum else -np.inf
    out = np.full(n_r * n_s, fill)
    ufunc.at(out, cell, values)
    out[np.isinf(out)] = np.nan
    return out.reshape(n_r, n_s)


def _median(values: Matrix) -> float:
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if finite.size else float("inf")
