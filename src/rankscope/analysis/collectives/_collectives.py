"""Who arrives last at each collective, from the traces of several ranks of one window
(`rankscope collectives`).

- What a collective is, and when a rank arrived at it (`read/_collective_events.py`
  reads them). On GPU, an NCCL (or RCCL) kernel: it starts when the rank's stream
  reaches the collective and then waits there for the others, so its start is the
  arrival. Where some rank's trace holds no such kernel (gloo, CPU-only capture), the
  c10d op each rank called (`c10d::allreduce_`, `_c10d_functional::all_reduce`): its
  start is when the rank's program reached the collective. A c10d op inside another is
  part of it; point-to-point ops (send, recv) and waits are left out. NCCL's SendRecv
  kernel runs send/recv and all_to_all alike: it is named by what launched it where the
  trace tells, else kept as "SendRecv" and said.
- Matching. Per process group where the trace names it (`Process Group Name` in the
  kernel's args or in the `record_param_comms` inside the c10d op), by its `Seq` where
  every event of the group has one and no rank repeats one, else by order. Where no
  group is named (gloo, older torch), by the order of each collective name on each
  rank. A rank whose count differs from the count most ranks have is left out of that
  group's rows, and said; so is the rest of a group from the first place its ranks
  disagree on the name.
- Clocks: `_collective_clocks.py` (each host's offset from the run's timings, where the
  ranks span hosts).
- Figures. A collective's skew is its last arrival less its first. The last rank's
  lateness (`late_ms`) is its arrival less the median arrival of the other ranks;
  `gap_ms` is its arrival less the second-to-last's (how long the collective waited on
  it alone). A rank's `late_ms` is its lateness summed over the collectives it arrived
  last at; a last arrival shared (equal times) counts for no rank.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..._errors import TraceError
from ..._text import format_ranks, shown
from ...rundir._layout import TRACES, window_key
from ...rundir._listing import RunDir, is_run_dir, is_window_folder
from ..core._parallel import file_size, ordered_map
from ..kernels._kernels import find_traces
from ..merge._plan import base_of
from ..read._collective_events import Arrival, RankCollectives, read_rank_collectives
from ..read._run import RunMeta, read_run_meta, run_root
from ._collective_clocks import HostOffsets, align_clocks, host_clock_offsets
from ._matching import match_collectives, rank_rows, row_dict, summary_of

__all__ = ["CollectiveReport", "HostOffsets", "collectives_of_run", "find_collectives"]

_RANK_LIMIT = 1 << 31
_REPORT_BYTES = 2 << 30
"""Traces of the report's window past this size are not read: `rankscope collectives`
reads them on request."""


@dataclass
class CollectiveReport:
    """The collectives of one window matched across its ranks, and who arrived last."""

    window: str | None
    """The window's name, where the traces are those of a run directory's window."""
    source: str
    """"gpu" (NCCL kernels) or "cpu" (c10d calls)."""
    summary: str
    alignment: str
    """How ranks of different hosts were put on one clock: "one host", "timings" (each
    host's offset from the run's timings taken off), "wall clocks" (as written, the
    offset not measured) or "as written" (no meta files: hosts not known)."""
    ranks: list[dict[str, Any]]
    """Per rank: host, clock, offset_ms (its host's, taken off), collectives,
    arrived_last, late_ms (total), its mean and max, and vs_median_ms (its mean arrival
    against each collective's median)."""
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
            "alignment": self.alignment,
            "ranks": self.ranks,
            "collectives": self.collectives,
            "unmatched": self.unmatched,
            "notes": self.notes,
            "skipped": self.skipped,
        }


def find_collectives(
    sources: Sequence[str | os.PathLike[str]],
    *,
    workers: int | None = None,
    offsets: HostOffsets | None = None,
) -> CollectiveReport:
    """Match the collectives in the traces of one window (its folder, or trace files).

    A trace that cannot be read, whose rank cannot be told, that says another rank than
    its name, or that shares its rank with another is skipped and said. TraceError
    where fewer than two ranks are left with collectives to match, or where `sources`
    is a whole run directory or spans several windows. Where the ranks span hosts, each
    host's clock offset is read from the run's timings, unless `offsets` gives them
    (`host_clock_offsets` of timings already read).
    """
    skipped: list[str] = []
    paths = _traces_of(sources, skipped)
    size = sum(file_size(path) for path in paths)
    read = ordered_map(read_rank_collectives, [str(p) for p in paths], size=size, workers=workers)
    traces = _ranked(read, skipped)
    where = _named(sources)
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
    notes.extend(_sendrecv_notes(traces, gpu))
    window = paths[0].parent if is_window_folder(paths[0].parent) else None
    meta = _meta(window, skipped)
    first_ns = {
        rank: (t.base or 0) + round(min(a.ts for a in arrivals[rank]) * 1000)
        if arrivals[rank]
        else None
        for rank, t in traces.items()
    }

    def timings() -> HostOffsets:  # called only where the ranks span hosts
        if offsets is not None:
            return offsets
        if window is None or meta is None:
            return HostOffsets(why_none="no run directory around the traces, so no timings")
        return _run_offsets(meta, skipped, workers)

    clocks, alignment = align_clocks(first_ns, meta, timings, notes)
    origin = min((t.base or 0) + clocks[rank].shift_ns for rank, t in traces.items())
    shift_us = {
        rank: ((t.base or 0) + clocks[rank].shift_ns - origin) / 1000 for rank, t in traces.items()
    }
    members: dict[str, list[int]] = {}
    for t in traces.values():
        for group, listed in t.members.items():
            members.setdefault(group, listed)
    matcher = match_collectives(arrivals, shift_us, members)
    notes.extend(matcher.notes)
    notes.extend(_group_notes(traces, arrivals))
    rows = sorted(matcher.rows, key=lambda row: (min(row.arrivals.values()), row.name))
    start = min((min(row.arrivals.values()) for row in rows), default=0.0)
    per_rank = rank_rows(traces, clocks, rows)
    return CollectiveReport(
        window=None if window is None else window.name,
        source="gpu" if gpu else "cpu",
        summary=summary_of(per_rank, len(rows)),
        alignment=alignment,
        ranks=per_rank,
        collectives=[row_dict(row, start) for row in rows],
        unmatched=matcher.unmatched,
        notes=notes,
        skipped=skipped,
    )


def collectives_of_run(
    run_dir: str | os.PathLike[str],
    skipped: list[str],
    *,
    offsets: HostOffsets | None = None,
) -> dict[str, Any] | None:
    """The report's part: `find_collectives` over the latest window of a run that holds
    the traces of two ranks or more; None where none does. One window only, and not
    past _REPORT_BYTES of traces: the report reads a run, and a window's traces can be
    the largest files in it. What the reading skips is added to `skipped` (a line
    already there is not said twice); a window that cannot be matched at all is listed
    with its error, one too large to read with `not_read`. `offsets` as for
    `find_collectives` (the report has read the timings already)."""
    run = RunDir(run_dir)
    windows = [
        name
        for name in run.windows()
        if len({t.rank for t in run.traces(name) if t.rank is not None}) >= 2
    ]
    if not windows:
        return None
    windows.sort(key=lambda name: (window_key(name) or (1 << 62, ""), name))
    latest = windows[-1]
    folder = run.root / TRACES / latest
    size = sum(file_size(t.path) for t in run.traces(latest))
    entry: dict[str, Any]
    if size > _REPORT_BYTES:
        entry = {
            "window": latest,
            "not_read": f"{size / 2**20:,.1f} MiB of traces, more than the report reads "
            f"({_REPORT_BYTES / 2**20:,.0f} MiB): rankscope collectives {folder} reads them",
        }
    else:
        try:
            entry = find_collectives([folder], offsets=offsets).to_dict()
        except TraceError as exc:
            entry = {"window": latest, "error": str(exc)}
        else:
            said = set(skipped)
            skipped.extend(line for line in entry.pop("skipped") if line not in said)
    entry["folder"] = str(folder)
    return {"windows": [entry], "left_out": windows[:-1]}


# -- the traces of one window --------------------------------------------------------------


def _traces_of(sources: Sequence[str | os.PathLike[str]], skipped: list[str]) -> list[Path]:
    for source in sources:
        path = Path(source)
        if path.is_dir():
            run_root(path)  # a TraceError for a folder that holds runs (runs/)
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
            trace.base = base_of(trace.path, trace.base)
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


def _named(sources: Sequence[str | os.PathLike[str]]) -> str:
    """The sources as the user gave them, for a message."""
    named = [str(source) for source in sources]
    return ", ".join(named[:3]) + (f", ... ({len(named)} given)" if len(named) > 3 else "")


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


def _run_offsets(meta: RunMeta, skipped: list[str], workers: int | None) -> HostOffsets:
    """Each host's clock offset from the run's timings; none, and why, without them."""
    from ..read._timed import read_timed_run  # numpy and the timings' engine: only here

    try:
        run = read_timed_run(meta, workers=workers)
    except TraceError as exc:
        return HostOffsets(why_none=f"no timings to measure it from ({exc})")
    said = set(skipped)
    skipped.extend(line for line in run.records.skipped if line not in said)
    return host_clock_offsets(run.matrices, meta.hosts)


def _sendrecv_notes(traces: dict[int, RankCollectives], gpu: bool) -> list[str]:
    """What became of the NCCL SendRecv kernels, which run send/recv and all_to_all alike."""
    if not gpu:
        return []
    notes = []
    named: dict[str, int] = {}
    for t in traces.values():
        for name, n in t.sendrecv.named.items():
            named[name] = named.get(name, 0) + n
    p2p = [rank for rank, t in traces.items() if t.sendrecv.point_to_point]
    if named or p2p:
        what = ", ".join(f"{n} {name}" for name, n in sorted(named.items()))
        left = sum(t.sendrecv.point_to_point for t in traces.values())
        notes.append(
            "NCCL SendRecv kernels (NCCL runs send/recv and all_to_all, and sometimes other "
            "collectives, in that kernel) were named by their Collective name arg or the "
            f"c10d call that launched them{f': {what}' if what else ''}"
            f"{f'; {left} send or recv (point-to-point) left out' if left else ''}"
        )
    unknown = {rank: t.sendrecv.unknown for rank, t in traces.items() if t.sendrecv.unknown}
    if unknown:
        notes.append(
            f"{format_ranks(unknown)}: {sum(unknown.values())} NCCL SendRecv kernels that the "
            "trace does not tell apart (no Collective name arg, no c10d call found around "
            "their launch): NCCL runs send/recv and all_to_all alike in that kernel. They "
            'are kept as "SendRecv" and matched with each other by order, never with a '
            "collective of another name; where they are point-to-point sends between "
            "pipeline stages, their rows pair unrelated transfers and their skews mean nothing"
        )
    return notes


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
    sizes = {size for t in traces.values() if type(size := t.info.get("world_size")) is int}
    if len(sizes) > 1:
        notes.append(
            f"the traces disagree on the world size ({', '.join(map(shown, sorted(sizes)))}): "
            "traces of several jobs?"
        )
    return notes


# -- matching ----------------------------------------------------------------------------


# -- figures ------------------------------------------------------------------------------
