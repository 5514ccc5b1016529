"""torch's Flight Recorder dumps, read and checked: the collectives each rank issued.

A dump is what `torch._C._distributed_c10d._dump_fr_trace` (any backend) or
`_dump_nccl_trace` returns, as rankscope's watchdog saves it beside a hang file, or as
torch writes it itself on an NCCL timeout (`TORCH_FR_DUMP_TEMP_FILE`, one file a rank,
named `<prefix><rank>`): a pickled dict, or the same in JSON (`_dump_fr_trace_json`).
This reader takes the 2.x formats of torch 2.4 and later:

- `version` "2.N"; `entries`, the ring buffer, oldest first: per collective its process
  group (`process_group`: (name, desc)), `collective_seq_id` (`seq_id` in some dumps),
  `profiling_name` ("nccl:all_reduce"), `state` (scheduled, started, completed) and, where
  the dump has it, `retired` (done and dropped from the active list: gloo marks a
  finished collective so, its state stays "scheduled"), the input and output sizes and
  dtypes, `time_created_ns`, `frames` (the Python stack that issued it, where the dump
  was asked with stacks) and `is_p2p`;
- `pg_config`: per process group its desc and global ranks (gloo's dumps collapse it to
  one entry named "", whose ranks are some group's: the members are then not known
  from the dump);
- `pg_status` (2.3 and later): per process group the last collective enqueued, started
  and completed: these survive the ring buffer's wrap.

Every dump is untrusted. A pickle is loaded by an unpickler that builds no object at all
(a dump holds only dicts, lists, tuples, strings, numbers, booleans and None): a pickle
that names any class or function, the only way a pickle runs code, is refused with a
line saying so. A file larger than `DUMP_MAX` is not read; a field of the wrong type is
named. Unknown fields are ignored.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..._errors import TraceError
from ..._text import shown
from ...rundir._listing import open_regular

__all__ = [
    "DUMP_MAX",
    "FlightDump",
    "FlightDumpError",
    "FlightEntry",
    "FlightFrame",
    "FlightGroup",
    "GroupStatus",
    "dumps_at",
    "read_flight_dump",
]

DUMP_MAX = 512 << 20
"""A dump of 2,000 entries with their stacks is a few MB; one past 512 MiB is not read."""
_MAX_ENTRIES = 1 << 20
_MAX_FRAMES = 256
"""The innermost frames kept of an entry's stack."""
_MAX_TEXT = 4096
_MAX_INT = (1 << 63) - 1
_STATES = ("scheduled", "started", "completed")
_VERSION = re.compile(r"^(\d+)\.(\d+)$")
_MAJOR = 2


class FlightDumpError(ValueError):
    """A dump that cannot be used, and why (the message names the file and the field)."""


@dataclass(frozen=True, slots=True)
class FlightFrame:
    """One frame of the Python stack that issued a collective."""

    function: str
    file: str
    line: int | None


@dataclass(frozen=True, slots=True)
class FlightEntry:
    """One collective (or send/recv) a rank issued, as its Flight Recorder kept it."""

    group: str
    """The process group's name in the dump ("0" for the default group)."""
    desc: str
    seq: int
    """Its collective sequence number in the group (a send/recv's own p2p number)."""
    p2p: bool
    op: str
    """The collective, without the backend ("all_reduce" of "nccl:all_reduce")."""
    backend: str
    state: str
    completed: bool
    input_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_sizes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[str, ...]
    created_ns: int | None
    frames: tuple[FlightFrame, ...]
    """Outermost first; empty where the dump was taken without stacks."""


@dataclass(frozen=True, slots=True)
class FlightGroup:
    """A process group as the dump's `pg_config` describes it."""

    name: str
    desc: str
    ranks: tuple[int, ...] | None
    """Its global ranks; None where the dump does not say (gloo's collapsed config)."""


@dataclass(frozen=True, slots=True)
class GroupStatus:
    """A process group's last collectives by sequence number (-1: none yet)."""

    enqueued: int
    started: int
    completed: int


@dataclass(frozen=True)
class FlightDump:
    """One rank's dump."""

    path: Path
    rank: int
    version: str
    entries: tuple[FlightEntry, ...]
    groups: dict[str, FlightGroup] = field(default_factory=dict)
    status: dict[str, GroupStatus] = field(default_factory=dict)
    form: str = "pickle"
    """"pickle" or "json"."""


def read_flight_dump(path: str | os.PathLike[str], rank: int) -> FlightDump:
    """Rank `rank`'s dump at `path`, checked. FlightDumpError (a ValueError) names what
    is wrong; OSError and TraceError (not a regular file) as the file system says."""
    path = Path(path)
    with open_regular(path) as fh:
        raw = fh.read(DUMP_MAX + 1)
    if len(raw) > DUMP_MAX:
        raise FlightDumpError(f"{path}: over {DUMP_MAX} bytes, not read as a Flight Recorder dump")
    form = "json" if raw.lstrip()[:1] == b"{" else "pickle"
    try:
        data = _json(raw) if form == "json" else _unpickle(raw)
    except FlightDumpError as exc:
        raise FlightDumpError(f"{path}: {exc}") from None
    except (ValueError, EOFError, pickle.UnpicklingError, RecursionError, MemoryError) as exc:
        what = (
            "a truncated or damaged" if isinstance(exc, EOFError) or "truncat" in str(exc) else "no"
        )
        raise FlightDumpError(
            f"{path}: {what} Flight Recorder dump ({type(exc).__name__}: {exc})"
        ) from None
    try:
        return _dump(data, path, rank, form)
    except FlightDumpError as exc:
        raise FlightDumpError(
            f"{path}: not a Flight Recorder dump rankscope reads ({exc})"
        ) from None


def dumps_at(where: str | os.PathLike[str]) -> tuple[dict[int, Path], list[str]]:
    """The dumps a user has, by rank: `where` is a folder of them, or the prefix torch
    was given (`TORCH_FR_DUMP_TEMP_FILE=/tmp/fr/rank_` writes /tmp/fr/rank_0, rank_1,
    ...). A file's rank is the number its name ends in. Returns (rank -> path, notes):
    in a folder whose files end in numbers after more than one prefix, the prefix most
    files share is taken and the others are said; two files of one rank are both left
    out. A TraceError where nothing there is a dump."""
    where = Path(where)
    if where.is_dir():
        folder, prefix = where, None
    elif where.parent.is_dir():
        folder, prefix = where.parent, where.name
    else:
        raise TraceError(f"{where}: no such folder of Flight Recorder dumps, nor a prefix of them")
    by_prefix: dict[str, dict[int, list[Path]]] = {}
    for entry in sorted(folder.iterdir()):
        if not entry.is_file():
            continue
        name = entry.name
        if prefix is not None and not name.startswith(prefix):
            continue
        found = _RANK_AT_END.match(name)
        if found is None or (prefix is not None and found.group(1) != prefix):
            continue
        rank = int(found.group(2))
        by_prefix.setdefault(found.group(1), {}).setdefault(rank, []).append(entry)
    if not by_prefix:
        said = (
            f"files named {prefix}<rank>"
            if prefix is not None
            else "files whose names end in a rank"
        )
        raise TraceError(f"{where}: no Flight Recorder dumps ({said})")
    chosen = max(by_prefix, key=lambda p: (len(by_prefix[p]), p))
    notes = [
        f"{folder / (p + '<rank>')}: {len(ranks)} other file(s) ending in a number, not read"
        for p, ranks in by_prefix.items()
        if p != chosen
    ]
    out: dict[int, Path] = {}
    for rank, paths in sorted(by_prefix[chosen].items()):
        if len(paths) == 1:
            out[rank] = paths[0]
        else:
            names = ", ".join(str(p) for p in paths)
            notes.append(f"{names}: rank {rank} is claimed by {len(paths)} dumps; none is used")
    return out, notes


# A dump's file name: a prefix, then its rank (torch's `<prefix><rank>`, rankscope's
# `rank-00003.flight-recorder.pickle` is found by its layout, not here).
_RANK_AT_END = re.compile(r"^(.*?)(\d{1,9})$")


# -- loading ---------------------------------------------------------------------------


class _PlainUnpickler(pickle.Unpickler):
    """An unpickler that builds no object: every class or function a pickle names is
    refused, so nothing in it can run (dicts, lists, tuples, strings, numbers, booleans
    and None need no name)."""

    def find_class(self, module: str, name: str) -> Any:
        raise FlightDumpError(
            f"the pickle names {shown(f'{module}.{name}')}: a Flight Recorder dump holds "
            "only plain values, and rankscope loads no pickle that builds objects or runs code"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise FlightDumpError(
            "the pickle refers to an outside object (a persistent id): no Flight Recorder dump does"
        )


def _unpickle(raw: bytes) -> Any:
    return _PlainUnpickler(io.BytesIO(raw)).load()


def _json(raw: bytes) -> Any:
    def refuse(name: str) -> float:
        raise FlightDumpError(f"{name} is not a JSON number")

    return json.loads(raw, parse_constant=refuse)


# -- checking --------------------------------------------------------------------------


def _dump(data: Any, path: Path, rank: int, form: str) -> FlightDump:
    if not isinstance(data, dict):
        raise FlightDumpError(f"a {type(data).__name__}, not a dict")
    version = data.get("version")
    if not isinstance(version, str) or _VERSION.match(version) is None:
        raise FlightDumpError(f"version is {shown(version)}, expected a string like '2.10'")
    major = int(version.split(".")[0])
    if major != _MAJOR:
        raise FlightDumpError(
            f"its version is {version}: this rankscope reads the {_MAJOR}.x dumps of "
            "torch 2.4 and later"
        )
    raw_entries = data.get("entries", [])
    if not isinstance(raw_entries, list):
        raise FlightDumpError(f"entries is {shown(raw_entries)}, expected a list")
    if len(raw_entries) > _MAX_ENTRIES:
        raise FlightDumpError(f"{len(raw_entries)} entries, more than a ring buffer holds")
    entries = tuple(_entry(e, i) for i, e in enumerate(raw_entries))
    return FlightDump(
        path=path,
        rank=rank,
        version=version,
        entries=entries,
        groups=_groups(data.get("pg_config")),
        status=_status(data.get("pg_status")),
        form=form,
    )


def _entry(e: Any, i: int) -> FlightEntry:
    where = f"entries[{i}]"
    if not isinstance(e, dict):
        raise FlightDumpError(f"{where} is {shown(e)}, expected a dict")
    group = e.get("process_group")
    if isinstance(group, (list, tuple)) and len(group) == 2:
        name, desc = (_str(g, f"{where}.process_group") for g in group)
    elif "pg_id" in e:
        name, desc = str(_int(e.get("pg_id"), f"{where}.pg_id")), ""
    else:
        raise FlightDumpError(f"{where}.process_group is {shown(group)}, expected (name, desc)")
    profiling = _str(e.get("profiling_name"), f"{where}.profiling_name")
    backend, _, op = profiling.rpartition(":")
    p2p_said = e.get("is_p2p")
    if p2p_said is not None and not isinstance(p2p_said, bool):
        raise FlightDumpError(f"{where}.is_p2p is {shown(p2p_said)}, expected true or false")
    p2p = p2p_said if p2p_said is not None else op in ("send", "recv")
    seq_key = "p2p_seq_id" if p2p and "p2p_seq_id" in e else "collective_seq_id"
    if seq_key not in e and "seq_id" in e:
        seq_key = "seq_id"
    seq = _int(e.get(seq_key), f"{where}.{seq_key}")
    state = e.get("state")
    if state not in _STATES:
        raise FlightDumpError(
            f"{where}.state is {shown(state)}, expected one of {', '.join(_STATES)}"
        )
    retired = e.get("retired", False)
    if not isinstance(retired, bool):
        raise FlightDumpError(f"{where}.retired is {shown(retired)}, expected true or false")
    created = e.get("time_created_ns")
    return FlightEntry(
        group=name,
        desc=desc,
        seq=seq,
        p2p=p2p,
        op=op,
        backend=backend,
        state=state,
        completed=state == "completed" or retired,
        input_sizes=_sizes(e.get("input_sizes", []), f"{where}.input_sizes"),
        input_dtypes=_dtypes(e.get("input_dtypes", []), f"{where}.input_dtypes"),
        output_sizes=_sizes(e.get("output_sizes", []), f"{where}.output_sizes"),
        output_dtypes=_dtypes(e.get("output_dtypes", []), f"{where}.output_dtypes"),
        created_ns=None if created is None else _int(created, f"{where}.time_created_ns"),
        frames=_frames(e.get("frames", []), f"{where}.frames"),
    )


def _groups(config: Any) -> dict[str, FlightGroup]:
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise FlightDumpError(f"pg_config is {shown(config)}, expected a dict")
    out = {}
    for key, value in config.items():
        where = f"pg_config[{shown(key)}]"
        name = _str(key, where)
        if not isinstance(value, dict):
            raise FlightDumpError(f"{where} is {shown(value)}, expected a dict")
        ranks = _ranks(value.get("ranks"), f"{where}.ranks")
        if name == "":
            continue  # gloo's collapsed config: one entry with no name, for no one group
        desc = value.get("desc", "")
        out[name] = FlightGroup(name, _str(desc, f"{where}.desc"), ranks or None)
    return out


def _status(status: Any) -> dict[str, GroupStatus]:
    if status is None:
        return {}
    if not isinstance(status, dict):
        raise FlightDumpError(f"pg_status is {shown(status)}, expected a dict")
    out = {}
    for key, value in status.items():
        where = f"pg_status[{shown(key)}]"
        if not isinstance(value, dict):
            raise FlightDumpError(f"{where} is {shown(value)}, expected a dict")
        last = [
            _int(value.get(k, -1), f"{where}.{k}", low=-1)
            for k in (
                "last_enqueued_collective",
                "last_started_collective",
                "last_completed_collective",
            )
        ]
        out[_str(key, where)] = GroupStatus(*last)
    return out


def _ranks(value: Any, where: str) -> tuple[int, ...]:
    """`pg_config`'s ranks: a string like "[0, 1, 2]" (as torch writes them) or a list."""
    if isinstance(value, str):
        if len(value) > 1 << 24:
            raise FlightDumpError(f"{where} is a string of {len(value)} characters")
        try:
            value = json.loads(value)
        except ValueError:
            raise FlightDumpError(f"{where} is {shown(value)}, expected a list of ranks") from None
    if not isinstance(value, list):
        raise FlightDumpError(f"{where} is {shown(value)}, expected a list of ranks")
    return tuple(_int(r, f"{where}[{i}]") for i, r in enumerate(value))


def _sizes(value: Any, where: str) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, list):
        raise FlightDumpError(f"{where} is {shown(value)}, expected a list of shapes")
    out = []
    for i, shape in enumerate(value):
        if not isinstance(shape, list):
            raise FlightDumpError(f"{where}[{i}] is {shown(shape)}, expected a shape")
        out.append(tuple(_int(n, f"{where}[{i}]") for n in shape))
    return tuple(out)


def _dtypes(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise FlightDumpError(f"{where} is {shown(value)}, expected a list of dtypes")
    return tuple(_str(v, f"{where}[{i}]") for i, v in enumerate(value))


def _frames(value: Any, where: str) -> tuple[FlightFrame, ...]:
    if not isinstance(value, list):
        raise FlightDumpError(f"{where} is {shown(value)}, expected a list of frames")
    out = []
    # torch lists a stack innermost first; rankscope says stacks outermost first.
    for i, frame in enumerate(value[:_MAX_FRAMES]):
        if not isinstance(frame, dict):
            raise FlightDumpError(f"{where}[{i}] is {shown(frame)}, expected a frame")
        line = frame.get("line")
        out.append(
            FlightFrame(
                function=_str(frame.get("name", ""), f"{where}[{i}].name"),
                file=_str(frame.get("filename", ""), f"{where}[{i}].filename"),
                line=None if line is None else _int(line, f"{where}[{i}].line"),
            )
        )
    return tuple(reversed(out))


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or len(value) > _MAX_TEXT:
        raise FlightDumpError(f"{where} is {shown(value)}, expected a name")
    return value


def _int(value: Any, where: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= _MAX_INT:
        raise FlightDumpError(f"{where} is {shown(value)}, expected an integer >= {low}")
    return value
