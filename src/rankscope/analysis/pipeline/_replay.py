"""A pipeline's step replayed from the order its ranks ran their ops: what a fix saves
where a stage waits for the stage before it, not for every rank.

The segment model (analysis/stragglers/_step_model.py) takes a step as work that ends in collectives.
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
- Where the calls' names say which way each sends and receives (Megatron's:
  `recv_forward`, `send_forward_recv_backward`; analysis/pipeline/_replay_calls.py), the k-th
  forward a stage sends is the k-th the next stage receives, the last stage's going round
  to stage 0 (an interleaved schedule's next chunk), and the backward the other way.
- Else a phase flows from stage to stage where every stage runs it as often and the comm ops
  just before it at one end stage are not those at the other (a recv at one end only;
  an optimizer after its all-reduce at both ends flows not). The first of them that
  stage 0 runs (the forward) flows from stage 0, the others (the backward) from the
  last stage. Sends and recvs must be phases of their own names for this to be seen,
  and a rank must run one stage's chunk (an interleaved schedule, where the stage the
  forward flows from receives it too, is refused: its runs do not pair in order).
- The k-th run of a flowing phase on a stage waits for the k-th run on the stage before
  it in the flow, in the same replica, and for that stage's send just after it, if any.
  The comm op just before it is its recv: it ends at its own time after the rank
  reached it, or the wire's time after the data left, the later.
- A send either hands its data over and goes on (the data leaves when the send ends),
  or, where its runs take far longer than its least (gloo's and NCCL's send waits for
  its recv to be posted), ends its own time after both it and its recv were reached
  (the data leaves when the send is reached). A call that sends and receives at once
  (Megatron's send_forward_recv_backward) is a recv whose data leaves when it is
  reached; one that receives both ways ends when the later of its data is there.
- Any other phase that ends in a collective and that the stages that run it run as
  often (every stage, or some: Megatron's embedding all-reduce joins the first and the
  last) ends, on their ranks, its own time (the least any rank spent in it that step:
  the last to arrive waits for no one) after the last of them reached it.
- Every other op is work, its time as measured. On host time, the time between two of a
  rank's ops (Python between phases) is its own, before the later op, as far as every
  replica of its stage took it (a longer gap is a wait no phase holds); the rest of its
  time in a step outside its ops and gaps is work at its end, as in the segment model.

A recv's or a waiting send's own time is the least time any of its runs took. The wire,
on host time, is the median of how long after the data left the recvs that waited
ended. On device time, where the host's clock says when ops were launched and not when
they ran, it is the recv's own time, made longer (the same for every such recv) as far as
brings the replay's steps level with the measured ones where they come out shorter.

The replay of the run as it was is held against the measured steps. Where it is further
than ROUGH_FIT from them, the segment model prices the fixes (analysis/stragglers/_cost.py decides).
A fix scales a rank's ops of a phase to the time the fix gives the phase in the step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ..read._matrix import nanmedian, quiet

__all__ = ["At", "Key", "Op", "Replay", "sends_as_measured"]

Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]
At = tuple[int, int]
"""(stage, op index)."""
Key = tuple[int, ...]
"""A collective: (phase, which run of it in the step), and a stage where it joins that
stage's replicas alone."""
_EXPLAINED = 0.5
"""Sends are taken to wait for their recv where the replay gives their time above their
own within this share of it."""


@dataclass(frozen=True)
class Op:
    """One op of a stage's step, as the replay runs it."""

    phase: int
    """Its phase (an index into the matrices' phases)."""
    role: str
    """"work"; "recv" (ends when the data from `sources` is there); "gated" (a flowing
    phase with no recv recorded before it: starts no sooner than the data is there);
    "send" (just after a flowing phase: the data leaves from it); "collective"."""
    sources: tuple[At, ...] = ()
    """A recv's or a gated op's: the sends (or, with none, the flowing ops) whose data it
    waits for (several where one call receives both ways: Megatron's interleaved steady
    state, send_forward_backward_recv_forward_backward)."""
    peers: tuple[At, ...] = ()
    """A send that waits for its recvs (and a call that receives too, where its sends
    wait): those recvs. It ends no sooner than its own time after they were reached."""
    key: Key | None = None
    """A collective's (phase, which run of it in the step), and its stage where it joins
    that stage's replicas alone (a data-parallel group's: each stage's replicas left it
    together, the stages apart; on a real Megatron trace, its parameters' all-gather)."""
    per_replica: bool = False
    """A collective that joins each replica's stages apart from the other replicas (each
    replica's ranks left it together, the replicas apart; Megatron's embedding all-reduce
    joins a replica's first and last stage)."""
    batched: bool = False
    """A recv that is a send too, in one call (Megatron's send_forward_recv_backward):
    its data leaves when it is reached; it ends when its recv's data is there."""

    @property
    def leaves_when_reached(self) -> bool:
        """Its data leaves as it is reached (a send that waits, or a call that receives
        too), not as it ends (a send that hands over and goes on)."""
        return bool(self.peers) or self.batched


@dataclass(eq=False)
class Replay:
    """A pipeline's steps replayed (see the module): `steps` over the matrices' columns
    `ok`, and the same with fixes (`step_ms`)."""

    key: str
    """The group that names the stages."""
    stage_of: dict[int, At]
    """Rank index -> (stage, replica)."""
    ops: list[list[Op]]
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
    collective_own: dict[Key, Floats]
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
            ends = ends + [e[:, rest] + run.shift[s][:, None] for s, e in enumerate(self.base.ends)]
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
    arrivals: dict[Key, Floats]
    """Per collective, (stage, step, replica) when each of its ranks reached it."""
    collective_ends: dict[Key, Floats]
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
        self.shift = np.zeros((len(replay.ops), shape[0]))
        """Per stage, how far its replicas not replayed are moved: by the change of the
        last collective it ran (one of its own replicas, or of every stage)."""
        self.members: dict[Key, list[int]] = {}
        """Per collective, the stages that run it (the others go on past it)."""
        for s, stage in enumerate(replay.ops):
            for op in stage:
                if op.key is not None and s not in self.members.setdefault(op.key, []):
                    self.members[op.key].append(s)
        self.arrivals: dict[Key, Floats] = {}
        self.collective_ends: dict[Key, Floats] = {}

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
        if op.peers:  # its sends wait for their recvs to be reached
            if any(self.at[v] < i for v, i in op.peers):
                return None
            for v, i in op.peers:
                reached = np.maximum(reached, self.reached(v, i))
            end = reached + self.r.own[op.phase]
            if not op.sources:
                return end
        elif not op.sources:
            end = reached + self.ms[s][j]
            return end
        left = self._left(op.sources)
        if left is None:
            return None
        if op.role == "recv":
            end = np.maximum(reached + self.r.own[op.phase], left + self.r.wire[op.phase])
        else:
            end = np.maximum(reached, left) + self.ms[s][j]
        return end

    def _left(self, sources: tuple[At, ...]) -> Floats | None:
        """When the last data of the sends (or flowing ops) at `sources` left: each as it
        was reached where the send waits for its recv or receives too, as it ended where
        not; None before then."""
        out: Floats | None = None
        for u, k in sources:
            if self.r.ops[u][k].leaves_when_reached:
                if self.at[u] < k:
                    return None
                left = self.reached(u, k)
            elif self.at[u] > k:
                left = self.end[u][k]
            else:
                return None
            out = left if out is None else np.maximum(out, left)
        return out

    def _collective(self) -> bool:
        """Every stage that runs a collective at it: it ends on their ranks; False where
        no collective has all its stages there."""
        ops, at = self.r.ops, self.at
        there: dict[Key, list[int]] = {}
        for s, stage in enumerate(ops):
            key = stage[at[s]].key if at[s] < len(stage) else None
            if key is not None:
                there.setdefault(key, []).append(s)
        for key, stages in there.items():
            if stages == self.members[key]:
                self._end(key, stages)
                return True
        return False

    def _end(self, key: Key, stages: list[int]) -> None:
        """The collective `key`, with every stage of it there, ends on their ranks."""
        reached = [self.reached(s, self.at[s]) for s in stages]
        self.arrivals[key] = np.stack(reached)  # (stage, step, replica)
        arrived = np.max(reached, axis=0)  # each replica's last rank
        own = self.r.collective_own[key]
        base = self.r.base
        end: Floats
        if self.r.ops[stages[0]][self.at[stages[0]]].per_replica:
            end = arrived + own[:, None]  # each replica's own: no other replica is moved
            self.collective_ends[key] = end
        else:
            last = arrived.max(axis=1)
            if self.cols is not None and base is not None:
                rest = [i for i in range(base.arrivals[key].shape[2]) if i not in self.cols]
                if rest:  # as they reached it, moved by their stage's last collective
                    theirs = base.arrivals[key][:, :, rest] + self.shift[stages][:, :, None]
                    last = np.maximum(last, theirs.max(axis=(0, 2)))
            ends = last + own
            self.collective_ends[key] = ends
            if base is not None and self.cols is not None:
                self.shift[stages] = ends - base.collective_ends[key]
            end = ends[:, None] + np.zeros_like(reached[0])
        for s, at in zip(stages, reached, strict=True):
            j = self.at[s]
            self.reach[s][j], self.end[s][j] = at, end
            self.now[s], self.at[s] = end.copy(), j + 1


def sends_as_measured(replay: Replay) -> bool:
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
            if op.peers:
                measured = replay.ms[s][j]
                off += float(np.sum(np.abs(run.end[s][j] - run.reach[s][j] - measured)))
                above += float(np.sum(measured - replay.own[op.phase]))
    return above > 0 and off <= _EXPLAINED * above
