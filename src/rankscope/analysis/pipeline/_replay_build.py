"""How a run's records become its pipeline's replay (analysis/pipeline/_replay.py has the model):
which group numbers the stages, each stage's ops in the order they ran, which phase flows,
which comm op is a recv, a send or a collective, and the own times and the wire."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from itertools import pairwise

import numpy as np
import numpy.typing as npt

from ..core._ops import StepOps
from ..read._matrix import STEP, PhaseMatrices, nanmedian, quiet
from ._replay import At, Key, Op, Replay, sends_as_measured
from ._replay_calls import Links, links_from_names

__all__ = ["build_replay"]

Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]
_MOST_CELLS = 200_000
"""Rank x step sequences read at most: a larger run is left to the segment model."""
_BISECTIONS = 20
"""Halvings of the search for an unmeasured wire (to a millionth of the step's gap)."""
_NEAR = 0.15
"""Sends taken to wait for their recv (analysis/pipeline/_replay.py sends_as_measured) need a
replay whose steps are this near the measured ones (as near as any replay kept). At 0.05,
a real gloo pipeline's waiting sends (their times as measured) fitted 0.94x on one run
and 0.95x on another: one was priced 0.77x as handing over, the other 1.04x."""
_APART = 10.0
"""A collective joins each stage's replicas apart from the other stages (or each
replica's stages apart) where its ranks left it this many times further apart across
stages than across replicas (or the other way)."""
_WAITS = 0.1
"""A send waits for its recv where this share of its runs take over twice its least
time (and 0.1 ms more)."""


def build_replay(
    m: PhaseMatrices, sync: set[str], groups: Mapping[int, Mapping[str, object]] | None
) -> Replay | str | None:
    """The replay of `m`'s pipeline (see the module); where `m` looks like a pipeline
    (`m.pipelined`) and cannot be replayed, why not; None where it holds no pipeline."""
    ops = m.ops
    if ops is None or not m.pipelined:
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
        templates, ok = _templates(seq, self.stages, n_s), np.ones(n_s, np.bool_)
        if not all(templates):
            return "a stage has no records"
        for ranks, template in zip(self.stages, templates, strict=True):
            # A rank that ran the same ops in a little other order (two that start
            # together, a send issued early) is read in the stage's order: each op is
            # its phase's n-th run either way.
            runs = Counter(template)
            for c in range(n_s):
                ok[c] &= all(
                    (ran := seq.get(r * n_s + c, ())) == template or Counter(ran) == runs
                    for r in ranks
                )
        if not ok.any():
            return "no sampled step where each stage's ranks ran the same phases"
        cols = np.flatnonzero(ok).tolist()
        shape = (len(cols), len(self.stages[0]))
        ms = [np.zeros((len(t), *shape)) for t in templates]
        start = [np.zeros((len(t), *shape)) for t in templates]
        end = [np.zeros((len(t), *shape)) for t in templates]
        for s, ranks in enumerate(self.stages):
            for d, r in enumerate(ranks):
                for i, c in enumerate(cols):
                    a = span[r * n_s + c][0]
                    at = a + _in_order(seq[r * n_s + c], templates[s])
                    ms[s][:, i, d] = self.ms[at]
                    start[s][:, i, d], end[s][:, i, d] = self.start[at], self.end[at]
        # A phase that ends in a collective is a comm op here where it is declared comm or
        # runs once a step: a per-microbatch work phase is not a collective, though its
        # ranks may leave it together by chance (the device timeline of two stages).
        counts = [Counter(t) for t in templates]
        most = {p: max(c[p] for c in counts) for c in counts for p in c}
        self.comm = {p for p in self.sync if self.m.kinds[p] == "comm" or most.get(p, 0) <= 1}
        links = links_from_names(templates, self.m.phases)
        if links is None:
            links = self._links_by_flow(templates)
        if isinstance(links, str):
            return links
        # On host time, the time between two ops is the rank's own (Python between two
        # phases) as far as every replica of its stage spends it: a replica's longer gap is
        # a wait that no phase holds (a GPU-side trace's collective starts once all are
        # there, the wait before it on no op: on a real Megatron trace, 22 s a step).
        gaps = [np.zeros_like(t) for t in ms]
        if all(self.m.clocks[p] == "host" for t in templates for p in t):
            for s in range(len(templates)):
                gaps[s][1:] = np.clip((start[s][1:] - end[s][:-1]) / 1e6, 0, None)
        lead = _leads(gaps)
        # Sends that wait for their recv, or that hand over and go on. Where they wait,
        # the replay says how long each send takes (until its recv is reached): kept where
        # that matches the times measured. Else the model that comes closer to the
        # measured steps (one that cannot run is no answer). Both can fit a step alike
        # (a real gloo pipeline: 0.99x either way) and price a fix apart (47 ms and 36 ms
        # against a true 45): the steps alone cannot choose.
        best: Replay | None = None
        for waits in (True, False):
            ops = self._scoped(self._roles(templates, ms, links, waits=waits), end)
            replay = Replay(
                key=self.key,
                stage_of={
                    r: (s, d) for s, ranks in enumerate(self.stages) for d, r in enumerate(ranks)
                },
                ops=ops,
                ms=ms,
                lead=lead,
                outside=self._outside(ms, gaps, ok),
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
                if waits and sends_as_measured(replay) and replay.off <= _NEAR:
                    best = replay
                    break
                if best is None or replay.off < best.off:
                    best = replay
            if not any(op.peers for stage in ops for op in stage):
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

    def _links_by_flow(self, templates: list[tuple[int, ...]]) -> Links | str:
        """Where the calls' names say no direction: the links read from which phases flow
        (see the module), or why there are none."""
        flows = self._flows(templates)
        if not flows:
            return (
                "no phase flows from stage to stage (time each send and recv as a phase of "
                "its own name, apart from the compute)"
            )
        # Where the stage a phase flows from receives it too, the flow wraps round: a rank
        # runs chunks of several stages (an interleaved schedule). Its runs do not pair
        # with the next stage's in order; replayed as if they did, such a run's step fitted
        # (1.00x) and a slow stage 0 was priced at half its true saving.
        for p, origin in flows.items():
            far = len(templates) - 1 if origin == 0 else 0
            if self._comm_before(templates[origin], p) & self._comm_before(templates[far], p):
                return (
                    f"stage {origin} receives {self.m.phases[p]} too: an interleaved schedule "
                    "(a rank runs chunks of several stages), which the replay reads only "
                    "from calls named by direction (recv_forward, send_backward, ...)"
                )
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
        links = Links(sends={(s, j) for (s, _), j in sent_by.items()})
        for s, template in enumerate(templates):
            for j, p in enumerate(template):
                if p not in flows or s == flows[p]:
                    continue
                u = s - (1 if flows[p] == 0 else -1)
                theirs = [i for i, q in enumerate(templates[u]) if q == p][runs[s][j]]
                source = (u, sent_by.get((u, theirs), theirs))
                if j > 0 and template[j - 1] in self.comm:  # a send and recv in one: its recv
                    links.recvs[s, j - 1] = (source,)
                else:
                    links.gated[s, j] = source
        return links

    def _roles(
        self,
        templates: list[tuple[int, ...]],
        ms: list[Floats],
        links: Links,
        *,
        waits: bool,
    ) -> list[list[Op]]:
        """Each stage's ops with their roles (see the module); with `waits`, the sends
        that wait for their recv (_waiting_sends) do."""
        runs = [_runs(t) for t in templates]
        waiting = self._waiting_sends(templates, links, ms) if waits else set()
        peers: dict[At, tuple[At, ...]] = {}
        for recv, sources in links.recvs.items():
            for source in sources:
                if source in waiting:
                    peers[source] = (*peers.get(source, ()), recv)
        counts = [Counter(t) for t in templates]
        out = []
        for s, template in enumerate(templates):
            ops = []
            for j, p in enumerate(template):
                at = (s, j)
                if at in links.recvs:  # a call that sends and receives is a recv that sends
                    ops.append(
                        Op(
                            p,
                            "recv",
                            sources=links.recvs[at],
                            peers=peers.get(at, ()),
                            batched=at in links.sends,
                        )
                    )
                elif at in links.gated:
                    ops.append(Op(p, "gated", sources=(links.gated[at],)))
                elif at in links.sends:
                    ops.append(Op(p, "send", peers=peers.get(at, ())))
                elif p in self.comm and len({c[p] for c in counts if c[p]}) == 1:
                    ops.append(Op(p, "collective", key=(p, runs[s][j])))
                else:
                    ops.append(Op(p, "work"))
            out.append(ops)
        return out

    def _scoped(self, ops: list[list[Op]], end: list[Floats]) -> list[list[Op]]:
        """`ops`, with each collective that joins each stage's replicas apart keyed by its
        stage, and each that joins each replica's stages apart marked so: where, on host
        time, its ranks left it _APART times further apart the other way (0.1 ms more),
        and the step ends in a collective of every rank.
        On a real Megatron trace the parameters' all-gather and the gradients'
        reduce-scatter left each stage's replicas within 0.24 ms and the stages 170-356 ms
        apart, the embedding all-reduce a replica's two stages within 0.15 ms and the
        replicas 2.4 s apart."""
        left: dict[Key, list[Floats]] = {}
        for s, stage in enumerate(ops):
            for j, op in enumerate(stage):
                if op.key is not None and self.m.clocks[op.phase] == "host":
                    left.setdefault(op.key, []).append(end[s][j] / 1e6)
        scope: dict[Key, str] = {}
        for key, ends in left.items():
            at = np.stack(ends)  # (stage, step, replica)
            replicas = float(np.median((at.max(axis=2) - at.min(axis=2)).max(axis=0)))
            stages = float(np.median((at.max(axis=0) - at.min(axis=0)).max(axis=1)))
            if stages > _APART * replicas + 0.1:
                scope[key] = "stage"
            elif replicas > _APART * stages + 0.1:
                scope[key] = "replica"

        # A step is replayed from all its stages starting together: where it does not end
        # in a collective of every rank, joining each stage's replicas alone left its
        # stages ending apart, and a real gloo pipeline (its step ended in each stage's
        # all-reduce) was priced 0.79x where joining all gave 1.04x.
        last = [
            next((op.key for op in reversed(stage) if op.key is not None), None) for stage in ops
        ]
        if any(key is None or key in scope for key in last):
            return ops

        def scoped(s: int, op: Op) -> Op:
            how = scope.get(op.key) if op.key is not None else None
            if op.key is not None and how == "stage":
                return replace(op, key=(*op.key, s))
            return replace(op, per_replica=True) if how == "replica" else op

        return [[scoped(s, op) for op in stage] for s, stage in enumerate(ops)]

    def _waiting_sends(
        self, templates: list[tuple[int, ...]], links: Links, ms: list[Floats]
    ) -> set[At]:
        """The sends whose phase may wait for its recv: a share _WAITS of its runs take
        over twice the least time of any send or recv (0.1 ms more). Noisy sends that
        hand over and go on pass too: build keeps the model whose replay fits. Against
        the phase's own least, a send that every run waits in (the last stage's one
        plain send of an interleaved step, 8 ms behind a slow stage 0) handed over, and
        kept its wait in a fix: priced 12% low on a real gloo pipeline."""
        p2p = links.sends | set(links.recvs)
        least = min((float(ms[s][j].min()) for s, j in p2p), default=0.0)
        by_phase: dict[int, list[At]] = {}
        for s, j in links.sends:
            by_phase.setdefault(templates[s][j], []).append((s, j))
        out: set[At] = set()
        for held in by_phase.values():
            times = np.concatenate([ms[s][j].ravel() for s, j in held])
            if np.mean(times > 2 * least + 0.1) >= _WAITS:
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
                if op.role != "recv" or self.m.clocks[op.phase] != "host":
                    continue
                # The latest of what it waited for: its data leaving, and the recvs of
                # its own sends where they wait.
                left = np.max(
                    [
                        *(
                            start[u][k] if replay.ops[u][k].leaves_when_reached else end[u][k]
                            for u, k in op.sources
                        ),
                        *(start[v][i] for v, i in op.peers),
                    ],
                    axis=0,
                )
                # A recv reached after what it waits for took no wire: a batched call's
                # exchange both ways (0.3 ms against a least of 0.04 on gloo) was taken as
                # one, where a slow stage left its peers 20 ms behind, and no fix shortened it.
                waited = (start[s][j] < left) & (replay.ms[s][j] > 2 * replay.own[op.phase] + 0.01)
                seen.setdefault(op.phase, []).append((end[s][j] - left)[waited] / 1e6)
        out = {}
        for p in {op.phase for ops in replay.ops for op in ops if op.role == "recv"}:
            after = np.concatenate(seen.get(p, [np.zeros(0)]))
            out[p] = max(0.0, float(np.median(after))) if len(after) else replay.own[p]
        return out


def _templates(
    seq: Mapping[int, tuple[int, ...]], stages: list[list[int]], n_s: int
) -> list[tuple[int, ...]]:
    """Per stage, the order its ranks ran their ops in most often. Where two orders are
    as common (one rank of two issues a send before the forward it follows), the one
    whose neighbouring ops the other stages run next to each other too: taking the early
    send's order, the send before the forward was read as its recv, and a slow stage was
    priced 5% low."""
    tied: list[list[tuple[int, ...]]] = []
    for ranks in stages:
        seen = Counter(seq.get(r * n_s + c, ()) for r in ranks for c in range(n_s))
        most = seen.most_common(1)[0][1]
        tied.append([order for order, count in seen.items() if count == most])
    out = []
    for s, orders in enumerate(tied):
        elsewhere = Counter(
            pair for t, other in enumerate(tied) if t != s for pair in pairwise(other[0])
        )
        out.append(max(orders, key=lambda order: sum(elsewhere[p] for p in pairwise(order))))
    return out


def _own(ops: list[list[Op]], ms: list[Floats]) -> dict[int, float]:
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
    return {op.phase: least for stage in ops for op in stage if op.role == "recv" or op.peers}


def _leads(gaps: list[Floats]) -> list[Floats]:
    """Per stage, (op, step, replica) time taken as the rank's own before each op: the
    least gap before it any replica of the stage had at that step."""
    return [g.min(axis=2, keepdims=True) + np.zeros_like(g) for g in gaps]


def _collective_own(ops: list[list[Op]], ms: list[Floats]) -> dict[Key, Floats]:
    """Per collective, the least time any rank spent in it at each replayed step."""
    out: dict[Key, Floats] = {}
    for s, stage in enumerate(ops):
        for j, op in enumerate(stage):
            if op.key is not None:
                least = ms[s][j].min(axis=1)
                out[op.key] = np.minimum(out.get(op.key, least), least)
    return out


def _in_order(ran: tuple[int, ...], template: tuple[int, ...]) -> npt.NDArray[np.int64]:
    """Where each op of `template` lies in `ran` (the same ops in another order): the
    n-th run of a phase in one is its n-th run in the other."""
    if ran == template:
        return np.arange(len(ran))
    where: dict[int, list[int]] = {}
    for i, p in enumerate(ran):
        where.setdefault(p, []).append(i)
    return np.asarray([where[p][k] for p, k in zip(template, _runs(template), strict=True)])


def _runs(template: tuple[int, ...]) -> list[int]:
    """Per op, which run of its phase in the step it is (0 for the first)."""
    seen: Counter[int] = Counter()
    out = []
    for p in template:
        out.append(seen[p])
        seen[p] += 1
    return out
