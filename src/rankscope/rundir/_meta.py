"""The per-rank meta file written at start: who this rank is and how to line up its clocks."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from .._version import __version__
from ..config._ranks import RankInfo
from ._files import read_regular, write_atomic
from ._layout import meta_path

__all__ = [
    "check_groups",
    "differing_settings",
    "flat_config",
    "previous_attempt",
    "rank_meta",
    "write_meta",
]

META_VERSION = 1


def write_meta(
    run_dir: str,
    info: RankInfo,
    config: dict[str, Any],
    attempt: dict[str, Any],
    groups: Mapping[str, int | str] | None = None,
) -> Path:
    """Write RUN_DIR/meta/rank-NNNNN.json atomically; OSError propagates to the caller."""
    path = meta_path(run_dir, info.rank)
    data = {
        "v": META_VERSION,
        "rank": info.rank,
        "local_rank": info.local_rank,
        "world_size": info.world_size,
        "local_world_size": info.local_world_size,
        "host": info.host,
        "pid": os.getpid(),
        "versions": _versions(),
        "device": _device(),
        "cpus": _cpus(),
        "config": config,
        "attempt": attempt,
        "groups": dict(groups or {}),
        # One instant read on both clocks: wall time for cross-rank timelines,
        # perf_counter for the host durations the timer records.
        "clock": {"time_ns": time.time_ns(), "perf_counter_ns": time.perf_counter_ns()},
    }
    # Through a hidden temporary in the folder, never through a link (see _files).
    write_atomic(run_dir, path, json.dumps(data, indent=1).encode("utf-8"), str(os.getpid()))
    return path


def _cpus() -> int:
    """The CPUs this process may run on (its affinity, where the system says)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


_META_MAX = 1 << 20  # a meta file is a few KB; more is not one


def rank_meta(run_dir: str, rank: int) -> dict[str, Any] | None:
    """A rank's meta file as written (a dict), or None where there is no regular file
    holding a JSON object. Never raises, and opens only a regular file."""
    try:
        raw = read_regular(meta_path(run_dir, rank), _META_MAX)
        data = json.loads(raw)
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


_NOT_SET = "(not set)"


def flat_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A config as dotted settings and their values in JSON ("timer.every_n_steps": "5"):
    what two ranks' configs are compared by. A value that is no JSON is its repr."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_config(value, name + "."))
        else:
            try:
                out[name] = json.dumps(value, sort_keys=True)
            except (TypeError, ValueError):
                out[name] = repr(value)
    return out


def differing_settings(a: Mapping[str, str], b: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(setting, a's value, b's value) for each setting two flat configs disagree on."""
    return [
        (key, a.get(key, _NOT_SET), b.get(key, _NOT_SET))
        for key in sorted(set(a) | set(b))
        if a.get(key, _NOT_SET) != b.get(key, _NOT_SET)
    ]


def previous_attempt(run_dir: str, rank: int) -> dict[str, Any] | None:
    """The attempt in this rank's meta file from an earlier start: None when there is no
    such regular file, {} when it does not say (an older version wrote it, or it is
    unreadable).

    Never raises, and opens only a regular file.
    """
    try:
        # A link or anything but a regular file is no job's meta (writing it is refused
        # and said); a FIFO is never waited on.
        raw = read_regular(meta_path(run_dir, rank), _META_MAX)
    except OSError:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    attempt = data.get("attempt") if isinstance(data, dict) else None
    return attempt if isinstance(attempt, dict) else {}


def _versions() -> dict[str, str | None]:
    torch = sys.modules.get("torch")
    return {
        "rankscope": __version__,
        "python": platform.python_version(),
        "torch": getattr(torch, "__version__", None),
    }


def _device() -> str:
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            index = torch.cuda.current_device()
            return f"cuda:{index} {torch.cuda.get_device_name(index)}"
    except Exception:
        return "unknown"
    return "cpu"


def check_groups(groups: Mapping[str, int | str] | None) -> dict[str, int | str]:
    """The parallel groups a rank names (Profiler's `groups`), checked: names to ints or
    short strings; a ConfigError naming the bad entry otherwise."""
    if groups is None:
        return {}
    if not isinstance(groups, Mapping):
        raise ConfigError(
            "groups",
            groups,
            'a mapping of group names to ints or strings, e.g. {"pipeline_stage": 3}',
        )
    out: dict[str, int | str] = {}
    for name, value in groups.items():
        if not isinstance(name, str) or not name or len(name) > _GROUP_TEXT:
            raise ConfigError(
                "groups", name, f"group names: strings of 1 to {_GROUP_TEXT} characters"
            )
        ok = isinstance(value, int) and not isinstance(value, bool)
        if not (ok or (isinstance(value, str) and 0 < len(value) <= _GROUP_TEXT)):
            raise ConfigError(
                f"groups[{name!r}]", value, f"an int or a string of 1 to {_GROUP_TEXT} characters"
            )
        out[name] = value
    return out


_GROUP_TEXT = 64
