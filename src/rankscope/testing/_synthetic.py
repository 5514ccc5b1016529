"""Run directories and Kineto traces with known answers, for tests, benchmarks and demos.

`write_timings` simulates a data-parallel job step by step (phases that end in a
collective end together on every rank, so an early rank waits there) and writes the
timer's JSONL exactly as the timer does. It does not import torch; Kineto-shaped traces are
testing/_synthetic_traces.py's.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..rundir._layout import meta_path, timing_path
from ..timing._record import STEP_PHASE, Span, format_record

__all__ = [
    "DDP_PHASES",
    "EPOCH_NS",
    "GPU_PHASES",
    "GPU_WAITING_PHASES",
    "PhaseSpec",
    "Slowdown",
    "Uneven",
    "write_timings",
]

EPOCH_NS = 1_790_000_000_000_000_000


@dataclass(frozen=True)
class PhaseSpec:
    """One phase of the simulated step."""

    name: str
    kind: str = "compute"
    ms: float = 10.0
    """Host time of the rank's own work in the phase."""
    sync: bool = False
    """The phase ends in a collective: every rank leaves it when the last one is done."""
    device_ms: float | None = None
    """The GPU's work in the phase. Given for every phase, the run is a GPU job's: `ms`
    is then the host's time in the phase (launching kernels, or a loader's own work)."""
    host_waits: bool = False
    """In a GPU job, the host waits for the GPU at the phase's end (DDP's wait for its
    all-reduce, a loss.item(), a synchronize): its host time holds the GPU's, and more."""


DDP_PHASES: tuple[PhaseSpec, ...] = (
    PhaseSpec("host_to_device", "data", 2.0),
    PhaseSpec("forward", "compute", 30.0),
    PhaseSpec("backward", "compute", 55.0, sync=True),  # DDP's all-reduce runs inside
    PhaseSpec("optimizer", "compute", 8.0),
    PhaseSpec("loss_allreduce", "comm", 1.0, sync=True),
)
"""A DDP step: backward holds the gradient all-reduce, so it is a sync point though its kind is compute."""

GPU_PHASES: tuple[PhaseSpec, ...] = (
    PhaseSpec("data", "data", 20.0, device_ms=0.0),  # a host-side loader: no GPU work
    PhaseSpec("forward", "compute", 1.0, device_ms=12.0),
    PhaseSpec("backward", "compute", 1.5, sync=True, device_ms=25.0),  # NCCL's all-reduce
    PhaseSpec("optimizer", "compute", 0.5, device_ms=3.0),
)
"""A DDP step on GPUs: the host launches kernels in a fraction of their device time and
loads the next batch while the GPU still runs the previous step."""

GPU_WAITING_PHASES: tuple[PhaseSpec, ...] = (
    PhaseSpec("data", "data", 20.0, device_ms=0.0),
    PhaseSpec("forward", "compute", 1.0, device_ms=12.0),
    PhaseSpec("backward", "compute", 1.5, sync=True, device_ms=25.0, host_waits=True),
    PhaseSpec("optimizer", "compute", 0.5, device_ms=3.0),
)
"""The same step where the host waits for the all-reduce at backward's end (as DDP did on
a real H200): backward's host time is the longer of its two clocks on every rank."""


@dataclass(frozen=True)
class Slowdown:
    """`rank` spends `factor` more time in `phase` (0.4: +40%) from `from_step` on."""

    rank: int
    phase: str
    factor: float
    from_step: int = 0
    share: float = 1.0
    """The fraction of sampled steps affected (chosen at random)."""
    on: str = "host"
    """In a GPU job (PhaseSpec.device_ms), which work grows: "host" (a loader, or the
    launches), "device" (the GPU's work, launches unchanged: a slower GPU) or "both"
    (extra GPU work whose launches take longer too)."""


@dataclass(frozen=True)
class Uneven:
    """Data that loads ranks unevenly from step to step (sequence lengths, expert routing):
    at each step each rank draws its own load, uniform in 1 +- `spread` / 2, and its
    work in `phases` scales with it. No rank is slower than the others for long: the
    slowest changes from step to step. With `tokens`, each of those phases records the
    load as a per-step value (`prof.phase("forward", tokens=n)`), `tokens` at load 1."""

    phases: tuple[str, ...] = ("forward",)
    spread: float = 0.6
    tokens: int | None = None
    from_step: int = 0


def write_timings(  # noqa: PLR0915 - one simulation, read top to bottom
    run_dir: str | os.PathLike[str],
    *,
    ranks: int,
    steps: int,
    every_n_steps: int = 1,
    phases: Sequence[PhaseSpec] = DDP_PHASES,
    slowdowns: Iterable[Slowdown] = (),
    noise: float = 0.03,
    spikes: float = 0.0,
    gpu: bool = False,
    seed: int = 0,
    clock_skew_ms: float = 0.0,
    resume_lag_ms: float = 0.0,
    resume_in_order: bool = True,
    ranks_per_host: int = 8,
    write_meta: bool = True,
    only_ranks: Iterable[int] | None = None,
    uneven: Uneven | None = None,
    groups: Callable[[int], dict[str, int | str]] | None = None,
) -> Path:
    """Simulate `steps` sampled steps of a `ranks`-rank job and write its timings.

    `noise` is the relative spread of every phase's time (log-normal); `spikes` the
    chance that one rank's phase on one step takes 1.5-3x as long (a shared machine's
    hiccups: not a straggler). `only_ranks` writes files for those ranks alone (the
    meta still says the whole world size), as a run with missing ranks would look.
    `clock_skew_ms` sets each host's wall clock off by up to that much (hosts whose
    clocks disagree; ranks `ranks_per_host` to a host share one); durations are
    unaffected. `resume_lag_ms` makes ranks leave a collective late by up to that much,
    as processes on an oversubscribed CPU do, woken one after another: in one order
    that holds at every step (`resume_in_order`), or in a new order each time. `uneven`
    loads the ranks unevenly from step to step (CPU runs only). `groups(rank)` gives
    the parallel groups each rank's meta names (`Profiler(groups=...)`).
    """
    root = Path(run_dir)
    rng = random.Random(seed)
    slow = list(slowdowns)
    hit = {(s.rank, s.phase): s for s in slow}
    writing = set(range(ranks) if only_ranks is None else only_ranks)
    hosts = (ranks + ranks_per_host - 1) // ranks_per_host
    # One draw per rank, as before hosts were modelled, so seeds give the runs they gave.
    draws = [int(rng.uniform(-clock_skew_ms, clock_skew_ms) * 1e6) for _ in range(ranks)]
    host_skew = draws[:hosts]
    skew = [host_skew[rank // ranks_per_host] for rank in range(ranks)]
    # Its own generator: runs without resume lag draw the same numbers as before it existed.
    lag_rng = random.Random(seed + 1)
    order = list(range(ranks))
    lag_rng.shuffle(order)
    lag_share = [order.index(rank) / max(1, ranks - 1) for rank in range(ranks)]
    files = {}
    for rank in sorted(writing):
        path = timing_path(root, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        files[rank] = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    if phases and all(spec.device_ms is not None for spec in phases):
        try:
            _GpuJob(rng, ranks, phases, hit, noise, skew).write(files, steps, every_n_steps)
        finally:
            for fh in files.values():
                fh.close()
        if write_meta:
            for rank in sorted(writing):
                _write_meta(root, rank, ranks, ranks_per_host, "cuda:0", groups)
        return root
    try:
        clock = [EPOCH_NS + rng.randrange(10**6) for _ in range(ranks)]  # ns; ranks start apart
        # Its own generator: runs without uneven data draw the same numbers as before.
        load_rng = random.Random(seed + 2)
        for sampled in range(steps):
            step = sampled * every_n_steps
            step_start = list(clock)
            lines: dict[int, list[str]] = {r: [] for r in writing}
            load = [1.0] * ranks
            if uneven is not None and step >= uneven.from_step:
                half = uneven.spread / 2
                load = [load_rng.uniform(1 - half, 1 + half) for _ in range(ranks)]
            for spec in phases:
                starts = list(clock)
                work = []
                for rank in range(ranks):
                    ms = spec.ms * rng.lognormvariate(0.0, noise) if noise else spec.ms
                    if spikes and rng.random() < spikes:
                        ms *= rng.uniform(1.5, 3.0)
                    s = hit.get((rank, spec.name))
                    if s is not None and step >= s.from_step and rng.random() < s.share:
                        ms *= 1.0 + s.factor
                    if uneven is not None and spec.name in uneven.phases:
                        ms *= load[rank]
                    work.append(int(ms * 1e6))
                if spec.sync:
                    # The collective completes when the last rank reaches it.
                    done = max(starts[r] + work[r] for r in range(ranks)) + 50_000
                    ends = [done] * ranks
                    if resume_lag_ms:
                        if not resume_in_order:
                            lag_rng.shuffle(lag_share)
                        ends = [
                            done + int(resume_lag_ms * 1e6 * lag_share[r] * lag_rng.uniform(0.5, 1))
                            for r in range(ranks)
                        ]
                else:
                    ends = [starts[r] + work[r] for r in range(ranks)]
                tokens = uneven.tokens if uneven and spec.name in uneven.phases else None
                for rank in writing:
                    span = _span(step, spec.name, spec.kind, starts[rank], ends[rank])
                    span.start_ns += skew[rank]
                    if tokens:
                        span.meta = json.dumps({"tokens": round(tokens * load[rank])})
                    lines[rank].append(format_record(rank, span, _gpu_ms(span, gpu), 0))
                clock = [end + 20_000 for end in ends]  # the Python between phases
            for rank in writing:
                span = _span(step, STEP_PHASE, STEP_PHASE, step_start[rank], clock[rank])
                span.start_ns += skew[rank]
                lines[rank].append(format_record(rank, span, _gpu_ms(span, gpu), 0))
                files[rank].write("".join(lines[rank]))
            # Unsampled steps in between: every rank's clock moves on alike.
            gap = int((every_n_steps - 1) * sum(p.ms for p in phases) * 1e6)
            clock = [c + gap for c in clock]
    finally:
        for fh in files.values():
            fh.close()
    if write_meta:
        for rank in sorted(writing):
            _write_meta(root, rank, ranks, ranks_per_host, None, groups)
    return root


def _span(step: int, phase: str, kind: str, start: int, end: int) -> Span:
    span = Span(step, phase, kind, None, 0, None)
    span.start_ns = start
    span.cpu_ns = end - start
    return span


def _gpu_ms(span: Span, gpu: bool) -> float | None:
    return round(span.cpu_ns / 1e6 * 0.97, 6) if gpu else None


class _GpuJob:
    """A GPU job's timeline, rank by rank: the host launches each phase's kernels (or does
    a loader's work) while the GPU runs them in order, later; a phase's device time is
    between its two events as the GPU passes them, its host time the host's own. The host
    waits for the GPU once a step (a loss.item() of the step before), so it runs up to
    one step ahead; the all-reduce at the end of a sync phase completes on every rank's
    GPU when the last GPU reaches it, and the host does not wait for it (NCCL)."""

    def __init__(  # noqa: PLR0917 - the simulation's settings, each passed once
        self,
        rng: random.Random,
        ranks: int,
        phases: Sequence[PhaseSpec],
        hit: dict[tuple[int, str], Slowdown],
        noise: float,
        skew: list[int],
    ) -> None:
        self.rng, self.ranks, self.phases, self.hit = rng, ranks, phases, hit
        self.noise, self.skew = noise, skew
        self.host = [EPOCH_NS + rng.randrange(10**6) for _ in range(ranks)]
        self.device = list(self.host)  # when each GPU is free
        self.previous = list(self.host)  # when each GPU ends the step before

    def _work(self, rank: int, spec: PhaseSpec, step: int) -> tuple[int, int]:
        """(host ns, device ns) of the rank's own work in the phase at this step."""
        host, device = spec.ms, spec.device_ms or 0.0
        if self.noise:
            host *= self.rng.lognormvariate(0.0, self.noise)
            device *= self.rng.lognormvariate(0.0, self.noise)
        s = self.hit.get((rank, spec.name))
        if s is not None and step >= s.from_step and self.rng.random() < s.share:
            if s.on in ("host", "both"):
                host *= 1.0 + s.factor
            if s.on in ("device", "both"):
                device *= 1.0 + s.factor
        return int(host * 1e6), int(device * 1e6)

    def write(self, files: dict[int, Any], steps: int, every_n_steps: int) -> None:
        for sampled in range(steps):
            for step in range(sampled * every_n_steps, (sampled + 1) * every_n_steps):
                lines = self._step(step)
                if step % every_n_steps == 0:
                    for rank, fh in files.items():
                        fh.write("".join(lines[rank]))

    def _step(self, step: int) -> list[list[str]]:
        n = self.ranks
        host, device = self.host, self.device
        lines: list[list[str]] = [[] for _ in range(n)]
        step_host = list(host)
        step_device = [max(h, d) for h, d in zip(host, device, strict=True)]
        for spec in self.phases:
            starts = list(host)
            begun = [max(h, d) for h, d in zip(host, device, strict=True)]  # its start event
            for rank in range(n):
                work_host, work_device = self._work(rank, spec, step)
                host[rank] += work_host
                if work_device:  # the last kernel cannot run before it is launched
                    device[rank] = max(begun[rank] + work_device, host[rank])
                else:
                    device[rank] = begun[rank]
            if spec.sync:
                done = max(device) + 50_000
                device[:] = [done] * n
            for rank in range(n):
                if spec.host_waits:
                    host[rank] = max(host[rank], device[rank])
                passed = max(host[rank], device[rank])  # its end event
                span = _span(step, spec.name, spec.kind, starts[rank], host[rank])
                span.start_ns += self.skew[rank]
                gpu = round((passed - begun[rank]) / 1e6, 6)
                lines[rank].append(format_record(rank, span, gpu, 0))
                host[rank] += 20_000  # the Python between phases
        for rank in range(n):
            host[rank] = max(host[rank], self.previous[rank])  # the step before's loss.item()
            self.previous[rank] = device[rank]
            span = _span(step, STEP_PHASE, STEP_PHASE, step_host[rank], host[rank])
            span.start_ns += self.skew[rank]
            gpu = round((max(host[rank], device[rank]) - step_device[rank]) / 1e6, 6)
            lines[rank].append(format_record(rank, span, gpu, 0))
        return lines


def _write_meta(  # noqa: PLR0917 - the run's settings, each passed once
    root: Path,
    rank: int,
    world_size: int,
    ranks_per_host: int,
    device: str | None = None,
    groups: Callable[[int], dict[str, int | str]] | None = None,
) -> None:
    path = meta_path(root, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "v": 1,
        "rank": rank,
        "local_rank": rank % ranks_per_host,
        "world_size": world_size,
        "local_world_size": min(ranks_per_host, world_size),
        "host": f"node{rank // ranks_per_host:03d}",
        "pid": 1000 + rank,
        "synthetic": True,
    }
    if device is not None:
        data["device"] = device
    if groups is not None:
        data["groups"] = groups(rank)
    path.write_text(json.dumps(data), encoding="utf-8")
