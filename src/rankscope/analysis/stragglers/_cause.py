"""Why a rank is slow, in words, with its evidence: a cause class for every slow finding.

- **machine**: the rank's GPU said so itself (its health samples, read/_health.py): its
  SM clock below the other ranks' since the onset, held there by a thermal or power
  throttle reason. Tried first: the clock is the GPU's own word on why it runs slower.
- **data-driven**: the rank is slow where the work it was given is larger. It needs a
  per-step value recorded with the phase (`prof.phase("forward", tokens=n)`): per unit
  of that value the rank runs as fast as the others (within the threshold), while at
  its slow steps it had more of it than they did.
- **partitioning**: several ranks are slow together in the phase, and they are what a
  parallel group (the `groups` a rank gave its Profiler, e.g. the last pipeline stage)
  holds, or every rank of a host; for a host, the machine and the way work is split
  across hosts both fit, and the text says so.
- **persistent** (the machine): slow at nearly every sampled step since it began, its
  fastest steps included.
- **intermittent**: it comes and goes (a shared or busy machine).

Where the evidence cannot tell causes apart, `could_be` names them and the text says
what would: data-driven slowness looks persistent or intermittent until a per-step
value is recorded. Where the rank's GPU was sampled healthy (its clock the others',
nothing throttling it), a persistent or intermittent rank is **unclear** instead, and
the text says what was ruled out and what is left. ECC errors that grew on the rank's
GPU since the onset are said whatever the class.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from ..._text import format_ranks
from ..read._matrix import PhaseMatrices, nanmedian, quiet
from ..read._values import CpuTimes, PhaseValues
from ._findings import ratio_text
from ._gpu_health import GpuHealth, gpu_health
from ._groups import GROUP_SHARE
from ._model import Cause, StragglerFinding

__all__ = ["PERSISTENT_SHARE", "causes_of"]

Matrix = npt.NDArray[np.float64]

_HOST_WORK = ("data", "io")
"""Kinds of phase whose work is the host's (a loader, a file): the GPU's clock says
nothing of why they are slow, so its health is not weighed there."""

PERSISTENT_SHARE = 0.9
"""A rank above at this share of its steps since the onset, or more, is persistent."""
_FEWEST = 3
"""Steps with a value, on the rank and the others, to judge by a value at all."""


def causes_of(
    m: PhaseMatrices,
    findings: list[StragglerFinding],
    *,
    threshold: float,
    steady: set[tuple[int, str]],
    values: PhaseValues | None = None,
    hosts: Mapping[int, str] | None = None,
    groups: Mapping[int, Mapping[str, object]] | None = None,
    gpus: bool | None = None,
    cpu: CpuTimes | None = None,
) -> list[Cause | None]:
    """A cause for each slow finding (None for the ranks that wait). `steady`: the slow
    (rank, phase) pairs slow at their fastest steps too (find_stragglers knows). The
    ranks' GPU health comes with the values (`values.health`), where it was read."""
    health = values.health if values is not None else None
    slow_in: dict[str, set[int]] = {}
    for f in findings:
        if f.role == "slow":
            slow_in.setdefault(f.phase, set()).add(f.rank)
    out: list[Cause | None] = []
    settled: set[int] = set()
    for f in findings:
        if f.role != "slow":
            out.append(None)
            continue
        gpu = None
        if health is not None and m.steps and f.kind not in _HOST_WORK:
            gpu = gpu_health(health, f.rank, m.ranks, f.since_step, m.steps[-1])
        if gpu is not None and gpu.slows(threshold):
            out.append(_with_ecc(Cause("machine", gpu.machine()), gpu))
            settled.add(len(out) - 1)  # its GPU says why: where its CPU time went says nothing more
            continue
        data = _data_driven(m, f, threshold, values)
        if isinstance(data, Cause):
            out.append(_with_ecc(data, gpu))
            continue
        group = _partition(m, f, slow_in[f.phase], hosts, groups)
        if group is not None:
            out.append(_with_ecc(group, gpu))
            continue
        steady_f = (f.rank, f.phase) in steady
        if gpu is not None and gpu.healthy(threshold):
            out.append(_with_ecc(_unclear(f, steady_f, data, gpu), gpu))
            continue
        out.append(_with_ecc(_machine(f, steady_f, data, gpu), gpu))
    return [
        cause if cause is None or i in settled else _with_cpu(cause, _on_cpu(m, f, cpu, gpus))
        for i, (f, cause) in enumerate(zip(findings, out, strict=True))
    ]


_ON_CPU = 0.5
"""A slow rank's extra time is its work where the thread ran on a CPU for this share of
it or more; a wait for a CPU where it waited for one this long; else it was off the CPU."""


def _on_cpu(
    m: PhaseMatrices,
    f: StragglerFinding,
    times: CpuTimes | None,
    gpus: bool | None,
) -> str | None:
    """Where a slow rank's extra time in its phase went, in words: on a CPU (the records'
    "oncpu_ms"), waiting for one ("runq_ms"), or off it; None where the records do not
    say, or the phase is read on device time (where the host's time is not the work)."""
    oncpu = times.oncpu.get(f.phase) if times is not None else None
    if times is None or oncpu is None or f.phase not in m.phases:
        return None
    p = m.index(f.phase)
    if m.clocks[p] != "host" or f.rank not in m.ranks:
        return None
    r = m.ranks.index(f.rank)
    since = np.asarray(m.steps) >= f.since_step
    runq = times.runq.get(f.phase)
    wall, cpu = m.ms[p][:, since], oncpu[:, since]
    queued = runq[:, since] if runq is not None else np.full_like(wall, np.nan)
    others = np.delete(np.arange(len(m.ranks)), r)
    with quiet():
        extra_wall = wall[r] - nanmedian(wall[others], axis=0)
        extra_cpu = cpu[r] - nanmedian(cpu[others], axis=0)
        extra_queued = queued[r] - nanmedian(queued[others], axis=0)
    known = np.isfinite(extra_wall) & np.isfinite(extra_cpu)
    if known.sum() < 3:
        return None
    lost = float(np.median(extra_wall[known]))
    if lost <= 0:
        return None
    share = min(1.0, max(0.0, float(np.median(extra_cpu[known])) / lost))
    with_queue = known & np.isfinite(extra_queued)
    queue = None
    if with_queue.sum() >= 3:
        queue = min(1.0, max(0.0, float(np.median(extra_queued[with_queue])) / lost))
    return _where_it_went(share, queue, gpus)


def _where_it_went(share: float, queue: float | None, gpus: bool | None) -> str:
    """The words for a slow rank's extra time: `share` of it on a CPU, `queue` of it
    waiting for one (None: not recorded)."""
    if share >= _ON_CPU:
        return (
            f"its thread ran on a CPU for {share:.0%} of its extra time: more work, or slower cores"
        )
    waits = "a loader's queue, I/O, a GPU sync, a lock" if gpus else "a loader's queue, I/O, a lock"
    if queue is None:
        return (
            f"its thread was off the CPU for {1 - share:.0%} of its extra time: it slept, "
            f"waited ({waits}) or was kept off a core"
        )
    if queue >= _ON_CPU:
        return (
            f"its thread waited for a CPU for {queue:.0%} of its extra time: other processes "
            "held its cores (its loader's workers, other ranks, another job)"
        )
    return (
        f"its thread was off the CPU, and not waiting for one, for "
        f"{max(0.0, 1 - share - queue):.0%} of its extra time: it slept or waited ({waits})"
    )


def _with_cpu(cause: Cause, said: str | None) -> Cause:
    """`cause`, saying where the slow rank's extra time went: on the CPU or off it."""
    if said is None:
        return cause
    return Cause(cause.kind, f"{cause.text}; {said}", cause.could_be)


def _with_ecc(cause: Cause, gpu: GpuHealth | None) -> Cause:
    """`cause`, saying the ECC errors that grew on the rank's GPU since the onset."""
    if gpu is None or gpu.ecc is None:
        return cause
    return Cause(cause.kind, f"{cause.text}; {gpu.ecc}", cause.could_be)


def _unclear(
    f: StragglerFinding, steady: bool, evidence: tuple[str, bool] | None, gpu: GpuHealth
) -> Cause:
    """A rank whose GPU was sampled healthy: what the health and the values ruled out,
    and what is left."""
    since = f" since step {f.since_step}" if f.since_step else ""
    kind = "persistent" if f.share_above >= PERSISTENT_SHARE and steady else "intermittent"
    data, data_out = evidence if evidence is not None else (_NOT_RECORDED.format(f.phase), False)
    ruled = [gpu.ruled_out()] + ([data] if data_out else [])
    host = gpu.host()
    left = [
        *(() if data_out else (f"uneven work ({data})",)),
        f"the host{f' ({host})' if host else ''}",
        "the network",
        "the rank's own process (its threads, its data loading)",
    ]
    text = (
        f"unclear: slow at {f.share_above:.0%} of sampled steps{since}"
        f"{', its fastest steps included' if steady else ''}, and not for its GPU; ruled "
        f"out: {'; '.join(ruled)}; left: {', '.join(left)}"
    )
    return Cause("unclear", text, (kind,) if data_out else (kind, "data-driven"))


_NOT_RECORDED = (
    'no per-step value is recorded with this phase: record one, e.g. prof.phase("{}", tokens=n)'
)
_NO_VALUE = (
    "no per-step value is recorded with this phase, so uneven work (longer "
    'sequences) is not ruled out: record one, e.g. prof.phase("{}", tokens=n)'
)


def _machine(
    f: StragglerFinding,
    steady: bool,
    evidence: tuple[str, bool] | None,
    gpu: GpuHealth | None = None,
) -> Cause:
    """Persistent or intermittent; with what the recorded values said (`evidence`: the
    words, whether they rule the data out; None where none was recorded) and the GPU's
    clock and throttle reasons where they neither show throttling nor rule it out (`gpu`)."""
    since = f" since step {f.since_step}" if f.since_step else ""
    if gpu is not None and gpu.clock is not None and gpu.others_clock is not None:
        # Neither throttled nor healthy: a low clock no reason explains (clocks an
        # application set, another GPU model), or a reason set with the clock near the
        # others', is said, not judged.
        share = gpu.throttled_share
        since += f" ({gpu.clock_words(since=False)}; " + (
            "its throttle reasons not read)"
            if share is None
            else f"a thermal or power throttle reason set at {share:.0%} of its samples)"
        )
    if evidence is None:
        evidence = (_NO_VALUE.format(f.phase), False)
    data, ruled_out = evidence
    unsure: tuple[str, ...] = () if ruled_out else ("data-driven",)
    if f.share_above >= PERSISTENT_SHARE and steady:
        # A loader's phase slow at every step is its own loading (a sleep, slow storage,
        # too few workers), not the machine: only its batches' size is "the data" here.
        where = (
            "its own loading (its storage, its loader's workers, the files it reads) more "
            "than the size of its batches"
            if f.kind in _HOST_WORK
            else "the machine (or its device) more than the data"
        )
        text = (
            f"persistent: slow at {f.share_above:.0%} of sampled steps{since}, its fastest "
            f"steps included: {where}; {data}"
        )
        return Cause("persistent", text, ("persistent", *unsure) if unsure else ())
    text = (
        f"intermittent: slow at {f.share_above:.0%} of sampled steps{since}"
        f"{'' if steady else ', not at its fastest'}: it comes and goes, as on a shared or "
        f"busy machine; {data}"
    )
    return Cause("intermittent", text, ("intermittent", *unsure) if unsure else ())


def _data_driven(
    m: PhaseMatrices, f: StragglerFinding, threshold: float, values: PhaseValues | None
) -> Cause | tuple[str, bool] | None:
    """A data-driven cause where a value recorded with the phase explains the excess;
    else (what the values said, whether they rule the data out); None without values."""
    recorded = values.of(f.phase) if values is not None else {}
    if not recorded:
        return None
    p, r = m.index(f.phase), m.ranks.index(f.rank)
    after = np.asarray(m.steps) >= f.since_step
    d = m.ms[p][:, after]
    said: list[str] = []
    unjudged: list[str] = []
    for name, matrix in sorted(recorded.items()):
        v = matrix[:, after]
        with quiet():
            per_unit = np.where(v > 0, d / v, np.nan)
            others_unit = nanmedian(np.delete(per_unit, r, 0), axis=0)
            others_value = nanmedian(np.delete(v, r, 0), axis=0)
            others_time = nanmedian(np.delete(d, r, 0), axis=0)
            unit = per_unit[r] / others_unit
            slow = d[r] / others_time > threshold
            more = v[r] / others_value
        judged = np.isfinite(unit) & np.isfinite(more)
        if int(judged.sum()) < _FEWEST:
            unjudged.append(name)
            continue
        unit_ratio = float(np.median(unit[judged]))
        at_slow = judged & slow
        value_ratio = float(np.median(more[at_slow])) if at_slow.any() else 1.0
        if unit_ratio <= threshold and value_ratio > threshold:
            return Cause(
                "data-driven",
                f"data-driven: at its slow steps its {name} was {value_ratio:.2f}x the other "
                f"ranks', and per {name} it runs at {ratio_text(unit_ratio)} vs them: the "
                "work it is given, not the rank, makes it slow (balance the data across ranks)",
            )
        if unit_ratio > threshold:
            said.append(f"per {name} it is still {ratio_text(unit_ratio)} vs the others")
        else:
            said.append(f"its {name} was no larger than the others' at its slow steps")
    if said:
        return "; ".join(said), True
    names = ", ".join(unjudged)
    return (
        f"its {names} cannot tell: fewer than {_FEWEST} of its steps have a value above 0 "
        "beside the other ranks'",
        False,
    )


def _partition(
    m: PhaseMatrices,
    f: StragglerFinding,
    slow: set[int],
    hosts: Mapping[int, str] | None,
    groups: Mapping[int, Mapping[str, object]] | None,
) -> Cause | None:
    """A partitioning cause where the ranks slow in the phase make up a group: a
    parallel group the ranks named, else every rank of a host."""
    if len(slow) < 2:
        return None
    fields = sorted({name for g in (groups or {}).values() for name in g})
    for name in fields:
        member = _slow_group(
            m.ranks, slow, f.rank, {r: g.get(name) for r, g in (groups or {}).items()}
        )
        if member is not None:
            value, ranks = member
            return Cause(
                "partitioning",
                f"partitioning: {format_ranks(sorted(ranks & slow))} are slow together "
                f"in {f.phase}, the ranks with {name}={value}: the work that group is given "
                "(e.g. the last pipeline stage), not one machine",
            )
    member = _slow_group(m.ranks, slow, f.rank, dict(hosts or {}))
    if member is None:
        return None
    host, ranks = member
    return Cause(
        "unclear",
        f"{format_ranks(sorted(ranks & slow))} are slow together in {f.phase}, every "
        f"rank of host {host}: the machine, or how the work is split across hosts; the "
        "timings do not tell them apart (name the ranks' parallel groups, "
        "Profiler(groups=...), to check the split)",
        ("persistent", "partitioning"),
    )


def _slow_group(
    ranks: list[int], slow: set[int], rank: int, label: Mapping[int, object]
) -> tuple[object, set[int]] | None:
    """(the label, its ranks) of `rank`'s group where the group is slow together: two
    ranks or more, most of them slow, and some group with none slow."""
    mine = label.get(rank)
    if mine is None:
        return None
    by_label: dict[object, set[int]] = {}
    for r in ranks:
        if label.get(r) is not None:
            by_label.setdefault(label[r], set()).add(r)
    group = by_label.get(mine, set())
    clean = any(not (members & slow) for members in by_label.values())
    if len(group) >= 2 and len(group & slow) >= GROUP_SHARE * len(group) and clean:
        return mine, group
    return None
