"""The only reader of the environment: RANKSCOPE_* overrides and launcher rank variables.

Every function takes the mapping to read, so tests pass a dict and never touch
`os.environ`; `None` means the process environment. A RANKSCOPE_* variable rankscope
does not know (a misspelling: RANKSCOPE_TIMER_EVRY) is warned about once, naming the
closest known one, rather than silently ignored.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigError
from .._log import get_logger
from .._text import closest

__all__ = [
    "KNOWN_VARIABLES",
    "EnvOverride",
    "config_overrides",
    "launcher_ranks",
    "parse_bool",
    "unknown_variables",
]

logger = get_logger(__name__)

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_BOOL_ACCEPTED = "1/true/yes/on or 0/false/no/off, in any case"


def parse_bool(name: str, value: str) -> bool:
    """Read a boolean environment variable; anything unclear is a ConfigError naming it."""
    word = value.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ConfigError(name, value, _BOOL_ACCEPTED)


_INT = re.compile(r"-?[0-9]+")


def _parse_int(name: str, value: str) -> int:
    # Plain ASCII digits only: int() also takes "1_0", "٣" and full-width digits.
    text = value.strip()
    if not _INT.fullmatch(text):
        raise ConfigError(name, value, "an integer written in ASCII digits")
    return int(text)


_FLOAT = re.compile(r"-?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?")


def _parse_float(name: str, value: str) -> float:
    text = value.strip()
    if not _FLOAT.fullmatch(text):
        raise ConfigError(name, value, "a number written in ASCII digits (180, 2.5)")
    return float(text)


def _text(_name: str, value: str) -> str:
    return value.strip()


# variable -> (path in the nested config dict, parser)
_OVERRIDES: dict[str, tuple[tuple[str, ...], Callable[[str, str], Any]]] = {
    "RANKSCOPE_OUTPUT_DIR": (("output_dir",), _text),
    "RANKSCOPE_TRACE": (("trace", "enable"), parse_bool),
    "RANKSCOPE_TRACE_RANKS": (("trace", "ranks"), _text),
    "RANKSCOPE_RECORD_SHAPES": (("trace", "record_shapes"), parse_bool),
    "RANKSCOPE_WITH_FLOPS": (("trace", "with_flops"), parse_bool),
    "RANKSCOPE_WITH_STACK": (("trace", "with_stack"), parse_bool),
    "RANKSCOPE_PROFILE_MEMORY": (("trace", "profile_memory"), parse_bool),
    "RANKSCOPE_MEMORY": (("memory", "enable"), parse_bool),
    "RANKSCOPE_MEMORY_RANKS": (("memory", "ranks"), _text),
    "RANKSCOPE_TIMER": (("timer", "enable"), parse_bool),
    "RANKSCOPE_TIMER_RANKS": (("timer", "ranks"), _text),
    "RANKSCOPE_TIMER_EVERY": (("timer", "every_n_steps"), _parse_int),
    "RANKSCOPE_HANG": (("hang", "enable"), parse_bool),
    "RANKSCOPE_HANG_AFTER_S": (("hang", "after_s"), _parse_float),
    "RANKSCOPE_HANG_FACTOR": (("hang", "factor"), _parse_float),
}

_PREFIX = "RANKSCOPE_"
_NOT_CONFIG = (
    "RANKSCOPE_WRITE_DOCS",  # tests/project/test_docs.py: rewrite docs/config.md
    "RANKSCOPE_SKYRL_CONFIG",  # integrations/skyrl.py: install(config) to SkyRL's workers
    "RANKSCOPE_SKYRL_THEN",  # integrations/skyrl.py: the user's own Ray setup hook
)
KNOWN_VARIABLES: tuple[str, ...] = tuple(sorted((*_OVERRIDES, *_NOT_CONFIG)))
"""Every RANKSCOPE_* variable rankscope reads."""
_warned: set[str] = set()  # unknown variables warned about in this process


@dataclass(frozen=True, slots=True)
class EnvOverride:
    """One RANKSCOPE_* variable that is set: which field it overrides and its parsed value."""

    variable: str
    path: tuple[str, ...]
    value: Any

    @property
    def field(self) -> str:
        return ".".join(self.path)


def config_overrides(environ: Mapping[str, str] | None = None) -> list[EnvOverride]:
    """The RANKSCOPE_* variables that are set (empty ones are ignored), parsed.

    Each unknown one that is set is warned about, once per process (`unknown_variables`).
    """
    env = os.environ if environ is None else environ
    found = []
    for name, (path, parse) in _OVERRIDES.items():
        raw = env.get(name)
        if raw is not None and raw.strip():
            found.append(EnvOverride(name, path, parse(name, raw)))
    _warn_unknown(env)
    return found


def unknown_variables(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """The RANKSCOPE_* variables set (not empty) that rankscope does not read, each with the
    known variable its name is closest to (None where none is close)."""
    env = os.environ if environ is None else environ
    known = {name[len(_PREFIX) :]: name for name in KNOWN_VARIABLES}
    out: dict[str, str | None] = {}
    for name in sorted(env):
        if not name.startswith(_PREFIX) or name in KNOWN_VARIABLES or not env[name].strip():
            continue
        # Compared without the prefix, which every name shares and would make all look close.
        close = closest(name[len(_PREFIX) :], known)
        out[name] = None if close is None else known[close]
    return out


def _warn_unknown(env: Mapping[str, str]) -> None:
    for name, guess in unknown_variables(env).items():
        if name in _warned:
            continue
        _warned.add(name)
        hint = (
            f"did you mean {guess}?"
            if guess is not None
            else f"the config variables are {', '.join(sorted(_OVERRIDES))}"
        )
        logger.warning(
            "rankscope: %s=%r is not a variable rankscope reads and is ignored; %s",
            name,
            env[name],
            hint,
        )


def launcher_ranks(environ: Mapping[str, str] | None = None) -> tuple[int, int, int, int] | None:
    """(rank, local_rank, world_size, local_world_size) from torchrun's or SLURM's variables.

    torchrun's win over SLURM's (torchrun inside an allocation sets both). None when
    neither launcher set its variables.
    """
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        rank = _parse_int("RANK", env["RANK"])
        world = _parse_int("WORLD_SIZE", env["WORLD_SIZE"])
        local = _parse_int("LOCAL_RANK", env.get("LOCAL_RANK", str(rank)))
        local_world = _parse_int("LOCAL_WORLD_SIZE", env.get("LOCAL_WORLD_SIZE", str(world)))
        _check_rank("RANK", rank, "WORLD_SIZE", world)
        return rank, local, world, local_world
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        rank = _parse_int("SLURM_PROCID", env["SLURM_PROCID"])
        world = _parse_int("SLURM_NTASKS", env["SLURM_NTASKS"])
        local = _parse_int("SLURM_LOCALID", env.get("SLURM_LOCALID", str(rank)))
        local_world = _slurm_local_world(env, world)
        _check_rank("SLURM_PROCID", rank, "SLURM_NTASKS", world)
        return rank, local, world, local_world
    return None


def _slurm_local_world(env: Mapping[str, str], world: int) -> int:
    # SLURM_NTASKS_PER_NODE is set only with --ntasks-per-node; SLURM_TASKS_PER_NODE
    # is always set but may read "4(x2)" or "4,2": its first count is this layout's norm.
    if "SLURM_NTASKS_PER_NODE" in env:
        return _parse_int("SLURM_NTASKS_PER_NODE", env["SLURM_NTASKS_PER_NODE"])
    per_node = env.get("SLURM_TASKS_PER_NODE", "")
    head = per_node.split(",")[0].split("(")[0]
    return int(head) if head.isascii() and head.isdigit() else world


def _check_rank(rank_name: str, rank: int, world_name: str, world: int) -> None:
    if world < 1:
        raise ConfigError(world_name, world, "an integer >= 1")
    if not 0 <= rank < world:
        raise ConfigError(rank_name, rank, f"0 to {world_name}-1 ({world_name}={world})")


def name_variable(exc: ConfigError, overrides: list[EnvOverride]) -> ConfigError:
    """`exc` naming the RANKSCOPE_* variable that set its field, where one did."""
    for override in overrides:
        if exc.field == override.field:
            return ConfigError(override.variable, exc.value, exc.accepted, exc.problem)
    return exc


def launcher_attempt(
    environ: Mapping[str, str] | None = None,
) -> tuple[str, str | None, int | None] | None:
    """(launcher, job id, restart count) from torchelastic's or SLURM's variables, else None.

    Never raises: a value that is not what the launcher writes is read as unknown (None),
    since an attempt's label must not stop a job from starting.
    """
    env = os.environ if environ is None else environ
    if "TORCHELASTIC_RESTART_COUNT" in env or "TORCHELASTIC_RUN_ID" in env:
        job = env.get("TORCHELASTIC_RUN_ID", "").strip()
        # torchrun's default --rdzv-id is "none": no id at all.
        return (
            "torchelastic",
            job if job and job != "none" else None,
            _count(env, "TORCHELASTIC_RESTART_COUNT"),
        )
    if "SLURM_JOB_ID" in env:
        job = env["SLURM_JOB_ID"].strip()
        # SLURM sets the count only once it has requeued the job: absent, it is 0.
        restart = _count(env, "SLURM_RESTART_COUNT") if "SLURM_RESTART_COUNT" in env else 0
        return "slurm", job or None, restart
    return None


def rendezvous(environ: Mapping[str, str] | None = None) -> str | None:
    """MASTER_ADDR:MASTER_PORT, where both are set (torchrun and most launchers set them);
    None otherwise. Never raises."""
    env = os.environ if environ is None else environ
    addr, port = env.get("MASTER_ADDR", "").strip(), env.get("MASTER_PORT", "").strip()
    if not addr or not port or len(addr) + len(port) > 300:
        return None
    return f"{addr}:{port}"


def _count(env: Mapping[str, str], name: str) -> int | None:
    text = env.get(name, "").strip()
    return int(text) if _INT.fullmatch(text) and not text.startswith("-") else None
