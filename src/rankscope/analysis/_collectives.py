"""Who arrives last at each collective, from the traces of several ranks of one window
(`rankscope collectives`).

- What a collective is, and when a rank arrived at it (`read/_collective_events.py`
  reads them). On GPU, an NCCL (or RCCL) kernel: it starts when the rank's stream
  reaches the collective and then waits there for the others, so its start is the
  arrival. Where some rank's trace holds no such kernel (gloo, CPU-only capture), the
  c10d op each rank called (`c10d::allreduce_`, `_c10d_functional::all_reduce`): its
  start is when the rank's program reached the collective. A c10d op inside another is
  part of it; point-to-point ops (send, recv) and waits are left out.
- Matching. Per process group where the trace names it (`Process Group Name` in the
  kernel's args or in the `record_param_comms` inside the c10d op), by its `Seq` where
  every event of the group has one, else by order. Where no group is named (gloo,
  older torch), by the order of each collective name on each rank. A rank whose count
  differs from the count most ranks have is left out of that group's rows, and said; so
  is the rest of a group from the first place its ranks disagree on the name.
- Clocks. A rank's time is its trace's `baseTimeNanoseconds` plus `ts`, as `rankscope
  merge` reads it. torch writes wall-clock times; a trace on the monotonic clock (its
  times near the `perf_counter_ns` of the rank's meta clock pair, not its `time_ns`) is
  moved onto the wall clock with its host's pair (one offset per host, the median of
  its ranks'), so the ranks of a host stay exact against each other. Ranks of
  different hosts are compared on their hosts' wall clocks, which differ by what NTP
  leaves; no file here measures it.
- Figures. A collective's skew is its last arrival less its first. The last rank's
  lateness (`late_ms`) is its arrival less the median arrival of the other ranks;
  `gap_ms` is its arrival less the second-to-last's (how long the collective waited on
  it alone). A rank's `late_ms` is its lateness summed over the collectives it arrived
  last at; a last arrival shared (equal times) counts for no rank.
"""

from __future__ import annotations

import os
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from .._errors import TraceError
from .._layout import TRACES, RunDir, is_run_dir, is_window_folder, window_key
from .._text import format_ranks, format_steps, shown
from ._kernels import find_traces
from ._parallel import file_size, ordered_map
from .merge._plan import _base_of
from .read._collective_events import Arrival, RankCollectives, read_rank_collectives
from .read._run import RunMeta, read_run_meta

__all__ = ["CollectiveReport", "collectives_of_run", "find_collectives"]

_YEAR_NS = 366 * 86_400 * 10**9
_RANK_LIMIT = 1 << 31
_MOST = 0.5
"""A rank last at more than this share of its collectives arrives last "at most"."""
_REPORT_WINDOWS = 4
"""Windows the report covers, the latest: each costs a read of its traces."""


@dataclass
class CollectiveReport:
    """The collectives of one window matched across its ranks, and who arrived last."""

    window: str | None
    """The window's name, where the traces are those of a run directory's window."""
    source: str
    """"gpu" (NCCL kernels) or "cpu" (c10d calls)."""
    summary: str
    ranks: list[dict[str, Any]]
    """Per rank: host, clock, collectives, arrived_last, late_ms (total), its mean and
    max, and vs_median_ms (its mean arrival against each collective's median)."""
    collectives: list[dict[str, Any]]
    """Per matched collective, in order of arrival: group, name, index, seq, ranks,
    at_ms, skew_ms, first_rank, last_rank, late_ms, gap_ms."""
    unmatched: list[dict[str, Any]]
    """What could not be matched: group, name, ranks left out, counts per rank, reason."""
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "source": self.source,
            "summary": self.summary,
            "ranks": self.ranks,
            "collectives": self.collectives,
            "unmatched": self.unmatched,
            "notes": self.notes,
            "skipped": self.skipped,
        }


def find_collectives(
    sources: Sequence[str | os.PathLike[str]], *, workers: int | None = None
) -> CollectiveReport:
    """Match the collectives in the traces of one window (its folder, or trace files).

    A trace that cannot be read, whose rank cannot be told, that says another rank than
    its name, or that shares its rank with another is skipped and said. TraceError
    where fewer than two ranks are left with collectives to match, or where `sources`
    is a whole run directory or spans several windows.
    """
    skipped: list[str] = []
    paths = _traces_of(sources, skipped)
    size = sum(file_size(path) for path in paths)
    read = ordered_map(read_rank_collectives, [str(p) for p in paths], size=size, workers=workers)
    traces = _ranked(read, skipped)
    where = str(paths[0].parent) if len({p.parent for p in paths}) == 1 else "the traces"
    if len(traces) < 2:
        ranks = f" (only {format_ranks(traces)})" if traces else ""
        said = f"; skipped: {'; '.join(skipped[:4])}" if skipped else ""
        raise TraceError(
            f"{where}: {len(traces)} usable trace{'' if len(traces) == 1 else 's'} of "
            f"{len(paths)}{ranks}: matching collectives needs two ranks or more{said}"
        )
    notes: list[str] = []
    gpu = all(t.gpu for t in traces.values())
    arrivals = {rank: t.gpu if gpu else t.cpu for rank, t in traces.items()}
    with_gpu = [rank for rank, t in traces.items() if t.gpu]
    if not gpu and with_gpu:
        notes.append(
            f"{format_ranks(with_gpu)} hold NCCL kernels, {format_ranks(set(traces) - set(with_gpu))} "
            "none: the c10d calls are compared (when each rank called a collective, not "
            "when its GPU reached it)"
        )
    silent = [rank for rank, events in arrivals.items() if not events]
    if len(traces) - len(silent) < 2:
        raise TraceError(
            f"{where}: no collectives to match: {len(traces) - len(silent)} of the "
            f"{len(traces)} ranks' traces hold any (no NCCL kernel, no c10d op)"
        )
    if silent:
        notes.append(f"{format_ranks(silent)}: no collectives in their traces")
    window = paths[0].parent if is_window_folder(paths[0].parent) else None
    meta = _meta(window, skipped)
    clocks = _clocks(traces, arrivals, meta, notes)
    origin = min((t.base or 0) + clocks[rank].shift_ns for rank, t in traces.items())
    shift_us = {
        rank: ((t.base or 0) + clocks[rank].shift_ns - origin) / 1000 for rank, t in traces.items()
    }
    members: dict[str, list[int]] = {}
    for t in traces.values():
        for group, listed in t.members.items():
            members.setdefault(group, listed)
    matcher = _match(arrivals, shift_us, members)
    notes.extend(_group_notes(traces, arrivals))
    rows = sorted(matcher.rows, key=lambda row: (min(row.arrivals.values()), row.name))
    start = min((min(row.arrivals.values()) for row in rows), default=0.0)
    per_rank = _rank_rows(traces, clocks, rows)
    return CollectiveReport(
        window=None if window is None else window.name,
        source="gpu" if gpu else "cpu",
        summary=_summary(per_rank, len(rows)),
        ranks=per_rank,
        collectives=[_row_dict(row, start) for row in rows],
        unmatched=matcher.unmatched,
        notes=notes,
        skipped=skipped,
    )


def collectives_of_run(
    run_dir: str | os.PathLike[str], skipped: list[str]
) -> dict[str, Any] | None:
    """The report's part: `find_collectives` over the latest windows of a run that hold
    the traces of two ranks or more; None where none does. What a window's reading
    skips is added to `skipped` (a line already there is not said twice); a window
    that cannot be matched at all is listed with its error."""
    run = RunDir(run_dir)
    windows = [
        name
        for name in run.windows()
        if len({t.rank for t in run.traces(name) if t.rank is not None}) >= 2
    ]
    if not windows:
        return None
    windows.sort(key=lambda name: (window_key(name) or (1 << 62, ""), name))
    out: list[dict[str, Any]] = []
    for name in windows[-_REPORT_WINDOWS:]:
        try:
            found = find_collectives([run.root / TRACES / name]).to_dict()
        except TraceError as exc:
            out.append({"window": name, "error": str(exc)})
            continue
        said = set(skipped)
        skipped.extend(line for line in found.pop("skipped") if line not in said)
        out.append(found)
    return {"windows": out, "left_out": windows[:-_REPORT_WINDOWS]}


# -- the traces of one window --------------------------------------------------------------


def _traces_of(sources: Sequence[str | os.PathLike[str]], skipped: list[str]) -> list[Path]:
    for source in sources:
        path = Path(source)
        run = path if is_run_dir(path) else path.parent
        if path.is_dir() and (path == run or path.name == TRACES) and is_run_dir(run):
            windows = RunDir(run).windows()
            listed = ", ".join(windows[:4]) + (", ..." if len(windows) > 4 else "")
            raise TraceError(
                f"{path}: a run directory; the collectives of one window are matched: give "
                f"one of its windows, {run / TRACES}/<window> ({listed or 'it has none'})"
            )
    paths = find_traces(sources, left_out=skipped)
    folders = sorted({p.parent for p in paths})
    if len(folders) > 1 and any(is_window_folder(f) for f in folders):
        raise TraceError(
            f"traces of several windows or folders ({', '.join(map(str, folders[:4]))}): "
            "the collectives of one window are matched; give one"
        )
    return paths


def _ranked(
    read: list[tuple[RankCollectives | None, list[str]]], skipped: list[str]
) -> dict[int, RankCollectives]:
    """The traces by rank, with their base checked; the others said in `skipped`."""
    claims: dict[int, list[RankCollectives]] = {}
    for trace, said in read:
        skipped.extend(said)
        if trace is None:
            continue
        try:
            trace.base = _base_of(trace.path, trace.base)
        except TraceError as exc:
            skipped.append(str(exc))
            continue
        info = trace.info.get("rank")
        if info is not None and not (type(info) is int and 0 <= info < _RANK_LIMIT):
            skipped.append(f"{trace.path}: distributedInfo.rank is {shown(info)}, not a rank")
            continue
        if info is not None and trace.name_rank is not None and info != trace.name_rank:
            skipped.append(
                f"{trace.path}: a trace of rank {info} (its distributedInfo) under the name "
                f"of rank {trace.name_rank}; skipped"
            )
            continue
        rank = trace.name_rank if trace.name_rank is not None else info
        if rank is None:
            skipped.append(
                f"{trace.path}: cannot tell its rank (no distributedInfo.rank, no rank in its name)"
            )
            continue
        claims.setdefault(rank, []).append(trace)
    out = {}
    for rank, traces in sorted(claims.items()):
        if len(traces) == 1:
            out[rank] = traces[0]
        else:
            names = ", ".join(Path(t.path).name for t in traces)
            skipped.append(f"rank {rank} is claimed by {len(traces)} traces ({names}); all skipped")
    return out


def _meta(window: Path | None, skipped: list[str]) -> RunMeta | None:
    """The meta files of the run around `window`; None outside a run directory."""
    if window is None:
        return None
    try:
        meta = read_run_meta(window.parent.parent)
    except TraceError as exc:
        skipped.append(str(exc))
        return None
    skipped.extend(meta.skipped)
    return meta


def _group_notes(
    traces: dict[int, RankCollectives], arrivals: dict[int, list[Arrival]]
) -> list[str]:
    """Where collectives name no group but the ranks are in several, and other doubts."""
    notes = []
    unnamed = any(a.group is None for events in arrivals.values() for a in events)
    several = [
        rank
        for rank, t in traces.items()
        if isinstance(t.info.get("pg_config"), list) and len(t.info["pg_config"]) > 1
    ]
    if unnamed and several:
        notes.append(
            f"the traces name no process group for their collectives, and {format_ranks(several)} "
            "are in several (distributedInfo.pg_config): collectives of different groups "
            "are matched by name and order, which holds where the ranks call them in one order"
        )
    sizes = {t.info.get("world_size") for t in traces.values()} - {None}
    if len(sizes) > 1:
        notes.append(
            f"the traces disagree on the world size ({', '.join(map(shown, sorted(sizes, key=str)))}): "
            "traces of several jobs?"
        )
    return notes


# -- clocks ------------------------------------------------------------------------------


class _Clock(NamedTuple):
    shift_ns: int
    """Added to the rank's base + ts to put it on the wall clock."""
    kind: str
    """"wall", "monotonic" (converted) or "as written"."""
    host: str | None


def _pair(meta: dict[str, Any] | None) -> tuple[int, int] | None:
    clock = meta.get("clock") if meta is not None else None
    if not isinstance(clock, dict):
        return None
    wall, mono = clock.get("time_ns"), clock.get("perf_counter_ns")
    if type(wall) is int and type(mono) is int and 0 < wall < 1 << 63 and 0 <= mono < 1 << 63:
        return wall, mono
    return None


def _clocks(
    traces: dict[int, RankCollectives],
    arrivals: dict[int, list[Arrival]],
    meta: RunMeta | None,
    notes: list[str],
) -> dict[int, _Clock]:
    """Each rank's shift onto the wall clock, through its host's clock pair where needed."""
    pairs = {r: _pair(meta.meta.get(r)) for r in traces} if meta is not None else {}
    hosts = meta.hosts if meta is not None else {}
    offsets: dict[str, list[int]] = {}
    for rank, pair in pairs.items():
        if pair is not None and rank in hosts:
            offsets.setdefault(hosts[rank], []).append(pair[0] - pair[1])
    host_offset = {host: statistics.median_low(values) for host, values in offsets.items()}
    out: dict[int, _Clock] = {}
    kinds: dict[str, list[int]] = {}
    for rank, trace in traces.items():
        host, pair = hosts.get(rank), pairs.get(rank)
        kind, shift = "as written", 0
        if pair is not None and arrivals[rank]:
            at_ns = (trace.base or 0) + round(min(a.ts for a in arrivals[rank]) * 1000)
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
        out[rank] = _Clock(shift, kind, host)
    if meta is None:
        notes.append(
            "no run directory around the traces, so no meta files: trace times are used as "
            "written (torch writes wall-clock times)"
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
    used = sorted({hosts[r] for r in traces if r in hosts})
    if len(used) > 1:
        notes.append(
            f"ranks on {len(used)} hosts ({', '.join(used[:4])}{', ...' if len(used) > 4 else ''}): "
            "arrivals across hosts are compared on their wall clocks, which differ by what "
            "NTP leaves (tens of microseconds to milliseconds, not measured here): a skew "
            "between hosts below that is not evidence"
        )
    return out


# -- matching ----------------------------------------------------------------------------


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
        seqs: dict[int, dict[int, tuple[float, Arrival]]] = {}
        for rank, events in per_rank.items():
            for t, a in events:
                seqs.setdefault(a.seq or 0, {}).setdefault(rank, (t, a))
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
                f"{len(partial)} collectives of group {group} (seq {format_steps(partial)}) were "
                f"seen by only some of {format_ranks(expected)}: left out (the window's edges, "
                "or a rank that did not call them)",
            )
        if disagree:
            self._say(
                group,
                None,
                [],
                counts,
                f"seq {format_steps(disagree)} of group {group}: the ranks name different "
                "collectives under one number: left out",
            )


def _match(
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


# -- figures ------------------------------------------------------------------------------


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


def _row_dict(row: _Row, start: float) -> dict[str, Any]:
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


def _rank_rows(
    traces: dict[int, RankCollectives], clocks: dict[int, _Clock], rows: list[_Row]
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
                "collectives": n,
                "arrived_last": len(late),
                "late_ms": _ms(sum(late)),
                "late_ms_mean": _ms(sum(late) / len(late)) if late else None,
                "late_ms_max": _ms(max(late)) if late else None,
                "vs_median_ms": _ms(vs_median[rank] / n) if n else None,
            }
        )
    return out


def _summary(ranks: list[dict[str, Any]], matched: int) -> str:
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
