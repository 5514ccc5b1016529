"""Putting the ranks of one window on one clock, for `rankscope collectives`.

- A rank's time is its trace's `baseTimeNanoseconds` plus `ts`, as `rankscope merge`
  reads it. torch writes wall-clock times; a trace on the monotonic clock (its times
  near the `perf_counter_ns` of the rank's meta clock pair, not its `time_ns`) is moved
  onto the wall clock with its host's pair (one offset per host, the median of its
  ranks'), so the ranks of a host stay exact against each other.
- Hosts' wall clocks differ by what NTP leaves. Where the window's ranks span hosts and
  the run has timings, each host's offset is taken off its ranks' times: the offset the
  straggler analysis estimates from when ranks leave comm phases, which all ranks leave
  together (`clock_offsets`), over the whole run. Without timings, or without
  a comm phase in them, hosts are compared on their wall clocks as written, and the
  output says so.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from ..._text import format_ranks

if TYPE_CHECKING:  # numpy, and the straggler analysis, only where timings are read
    from ..read._matrix import PhaseMatrices
    from ..read._run import RunMeta

__all__ = [
    "ALIGNMENTS",
    "Clock",
    "HostOffsets",
    "align_clocks",
    "clock_offsets",
    "host_clock_offsets",
    "unmeasured_clocks",
]

_YEAR_NS = 366 * 86_400 * 10**9
_OFFSET_LIMIT_NS = 3_600 * 10**9
"""An estimate past an hour is no NTP offset but a fault in the timings: not used."""
_HOSTS_SHOWN = 4

ALIGNMENTS = {
    "one host": "every rank on one host, one clock",
    "timings": "each host's clock offset, from the run's timings, taken off its ranks' times",
    "wall clocks": "hosts compared on their wall clocks as written (their offset not measured)",
    "as written": "trace times as written (no meta files: hosts not known)",
}
"""How ranks of different hosts were put on one clock (`CollectiveReport.alignment`), in words."""


@dataclass(frozen=True)
class HostOffsets:
    """Each host's wall-clock offset, as the run's timings show it."""

    ns: dict[str, int] = field(default_factory=dict)
    """Per host, what its clock reads ahead of the others' median (ns): taken off its
    ranks' times. Empty where none could be estimated."""
    why_none: str | None = None
    """Why there are none, in words (where `ns` is empty)."""


def clock_offsets(m: PhaseMatrices, hosts: Mapping[int, str] | None) -> Any:
    """Each rank's clock offset (ns), from collectives, which all ranks leave together.

    Ranks on one host read one clock: they get one offset, the median of theirs, so a
    rank that is merely slow to resume after a collective (an oversubscribed CPU) is not
    taken for a rank whose clock is off. With every rank on one host, there is none.
    """
    import numpy as np

    from ..read._matrix import nanmedian, quiet

    deviations = []
    for p, kind in enumerate(m.kinds):
        if kind == "comm":
            leave = m.end_ns[p]
            with quiet():
                deviations.append(leave - nanmedian(leave, 0))
    if not deviations:
        return np.zeros(len(m.ranks))
    with quiet():
        offset = np.nan_to_num(nanmedian(np.concatenate(deviations, 1), axis=1))
    if hosts is None:
        return offset
    groups: dict[str, list[int]] = {}
    for i, rank in enumerate(m.ranks):
        groups.setdefault(hosts.get(rank, f"rank {rank}"), []).append(i)
    if len(groups) == 1:
        return np.zeros(len(m.ranks))
    # Per step, smoothed over the steps around it: a host whose clock was stepped
    # mid-run (NTP, +2 s) is followed across the step, where one offset for the whole
    # run put half its steps 2 s off and hid the ranks that waited.
    with quiet():
        per_step = nanmedian(np.stack(deviations), axis=0)  # ranks x steps
    shared = np.zeros((len(m.ranks), len(m.steps)))
    for members in groups.values():
        whole = float(np.median(offset[members]))
        with quiet():
            host = nanmedian(per_step[members], axis=0)
        shared[members] = np.nan_to_num(_rolling_median(host), nan=whole)
    return shared


_OFFSET_WINDOW = 9
"""Steps a host's per-step clock offset is smoothed over (the median of them)."""


def _rolling_median(values: Any) -> Any:
    """The median of each step's `_OFFSET_WINDOW` neighbours (NaN ignored; NaN where all are)."""
    import numpy as np
    from numpy.lib.stride_tricks import sliding_window_view

    from ..read._matrix import nanmedian, quiet

    half = _OFFSET_WINDOW // 2
    padded = np.concatenate((np.full(half, np.nan), values, np.full(half, np.nan)))
    with quiet():
        return nanmedian(sliding_window_view(padded, _OFFSET_WINDOW), axis=1)


def unmeasured_clocks(m: PhaseMatrices, hosts: Mapping[int, str] | None) -> str | None:
    """A note where the ranks ran on several hosts and no phase of kind comm measures how
    far apart their clocks are: who arrives last across hosts is then read on clocks that
    may differ by milliseconds (NTP's usual), and a waiting rank can vanish with it."""
    if not hosts or "comm" in m.kinds or m.on_device:
        return None
    spanned = {hosts[r] for r in m.ranks if r in hosts}
    if len(spanned) < 2:
        return None
    return (
        f"the ranks ran on {len(spanned)} hosts and no phase of kind comm measures how far "
        "apart their clocks are: who arrives last across hosts (the ranks that wait, and "
        "what they cost) is read on the hosts' clocks as they are, which NTP keeps within "
        "milliseconds and a clock step moves by seconds; time a collective as a phase of "
        'kind comm (prof.phase("sync", kind="comm")) to have the offsets measured'
    )


def host_clock_offsets(m: PhaseMatrices, hosts: Mapping[int, str]) -> HostOffsets:
    """Each host's clock offset from the run's timings (`clock_offsets`, the
    median over a host's ranks). Empty, with the reason, where the timings hold no comm
    phase: those are what the offsets are measured at."""
    if "comm" not in m.kinds:
        return HostOffsets(
            why_none="the timings hold no phase of kind comm, whose ends measure the offsets"
        )
    import numpy as np

    offsets = clock_offsets(m, hosts)
    per_host: dict[str, list[float]] = {}
    if offsets.ndim == 2:  # per step: the host's offset over the run is their median
        offsets = np.nan_to_num(np.median(offsets, axis=1))
    for i, rank in enumerate(m.ranks):
        host = hosts.get(rank)
        if host is not None:
            per_host.setdefault(host, []).append(float(offsets[i]))
    if not per_host:
        return HostOffsets(why_none="the meta files name no host of a rank with timings")
    medians = {host: statistics.median(v) for host, v in per_host.items()}
    kept = {
        host: round(ns)
        for host, ns in medians.items()
        if math.isfinite(ns) and abs(ns) <= _OFFSET_LIMIT_NS
    }
    if not kept:
        return HostOffsets(why_none="the timings put every host's offset past an hour")
    return HostOffsets(kept)


class Clock(NamedTuple):
    """How one rank's trace times are put on the window's clock."""

    shift_ns: int
    """Added to the rank's base + ts."""
    kind: str
    """"wall", "monotonic" (moved onto the wall clock) or "as written"."""
    host: str | None
    offset_ns: int | None
    """Its host's clock offset taken off (part of `shift_ns`); None where none was."""


def _pair(meta: dict[str, Any] | None) -> tuple[int, int] | None:
    clock = meta.get("clock") if meta is not None else None
    if not isinstance(clock, dict):
        return None
    wall, mono = clock.get("time_ns"), clock.get("perf_counter_ns")
    if type(wall) is int and type(mono) is int and 0 < wall < 1 << 63 and 0 <= mono < 1 << 63:
        return wall, mono
    return None


def align_clocks(
    first_ns: Mapping[int, int | None],
    meta: RunMeta | None,
    offsets: Callable[[], HostOffsets],
    notes: list[str],
) -> tuple[dict[int, Clock], str]:
    """Each rank's clock, and how hosts were aligned (one of ALIGNMENTS).

    `first_ns` is each rank's first arrival as its trace writes it (base + ts, ns; None
    where it has none). `offsets` is called only where the ranks span hosts. What was
    done, and what could not be, is added to `notes`.
    """
    walls = _onto_wall_clock(first_ns, meta, notes)
    hosts = meta.hosts if meta is not None else {}
    used = sorted({hosts[r] for r in first_ns if r in hosts})
    unknown = [r for r in first_ns if r not in hosts]
    if meta is None:
        return walls, "as written"
    if len(used) <= 1 and not unknown:
        return walls, "one host"
    if len(used) <= 1:
        notes.append(
            f"{format_ranks(unknown)}: no host in their meta, so the ranks may span hosts: "
            "compared on their wall clocks as written, which differ between hosts by what "
            "NTP leaves (not measured here)"
        )
        return walls, "wall clocks"
    found = offsets()
    applied = {r: found.ns[hosts[r]] for r in first_ns if hosts.get(r) in found.ns}
    named = f"ranks on {len(used)} hosts ({_listed(used)})"
    if not applied:
        notes.append(
            f"{named} are compared on their wall clocks, which differ by what NTP leaves "
            f"(tens of microseconds to milliseconds) and is not measured here: "
            f"{found.why_none or 'the timings name none of these hosts'}. A skew between "
            "hosts below that is not evidence"
        )
        return walls, "wall clocks"
    out = {
        r: c._replace(shift_ns=c.shift_ns - applied[r], offset_ns=applied[r]) if r in applied else c
        for r, c in walls.items()
    }
    shown = ", ".join(
        f"{host} {found.ns[host] / 1e6:+.3f} ms" for host in used[:_HOSTS_SHOWN] if host in found.ns
    )
    notes.append(
        f"{named}: each host's clock offset, as the run's timings show it (where ranks "
        f"leave comm phases, which they leave together; the straggler analysis's "
        f"estimate over the whole run), is taken off its ranks' times ({shown}"
        f"{', ...' if len(used) > _HOSTS_SHOWN else ''})"
    )
    left = sorted(set(first_ns) - set(applied))
    if left:
        notes.append(
            f"{format_ranks(left)}: no clock offset for their host (no host in their meta, "
            "no timings of its ranks, or an estimate past an hour, which is no clock's "
            "offset): their wall clocks are used as written"
        )
    return out, "timings"


def _listed(hosts: list[str]) -> str:
    return ", ".join(hosts[:_HOSTS_SHOWN]) + (", ..." if len(hosts) > _HOSTS_SHOWN else "")


def _onto_wall_clock(
    first_ns: Mapping[int, int | None], meta: RunMeta | None, notes: list[str]
) -> dict[int, Clock]:
    """Each rank's shift onto the wall clock, through its host's clock pair where needed."""
    pairs = {r: _pair(meta.meta.get(r)) for r in first_ns} if meta is not None else {}
    hosts = meta.hosts if meta is not None else {}
    offsets: dict[str, list[int]] = {}
    for rank, pair in pairs.items():
        if pair is not None and rank in hosts:
            offsets.setdefault(hosts[rank], []).append(pair[0] - pair[1])
    host_offset = {host: statistics.median_low(values) for host, values in offsets.items()}
    out: dict[int, Clock] = {}
    kinds: dict[str, list[int]] = {}
    for rank, at_ns in first_ns.items():
        host, pair = hosts.get(rank), pairs.get(rank)
        kind, shift = "as written", 0
        if pair is not None and at_ns is not None:
            wall, mono = pair
            if abs(at_ns - wall) < min(abs(at_ns - mono), _YEAR_NS):
                kind = "wall"
            elif abs(at_ns - mono) < _YEAR_NS:
                kind = "monotonic"
                shift = host_offset.get(host, wall - mono) if host is not None else wall - mono
            else:
                kinds.setdefault("neither", []).append(rank)
        elif meta is not None:
            kinds.setdefault("no pair", []).append(rank)
        kinds.setdefault(kind, []).append(rank)
        out[rank] = Clock(shift, kind, host, None)
    if meta is None:
        notes.append(
            "no run directory around the traces, so no meta files: trace times are used as "
            "written (torch writes wall-clock times), and the hosts are not known"
        )
    if "no pair" in kinds:
        notes.append(
            f"{format_ranks(kinds['no pair'])}: no clock pair in their meta; trace times used as written"
        )
    if "neither" in kinds:
        notes.append(
            f"{format_ranks(kinds['neither'])}: trace times near neither clock of their meta "
            "(wall or monotonic); used as written"
        )
    if "monotonic" in kinds:
        notes.append(
            f"{format_ranks(kinds['monotonic'])}: trace times on the monotonic clock, moved "
            "onto the wall clock with their host's clock pair"
        )
    return out
