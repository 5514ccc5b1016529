"""What the watchdog saves of torch's Flight Recorder when it declares a hang: the
rank's ring buffer of collectives (any backend: NCCL, gloo), and the process groups it
is in, so that the dump describes itself (gloo's dumps name no group's ranks).

Both read torch's own tables in this process: no collective, no NCCL call, nothing
that waits on another rank. A failure is a reason in the hang file, never an error in
the job.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from ..rundir._files import write_atomic

__all__ = ["DUMP_LIMIT", "dump_flight_recorder", "no_flight_recorder", "process_groups"]

DUMP_LIMIT = 256 << 20
"""A dump larger than this is not written (2,000 entries with stacks are a few MB)."""
_GROUPS_KEPT = 4096
"""Process groups listed at most (a job has a few per parallel dimension)."""


def no_flight_recorder() -> dict[str, str] | None:
    """Why there can be no dump (no process group, a torch without the recorder); None
    where there can be one."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return {"skipped": "torch.distributed is not initialized"}
    except Exception as exc:
        return {"skipped": f"torch.distributed could not be asked ({type(exc).__name__}: {exc})"}
    if _dumper() is None:
        return {"skipped": "this torch has no Flight Recorder dump"}
    return None


def dump_flight_recorder(run_dir: str, path: Path) -> dict[str, str]:
    """The rank's Flight Recorder buffer, with the stacks that issued each collective,
    written at `path` (under `run_dir`, atomically); what the hang file says of it."""
    try:
        dump = _dumper()
        if dump is None:
            return {"skipped": "this torch has no Flight Recorder dump"}
        try:  # every entry: the completed ones say how far each rank got
            raw = dump(includeCollectives=True, includeStackTraces=True, onlyActive=False)
        except TypeError:  # a torch whose dump takes no options
            raw = dump()
        data = bytes(raw)
        if len(data) > DUMP_LIMIT:
            return {"skipped": f"the dump is {len(data)} bytes, over {DUMP_LIMIT}: not written"}
        write_atomic(run_dir, path, data, str(os.getpid()))
        return {"path": path.name}
    except Exception as exc:
        return {"skipped": f"the dump failed ({type(exc).__name__}: {exc})"}


def process_groups() -> list[dict[str, Any]]:
    """Every process group this rank is in: its name as the Flight Recorder dump names it
    ("0" the default group), its description, its global ranks and its backend. Empty
    where torch's table cannot be read."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    world = getattr(c10d, "_world", None)
    if world is None:
        return []
    try:
        names = dict(world.pg_names)
        members = dict(world.pg_group_ranks)
        backends = dict(world.pg_map)
    except Exception:
        return []
    out = []
    for pg, name in list(names.items())[:_GROUPS_KEPT]:
        try:
            ranks = sorted(int(r) for r in members.get(pg, {}))
            backend = backends.get(pg, (None,))[0]
            out.append(
                {
                    "name": str(name),
                    "desc": str(getattr(pg, "group_desc", "") or ""),
                    "ranks": ranks,
                    "backend": None if backend is None else str(backend),
                }
            )
        except Exception:
            continue
    return out


def _dumper() -> Any:
    c10d = getattr(getattr(sys.modules.get("torch"), "_C", None), "_distributed_c10d", None)
    if c10d is None:
        return None
    # Any backend's buffer; in a torch that has only NCCL's, NCCL's.
    return getattr(c10d, "_dump_fr_trace", None) or getattr(c10d, "_dump_nccl_trace", None)
