"""Reading the collectives out of one rank's Kineto trace: which, when, in which group.

Streamed batch by batch (`scan_batches`): a typed msgspec decoder where msgspec can be
imported keeps each event's args undecoded, and only the few events that are
collectives have theirs read. What is a collective and what its time means is told in
`analysis/collectives/_collectives.py`, which matches them across ranks.

NCCL runs send/recv and all_to_all (and, in some versions, other collectives) in one
kernel, `SendRecv`: its name does not say which ran. Such a kernel is named by its
`Collective name` arg where torch writes one, else by the c10d call that launched it
(the kernel's correlation id leads to its launch on the CPU, inside that call); one
that is send or recv is left out, one that nothing names is kept as "SendRecv".
"""

from __future__ import annotations

import bisect
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from ..._errors import TraceError
from ...rundir._layout import rank_of_file
from ...traces._stream import BatchDecoder, plain_events, scan_batches

__all__ = ["Arrival", "RankCollectives", "SendRecvKernels", "read_rank_collectives"]

_CPU_PREFIXES = ("c10d::", "_c10d_functional::")
_NOT_COLLECTIVE = frozenset({"send", "recv", "recv_any_source", "wait", "wait_tensor"})
"""Point-to-point ops and waits: a rank meets one peer there, not the group."""
_PARAMS = "record_param_comms"
_MAX_TS_US = 1e18
_SENDRECV = "sendrecv"
_LAUNCH_CATS = ("cuda_runtime", "cuda_driver")  # a tuple: `in` compares, a list cat is no error
_CORRELATION = re.compile(rb'"correlation"[ \t\n\r]*:[ \t\n\r]*([0-9]{1,18})[ \t\n\r]*[,}]')
_ID_LIMIT = 1 << 62
_THREAD_ID_LIMIT = 1 << 64


class Arrival(NamedTuple):
    """One rank's arrival at one collective."""

    group: str | None
    """The process group the trace names; None where it names none."""
    name: str
    ts: float
    """As written (us), on the trace's own clock."""
    seq: int | None
    """The group's sequence number, where the trace records it."""


@dataclass
class SendRecvKernels:
    """What one trace's NCCL SendRecv kernels turned out to be."""

    named: dict[str, int] = field(default_factory=dict)
    """Per collective, how many its `Collective name` or the c10d call that launched it
    names."""
    point_to_point: int = 0
    """How many were send or recv: left out."""
    unknown: int = 0
    """How many nothing names: kept as "SendRecv", matched by name and order."""


@dataclass
class RankCollectives:
    """What one rank's trace says about its collectives."""

    path: str
    name_rank: int | None
    """The rank its file name gives."""
    info: dict[str, Any]
    """Its distributedInfo ({} where it has none)."""
    base: Any
    """baseTimeNanoseconds as written (checked by the caller); None where there is none."""
    gpu: list[Arrival]
    """NCCL/RCCL kernels, by their start."""
    cpu: list[Arrival]
    """The outermost c10d ops of each thread, by their start."""
    members: dict[str, list[int]]
    """Per process group, its ranks where the trace lists them in full."""
    sendrecv: SendRecvKernels = field(default_factory=SendRecvKernels)


class _Ev:
    """The fields of an event read here, as the stdlib decoder makes them."""

    __slots__ = ("args", "cat", "dur", "name", "ph", "pid", "tid", "ts")

    def __init__(self, event: dict[str, Any]) -> None:
        get = event.get
        self.ph, self.cat, self.name = get("ph"), get("cat"), get("name")
        self.ts, self.dur, self.pid, self.tid = get("ts"), get("dur"), get("pid"), get("tid")
        self.args = get("args")


def _shape(events: list[dict[str, Any]]) -> list[Any]:
    return [_Ev(event) for event in events]


def _plain(text: str) -> list[Any] | None:
    events = plain_events(text)
    return None if events is None else _shape(events)


_DECODERS: list[BatchDecoder] = []  # built on first use: importing msgspec is not free


def _decoder() -> BatchDecoder:
    """msgspec's typed decoder where importable (args kept raw), else the stdlib's."""
    if _DECODERS:
        return _DECODERS[0]
    try:
        import msgspec  # the analysis extra's
    except ImportError:
        _DECODERS.append(BatchDecoder(_plain, _shape))
        return _DECODERS[0]

    # Any, not the JSON types: a bad field is an event to pass over, not a batch refused.
    # Built by defstruct: this module's annotations are strings, which msgspec would
    # look up among its globals, where msgspec is not.
    fields = [(name, Any, None) for name in ("ph", "cat", "name", "ts", "dur", "pid", "tid")]
    event = msgspec.defstruct(
        "CollectiveEvent", [*fields, ("args", msgspec.Raw, msgspec.Raw())], gc=False
    )
    typed = msgspec.json.Decoder(list[event]).decode  # type: ignore[valid-type]

    def decode(text: str) -> list[Any] | None:
        try:
            return typed(text)
        except (msgspec.DecodeError, RecursionError):  # NaN, 1e400: as the stdlib reads it
            return _plain(text)

    _DECODERS.append(BatchDecoder(decode, _shape))
    return _DECODERS[0]


def _args_of(raw: Any) -> dict[str, Any]:
    """An event's args as a dict; {} where they are not an object."""
    if isinstance(raw, dict):
        return raw
    if raw is None or isinstance(raw, (str, int, float, list)):
        return {}
    try:
        value = json.loads(bytes(raw))  # msgspec.Raw
    except (TypeError, ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _is_time(value: object) -> bool:
    return type(value) in (int, float) and -_MAX_TS_US < value < _MAX_TS_US  # type: ignore[operator]


def _thread_of(pid: object, tid: object) -> str | None:
    """ "pid/tid" where both are what a trace writes (a number or a short name); else None."""
    for part in (pid, tid):
        if type(part) is int:
            if not -_THREAD_ID_LIMIT < part < _THREAD_ID_LIMIT:
                return None
        elif type(part) is not str or len(part) > 256:
            return None
    return f"{pid}/{tid}"


def _correlation(raw: Any) -> int | None:
    """An event's `correlation` arg, read from its args undecoded where they are."""
    if isinstance(raw, dict):
        value = raw.get("correlation")
        return value if type(value) is int and 0 <= value < _ID_LIMIT else None
    if raw is None or isinstance(raw, (str, int, float, list)):
        return None
    try:
        found = _CORRELATION.search(raw)  # msgspec.Raw: the args' JSON text
    except TypeError:
        return None
    return int(found.group(1)) if found is not None else None


def _launches(path: str, wanted: set[int]) -> dict[int, tuple[str, float]]:
    """(thread, ts) of the kernel launches on the CPU (cudaLaunchKernel and its kin) with
    these correlation ids: a second read of the trace, made only for SendRecv kernels
    that nothing else names, so that other traces pay nothing for it."""
    found: dict[int, tuple[str, float]] = {}

    def add(events: list[Any]) -> None:
        for ev in events:
            name = ev.name
            if ev.cat not in _LAUNCH_CATS or type(name) is not str or "aunch" not in name:
                continue  # cudaLaunchKernel, cuLaunchKernelEx, hipLaunchKernel
            at = _correlation(ev.args)
            thread = _thread_of(ev.pid, ev.tid)
            if at in wanted and ev.ph == "X" and thread is not None and _is_time(ev.ts):
                found.setdefault(at, (thread, float(ev.ts)))

    try:
        scan_batches(path, add, _decoder())
    except TraceError:  # changed since the first read: those kernels stay unnamed
        return {}
    return found


class _Collector:
    """The collective events of a trace, gathered batch by batch."""

    def __init__(self) -> None:
        self.kernels: list[tuple[float, str, dict[str, Any]]] = []
        self.ops: list[tuple[str, float, float, str]] = []
        self.params: list[tuple[str, float, dict[str, Any]]] = []
        self.bad = 0

    def add(self, events: list[Any]) -> None:
        for ev in events:
            name = ev.name
            if ev.ph != "X" or type(name) is not str:
                continue
            cat = ev.cat
            if cat == "kernel":
                low = name.lower()
                if "nccl" not in low and "rccl" not in low:
                    continue
            elif cat != "cpu_op" or not (name == _PARAMS or name.startswith(_CPU_PREFIXES)):
                continue
            ts = ev.ts
            if not _is_time(ts):
                self.bad += 1
                continue
            if cat == "kernel":
                self.kernels.append((float(ts), name, _args_of(ev.args)))
                continue
            thread = _thread_of(ev.pid, ev.tid)
            if thread is None:
                self.bad += 1
                continue
            if name == _PARAMS:
                self.params.append((thread, float(ts), _args_of(ev.args)))
            else:
                dur = ev.dur if type(ev.dur) in (int, float) and 0 <= ev.dur < _MAX_TS_US else 0
                self.ops.append((thread, float(ts), float(ts) + dur, name))


class _Calls:
    """The outermost c10d ops of each thread, by start: which call a moment is inside."""

    def __init__(self, ops: list[tuple[str, float, float, str]]) -> None:
        threads: dict[str, list[tuple[float, float, str]]] = {}
        for thread, ts, end, name in ops:
            threads.setdefault(thread, []).append((ts, -end, name))
        self.calls: dict[str, list[list[Any]]] = {}
        """Per thread, [start, end, name, the args of the record_param_comms inside]."""
        self._starts: dict[str, list[float]] = {}
        for thread, held in threads.items():
            held.sort()  # by start, the longest first: an op comes after the op holding it
            kept: list[list[Any]] = []
            end = -math.inf
            for ts, neg_end, name in held:
                if ts < end:
                    continue  # inside the op before it: part of that collective
                end = -neg_end
                kept.append([ts, end, name, None])
            self.calls[thread] = kept
            self._starts[thread] = [call[0] for call in kept]

    def around(self, thread: str, ts: float) -> list[Any] | None:
        """The call on `thread` that `ts` falls in; None where it falls in none."""
        starts = self._starts.get(thread)
        if not starts:
            return None
        at = bisect.bisect_right(starts, ts) - 1
        if at >= 0 and self.calls[thread][at][1] >= ts:
            return self.calls[thread][at]
        return None


def _call_name(op: str) -> str:
    """`allreduce` of `c10d::allreduce_`."""
    return op.split("::", 1)[1].strip("_")


def _arrival(name: str, ts: float, args: dict[str, Any]) -> Arrival:
    group, seq = args.get("Process Group Name"), args.get("Seq")
    return Arrival(
        group if isinstance(group, str) and group else None,
        name,
        ts,
        seq if type(seq) is int and seq >= 0 else None,
    )


def kernel_collective(name: str) -> str:
    """`AllReduce` of `ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)`: the word after the prefix."""
    parts = name.split("(", 1)[0].split("_")
    return parts[1] if len(parts) > 1 and parts[1] else parts[0]


def _gpu_arrivals(
    path: str, collector: _Collector, calls: _Calls, sendrecv: SendRecvKernels
) -> list[Arrival]:
    """The NCCL kernels, SendRecv ones named where the trace allows (see the module's doc)."""
    out = []
    unnamed: list[tuple[float, str, dict[str, Any]]] = []
    for ts, name, args in collector.kernels:
        said = args.get("Collective name")
        from_kernel = kernel_collective(name)
        is_sendrecv = from_kernel.lower() == _SENDRECV
        if not (isinstance(said, str) and said):
            if is_sendrecv:
                unnamed.append((ts, from_kernel, args))
                continue
            said = from_kernel
        collective: str = said
        if collective.lower() not in _NOT_COLLECTIVE:
            out.append(_arrival(collective, ts, args))
            if is_sendrecv:
                sendrecv.named[collective] = sendrecv.named.get(collective, 0) + 1
        elif is_sendrecv:
            sendrecv.point_to_point += 1
    wanted = {at for *_, args in unnamed if (at := _correlation(args)) is not None}
    launched = _launches(path, wanted) if wanted and calls.calls else {}
    for ts, collective, args in unnamed:
        at = _correlation(args)
        where = launched.get(at) if at is not None else None
        call = calls.around(*where) if where is not None else None
        if call is None:
            sendrecv.unknown += 1
            out.append(_arrival(collective, ts, args))
            continue
        named = _call_name(call[2])
        if named in _NOT_COLLECTIVE:
            sendrecv.point_to_point += 1
        elif named:
            sendrecv.named[named] = sendrecv.named.get(named, 0) + 1
            out.append(_arrival(named, ts, args))
    return out


def _cpu_arrivals(collector: _Collector, calls: _Calls) -> list[Arrival]:
    """The outermost c10d ops of each thread, with the args of the record_param_comms inside."""
    out: list[Arrival] = []
    for thread, ts, args in collector.params:
        call = calls.around(thread, ts)
        if call is not None:
            if call[3] is None:
                call[3] = args
            continue
        said = args.get("Collective name")  # called outside any c10d op: it stands for one
        if isinstance(said, str) and said and said.lower() not in _NOT_COLLECTIVE:
            out.append(_arrival(said, ts, args))
    for held in calls.calls.values():
        for start, _, name, inner in held:
            collective = _call_name(name)
            if collective and collective not in _NOT_COLLECTIVE:
                out.append(_arrival(collective, start, inner or {}))
    return out


def _members(args_seen: list[dict[str, Any]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for args in args_seen:
        group, ranks = args.get("Process Group Name"), args.get("Process Group Ranks")
        if not isinstance(group, str) or group in out:
            continue
        if isinstance(ranks, str) and "..." not in ranks:  # torch cuts long lists short
            try:
                ranks = json.loads(ranks)
            except (ValueError, RecursionError):
                continue
        if isinstance(ranks, list) and ranks and all(type(r) is int for r in ranks):
            out[group] = ranks
    return out


def read_rank_collectives(path: str) -> tuple[RankCollectives | None, list[str]]:
    """One trace's collectives (None where it cannot be read), and what to say about it.

    Never raises: a worker process runs it (`ordered_map`).
    """
    collector = _Collector()
    try:
        top = scan_batches(path, collector.add, _decoder())
    except TraceError as exc:
        return None, [str(exc)]
    info = top.get("distributedInfo")
    said = []
    if collector.bad:
        said.append(f"{path}: {collector.bad} collective events with a bad ts, pid or tid left out")
    calls = _Calls(collector.ops)
    sendrecv = SendRecvKernels()
    found = RankCollectives(
        path=path,
        name_rank=rank_of_file(Path(path).name),
        info=info if isinstance(info, dict) else {},
        base=top.get("baseTimeNanoseconds"),
        gpu=_gpu_arrivals(path, collector, calls, sendrecv),
        cpu=_cpu_arrivals(collector, calls),
        members=_members([a for *_, a in collector.kernels] + [a for *_, a in collector.params]),
        sendrecv=sendrecv,
    )
    return found, said
