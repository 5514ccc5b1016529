"""A pipeline's step replayed from the order its ranks ran their ops: what a fix saves
where a stage waits for the stage before it, not for every rank.

The segment model (analysis/_cost.py) takes a step as work that ends in collectives.
In a pipeline a stage runs a microbatch's forward once the stage before has sent it,
and how much of a slow stage's extra work the other stages' bubbles hide depends on the
schedule: 1F1B hides part of an early stage's, GPipe none. Where the ranks name their
pipeline stage as a parallel group (`Profiler(groups={"pipeline_stage": s})`: a group
whose values are 0 to S-1, as many ranks each, stage 0 the one that reads the input)
and some phase runs more than once a step (microbatches), the step is replayed:

- Each rank runs its top-level ops in the order it ran them (by entry; on a GPU the
  launch order, the program's). A stage's ranks ran the same ops in the same order at
  every replayed step (a step where one did not is left to the segment model); the
  i-th rank of one stage and the i-th of another are one replica of the pipeline.
- A phase flows from stage to stage where every stage runs it as often and the comm ops
  just before it at one end stage are not those at the other (a recv at one end only;
  an optimizer after its all-reduce at both ends flows not). The first of them that
  stage 0 runs (the forward) flows from stage 0, the others (the backward) from the
  last stage. Sends and recvs must be phases of their own names for this to be seen.
- The k-th run of a flowing phase on a stage waits for the k-th run on the stage before
  it in the flow, in the same replica, and for that stage's send just after it, if any.
  The comm op just before it is its recv: it ends at its own time after the rank
  reached it, or the wire's time after the data left, the later.
- A send either hands its data over and goes on (the data leaves when the send ends),
  or, where its runs take far longer than its least (gloo's and NCCL's send waits for
  its recv to be posted), ends its own time after both it and its recv were reached
  (the data leaves when the send is reached).
- Any other phase that ends in a collective and that every stage runs as often ends,
  on every rank, its own time (the least any rank spent in it that step: the last to
  arrive waits for no one) after the last rank reached it.
- Every other op is work, its time as measured. On host time, the time between two of a
  rank's ops (Python between phases) is its own, before the later op; the rest of its
  time in a step outside its ops is work at its end, as in the segment model.

A recv's or a waiting send's own time is the least time any of its runs took. The wire,
on host time, is the median of how long after the data left the recvs that waited
ended. On device time, where the host's clock says when ops were launched and not when
they ran, it is the recv's own time, made longer (the same for every such recv) as far as
brings the replay's steps level with the measured ones where they come out shorter.

The replay of the run as it was is held against the measured steps. Where it is further
than ROUGH_FIT from them, the segment model prices the fixes (analysis/_cost.py decides).
A fix scales a rank's ops of a phase to the time the fix gives the phase in the step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ._matrix import STEP, PhaseMatrices, nanmedian, quiet
from ._ops import StepOps

__all__ = ["Replay", "build_replay"]

Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]
At = tuple[int, int]
"""(stage, op index)."""
_MOST_CELLS = 200_000
"""Rank x step sequences read at most: a larger run is left to the segment model."""
_BISECTIONS = 20
"""Halvings of the search for an unmeasured wire (to a millionth of the step's gap)."""
_EXPLAINED = 0.5
"""Sends are taken to wait for their recv where the replay gives their time above their
own within this share of it."""
_NEAR = 0.05
"""And where that replay's steps are this near the measured ones."""
_WAITS = 0.1
"""A send waits for its recv where this share of its runs take over twice its least
time (and 0.1 ms more)."""


@dataclass(frozen=True)
class _Op:
    """One op of a stage's step, as the replay runs it."""

    phase: int
    """Its phase (an index into the matrices' phases)."""
    role: str
    """"work"; "recv" (ends when the data from `source` is there); "gated" (a flowing
    phase with no recv recorded before it: starts no sooner than the data is there);
    "send" (just after a flowing phase: the data leaves from it); "collective"."""
    source: At | None = None
    """A recv's or a gated op's: the send (or, with none, the flowing op) it waits for."""
    peer: At | None = None
    """A send that waits for its recv: that recv."""
    key: tuple[int, int] | None = None
    """A collective's (phase, which run of it in the step)."""


@dataclass(eq=False)
class Replay:
    """A pipeline's steps replayed (see the module): `steps` over the matrices' columns
    `ok`, and the same with fixes (`step_ms`)."""

    key: str
    """The group that names the stages."""
    stage_of: dict[int, At]
    """Rank index -> (stage, replica)."""
    ops: list[list[_Op]]
    """Each stage's ops, in the order they run."""
    ms: list[Floats]
    """Per stage, (op, replayed step, replica) times."""
    lead: list[Floats]
    """Per stage, (op, replayed step, replica) time between the op before and this one
    (on host time: the rank's own, as Python between two phases; none on device time)."""
    outside: list[Floats]
    """Per stage, (replayed step, replica) time outside the ops and their leads."""
    own: dict[int, float]
    """A recv's or a waiting send's phase: its own time (ms)."""
    wire: dict[int, float]
    """A recv's phase: how long after the data left it is there (ms)."""
    collective_own: dict[tuple[int, int], Floats]
    """A collective's own time at each replayed step."""
    ok: Bools
    """The matrices' columns (sampled steps) replayed."""
    steps: Floats = field(default_factory=lambda: np.zeros(0))
    """Per column, the replayed step (ms; NaN where not replayed)."""
    off: float = 0.0
    """How far its steps are from the measured ones (0: level; 0.1: 10% apart)."""
    base: _Baseline | None = None
    """The run as it was, replayed (keep_baseline): what replays of some replicas need."""

    def stages(self) -> list[list[int]]:
        """Each stage's rank indices, by replica."""
        out: list[list[int]] = [[] for _ in self.ops]
        for r, (s, _) in sorted(self.stage_of.items(), key=lambda kv: kv[1]):
            out[s].append(r)
        return out

    def step_ms(self, scale: Mapping[tuple[int, int], Floats]) -> Floats | None:
        """Per column, the replayed step with each (rank index, phase index) of `scale`'s
        ops multiplied by its factor at that column (1: as it was); None where the ops
        cannot be run in their order (a recv whose send never comes).

        A fix of some replicas replays those alone: the others run as they did, each
        stretch between two collectives moved by as much as the collective before it
        (their ops wait for no rank of another replica but in a collective). At 2048
        ranks, a replay per finding of a slow stage's ranks took 16 s of 31."""
        touched = sorted({self.stage_of[r][1] for r, _ in scale if r in self.stage_of})
        replicas = self.outside[0].shape[1]
        if not scale or self.base is None or len(touched) >= replicas:
            cols: list[int] | None = None
        else:
            cols = touched
        ms = [m if cols is None else m[:, :, cols] for m in self.ms]
        for (r, p), factor in scale.items():
            where = self.stage_of.get(r)
            if where is None:
                continue
            s, d = where
            at = [j for j, op in enumerate(self.ops[s]) if op.phase == p and op.role != "recv"]
            if at and ms[s] is self.ms[s]:
                ms[s] = ms[s].copy()
            for j in at:
                ms[s][j, :, d if cols is None else cols.index(d)] *= factor[self.ok]
        run = _Run(self, ms, cols)
        ends = run.ends()
        if ends is None:
            return None
        if cols is not None and self.base is not None:
            rest = [i for i in range(replicas) if i not in cols]
            ends = ends + [e[:, rest] + run.shift[:, None] for e in self.base.ends]
        out = np.full(len(self.ok), np.nan)
        with quiet():  # every rank's step: the measured step is their median
            out[self.ok] = nanmedian(np.concatenate(ends, axis=1), axis=1)
        return out

    def keep_baseline(self) -> bool:
        """Replays the run as it was and keeps what replays of some replicas need (False
        where it cannot be replayed)."""
        run = _Run(self, self.ms, None)
        ends = run.ends()
        if ends is None:
            return False
        self.base = _Baseline(ends=ends, arrivals=run.arrivals, collective_ends=run.collective_ends)
        return True


@dataclass(frozen=True)
class _Baseline:
    """The run as it was, replayed: what a replay of some replicas holds the rest to."""

    ends: list[Floats]
    """Per stage, (step, replica) end of step."""
    arrivals: dict[tuple[int, int], Floats]
    """Per collective, (step, replica) when the replica's last rank reached it."""
    collective_ends: dict[tuple[int, int], Floats]
    """Per collective, (step,) when it ended."""


class _Run:
    """One replay of the stages' ops with times `ms`, of every replica, or of the
    replicas `cols` alone (the others as in the replay's baseline)."""

    def __init__(self, replay: Replay, ms: list[Floats], cols: list[int] | None) -> None:
        self.r, self.ms, self.cols = replay, ms, cols
        self.lead = replay.lead if cols is None else [a[..., cols] for a in replay.lead]
        self.outside = replay.outside if cols is None else [a[:, cols] for a in replay.outside]
        shape = self.outside[0].shape
        self.now = [np.zeros(shape) for _ in replay.ops]
        self.reach = [np.zeros((len(ops), *shape)) for ops in replay.ops]
        self.end = [np.zeros((len(ops), *shape)) for ops in replay.ops]
        self.at = [0] * len(replay.ops)
        self.shift = np.zeros(shape[0])
        """How far the replicas not replayed are moved: by the last collective's change."""
        self.arrivals: dict[tuple[int, int], Floats] = {}
        self.collective_ends: dict[tuple[int, int], Floats] = {}

    def reached(self, s: int, j: int) -> Floats:
        """When stage `s` reached its op `j` (it is there or past it)."""
        at: Floats = self.reach[s][j] if self.at[s] > j else self.now[s] + self.lead[s][j]
        return at

    def ends(self) -> list[Floats] | None:
        """Each stage's (step, replica) end of step; None where no stage can go on."""
        stages, ops = range(len(self.r.ops)), self.r.ops
        while True:
            moved = False
            for s in stages:
                while self.at[s] < len(ops[s]) and ops[s][self.at[s]].role != "collective":
                    end = self._next(s)
                    if end is None:
                        break
                    j = self.at[s]
                    self.reach[s][j], self.end[s][j] = self.reached(s, j), end
                    self.now[s], self.at[s], moved = end, j + 1, True
            if all(self.at[s] == len(ops[s]) for s in stages):
                return [self.now[s] + self.outside[s] for s in stages]
            if not moved and not self._collective():
                return None  # stages wait at different collectives, or for one another

    def _next(self, s: int) -> Floats | None:
        """When stage `s`'s next op (not a collective) ends, or None while it waits for
        another stage."""
        j = self.at[s]
        op, reached = self.r.ops[s][j], self.reached(s, j)
        end: Floats
        if op.peer is not None:  # a send that waits for its recv
            v, i = op.peer
            if self.at[v] < i:
                return None
            end = np.maximum(reached, self.reached(v, i)) + self.r.own[op.phase]
        elif op.source is None:
            end = reached + self.ms[s][j]
        else:
            left = self._left(op.source)
            if left is None:
                return None
            if op.role == "recv":
                end = np.maximum(reached + self.r.own[op.phase], left + self.r.wire[op.phase])
            else:
                end = np.maximum(reached, left) + self.ms[s][j]
        return end

    def _left(self, source: At) -> Floats | None:
        """When the data of the send (or flowing op) at `source` left: as it was reached
        where the send waits for its recv, as it ended where not; None before then."""
        u, k = source
        if self.r.ops[u][k].peer is not None:
            return self.reached(u, k) if self.at[u] >= k else None
        return self.end[u][k] if self.at[u] > k else None

    def _collective(self) -> bool:
        """Every stage at the same collective: it ends on every rank; False where not."""
        stages, ops = range(len(self.r.ops)), self.r.ops
        if any(self.at[s] == len(ops[s]) for s in stages):
            return False
        keys = {ops[s][self.at[s]].key for s in stages}
        key = keys.pop()
        if keys or key is None:
            return False
        reached = [self.reached(s, self.at[s]) for s in stages]
        arrived = np.max(reached, axis=0)  # (step, replica): each replica's last rank
        self.arrivals[key] = arrived
        last = arrived.max(axis=1)
        base = self.r.base
        if self.cols is not None and base is not None:
            rest = [i for i in range(base.arrivals[key].shape[1]) if i not in self.cols]
            if rest:
                last = np.maximum(last, base.arrivals[key][:, rest].max(axis=1) + self.shift)
        ends = last + self.r.collective_own[key]
        self.collective_ends[key] = ends
        if base is not None and self.cols is not None:
            self.shift = ends - base.collective_ends[key]
        end = ends[:, None] + np.zeros_like(reached[0])
        for s in stages:
            j = self.at[s]
            self.reach[s][j], self.end[s][j] = reached[s], end
            self.now[s], self.at[s] = end.copy(), j + 1
        return True


def build_replay(
    m: PhaseMatrices, sync: set[str], groups: Mapping[int, Mapping[str, object]] | None
) -> Replay | str | None:
    """The replay of `m`'s pipeline (see the module); where `m` looks like a pipeline (a
    comm phase runs more than once in a rank's step) and cannot be replayed, why not; None
    where it holds no pipeline (no phase runs more than once a step, or no comm phase does:
    gradient accumulation)."""
    ops = m.ops
    if ops is None or not _p2p(m, ops, sync):
        return None
    cells = len(m.ranks) * len(m.steps)
    if cells > _MOST_CELLS:
        return f"more than {_MOST_CELLS:,} rank x step sequences to read"
    keys = _stage_keys(m.ranks, groups or {})
    if not keys:
        return (
            "no parallel group numbers its stages with integers, as many ranks each "
            '(Profiler(groups={"pipeline_stage": s}))'
        )
    # Each group that could number the stages, each way round (stage 0 should read the
    # input; where it is the last, the numbers run the other way): the replay that
    # comes closest to the measured steps.
    best: Replay | None = None
    why: list[str] = []
    records = _Sequences(m, ops)
    for key, stages in keys:
        for order in (stages, stages[::-1]):
            built = _Builder(m, sync, records, key, order).build()
            if isinstance(built, str):
                if order is stages and built not in why:
                    why.append(f"by {key}: {built}")
            elif best is None or built.off < best.off:
                best = built
    return best if best is not None else "; ".join(why)


def _p2p(m: PhaseMatrices, ops: StepOps, sync: set[str]) -> bool:
    """Some comm phase runs more than once in a rank's step (a pipeline's sends and recvs)."""
    comm = [i for i, name in enumerate(ops.names) if name in sync]
    if not comm or not len(m.steps):
        return False
    mine = np.isin(ops.phase, comm)
    cell = (ops.rank[mine] * (int(ops.step.max()) + 1) + ops.step[mine]) * len(ops.names)
    return bool(len(cell)) and bool(np.bincount(cell + ops.phase[mine]).max() > 1)


def _stage_keys(
    ranks: list[int], groups: Mapping[int, Mapping[str, object]]
) -> list[tuple[str, list[list[int]]]]:
    """Each group that could name pipeline stages: integer values, two or more, as many
    ranks each, every rank named; its stages' rank indices in rank order, stage 0 the
    least value."""
    out = []
    names = sorted({str(f) for named in groups.values() for f in named})
    for name in names:
        named = [groups.get(rank, {}).get(name) for rank in ranks]
        values = [v for v in named if isinstance(v, int) and not isinstance(v, bool)]
        if len(values) != len(ranks):
            continue
        count = Counter(values)
        if len(count) < 2 or len(set(count.values())) != 1:
            continue
        order = {v: i for i, v in enumerate(sorted(count))}
        stages: list[list[int]] = [[] for _ in count]
        for i, v in enumerate(values):
            stages[order[v]].append(i)
        out.append((name, stages))
    return out


class _Sequences:
    """Each rank's top-level records of each sampled step, as the matrices index them:
    read once for every group tried as the stages."""

    def __init__(self, m: PhaseMatrices, ops: StepOps) -> None:
        where = {name: m.phases.index(name) for name in ops.names if name in m.phases}
        phase = np.asarray([where.get(n, -1) for n in ops.names], np.int64)[ops.phase]
        ranks, steps = np.asarray(m.ranks), np.asarray(m.steps)
        rank = np.minimum(np.searchsorted(ranks, ops.rank), len(ranks) - 1)
        col = np.minimum(np.searchsorted(steps, ops.step), len(steps) - 1)
        known = (phase >= 0) & (ranks[rank] == ops.rank) & (steps[col] == ops.step)
        device = np.asarray([clock == "device" for clock in m.clocks])
        ms = np.where(device[np.maximum(phase, 0)], ops.device_ms, ops.ms)
        self.phase, self.ms = phase[known], np.nan_to_num(ms[known])
        self.start, self.end = ops.start_ns[known], ops.end_ns[known]
        cell = rank[known] * len(steps) + col[known]
        cuts = np.flatnonzero(np.diff(cell)) + 1
        cells = cell[np.r_[0, cuts]] if len(cell) else cell
        bounds = np.r_[0, cuts, len(cell)].tolist()
        phases = self.phase.tolist()
        self.seq: dict[int, tuple[int, ...]] = {}
        """(rank index x steps + column) -> its phases in the order they ran."""
        self.span: dict[int, tuple[int, int]] = {}
        """The same -> where its records lie in the arrays."""
        for i, c in enumerate(cells.tolist()):
            a, b = bounds[i], bounds[i + 1]
            self.seq[c], self.span[c] = tuple(phases[a:b]), (a, b)


class _Builder:
    """The work of build_replay for one group taken as the stages."""

    def __init__(
        self,
        m: PhaseMatrices,
        sync: set[str],
        records: _Sequences,
        key: str,
        stages: list[list[int]],
    ) -> None:
        self.m, self.key, self.stages = m, key, stages
        self.sync = {m.index(p) for p in sync if p in m.phases}
        self.records = records
        self.ms, self.start, self.end = records.ms, records.start, records.end

    def build(self) -> Replay | str:
        """The replay, or why there is none."""
        n_s = len(self.m.steps)
        seq, span = self.records.seq, self.records.span
        templates, ok = [], np.ones(n_s, np.bool_)
        for ranks in self.stages:
            seen = Counter(seq.get(r * n_s + c, ()) for r in ranks for c in range(n_s))
            template = seen.most_common(1)[0][0]
            if not template:
                return "a stage has no records"
            templates.append(template)
            for c in range(n_s):
                ok[c] &= all(seq.get(r * n_s + c) == template for r in ranks)
        if not ok.any():
            return "no sampled step where each stage's ranks ran the same phases in one order"
        cols = np.flatnonzero(ok).tolist()
        shape = (len(cols), len(self.stages[0]))
        ms = [np.zeros((len(t), *shape)) for t in templates]
        start = [np.zeros((len(t), *shape)) for t in templates]
        end = [np.zeros((len(t), *shape)) for t in templates]
        for s, ranks in enumerate(self.stages):
            for d, r in enumerate(ranks):
                for i, c in enumerate(cols):
                    a, b = span[r * n_s + c]
                    ms[s][:, i, d] = self.ms[a:b]
                    start[s][:, i, d], end[s][:, i, d] = self.start[a:b], self.end[a:b]
        # A phase that ends in a collective is a comm op here where it is declared comm or
        # runs once a step: a per-microbatch work phase is not a collective, though its
        # ranks may leave it together by chance (the device timeline of two stages).
        counts = [Counter(t) for t in templates]
        most = {p: max(c[p] for c in counts) for c in counts for p in c}
        self.comm = {p for p in self.sync if self.m.kinds[p] == "comm" or most.get(p, 0) <= 1}
        flows = self._flows(templates)
        if not flows:
            return (
                "no phase flows from stage to stage (time each send and recv as a phase of "
                "its own name, apart from the compute)"
            )
        lead = [np.zeros_like(t) for t in ms]
        if all(self.m.clocks[p] == "host" for t in templates for p in t):
            for s in range(len(templates)):
                lead[s][1:] = np.clip((start[s][1:] - end[s][:-1]) / 1e6, 0, None)
        # Sends that wait for their recv, or that hand over and go on. Where they wait,
        # the replay says how long each send takes (until its recv is reached): kept where
        # that matches the times measured. Else the model that comes closer to the
        # measured steps (one that cannot run is no answer). Both can fit a step alike
        # (a real gloo pipeline: 0.99x either way) and price a fix apart (47 ms and 36 ms
        # against a true 45): the steps alone cannot choose.
        best: Replay | None = None
        for waits in (True, False):
            ops = self._roles(templates, ms, flows, waits=waits)
            replay = Replay(
                key=self.key,
                stage_of={
                    r: (s, d) for s, ranks in enumerate(self.stages) for d, r in enumerate(ranks)
                },
                ops=ops,
                ms=ms,
                lead=lead,
                outside=self._outside(ms, lead, ok),
                own=_own(ops, ms),
                wire={},
                collective_own=_collective_own(ops, ms),
                ok=ok,
            )
            replay.wire = self._wire(replay, start, end)
            steps = replay.step_ms({})
            if steps is not None:
                replay.steps = steps
                self._fit_wire(replay)
                replay.off = self._off(replay)
                if waits and _sends_explained(replay) and replay.off <= _NEAR:
                    best = replay
                    break
                if best is None or replay.off < best.off:
                    best = replay
            if not any(op.peer is not None for stage in ops for op in stage):
                break  # no send waits: one model
        if best is None or not best.keep_baseline():
            return "its ops cannot be run in the order they ran (a recv whose send never comes)"
        return best

    def _off(self, replay: Replay) -> float:
        """How far the replay's steps are from the measured ones (0: level)."""
        if STEP not in self.m.phases:
            return 0.0
        with quiet():
            measured = nanmedian(self.m.ms[self.m.index(STEP)], 0)[replay.ok]
            return abs(float(np.nanmean(replay.steps[replay.ok]) / np.nanmean(measured)) - 1)

    def _fit_wire(self, replay: Replay) -> None:
        """On device time the wire is not measured: where the replay's steps come out
        shorter than the measured ones, each unmeasured wire is made longer by the same
        time, as far as brings them level (bisection; the replay's step grows with the
        wire). Taken as the recv's own time, it priced a GPipe pipeline's slow stage 3% low."""
        guessed = [p for p in replay.wire if self.m.clocks[p] != "host"]
        if not guessed or STEP not in self.m.phases:
            return
        with quiet():
            measured = float(np.nanmean(nanmedian(self.m.ms[self.m.index(STEP)], 0)[replay.ok]))
        base = dict(replay.wire)

        def short_by(more: float) -> float | None:
            for p in guessed:
                replay.wire[p] = base[p] + more
            steps = replay.step_ms({})
            return None if steps is None else measured - float(np.nanmean(steps[replay.ok]))

        gap = short_by(0.0)
        if gap is None or not gap > 0:
            replay.wire = base
            return
        low, high = 0.0, gap
        for _ in range(_BISECTIONS):
            middle = (low + high) / 2
            left = short_by(middle)
            if left is None:
                break
            low, high = (middle, high) if left > 0 else (low, middle)
        short_by(low)
        steps = replay.step_ms({})
        if steps is not None:
            replay.steps = steps

    def _flows(self, templates: list[tuple[int, ...]]) -> dict[int, int]:
        """Per phase that flows from stage to stage, the stage it flows from (see the
        module)."""
        last = len(templates) - 1
        counts = [Counter(t) for t in templates]
        flowing = [
            p
            for p in dict.fromkeys(templates[0])  # in the order stage 0 first runs them
            if p not in self.comm
            and len({c[p] for c in counts}) == 1
            and self._comm_before(templates[0], p) != self._comm_before(templates[last], p)
        ]
        return {p: 0 if i == 0 else last for i, p in enumerate(flowing)}

    def _comm_before(self, template: tuple[int, ...], p: int) -> set[int]:
        """The comm phases a stage runs just before its runs of `p`."""
        return {
            template[j - 1]
            for j, q in enumerate(template)
            if q == p and j > 0 and template[j - 1] in self.comm
        }

    def _roles(
        self,
        templates: list[tuple[int, ...]],
        ms: list[Floats],
        flows: dict[int, int],
        *,
        waits: bool,
    ) -> list[list[_Op]]:
        """Each stage's ops with their roles (see the module); with `waits`, the sends
        that wait for their recv (_waiting_sends) do."""
        last = len(templates) - 1
        runs = [_runs(t) for t in templates]
        # A flowing phase's send: the first comm op after it, before the next flowing
        # phase (a copy to the host may come between), on a stage it flows on from.
        sent_by: dict[At, int] = {}
        for s, template in enumerate(templates):
            for i, p in enumerate(template):
                onward = s + (1 if flows.get(p) == 0 else -1)
                if p not in flows or not 0 <= onward <= last:
                    continue
                for j in range(i + 1, len(template)):
                    if template[j] in flows:
                        break
                    if template[j] in self.comm:
                        sent_by[s, i] = j
                        break
        sends = {(s, j) for (s, _), j in sent_by.items()}
        recvs: dict[At, At] = {}  # a recv -> the send (or flowing op) it waits for
        gated: dict[At, At] = {}
        for s, template in enumerate(templates):
            for j, p in enumerate(template):
                if p not in flows or s == flows[p]:
                    continue
                u = s - (1 if flows[p] == 0 else -1)
                theirs = [i for i, q in enumerate(templates[u]) if q == p][runs[s][j]]
                source = (u, sent_by.get((u, theirs), theirs))
                if j > 0 and template[j - 1] in self.comm:  # a send and recv in one: its recv
                    recvs[s, j - 1] = source
                else:
                    gated[s, j] = source
        waiting = self._waiting_sends(templates, sends, ms) if waits else set()
        peer = {source: recv for recv, source in recvs.items() if source in waiting}
        counts = [Counter(t) for t in templates]
        out = []
        for s, template in enumerate(templates):
            ops = []
            for j, p in enumerate(template):
                at = (s, j)
                if at in recvs:
                    ops.append(_Op(p, "recv", source=recvs[at]))
                elif at in gated:
                    ops.append(_Op(p, "gated", source=gated[at]))
                elif at in sends:
                    ops.append(_Op(p, "send", peer=peer.get(at)))
                elif p in self.comm and len({c[p] for c in counts}) == 1:
                    ops.append(_Op(p, "collective", key=(p, runs[s][j])))
                else:
                    ops.append(_Op(p, "work"))
            out.append(ops)
        return out

    def _waiting_sends(
        self, templates: list[tuple[int, ...]], sends: set[At], ms: list[Floats]
    ) -> set[At]:
        """The sends whose phase may wait for its recv: a share _WAITS of its runs take
        over twice its least time (0.1 ms more). Noisy sends that hand over and go on pass
        too: build keeps the model whose replay fits."""
        by_phase: dict[int, list[At]] = {}
        for s, j in sends:
            by_phase.setdefault(templates[s][j], []).append((s, j))
        out: set[At] = set()
        for held in by_phase.values():
            times = np.concatenate([ms[s][j].ravel() for s, j in held])
            if np.mean(times > 2 * times.min() + 0.1) >= _WAITS:
                out.update(held)
        return out

    def _outside(self, ms: list[Floats], lead: list[Floats], ok: Bools) -> list[Floats]:
        """Per stage, each (step, replica)'s time in the step outside its ops and leads."""
        m, cols = self.m, np.flatnonzero(ok)
        out = []
        for s, ranks in enumerate(self.stages):
            inside = ms[s].sum(axis=0) + lead[s].sum(axis=0)
            if STEP not in m.phases:
                out.append(np.zeros_like(inside))
                continue
            step = m.ms[m.index(STEP)][np.asarray(ranks)][:, cols].T
            out.append(np.clip(np.nan_to_num(step - inside), 0, None))
        return out

    def _wire(self, replay: Replay, start: list[Floats], end: list[Floats]) -> dict[int, float]:
        """Per recv phase, how long after the data left the recvs that waited ended (on
        host time; the recv's own time on device time)."""
        seen: dict[int, list[Floats]] = {}
        for s, ops in enumerate(replay.ops):
            for j, op in enumerate(ops):
                if op.role != "recv" or op.source is None or self.m.clocks[op.phase] != "host":
                    continue
                u, k = op.source
                left = start[u][k] if replay.ops[u][k].peer is not None else end[u][k]
                waited = replay.ms[s][j] > 2 * replay.own[op.phase] + 0.01
                seen.setdefault(op.phase, []).append((end[s][j] - left)[waited] / 1e6)
        out = {}
        for p in {op.phase for ops in replay.ops for op in ops if op.role == "recv"}:
            after = np.concatenate(seen.get(p, [np.zeros(0)]))
            out[p] = max(0.0, float(np.median(after))) if len(after) else replay.own[p]
        return out


def _sends_explained(replay: Replay) -> bool:
    """The replay, with its sends waiting for their recvs, gives their times as measured:
    their time above their own is off by at most `_EXPLAINED` of it, over every run.
    Sends that merely vary (that hand over and go on) are not: the replay has their recv
    reached before them, and gives them their own time."""
    run = _Run(replay, replay.ms, None)
    if run.ends() is None:
        return False
    off, above = 0.0, 0.0
    for s, stage in enumerate(replay.ops):
        for j, op in enumerate(stage):
            if op.peer is not None:
                measured = replay.ms[s][j]
                off += float(np.sum(np.abs(run.end[s][j] - run.reach[s][j] - measured)))
                above += float(np.sum(measured - replay.own[op.phase]))
    return above > 0 and off <= _EXPLAINED * above


def _own(ops: list[list[_Op]], ms: list[Floats]) -> dict[int, float]:
    """Per recv or waiting send phase, its own time: the least time any send or recv of
    the replay took. A phase's own least is not enough: where every run of it waits (one
    microbatch, or recvs named per direction, the backward's all behind a slow last
    stage), its least is a wait, and a fix that ends the wait was priced at a third."""
    p2p = [
        float(np.min(ms[s][j]))
        for s, stage in enumerate(ops)
        for j, op in enumerate(stage)
        if op.role in ("recv", "send")
    ]
    least = min(p2p, default=0.0)
    return {
        op.phase: least for stage in ops for op in stage if op.role == "recv" or op.peer is not None
    }


def _collective_own(ops: list[list[_Op]], ms: list[Floats]) -> dict[tuple[int, int], Floats]:
    """Per collective, the least time any rank spent in it at each replayed step."""
    out: dict[tuple[int, int], Floats] = {}
    for s, stage in enumerate(ops):
        for j, op in enumerate(stage):
            if op.key is not None:
                least = ms[s][j].min(axis=1)
                out[op.key] = np.minimum(out.get(op.key, least), least)
    return out


def _runs(template: tuple[int, ...]) -> list[int]:
    """Per op, which run of its phase in the step it is (0 for the first)."""
    seen: Counter[int] = Counter()
    out = []
    for p in template:
        out.append(seen[p])
        seen[p] += 1
    return out
