"""Matching one collective across the ranks of a window (by the order each rank issued
them, or by sequence number), and what each rank's arrivals add up to: who arrives last,
and how late."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..._text import format_ranks, format_steps
from ..read._collective_events import Arrival, RankCollectives
from ._collective_clocks import Clock

__all__ = ["match_collectives", "rank_rows", "row_dict", "summary_of"]

_MOST = 0.5
"""A rank last at more than this share of its collectives arrives last "at most"."""


@dataclass(frozen=True)
class _Row:
    group: str | None
    name: str
    index: int
    seq: int | None
    arrivals: dict[int, float]
    """Per rank, its arrival (us, on the window's common clock)."""


@dataclass
class _Matcher:
    rows: list[_Row] = field(default_factory=list)
    unmatched: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def group(
        self,
        key: tuple[str, str],
        per_rank: dict[int, list[tuple[float, Arrival]]],
        expected: list[int],
    ) -> None:
        group = key[1] if key[0] == "group" else None
        seqs = all(a.seq is not None for events in per_rank.values() for _, a in events)
        if group is not None and seqs:
            self._by_seq(group, per_rank, expected)
        else:
            self._by_order(group, key[1], per_rank, expected)

    def _say(
        self,
        group: str | None,
        name: str | None,
        ranks: list[int],
        counts: dict[int, int],
        reason: str,
    ) -> None:
        self.unmatched.append(
            {
                "group": group,
                "name": name,
                "ranks": sorted(ranks),
                "counts": {str(r): c for r, c in sorted(counts.items())},
                "reason": reason,
            }
        )

    def _by_order(
        self,
        group: str | None,
        label: str,
        per_rank: dict[int, list[tuple[float, Arrival]]],
        expected: list[int],
    ) -> None:
        counts = {r: len(per_rank.get(r, ())) for r in expected}
        tally = Counter(c for c in counts.values() if c)
        if not tally:
            return  # none of the ranks expected holds any
        count = max(tally, key=lambda c: (tally[c], c))
        agree = [r for r, c in counts.items() if c == count]
        what = f"collectives of group {group}" if group is not None else label
        if len(agree) < 2:
            held = ", ".join(f"rank {r}: {c}" for r, c in counts.items() if c)
            self._say(
                group,
                None if group else label,
                list(counts),
                counts,
                f"the ranks each have another count of {what} ({held}): none matched",
            )
            return
        others = [r for r in counts if r not in agree]
        if others:
            less = ", ".join(f"rank {r} has {counts[r]}" for r in others[:8]) + (
                ", ..." if len(others) > 8 else ""
            )
            self._say(
                group,
                None if group else label,
                others,
                counts,
                f"{less} {what} where {format_ranks(agree)} have {count}: left out of its rows "
                "(a process group it is not in, or collectives at the window's edge)",
            )
        for i in range(count):
            names = {r: per_rank[r][i][1].name for r in agree}
            if len(set(names.values())) > 1:
                held = ", ".join(
                    f"{name} on {format_ranks(r for r in agree if names[r] == name)}"
                    for name, _ in Counter(names.values()).most_common()
                )
                self._say(
                    group,
                    None,
                    agree,
                    counts,
                    f"collective #{i} of group {group}: the ranks disagree on it ({held}); it "
                    "and the group's later collectives are left out (their order no longer matches)",
                )
                return
            self.rows.append(
                _Row(group, names[agree[0]], i, None, {r: per_rank[r][i][0] for r in agree})
            )

    def _by_seq(
        self, group: str, per_rank: dict[int, list[tuple[float, Arrival]]], expected: list[int]
    ) -> None:
        repeated: dict[int, set[int]] = {}
        for rank, events in per_rank.items():
            held = Counter(a.seq for _, a in events)
            twice = {seq for seq, n in held.items() if n > 1 and seq is not None}
            if twice:
                repeated[rank] = twice
        if repeated:
            numbers = sorted(set().union(*repeated.values()))
            self.notes.append(
                f"group {group}: {format_ranks(repeated)} repeat sequence numbers (seq "
                f"{_some(numbers)}), so Seq does not tell its collectives apart: they are "
                "matched by order instead"
            )
            self._by_order(group, group, per_rank, expected)
            return
        seqs: dict[int, dict[int, tuple[float, Arrival]]] = {}
        for rank, events in per_rank.items():
            for t, a in events:
                seqs.setdefault(a.seq or 0, {})[rank] = (t, a)
        partial, disagree = [], []
        for index, seq in enumerate(sorted(seqs)):
            present = seqs[seq]
            if len(present) < 2 or sorted(present) != expected:
                partial.append(seq)
            elif len({a.name for _, a in present.values()}) > 1:
                disagree.append(seq)
            else:
                name = next(iter(present.values()))[1].name
                self.rows.append(
                    _Row(group, name, index, seq, {r: t for r, (t, _) in present.items()})
                )
        counts = {r: len(per_rank.get(r, ())) for r in expected}
        if partial:
            self._say(
                group,
                None,
                [],
                counts,
                f"{len(partial)} collectives of group {group} (seq {_some(partial)}) were "
                f"seen by only some of {format_ranks(expected)}: left out (the window's edges, "
                "or a rank that did not call them)",
            )
        if disagree:
            self._say(
                group,
                None,
                [],
                counts,
                f"seq {_some(disagree)} of group {group}: the ranks name different "
                "collectives under one number: left out",
            )


def _some(numbers: list[int], limit: int = 8) -> str:
    """The first `limit` numbers, and how many there are where there are more."""
    if len(numbers) <= limit:
        return format_steps(numbers)
    return f"{format_steps(numbers[:limit])}, ... ({len(numbers)} in all)"


def match_collectives(
    arrivals: dict[int, list[Arrival]], shift_us: dict[int, float], members: dict[str, list[int]]
) -> _Matcher:
    groups: dict[tuple[str, str], dict[int, list[tuple[float, Arrival]]]] = {}
    for rank, events in arrivals.items():
        for a in events:
            key = ("group", a.group) if a.group is not None else ("name", a.name)
            groups.setdefault(key, {}).setdefault(rank, []).append((a.ts + shift_us[rank], a))
    active = sorted(r for r, events in arrivals.items() if events)
    matcher = _Matcher()
    for key, per_rank in sorted(groups.items()):
        for timed in per_rank.values():
            timed.sort(key=lambda item: item[0])
        if key[0] == "group":
            listed = members.get(key[1])
            expected = sorted(set(listed) & set(active)) if listed else sorted(per_rank)
        else:
            expected = active
        matcher.group(key, per_rank, expected or sorted(per_rank))
    return matcher


class _Figures(NamedTuple):
    first_rank: int
    first: float
    last_rank: int | None
    """None where two ranks share the last arrival."""
    last: float
    late: float
    gap: float


def _figures(row: _Row) -> _Figures:
    ordered = sorted(row.arrivals.items(), key=lambda item: (item[1], item[0]))
    (first_rank, first), (last_rank, last) = ordered[0], ordered[-1]
    before = ordered[-2][1]
    if before == last:
        return _Figures(first_rank, first, None, last, 0.0, 0.0)
    late = last - statistics.median(t for _, t in ordered[:-1])
    return _Figures(first_rank, first, last_rank, last, late, last - before)


def _ms(us: float) -> float:
    return round(us / 1000, 4)


def row_dict(row: _Row, start: float) -> dict[str, Any]:
    f = _figures(row)
    return {
        "group": row.group,
        "name": row.name,
        "index": row.index,
        "seq": row.seq,
        "ranks": len(row.arrivals),
        "at_ms": _ms(f.first - start),
        "skew_ms": _ms(f.last - f.first),
        "first_rank": f.first_rank,
        "last_rank": f.last_rank,
        "late_ms": _ms(f.late),
        "gap_ms": _ms(f.gap),
    }


def rank_rows(
    traces: dict[int, RankCollectives], clocks: dict[int, Clock], rows: list[_Row]
) -> list[dict[str, Any]]:
    seen = dict.fromkeys(traces, 0)
    vs_median = dict.fromkeys(traces, 0.0)
    lateness: dict[int, list[float]] = {rank: [] for rank in traces}
    for row in rows:
        median = statistics.median(row.arrivals.values())
        for rank, t in row.arrivals.items():
            seen[rank] += 1
            vs_median[rank] += t - median
        f = _figures(row)
        if f.last_rank is not None:
            lateness[f.last_rank].append(f.late)
    out = []
    for rank in sorted(traces):
        late, n = lateness[rank], seen[rank]
        out.append(
            {
                "rank": rank,
                "host": clocks[rank].host,
                "clock": clocks[rank].kind,
                "offset_ms": None if (off := clocks[rank].offset_ns) is None else _ms(off / 1000),
                "collectives": n,
                "arrived_last": len(late),
                "late_ms": _ms(sum(late)),
                "late_ms_mean": _ms(sum(late) / len(late)) if late else None,
                "late_ms_max": _ms(max(late)) if late else None,
                "vs_median_ms": _ms(vs_median[rank] / n) if n else None,
            }
        )
    return out


def summary_of(ranks: list[dict[str, Any]], matched: int) -> str:
    if not matched:
        return "no collective could be matched across ranks"
    top = max(ranks, key=lambda r: (r["arrived_last"], r["late_ms"], -r["rank"]))
    if not top["arrived_last"]:
        return f"{matched} collectives matched; at none did one rank arrive last alone"
    said = (
        f"rank {top['rank']} arrived last at {top['arrived_last']} of its "
        f"{top['collectives']} collectives, {top['late_ms_mean']:.3g} ms after the "
        "others' median on average"
    )
    if top["arrived_last"] > _MOST * top["collectives"]:
        return f"rank {top['rank']} arrives last at most collectives: {said}"
    return f"no rank arrives last at most collectives; the most often: {said}"
