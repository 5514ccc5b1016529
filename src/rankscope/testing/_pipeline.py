"""Synthetic pipeline-parallel runs: stages that pass activations and gradients with
send/recv, microbatches, data-parallel replicas (a GPipe or a 1F1B schedule), with known answers.

Rank `stage * dp + replica`; each rank's meta names `pipeline_stage` and `dp`. A step:
every microbatch's forward through the stages in turn (a stage receives the activation
from the stage before, `pp_recv`, runs `forward`, sends it on, `pp_send`), then every
microbatch's backward back through them, then each stage's gradient all-reduce across its
replicas (`dp_allreduce`), the optimizer, and a loss all-reduce across every rank
(`loss_allreduce`), which ends the step together. A phase that runs once per microbatch
is written once per run of it, as the timer writes it.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ..rundir._layout import timing_path
from ..timing._record import STEP_PHASE, Span, format_record
from ._synthetic import EPOCH_NS, Uneven, _gpu_ms, _span, _write_meta

__all__ = ["Pipeline", "SlowStage", "calls_of", "exchange", "write_pipeline"]

_NS = 1_000_000


@dataclass(frozen=True)
class Pipeline:
    """The job's shape and each stage's work, in ms per microbatch."""

    stages: int = 4
    dp: int = 2
    microbatches: int = 8
    forward_ms: float = 4.0
    backward_ms: float = 8.0
    send_ms: float = 0.2
    """A send's own time, and an activation's time on the wire."""
    allreduce_ms: float = 3.0
    optimizer_ms: float = 2.0
    copy_ms: float = 0.0
    """Where above 0, a stage copies each microbatch to the device (`h2d`) between its
    recv and its forward."""
    send_jitter: float = 0.0
    """A send's own time varies by this much from run to run (lognormal sigma)."""
    schedule: str = "gpipe"
    """"gpipe" (every forward, then every backward) or "1f1b" (a stage runs its first
    `stages - stage - 1` forwards, then one forward and one backward in turn, then the
    backwards left: Megatron's default)."""
    calls: str = "pp"
    """How the sends and recvs are timed: "pp" (`pp_recv` and `pp_send`, one name both
    ways), "megatron" (Megatron-LM's calls, `pp_recv_forward`, `pp_send_forward`,
    `pp_recv_backward`, `pp_send_backward`, with 1F1B's steady state sending and
    receiving in one batched call: `pp_send_forward_recv_backward`,
    `pp_send_backward_recv_forward`), or "megatron_split" (the same names, each direction
    a call of its own)."""
    chunks: int = 1
    """Model chunks per rank (virtual stages: Megatron's interleaved 1F1B; microbatches a
    multiple of stages). With "megatron" calls, each forward and backward of the steady
    state is followed by one call both ways:
    `pp_send_forward_backward_recv_forward_backward`."""


@dataclass(frozen=True)
class SlowStage:
    """`stage`'s forward and backward take `factor` more (0.5: +50%), on every replica,
    or on `replica`'s rank of the stage alone."""

    stage: int
    factor: float
    replica: int | None = None


def _order(shape: Pipeline, stage: int) -> list[tuple[str, int]]:
    """The (op, microbatch) a stage runs in a step, in order."""
    m = shape.microbatches
    forwards = [("F", mb) for mb in range(m)]
    backwards = [("B", mb) for mb in range(m)]
    if shape.schedule == "gpipe":
        return forwards + backwards
    warm = min(shape.stages - stage - 1, m)
    out = forwards[:warm]
    for i in range(m - warm):
        out += [forwards[warm + i], backwards[i]]
    return out + backwards[m - warm :]


_Key = tuple[str, int, int]
"""What a send hands over: its direction ("F" or "B"), the stage that sends it, and
which microbatch of which chunk (chunk x microbatches + microbatch)."""
_Call = tuple[str, tuple[_Key, ...], tuple[_Key, ...]]
"""A p2p call: its name, what it sends, what it receives."""


def _virtual_order(shape: Pipeline, stage: int) -> list[tuple[str, int, int]]:
    """The (op, microbatch, chunk) a stage runs in a step. With one chunk, `_order`; with
    more (an interleaved schedule, Megatron's), the forwards go a stage-count of
    microbatches at a time through each chunk in turn, the backwards through the chunks
    the other way, after (stages - stage - 1) x 2 + (chunks - 1) x stages warm-up
    forwards, one forward and one backward in turn."""
    if shape.chunks == 1:
        return [(op, mb, 0) for op, mb in _order(shape, stage)]
    p, v, m = shape.stages, shape.chunks, shape.microbatches
    total = m * v

    def at(op: str, i: int) -> tuple[str, int, int]:
        chunk = (i // p) % v
        return op, (i // (p * v)) * p + i % p, (v - 1 - chunk if op == "B" else chunk)

    warm = min((p - stage - 1) * 2 + (v - 1) * p, total)
    out = [at("F", i) for i in range(warm)]
    for i in range(total - warm):
        out += [at("F", warm + i), at("B", i)]
    return out + [at("B", i) for i in range(total - warm, total)]


def calls_of(shape: Pipeline, stage: int) -> list[tuple[str, int] | _Call]:
    """A stage's ops in a step with Megatron's calls: ("F" or "B", microbatch) for the
    compute, a _Call for each send and recv (see Pipeline.calls). With chunks, virtual
    stage chunk x stages + stage: a forward flows from the last stage on to stage 0's
    next chunk."""
    p, m = shape.stages, shape.microbatches
    out: list[tuple[str, int] | _Call] = []
    for op, mb, chunk in _virtual_order(shape, stage):
        k = chunk * p + stage  # its virtual stage
        first, last = k == 0, k == p * shape.chunks - 1
        here = chunk * m + mb
        if op == "F":
            if not first:
                sent = (k - 1) // p * m + mb
                out.append(("pp_recv_forward", (), (("F", (k - 1) % p, sent),)))
            out.append((op, mb))
            if not last:
                out.append(("pp_send_forward", (("F", stage, here),), ()))
        else:
            if not last:
                sent = (k + 1) // p * m + mb
                out.append(("pp_recv_backward", (), (("B", (k + 1) % p, sent),)))
            out.append((op, mb))
            if not first:
                out.append(("pp_send_backward", (("B", stage, here),), ()))
    if shape.calls != "megatron" or shape.schedule != "1f1b":
        return out
    if shape.chunks > 1:
        return _interleaved_calls(shape, stage, out)
    # 1F1B's steady state: a send, then a recv the other way, are one batched call.
    pairs = {
        ("pp_send_forward", "pp_recv_backward"): "pp_send_forward_recv_backward",
        ("pp_send_backward", "pp_recv_forward"): "pp_send_backward_recv_forward",
    }
    merged: list[tuple[str, int] | _Call] = []
    for item in out:
        before = merged[-1] if merged else None
        if len(item) == 3 and before is not None and len(before) == 3:
            name = pairs.get((str(before[0]), str(item[0])))
            if name is not None:
                merged[-1] = (name, before[1], item[2])
                continue
        merged.append(item)
    return merged


def _interleaved_calls(
    shape: Pipeline, stage: int, split: list[tuple[str, int] | _Call]
) -> list[tuple[str, int] | _Call]:
    """Megatron's interleaved 1F1B with batched calls: after each warm-up forward, each
    steady-state forward and backward, and each cool-down backward, one call sends what
    they made and receives what the next of them needs (`pp_send_forward_recv_forward`,
    `pp_send_forward_backward_recv_forward_backward`, ...); the first input is received
    alone (`pp_recv_forward`). `split` is the same step with a call per direction."""
    computes: list[tuple[tuple[str, int], list[_Key], list[_Key]]] = []
    needs: list[_Key] = []
    for item in split:
        if len(item) == 2:
            computes.append((item, needs, []))
            needs = []
        elif item[2]:
            needs = list(item[2])
        else:
            computes[-1][2].extend(item[1])
    p, v, m = shape.stages, shape.chunks, shape.microbatches
    warm = min((p - stage - 1) * 2 + (v - 1) * p, m * v)
    steady = m * v - warm
    sizes = [1] * warm + [2] * steady + [1] * warm
    groups, at = [], 0
    for size in sizes:
        groups.append(computes[at : at + size])
        at += size
    if at != len(computes):
        raise RuntimeError("the interleaved schedule left ops out")  # a schedule bug

    def call(sends: list[_Key], recvs: list[_Key]) -> _Call:
        ways = {"F": "forward", "B": "backward"}
        said = ["pp"]
        for verb, keys in (("send", sends), ("recv", recvs)):
            if keys:
                said += [verb, *(ways[w] for w in "FB" if any(k[0] == w for k in keys))]
        return "_".join(said), tuple(sends), tuple(recvs)

    out: list[tuple[str, int] | _Call] = []
    if groups[0][0][1]:
        out.append(call([], groups[0][0][1]))
    for g, group in enumerate(groups):
        out += [compute for compute, _, _ in group]
        sends = [k for _, _, made in group for k in made]
        recvs = [k for _, need, _ in groups[g + 1] for k in need] if g + 1 < len(groups) else []
        if sends or recvs:
            out.append(call(sends, recvs))
    return out


_TAGS = {"F": 1, "B": 2}
"""A message's tag by direction: two ranks exchange both ways on a two-stage ring."""


def exchange(  # noqa: PLR0917 - a call and where its rank stands
    call: _Call, stage: int, stages: int, dp: int, replica: int, size: tuple[int, ...]
) -> None:
    """Run a p2p call of `calls_of` on torch.distributed as Megatron's p2p module does:
    its sends and recvs (tensors of `size`) posted in one `batch_isend_irecv` and waited
    on together, with rank `stage * dp + replica`'s neighbours in its own replica. For
    real jobs (the tests' and the field suite's); needs an initialized process group."""
    import torch
    import torch.distributed as dist

    _, sends, recvs = call
    ops = [
        dist.P2POp(
            dist.isend,
            torch.ones(size),
            (stage + (1 if way == "F" else -1)) % stages * dp + replica,
            tag=_TAGS[way],
        )
        for way, _, _ in sends
    ]
    ops += [
        dist.P2POp(dist.irecv, torch.zeros(size), source * dp + replica, tag=_TAGS[way])
        for way, source, _ in recvs
    ]
    for request in dist.batch_isend_irecv(ops):
        request.wait()


def _megatron_replica(  # noqa: PLR0917 - the simulation's state, passed down
    shape: Pipeline,
    d: int,
    now: int,
    record: _Recorder,
    work: Callable[..., int],
    load: dict[str, float],
) -> dict[int, int]:
    """One replica's step with Megatron's calls: each rank's end of its last op. A send's
    data leaves when the call is reached where it also receives (a batched call), when it
    ends where not; a call that receives ends a quarter of its own time after the last of
    its data is there (its own time after it left)."""
    own = int(shape.send_ms * _NS)
    order = [calls_of(shape, s) for s in range(shape.stages)]
    free = [now] * shape.stages
    left: dict[_Key, int] = {}  # what a send hands over -> when it left
    at = [0] * shape.stages
    while any(at[s] < len(order[s]) for s in range(shape.stages)):
        moved = False
        for s in range(shape.stages):
            while at[s] < len(order[s]):
                item, start, rank = order[s][at[s]], free[s], s * shape.dp + d
                if len(item) == 2:
                    name = "forward" if item[0] == "F" else "backward"
                    ms = shape.forward_ms if item[0] == "F" else shape.backward_ms
                    end = start + work(s, d, ms, load.get(name, 1.0))
                    record(rank, name, "compute", start, end)
                else:
                    name, sends, recvs = item
                    if recvs:  # a batched call's sends leave as it is reached
                        left.update(dict.fromkeys(sends, start))
                    if any(k not in left for k in recvs):
                        break  # its data has not left yet
                    end = start + own
                    if recvs:
                        there = max(left[k] for k in recvs) + own
                        end = max(start, there) + own // 4
                    left.update(dict.fromkeys(sends if not recvs else (), end))
                    record(rank, name, "comm", start, end)
                free[s], at[s], moved = end, at[s] + 1, True
        if not moved:
            raise RuntimeError("the pipeline's calls wait on each other")  # a schedule bug
    return {s * shape.dp + d: free[s] for s in range(shape.stages)}


class _Recorder:
    """Appends one step's records to each rank's lines."""

    def __init__(self, step: int, lines: dict[int, list[str]], gpu: bool) -> None:
        self.step, self.lines, self.gpu = step, lines, gpu

    def __call__(  # noqa: PLR0917 - one record's fields
        self, rank: int, phase: str, kind: str, start: int, end: int, meta: str | None = None
    ) -> None:
        span: Span = _span(self.step, phase, kind, start, end)
        span.meta = meta
        self.lines[rank].append(format_record(rank, span, _gpu_ms(span, self.gpu), 0))


def write_pipeline(  # noqa: PLR0915 - one simulation, read top to bottom
    run_dir: str | os.PathLike[str],
    *,
    shape: Pipeline = Pipeline(),
    steps: int = 30,
    slow: Iterable[SlowStage] = (),
    uneven: Uneven | None = None,
    balanced: bool = False,
    noise: float = 0.03,
    seed: int = 0,
    gpu: bool = False,
) -> Path:
    """Simulate `steps` steps of a pipeline-parallel job and write its timings and meta;
    with `gpu`, every record carries a device time too (the phase's time, as the GPU's
    timeline would show a stage that waits in its recv). `uneven` loads the replicas
    unevenly from step to step (each replica's data: every stage of it alike) in its
    phases ("forward", "backward"), with `tokens` recorded on them; with `balanced`, the
    same draws are spread evenly over the replicas at each step (what balancing the data
    would make of the job)."""
    root = Path(run_dir)
    rng = random.Random(seed)
    load_rng = random.Random(seed + 2)  # its own: runs with even data draw as before
    factor: dict[tuple[int, int], float] = {}
    for slowed in slow:
        replicas = range(shape.dp) if slowed.replica is None else (slowed.replica,)
        for replica in replicas:
            factor[slowed.stage, replica] = 1.0 + slowed.factor
    ranks = shape.stages * shape.dp
    files = {}
    for rank in range(ranks):
        path = timing_path(root, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        files[rank] = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed below

    def work(stage: int, replica: int, ms: float, load: float = 1.0) -> int:
        jitter = rng.lognormvariate(0.0, noise) if noise else 1.0
        return int(ms * factor.get((stage, replica), 1.0) * load * jitter * _NS)

    send = int(shape.send_ms * _NS)
    try:
        now = EPOCH_NS
        for step in range(steps):
            lines: dict[int, list[str]] = {r: [] for r in range(ranks)}
            record = _Recorder(step, lines, gpu)

            ends = {}
            loads = [1.0] * shape.dp
            if uneven is not None and step >= uneven.from_step:
                half = uneven.spread / 2
                loads = [load_rng.uniform(1 - half, 1 + half) for _ in range(shape.dp)]
                if balanced:  # the same data, each step's spread evenly over the replicas
                    loads = [sum(loads) / len(loads)] * shape.dp
            for d in range(shape.dp) if shape.calls != "pp" else ():
                load = {p: loads[d] for p in uneven.phases} if uneven is not None else {}
                ends.update(_megatron_replica(shape, d, now, record, work, load))
            for d in range(shape.dp) if shape.calls == "pp" else ():
                free = [now] * shape.stages
                done: dict[tuple[str, int, int], int] = {}  # (op, stage, microbatch) -> end
                order = [_order(shape, s) for s in range(shape.stages)]
                at = [0] * shape.stages
                while any(at[s] < len(order[s]) for s in range(shape.stages)):
                    for s in range(shape.stages):
                        if at[s] == len(order[s]):
                            continue
                        op, mb = order[s][at[s]]
                        # A forward needs the activation from the stage before; a backward,
                        # the gradient from the stage after (the last stage: its forward).
                        near = s - 1 if op == "F" else s + 1
                        has_dep = 0 <= near < shape.stages
                        if has_dep and (op, near, mb) not in done:
                            continue
                        at[s] += 1
                        rank = s * shape.dp + d
                        start = free[s]
                        if has_dep:
                            begin = max(start, done[op, near, mb] + send)
                            record(rank, "pp_recv", "comm", start, begin + send // 4)
                            start = begin + send // 4
                        if op == "F" and shape.copy_ms > 0:
                            copied = start + work(s, d, shape.copy_ms)
                            record(rank, "h2d", "compute", start, copied)
                            start = copied
                        name = "forward" if op == "F" else "backward"
                        ms = shape.forward_ms if op == "F" else shape.backward_ms
                        loaded = uneven is not None and name in uneven.phases
                        end = start + work(s, d, ms, loads[d] if loaded else 1.0)
                        tokens = uneven.tokens if uneven is not None and loaded else None
                        meta = json.dumps({"tokens": round(tokens * loads[d])}) if tokens else None
                        record(rank, name, "compute", start, end, meta)
                        onward = s + 1 if op == "F" else s - 1
                        if 0 <= onward < shape.stages:
                            took = send
                            if shape.send_jitter:
                                took = int(send * rng.lognormvariate(0.0, shape.send_jitter))
                            record(rank, "pp_send", "comm", end, end + took)
                            end += took
                        done[op, s, mb] = end
                        free[s] = end
                for s in range(shape.stages):
                    ends[s * shape.dp + d] = free[s]
            # Each stage's gradients across its replicas, then the optimizer.
            after = {}
            for s in range(shape.stages):
                group = [s * shape.dp + d for d in range(shape.dp)]
                reduced = max(ends[r] for r in group) + int(shape.allreduce_ms * _NS)
                for r in group:
                    record(r, "dp_allreduce", "comm", ends[r], reduced)
                    finish = reduced + work(-1, 0, shape.optimizer_ms)
                    record(r, "optimizer", "compute", reduced, finish)
                    after[r] = finish
            # The loss across every rank ends the step together.
            last = max(after.values()) + send
            for r in range(ranks):
                record(r, "loss_allreduce", "comm", after[r], last)
                record(r, STEP_PHASE, STEP_PHASE, now, last)
                files[r].write("".join(lines[r]))
            now = last + 50_000
    finally:
        for fh in files.values():
            fh.close()
    for rank in range(ranks):
        _write_meta(
            root,
            rank,
            ranks,
            ranks,
            None,
            lambda r: {"pipeline_stage": r // shape.dp, "dp": r % shape.dp},
        )
    return root
