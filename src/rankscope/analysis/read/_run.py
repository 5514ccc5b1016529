"""What a run directory says about its ranks: the meta files, the world size, who is missing."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..._errors import TraceError
from ..._text import format_ranks, printable
from ...rundir._layout import META
from ...rundir._listing import RunDir, is_run_dir, open_regular, runs_in
from ...rundir._meta import flat_config

__all__ = ["RunMeta", "read_run_meta"]

_VERSIONS = (1,)
"""The meta schema versions this reader knows."""
_MAX_WORLD = 1 << 20
"""Larger than any job: a world size above it is not believed (a file may say anything)."""
_META_MAX = 1 << 20
"""A meta file is a few KB; one past this is not read."""


@dataclass
class RunMeta:
    """The ranks' meta files, and what they tell together."""

    root: Path
    meta: dict[int, dict[str, Any]]
    world_size: int | None
    """The world size the meta files state (the largest, if they disagree); None without meta."""
    skipped: list[str] = field(default_factory=list)

    @property
    def hosts(self) -> dict[int, str]:
        return {r: str(m["host"]) for r, m in self.meta.items() if isinstance(m.get("host"), str)}

    @property
    def groups(self) -> dict[int, dict[str, int | str]]:
        """Each rank's parallel groups (Profiler's `groups`): names to ints or strings;
        any other entry of an untrusted file is left out."""
        out: dict[int, dict[str, int | str]] = {}
        for rank, data in self.meta.items():
            named = data.get("groups")
            if isinstance(named, dict):
                kept = {
                    k: v
                    for k, v in named.items()
                    if isinstance(k, str) and isinstance(v, (int, str)) and not isinstance(v, bool)
                }
                if kept:
                    out[rank] = kept
        return out

    @property
    def shared_cores(self) -> bool:
        """Some host ran more ranks than it has CPUs (as its meta files say: `cpus`, the
        CPUs a rank may run on): its ranks took turns on the cores, which spreads any
        phase that runs on them. False where no meta file says."""
        ranks: dict[str, int] = {}
        cpus: dict[str, int] = {}
        for data in self.meta.values():
            host, n = data.get("host"), data.get("cpus")
            if not isinstance(host, str):
                continue
            ranks[host] = ranks.get(host, 0) + 1
            if isinstance(n, int) and not isinstance(n, bool) and 0 < n < _MAX_WORLD:
                cpus[host] = min(n, cpus.get(host, n))
        return any(ranks[host] > n for host, n in cpus.items())

    @property
    def gpus(self) -> bool | None:
        """Whether the ranks ran on GPUs: True where a meta file names a CUDA device,
        False where every one that names a device names the CPU, None where none says."""
        devices = [str(m["device"]) for m in self.meta.values() if isinstance(m.get("device"), str)]
        if any(d.startswith("cuda") for d in devices):
            return True
        return False if devices and all(d == "cpu" for d in devices) else None

    def missing(self, present: set[int] | list[int]) -> list[int]:
        """Ranks below the world size that `present` lacks (below max+1 without meta)."""
        have = set(present)
        size = self.world_size if self.world_size is not None else max(have, default=-1) + 1
        return [r for r in range(size) if r not in have]

    def sampling(self, rank: int) -> int:
        """Every how many steps the rank's timer samples, as its meta file's config says
        (1 where it does not say, or says something no config holds)."""
        config = self.meta.get(rank, {}).get("config")
        timer = config.get("timer") if isinstance(config, dict) else None
        every = timer.get("every_n_steps") if isinstance(timer, dict) else None
        if isinstance(every, int) and not isinstance(every, bool) and 0 < every < 1 << 31:
            return every
        return 1

    def config_differences(self, most: int = 5) -> list[str]:
        """One line per setting the ranks' meta files disagree on, the value most ranks
        have last ("timer.every_n_steps is 5 on rank 1, 1 on ranks 0, 2, 3"): ranks
        configured apart time different steps, or none."""
        flat = {
            rank: flat_config(data["config"])
            for rank, data in sorted(self.meta.items())
            if isinstance(data.get("config"), dict)
        }
        if len(flat) < 2:
            return []
        lines = []
        for key in sorted(set().union(*flat.values())):
            held: dict[str, list[int]] = {}
            for rank, settings in flat.items():
                held.setdefault(settings.get(key, "(not set)"), []).append(rank)
            if len(held) > 1:
                parts = sorted(held.items(), key=lambda item: (len(item[1]), item[1][0]))
                said = ", ".join(
                    f"{printable(value)[:60]} on {format_ranks(ranks)}" for value, ranks in parts
                )
                lines.append(f"the ranks' configs differ: {key} is {said}")
        if len(lines) > most:
            lines[most:] = [
                f"... and {len(lines) - most} more settings differ (the meta files hold each rank's config)"
            ]
        return lines

    def say_missing(self, present: set[int] | list[int] | dict[int, Any]) -> list[str]:
        """One line naming the ranks below the world size without timings; none when none are."""
        missing = self.missing(list(present))
        if not missing:
            return []
        world = f"of a world of {self.world_size or '?'}"
        started = [r for r in missing if r in self.meta]
        silent = [r for r in missing if r not in self.meta]
        lines = [f"{format_ranks(started)}: no timings ({world})"] if started else []
        if silent:
            # No meta file either: its rankscope wrote nothing here. Its own log says why.
            lines.append(
                f"{format_ranks(silent)}: no timings ({world}); no meta file either: "
                "nothing of it was written here (another output_dir, its own config "
                "leaving it out, or it never started: its log says)"
            )
        return lines


def _enclosing_run_dir(path: Path) -> Path | None:
    """The run directory that `path` lies inside (traces/, a window), when it is not one itself."""
    if is_run_dir(path):
        return None
    for parent in list(path.resolve().parents)[:3]:
        if is_run_dir(parent):
            return parent
    return None


def run_root(run_dir: str | os.PathLike[str]) -> Path:
    """`run_dir` as a Path, or a TraceError when it is no directory at all, or a folder
    that holds runs (`runs/`) rather than a run: read as one, its runs' windows would
    add up (a kernel counted once per run)."""
    root = Path(run_dir)
    if not root.exists():
        raise TraceError(f"{root}: no such directory")
    if not root.is_dir():
        raise TraceError(f"{root}: not a directory (expected a run directory)")
    runs = runs_in(root)
    if runs:
        raise TraceError(_folder_of_runs(root, runs))
    return root


_RUNS_NAMED = 4
"""The runs a message names, of a folder that holds runs."""


def _folder_of_runs(root: Path, runs: list[Path]) -> str:
    names = ", ".join(run.name for run in runs[:_RUNS_NAMED])
    if len(runs) > _RUNS_NAMED:
        names += f", ... ({len(runs)} in all)"
    one = "it" if len(runs) == 1 else "one of them"
    return printable(  # a run's name may hold a byte that is not UTF-8
        f"{root}: a folder holding {len(runs)} run{'s' if len(runs) > 1 else ''} ({names}), "
        f"not a run; give {one}, e.g. {runs[0]}"
    )


def read_run_meta(run_dir: str | os.PathLike[str]) -> RunMeta:
    """Read the ranks' meta files (RUN_DIR/meta); unreadable files are skipped and said."""
    root = run_root(run_dir)
    enclosing = _enclosing_run_dir(root)
    if enclosing is not None:
        raise TraceError(
            f"{root} lies inside the run directory {enclosing}: give that one "
            f"(the commands that read a run take its top folder)"
        )
    meta: dict[int, dict[str, Any]] = {}
    skipped: list[str] = []
    sizes: set[int] = set()
    latest: tuple[int, int] | None = None  # (started_ns, world size) of the latest start
    run = RunDir(root)
    for found in run.meta():
        path, rank = found.path, found.rank
        try:
            with open_regular(path) as fh:
                text = fh.read(_META_MAX + 1)
            if len(text) > _META_MAX:
                raise ValueError(f"over {_META_MAX} bytes")
            data = json.loads(text)
        except TraceError as exc:  # not a regular file after all (replaced since listed)
            skipped.append(str(exc))
            continue
        except (OSError, ValueError, RecursionError) as exc:
            skipped.append(f"{path}: not readable meta ({type(exc).__name__}: {exc})")
            continue
        if not isinstance(data, dict) or data.get("rank") != rank:
            skipped.append(f"{path}: not the meta of rank {rank}")
            continue
        if data.get("v", 1) not in _VERSIONS:
            known = ", ".join(map(str, _VERSIONS))
            skipped.append(
                f"{path}: meta schema version {data.get('v')!r} left out (this rankscope "
                f"reads version {known}; a newer rankscope wrote it?)"
            )
            continue
        if rank in meta:
            skipped.append(f"{path}: a second meta file for rank {rank}; ignored")
            continue
        meta[rank] = data
        size = data.get("world_size")
        if isinstance(size, int) and not isinstance(size, bool) and size > rank:
            if size > _MAX_WORLD:
                skipped.append(
                    f"{path}: world_size {size} is past any job's (over {_MAX_WORLD}); ignored"
                )
            else:
                sizes.add(size)
                started = _started(data)
                if started is not None and (latest is None or started > latest[0]):
                    latest = (started, size)
    skipped.extend(run.left_out)  # a FIFO or a folder under a meta name
    world = _world(root, sizes, latest, skipped)
    return RunMeta(root=root, meta=meta, world_size=world, skipped=skipped)


def _world(
    root: Path, sizes: set[int], latest: tuple[int, int] | None, skipped: list[str]
) -> int | None:
    """The run's world size from the sizes its meta files state. Where they disagree (an
    elastic restart with fewer ranks leaves the ranks it dropped with the earlier start's
    meta file), the latest start's: the job's world now; said in `skipped`."""
    if not sizes:
        return None
    if len(sizes) == 1:
        return next(iter(sizes))
    world, which = max(sizes), "the largest"
    if latest is not None:
        world, which = latest[1], "the latest start's"
    skipped.append(
        f"{root / META}: the ranks disagree on the world size ({sorted(sizes)}); using {which}"
    )
    return world


def _started(data: dict[str, Any]) -> int | None:
    """When the start that wrote a meta file began (its attempt's started_ns), or None."""
    attempt = data.get("attempt")
    started = attempt.get("started_ns") if isinstance(attempt, dict) else None
    return started if isinstance(started, int) and not isinstance(started, bool) else None
