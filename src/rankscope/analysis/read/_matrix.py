"""A run's timings as one rank x sampled-step matrix per phase: what the analyzers compare."""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..._errors import ConfigError
from ..._text import format_ranks, number_ranges, one_line
from ..core._clocks import choose_clock
from ..core._ops import OpsGatherer, StepOps
from ..core._options import TIME, TIME_BASES
from ._engine import PhaseRecords, RunRecords
from ._timings import RunTimings

__all__ = [
    "STEP",
    "PhaseMatrices",
    "matrices_of",
    "nanmedian",
    "phase_matrices",
    "quiet",
    "shared_steps",
]

STEP = "step"
"""The phase name (and kind) of the timer's per-step record."""

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
    """The basis asked for: "auto", "host" (cpu_ms) or "device" (gpu_ms)."""
    clocks: list[str]
    """The clock each phase was read on, "host" or "device" (analysis/core/_clocks.py)."""
    ms: list[Matrix]
    """Time spent in the phase, summed over its invocations in the step."""
    start_ns: list[Matrix]
    """Wall clock at its first entry in the step (ns after `origin_ns`)."""
    end_ns: list[Matrix]
    """Wall clock at its last exit in the step (host time, ns after `origin_ns`)."""
    origin_ns: int
    timeline_ms: list[Matrix] | None = None
    """Where some phases are read on host time and others on device time: every phase's
    device time, the GPU's timeline, on which the phases follow each other (a host-side
    loader overlaps the GPU's work on the step before). None otherwise."""
    ops: StepOps | None = None
    """Each rank's top-level records in the order it ran them, where a phase runs more
    than once in a step (a pipeline's microbatches): what the pipeline replay reads."""
    runs: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """The phases some rank ran more than once in a step (a pipeline's microbatches, its
    sends and recvs; gradient accumulation's forward and backward): how many times a rank
    typically ran each in a step (the median over the rank-steps that ran it)."""
    issued: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    """The phases whose records say whether a collective was issued in them ("coll",
    timing/_collectives.py): True where half the records that say, or more, say one was.
    A phase absent here has records that do not say (an older rankscope, no process
    group): whether it ends in a collective is then guessed (analysis/stragglers/_arrivals.py)."""

    @property
    def repeats(self) -> frozenset[str]:
        """The phases some rank ran more than once in a step."""
        return frozenset(self.runs)

    @property
    def pipelined(self) -> bool:
        """A comm phase runs more than once in a rank's step: a pipeline's sends and recvs
        (gradient accumulation repeats its work phases, not its all-reduce)."""
        return any(
            kind == "comm" and name in self.runs
            for name, kind in zip(self.phases, self.kinds, strict=True)
        )

    def on_timeline(self) -> PhaseMatrices:
        """These matrices with every phase on the clock that places it in the step: what
        arrivals and the cost model add up (the device's, where phases are read on both)."""
        if self.timeline_ms is None:
            return self
        return dataclasses.replace(
            self, ms=self.timeline_ms, clocks=["device"] * len(self.phases), timeline_ms=None
        )

    def index(self, phase: str) -> int:
        return self.phases.index(phase)

    def holders(self) -> dict[int, tuple[int, npt.NDArray[np.bool_]]]:
        """Each nested phase's top-level phase: the one whose entry and exit hold the
        nested phase's at half or more of the (rank, step) cells where both ran (ties: the
        first to run), with the cells where it does. Nested phases held by none are left
        out."""
        top = [q for q, d in enumerate(self.depths) if d == 0 and self.phases[q] != STEP]
        out = {}
        for p, depth in enumerate(self.depths):
            if depth == 0:
                continue
            best, share, cells = -1, 0.5, np.zeros(0, dtype=bool)
            for q in top:
                with quiet(), np.errstate(invalid="ignore"):
                    both = np.isfinite(self.start_ns[p]) & np.isfinite(self.start_ns[q])
                    inside = (
                        both
                        & (self.start_ns[q] <= self.start_ns[p])
                        & (self.end_ns[p] <= self.end_ns[q])
                    )
                ran = int(both.sum())
                held = inside.sum() / ran if ran else 0.0
                if held > share or (best < 0 and held == share and ran):
                    best, share, cells = q, held, inside
            if best >= 0:
                out[p] = (best, cells)
        return out

    def work_inside(self, sync: set[str]) -> dict[int, tuple[list[int], Matrix]]:
        """Per top-level phase in `sync` (it ends in a collective) that holds work phases
        (nested one level down, not comm, that issued no collective of their own: a
        Trainer's batch fetch before its token count's all-gather): those phases, and
        each rank's time in them per step (ms, 0 where none ran inside). That work is the
        rank's own, done before it reaches the collective."""
        out: dict[int, tuple[list[int], Matrix]] = {}
        for p, (q, cells) in self.holders().items():
            if (
                self.depths[p] != 1
                or self.phases[q] not in sync
                or self.kinds[p] == "comm"
                or self.issued.get(self.phases[p], False)
            ):
                continue
            phases, ms = out.get(q, ([], np.zeros((len(self.ranks), len(self.steps)))))
            out[q] = ([*phases, p], ms + np.where(cells, np.nan_to_num(self.ms[p]), 0.0))
        return out

    @property
    def on_device(self) -> bool:
        """Some phase is read on device time: the host's clock does not say when a rank
        reached it, so arrivals are counted in the phases' own times."""
        return "device" in self.clocks

    @property
    def untimed(self) -> list[str]:
        """Phases asked for on device time whose records carry none."""
        return [
            phase
            for phase, clock, ms in zip(self.phases, self.clocks, self.ms, strict=True)
            if clock == "device" and not np.isfinite(ms).any()
        ]


def phase_matrices(timings: RunTimings, time: str = TIME) -> PhaseMatrices:
    """Gather every rank's records into per-phase matrices (errored phases left out).

    `time` chooses the durations compared: "auto" (each phase on the clock of its work,
    analysis/core/_clocks.py), "host" (cpu_ms, every record has it) or "device" (gpu_ms;
    records without it count as missing).
    """
    if time not in TIME_BASES:
        raise ConfigError("time", time, " or ".join(TIME_BASES))
    records = RunRecords(run_dir=timings.run_dir, time=time)
    for rank in sorted(timings.ranks):
        records.add_rank(timings.ranks[rank])
    out = matrices_of(records)
    timings.skipped.extend(records.skipped)  # the records counted once
    return out


def matrices_of(records: RunRecords) -> PhaseMatrices:
    """The per-phase matrices of a run's records (read/_engine.py read_run_records).

    The records are used up: each phase's parts are joined, placed and released in turn,
    so memory holds the records and one phase's copy besides the matrices. Where a
    top-level phase runs more than once in a rank's step (a pipeline's microbatches), the
    top-level records are kept besides, in order (`ops`)."""
    records.drop_all_twins()
    ranks = sorted(records.ranks)
    rank_index = np.asarray(ranks, np.int64)
    # Each part's few steps, then theirs: a join of every record's step would be two
    # copies of a column at the moment every record is still held (78 MB at 4096 x 200).
    every = [_distinct(part[1]) for phase in records.phases.values() for part in phase.parts]
    steps = _distinct(np.concatenate(every)) if every else np.zeros(0, np.int64)
    starts = [part[3] for phase in records.phases.values() for part in phase.parts if len(part[3])]
    origin = min((int(s.min()) for s in starts), default=0)
    n_r, n_s = len(ranks), len(steps)
    names = list(records.phases)
    ops = OpsGatherer() if _repeats(records, rank_index, steps) else None
    placed = _Placed(records.time, rank_index, steps, origin, ops)
    for name in names:
        placed.add(name, records.phases[name])
    first = placed.first
    # Steps run their phases in start order; the step record (which spans them all) goes last.
    began = np.full((n_r, n_s), np.nan)
    for start in first:
        np.fmin(began, start, out=began)
    typical = [_median(s - began) for s in first]
    ranked = sorted(range(len(names)), key=lambda p: (names[p] == STEP, typical[p], names[p]))
    return PhaseMatrices(
        ranks=ranks,
        steps=[int(s) for s in steps],
        phases=[names[p] for p in ranked],
        kinds=[one_line(_kind_of(records.phases[names[p]].kinds)) for p in ranked],
        depths=[records.phases[names[p]].depth for p in ranked],
        time=records.time,
        clocks=[placed.clocks[p] for p in ranked],
        ms=[placed.ms[p] for p in ranked],
        timeline_ms=_timeline([placed.device[p] for p in ranked], n_r, n_s)
        if len(set(placed.clocks)) > 1
        else None,
        start_ns=[first[p] for p in ranked],
        end_ns=[placed.last[p] for p in ranked],
        origin_ns=origin,
        ops=None if ops is None else ops.done(),
        runs=placed.runs,
        issued=placed.issued,
    )


@dataclass(eq=False)
class _Placed:
    """Each phase's records placed in its matrices, a phase at a time: what one phase's
    placing needs dies with it (at 4096 ranks x 200 steps its columns and cells, 50 MB,
    were held to the end beside every matrix)."""

    time: str
    ranks: npt.NDArray[np.int64]
    steps: npt.NDArray[np.int64]
    origin: int
    ops: OpsGatherer | None
    ms: list[Matrix] = dataclasses.field(default_factory=list)
    device: list[Matrix | None] = dataclasses.field(default_factory=list)
    """Each phase's device time under auto (None: it has none)."""
    clocks: list[str] = dataclasses.field(default_factory=list)
    first: list[Matrix] = dataclasses.field(default_factory=list)
    last: list[Matrix] = dataclasses.field(default_factory=list)
    runs: dict[str, float] = dataclasses.field(default_factory=dict)
    issued: dict[str, bool] = dataclasses.field(default_factory=dict)

    def add(self, name: str, phase: PhaseRecords) -> None:
        n_r, n_s = len(self.ranks), len(self.steps)
        if phase.said:
            self.issued[name] = 2 * phase.issued >= phase.said
        depth = phase.depth
        rank, step, dur, start_ns, host_ms = phase.take()
        cell = np.searchsorted(self.ranks, rank) * n_s + np.searchsorted(self.steps, step)
        clock = "host" if dur is host_ms else choose_clock(self.time, dur, host_ms)
        on_device = None if dur is host_ms else dur
        self.clocks.append(clock)
        if self.time == "auto":  # a CPU run's phases have none: not summed for nothing
            timed = dur is not host_ms and bool(np.isfinite(dur).any())
            self.device.append(_sum(cell, dur, n_r, n_s) if timed else None)
        if clock == "host":
            dur = host_ms
        start = (start_ns - self.origin).astype(np.float64)
        single = np.bincount(cell, minlength=1).max() <= 1  # a record per cell (common)
        if not single:
            counts = np.bincount(cell)
            self.runs[name] = float(np.median(counts[counts > 0]))
        self.ms.append(_sum(cell, dur, n_r, n_s))
        self.first.append(_extreme(np.minimum, cell, start, n_r, n_s, single=single))
        with np.errstate(over="ignore"):  # a time near a double's limit ends at infinity
            end = start + host_ms * 1e6
        self.last.append(_extreme(np.maximum, cell, end, n_r, n_s, single=single))
        if self.ops is not None and depth == 0 and name != STEP:
            self.ops.add(
                name,
                rank=rank,
                step=step,
                start_ns=start,
                end_ns=end,
                ms=dur,
                device_ms=on_device,
            )


def _repeats(
    records: RunRecords, ranks: npt.NDArray[np.int64], steps: npt.NDArray[np.int64]
) -> bool:
    """Some top-level phase (the step record aside) runs more than once in a rank's step.
    A file's records are in one part, so a cell's are too."""
    for name, phase in records.phases.items():
        if phase.depth != 0 or name == STEP:
            continue
        for part in phase.parts:
            cell = np.searchsorted(ranks, part[0]) * len(steps) + np.searchsorted(steps, part[1])
            if len(cell) and np.bincount(cell).max() > 1:
                return True
    return False


def _timeline(device: list[Matrix | None], n_r: int, n_s: int) -> list[Matrix]:
    """Every phase's device time, NaN (missing) where a phase has none."""
    return [np.full((n_r, n_s), np.nan) if d is None else d for d in device]


def _distinct(values: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The sorted distinct values (np.unique hashes large arrays of ints, 10x slower)."""
    ordered = np.sort(values)
    first = np.ones(len(ordered), np.bool_)
    first[1:] = ordered[1:] != ordered[:-1]
    return ordered[first]


def _kind_of(votes: Counter[str]) -> str:
    """The kind most ranks recorded the phase with; of kinds with as many votes, the first
    by name (so the answer does not follow the order the files were read in)."""
    return min(votes.items(), key=lambda vote: (-vote[1], vote[0]))[0] if votes else "compute"


def _sum(cell: npt.NDArray[np.int64], values: Matrix, n_r: int, n_s: int) -> Matrix:
    valid = ~np.isnan(values)
    total: Matrix = np.bincount(cell[valid], weights=values[valid], minlength=n_r * n_s).astype(
        np.float64, copy=False
    )
    count = np.bincount(cell[valid], minlength=n_r * n_s)
    total[count == 0] = np.nan
    return total.reshape(n_r, n_s)


def _extreme(
    ufunc: np.ufunc,
    cell: npt.NDArray[np.int64],
    values: Matrix,
    n_r: int,
    n_s: int,
    *,
    single: bool,
) -> Matrix:
    """Per cell, the smallest (np.minimum) or largest of `values`; `single`: each cell has
    one record at most, which is then placed at once."""
    if single:
        out = np.full(n_r * n_s, np.nan)
        out[cell] = values
        return out.reshape(n_r, n_s)
    fill = np.inf if ufunc is np.minimum else -np.inf
    out = np.full(n_r * n_s, fill)
    ufunc.at(out, cell, values)
    out[np.isinf(out)] = np.nan
    return out.reshape(n_r, n_s)


def _median(values: Matrix) -> float:
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if finite.size else float("inf")


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """All-NaN columns are expected (a missing rank, a step with one rank): no warnings."""
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def nanmedian(values: npt.ArrayLike, axis: int) -> npt.NDArray[np.float64]:
    """np.nanmedian(values, axis=axis), the same figures, without its slow path: over an
    axis of 600 values or more that holds a NaN, numpy takes a median per column in
    Python (0.8 s of the straggler rules at 4096 ranks). One sort instead: NaN sorts
    last, and each column's middle is found by its count of numbers."""
    a = np.asarray(values, dtype=np.float64)
    nan = np.isnan(a)
    if not nan.any():
        whole: npt.NDArray[np.float64] = np.median(a, axis=axis)
        return whole
    ordered = np.sort(a, axis=axis)
    count = np.expand_dims(a.shape[axis] - nan.sum(axis=axis), axis)
    low = np.take_along_axis(ordered, np.maximum((count - 1) // 2, 0), axis=axis)
    high = np.take_along_axis(ordered, count // 2, axis=axis)
    middle = np.where(count > 0, (low + high) / 2, np.nan)
    return np.squeeze(middle, axis=axis)


def shared_steps(m: PhaseMatrices) -> tuple[PhaseMatrices, list[str]]:
    """The matrices over the sampled steps every rank has, and a line for each group of
    ranks that had more, naming how many and which.

    A step only some ranks sampled cannot be compared: a median over one rank is its own
    time, a rank alone at 333k steps makes the run's figures its own, and a rank that
    samples every 5th step where the others sample each would be judged against steps
    it never saw. Where no step has every rank, the steps two ranks or more share are
    kept, and said."""
    if len(m.ranks) < 2 or not m.steps:
        return m, []
    has = np.zeros((len(m.ranks), len(m.steps)), np.bool_)
    for start in m.start_ns:
        has |= np.isfinite(start)
    every = np.asarray(has.all(axis=0), np.bool_)
    if every.all():
        return m, []
    keep = every if every.any() else np.asarray(np.sum(has, axis=0) >= 2, np.bool_)
    if not keep.any():
        return m, []  # no two ranks share a step: nothing to compare, as the rules say
    extra = has & ~keep[None, :]
    steps = np.asarray(m.steps)
    groups: dict[tuple[int, str], list[int]] = {}
    for r in np.flatnonzero(extra.any(axis=1)).tolist():
        mine = steps[extra[r]].tolist()
        groups.setdefault((len(mine), _few_ranges(mine, m.steps)), []).append(m.ranks[r])
    shared = "they all have" if every.any() else "two ranks or more have"
    lines = [
        f"{format_ranks(ranks)}: {count} sampled step{'s' if count != 1 else ''}"
        f"{' each' if len(ranks) > 1 else ''} that not every rank has (steps {said}), left "
        f"out: ranks are compared on the {int(keep.sum())} steps {shared}"
        for (count, said), ranks in sorted(groups.items(), key=lambda g: g[1][0])
    ]
    return take_steps(m, np.flatnonzero(keep)), lines


def take_steps(m: PhaseMatrices, cols: npt.NDArray[np.int64]) -> PhaseMatrices:
    """The matrices of the steps at `cols` alone."""
    return dataclasses.replace(
        m,
        steps=[m.steps[c] for c in cols.tolist()],
        ms=[d[:, cols] for d in m.ms],
        start_ns=[d[:, cols] for d in m.start_ns],
        end_ns=[d[:, cols] for d in m.end_ns],
        timeline_ms=None if m.timeline_ms is None else [d[:, cols] for d in m.timeline_ms],
    )


def _few_ranges(numbers: list[int], among: list[int], most: int = 3) -> str:
    """`200-999998`, or the first `most` runs of many and how many more."""
    runs = number_ranges(numbers, among=among).split(", ")
    return (
        ", ".join(runs)
        if len(runs) <= most
        else f"{', '.join(runs[:most])} and {len(runs) - most} more runs"
    )
