"""Hangs named from the collectives themselves: per process group, from each rank's
Flight Recorder dump, the last collective every rank completed, the first one some rank
never entered, and calls that do not match between ranks (docs/hangs.md says these rules
for users).

- Members. A group's ranks are as rankscope's watchdog recorded them beside its dump
  (the hang file's `process_groups`, read from torch's own table), else as the dump's
  `pg_config` says (NCCL's dumps), else inferred: the default group ("0") holds every
  rank of the world, any other group the ranks whose dumps name it. How they were known
  is said.
- Entered and completed. A rank's last collective entered and last completed in a
  group are its dump's `pg_status` (it outlives the ring buffer), else the highest
  sequence number among its entries, and among its completed ones (`state` completed,
  or `retired`: gloo leaves the state "scheduled" and retires a finished collective).
- The group's answer. `last_done` is the last collective every member with a dump
  completed; the one after it, where some member entered it, is `pending`: the members
  that entered it wait in it; those that never entered it (their last is earlier) are
  what it waits for. Where every member entered it, no rank is missing from it: the
  calls' mismatches, if any, say why it does not complete, else the collective itself
  stalls (a network fault, a peer's device).
- Mismatches. For each sequence number two or more ranks hold, the calls' ops, dtypes
  and sizes are compared (sizes not for the ops whose sizes may differ by rank: the
  all-to-alls, gather and scatter). Sends and receives are not matched here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..read._flight import FlightDump, FlightEntry
from ._hang_model import (
    FROM_DUMPS,
    FROM_PG_CONFIG,
    FROM_WATCHDOG,
    CallMismatch,
    GroupCollectives,
)

__all__ = ["collectives_of"]

_DEFAULT_GROUP = "0"
_SIZES_MAY_DIFFER = frozenset(
    {"all_to_all", "alltoall", "alltoall_base", "all_to_all_single", "gather", "scatter"}
)
_MISMATCHES_KEPT = 5
"""The earliest mismatched calls kept per group: the first is the cause, the rest follow."""


def collectives_of(
    dumps: Mapping[int, FlightDump],
    recorded: Mapping[str, tuple[str, tuple[int, ...]]],
    world: int | None,
) -> list[GroupCollectives]:
    """Per process group that any dump names, what its members' dumps say; groups with
    a collective pending first. `recorded`: group name -> (desc, global ranks) as the
    watchdog wrote them; `world`: the run's world size, where known."""
    names: dict[str, str] = {}
    for dump in dumps.values():
        for e in dump.entries:
            names.setdefault(e.group, e.desc)
        for name, group in dump.groups.items():
            names.setdefault(name, group.desc)
        for name in dump.status:
            names.setdefault(name, "")
    for name, (desc, _) in recorded.items():
        if name in names and not names[name]:
            names[name] = desc
    out = [_group(name, desc, dumps, recorded, world) for name, desc in names.items()]
    return sorted(out, key=lambda g: (g.pending is None, not g.absent, _order(g.name)))


def _order(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 62, name)


def _group(
    name: str,
    desc: str,
    dumps: Mapping[int, FlightDump],
    recorded: Mapping[str, tuple[str, tuple[int, ...]]],
    world: int | None,
) -> GroupCollectives:
    ranks, source = _members(name, dumps, recorded, world)
    dumped = [r for r in ranks if r in dumps]
    calls: dict[int, dict[int, FlightEntry]] = {
        r: {e.seq: e for e in dumps[r].entries if e.group == name and not e.p2p} for r in dumped
    }
    entered = {r: _entered(dumps[r], name, calls[r]) for r in dumped}
    completed = {r: _completed(dumps[r], name, calls[r]) for r in dumped}
    last_done = min(completed.values()) if completed else None
    pending = None
    if last_done is not None and max(entered.values()) > last_done:
        pending = last_done + 1
    inside = tuple(r for r in dumped if pending is not None and entered[r] >= pending)
    absent = tuple(r for r in dumped if pending is not None and entered[r] < pending)
    return GroupCollectives(
        name=name,
        desc=desc,
        ranks=tuple(ranks),
        members_from=source,
        dumped=tuple(dumped),
        missing=tuple(r for r in ranks if r not in dumps),
        last_done=last_done if last_done else None,
        last_done_op=_op_of(last_done, calls.values()),
        pending=pending,
        pending_op=_op_of(pending, calls.values()),
        entered=inside,
        absent=absent,
        last_entered={r: entered[r] for r in absent},
        last_entered_op={r: _op_of(entered[r], [calls[r]]) for r in absent},
        calls={r: calls[r][pending] for r in inside if pending in calls[r]},
        mismatches=tuple(_mismatches(calls)),
        p2p=sum(1 for r in dumped for e in dumps[r].entries if e.group == name and e.p2p),
    )


def _members(
    name: str,
    dumps: Mapping[int, FlightDump],
    recorded: Mapping[str, tuple[str, tuple[int, ...]]],
    world: int | None,
) -> tuple[list[int], str]:
    if name in recorded:
        return sorted(recorded[name][1]), FROM_WATCHDOG
    for dump in dumps.values():
        group = dump.groups.get(name)
        if group is not None and group.ranks:
            return sorted(group.ranks), FROM_PG_CONFIG
    if name == _DEFAULT_GROUP and world is not None:
        return list(range(world)), FROM_DUMPS
    naming = [
        r
        for r, d in dumps.items()
        if name in d.status or name in d.groups or any(e.group == name for e in d.entries)
    ]
    if name == _DEFAULT_GROUP:
        naming = list(range(max(naming, default=-1) + 1))
    return sorted(naming), FROM_DUMPS


def _entered(dump: FlightDump, name: str, calls: Mapping[int, FlightEntry]) -> int:
    """The last collective the rank entered in the group (0: none)."""
    status = dump.status.get(name)
    if status is not None:
        return max(0, status.enqueued)
    return max(calls, default=0)


def _completed(dump: FlightDump, name: str, calls: Mapping[int, FlightEntry]) -> int:
    status = dump.status.get(name)
    if status is not None:
        return max(0, status.completed)
    return max((seq for seq, e in calls.items() if e.completed), default=0)


def _op_of(seq: int | None, calls: Iterable[Mapping[int, FlightEntry]]) -> str | None:
    if not seq:
        return None
    for held in calls:
        if seq in held:
            return held[seq].op
    return None  # out of every ring buffer


def _mismatches(calls: Mapping[int, Mapping[int, FlightEntry]]) -> list[CallMismatch]:
    seqs = sorted({seq for held in calls.values() for seq in held})
    out: list[CallMismatch] = []
    for seq in seqs:
        found = {r: held[seq] for r, held in calls.items() if seq in held}
        if len(found) < 2:
            continue
        for what, value in (
            ("ops", lambda e: e.op),
            ("dtypes", lambda e: ", ".join(e.input_dtypes + e.output_dtypes)),
            ("sizes", _sizes_text),
        ):
            if what == "sizes" and any(e.op in _SIZES_MAY_DIFFER for e in found.values()):
                continue
            by_value: dict[str, list[int]] = {}
            for r, e in sorted(found.items()):
                by_value.setdefault(value(e), []).append(r)
            if len(by_value) > 1:
                out.append(CallMismatch(seq, what, {v: tuple(rs) for v, rs in by_value.items()}))
                break  # one line a call: its op first, then its dtypes, then its sizes
        if len(out) >= _MISMATCHES_KEPT:
            break
    return out


def _sizes_text(e: FlightEntry) -> str:
    def shapes(sizes: tuple[tuple[int, ...], ...]) -> str:
        return ", ".join("[" + ", ".join(map(str, s)) + "]" for s in sizes)

    return f"in {shapes(e.input_sizes)} out {shapes(e.output_sizes)}"
