"""Configuration: dataclasses validated at construction, built from code, dicts, YAML or the environment."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from .._errors import ConfigError
from .._log import get_logger
from .._text import closest
from . import _env
from ._checks import check_bool, check_int, check_seconds
from ._fields import CONFIG_DEST, NOT_GIVEN, ConfigField, dest, flag_name, leaf_fields
from ._ranks import RankSet, RankSpec, parse_ranks
from ._trace import AutoTrigger, Schedule, TraceConfig

__all__ = ["STACKS", "HangConfig", "MemoryConfig", "ProfileConfig", "TimerConfig"]

logger = get_logger(__name__)

# torch.profiler writes through the local filesystem only.
_CLOUD_SCHEMES = ("s3", "gs", "gcs", "hdfs", "az", "abfs", "abfss")
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True, kw_only=True, slots=True)
class TimerConfig:
    """The always-on phase timer: host and device time per phase on sampled steps.

    Step s is sampled when start_step <= s < end_step and (s - start_step) is a
    multiple of every_n_steps. Each sampled step writes one line per phase plus one
    "step" line to RUN_DIR/timings/rank-NNNNN.jsonl.
    """

    enable: bool = False
    """Time phases at all. Off by default; RANKSCOPE_TIMER=1 turns it on."""
    ranks: RankSpec = "all"
    """Ranks that time phases, in the same forms as TraceConfig.ranks. All ranks by default:
    finding the slow rank needs every rank's timings."""
    start_step: int = 0
    """First step that may be sampled (steps count step() calls from 0)."""
    end_step: int | None = None
    """Steps from this one on are not sampled; None means until stop()."""
    every_n_steps: int = 10
    """Sample one step in this many. 1 times every step."""
    flush_every_n_steps: int = 10
    """Resolve device events and append records to the file every this many steps (and at stop()).
    A crash loses at most the records since the last flush."""
    max_pending_events: int = 4096
    """Device events waiting for the GPU to reach them, at most. Past it the oldest phase is
    written without its device time and the loss is counted in the next record."""
    health: bool = True
    """On CUDA ranks with nvidia-ml-py installed, also read the GPU's health (NVML clocks,
    throttle reasons, temperature, power, ECC errors) and the host's load and free memory,
    off the training thread, into RUN_DIR/health/rank-NNNNN.jsonl."""
    health_every_s: float = 5.0
    """Read the health at the first sampled step, then once in this many seconds while
    steps go on, and at stop(). Clocks, temperature and ECC counts change over seconds,
    not steps: reading them at every sampled step cost the step its time (the sampler's
    Python work holds the interpreter lock the training loop needs)."""

    def __post_init__(self) -> None:
        check_bool("timer.enable", self.enable)
        check_bool("timer.health", self.health)
        object.__setattr__(
            self,
            "health_every_s",
            check_seconds("timer.health_every_s", self.health_every_s, 0.01),
        )
        object.__setattr__(self, "ranks", self.rank_set.spec())
        check_int("timer.start_step", self.start_step, 0)
        end = self.end_step
        if end is not None and (
            isinstance(end, bool) or not isinstance(end, int) or end <= self.start_step
        ):
            accepted = f"None or an int > start_step ({self.start_step})"
            raise ConfigError("timer.end_step", end, accepted)
        check_int("timer.every_n_steps", self.every_n_steps, 1)
        check_int("timer.flush_every_n_steps", self.flush_every_n_steps, 1)
        check_int("timer.max_pending_events", self.max_pending_events, 2)

    @property
    def rank_set(self) -> RankSet:
        """The parsed `ranks`."""
        return parse_ranks(self.ranks, "timer.ranks")


STACKS = ("python", "all")
"""What `MemoryConfig.stacks` accepts."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryConfig:
    """CUDA memory snapshots: the allocator's history, in the pickle format PyTorch's memory_viz
    (https://pytorch.org/memory_viz) reads, written to RUN_DIR/memory/<window>/rank-NNNNN.pickle.

    History is recorded from start() to stop() on the chosen ranks and dumped when a trace
    window closes there and when CUDA runs out of memory. Without CUDA: one info line.
    """

    enable: bool = False
    """Record allocator history and dump snapshots. Off by default."""
    ranks: RankSpec = "0"
    """Ranks that record, in the forms of TraceConfig.ranks."""
    max_entries: int = 100000
    """Allocation events kept, newest last (a ring buffer): bounds host memory and the size and
    time of a dump. Events older than the last max_entries are gone from a snapshot."""
    stacks: str = "python"
    """Call stacks kept per event: "python" (fast to dump) or "all" (C++ frames too; symbolising
    them can make one dump take minutes)."""
    on_oom: bool = True
    """Dump a snapshot when CUDA runs out of memory (RUN_DIR/memory/oom-step-NNNNNN/), before the
    error reaches the training loop."""

    def __post_init__(self) -> None:
        check_bool("memory.enable", self.enable)
        object.__setattr__(self, "ranks", self.rank_set.spec())
        check_int("memory.max_entries", self.max_entries, 1)
        if self.stacks not in STACKS:
            raise ConfigError("memory.stacks", self.stacks, " or ".join(repr(s) for s in STACKS))
        check_bool("memory.on_oom", self.on_oom)

    @property
    def rank_set(self) -> RankSet:
        """The parsed `ranks`."""
        return parse_ranks(self.ranks, "memory.ranks")


@dataclass(frozen=True, kw_only=True, slots=True)
class HangConfig:
    """The heartbeat (RUN_DIR/live/rank-NNNNN.json: the step and the open phases) and the
    hang watchdog (RUN_DIR/hangs/step-NNNNNN-<attempt>/rank-NNNNN.json, once per stall), on every rank
    that times or traces. See docs/hangs.md.
    """

    enable: bool = True
    """Keep a heartbeat and watch for stalls wherever the timer or the capture is on."""
    after_s: float = 180.0
    """A step that has not ended after max(after_s, factor x the median step) is a stall.
    Below the default NCCL timeout (10 min), so the hang files are written before it fires."""
    factor: float = 10.0
    """How many median steps a step may take before it is a stall (when that is over after_s)."""
    heartbeat_s: float = 5.0
    """The heartbeat file is rewritten at most this often, and only when something changed."""

    def __post_init__(self) -> None:
        check_bool("hang.enable", self.enable)
        # Floors: the watchdog polls every min(1 s, after_s / 4, heartbeat_s).
        for name, least in (("after_s", 0.5), ("factor", 1.0), ("heartbeat_s", 0.1)):
            object.__setattr__(
                self, name, check_seconds(f"hang.{name}", getattr(self, name), least)
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class ProfileConfig:
    """Everything a Profiler needs; the environment may override parts of it (see `with_env`)."""

    output_dir: PathLike = "runs/rankscope"
    """The run directory every rank writes into (a local or mounted path; resolved to an absolute path)."""
    trace: TraceConfig = field(default_factory=TraceConfig)
    """torch.profiler trace capture."""
    timer: TimerConfig = field(default_factory=TimerConfig)
    """The sampled phase timer."""
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    """CUDA memory snapshots."""
    hang: HangConfig = field(default_factory=HangConfig)
    """The heartbeat and the hang watchdog."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "output_dir", _resolve_output_dir(self.output_dir))
        if not isinstance(self.trace, TraceConfig):
            raise ConfigError("trace", self.trace, "a TraceConfig")
        if not isinstance(self.timer, TimerConfig):
            raise ConfigError("timer", self.timer, "a TimerConfig")
        if not isinstance(self.memory, MemoryConfig):
            raise ConfigError("memory", self.memory, "a MemoryConfig")
        if not isinstance(self.hang, HangConfig):
            raise ConfigError("hang", self.hang, "a HangConfig")
        if self.memory.enable and not self.memory.on_oom and not self.trace.enable:
            raise ConfigError(
                "memory.on_oom",
                False,
                "True, or False with trace.enable=True",
                "snapshots are dumped when a trace window closes or CUDA runs out of memory, "
                "so with neither the history would be recorded and never written",
            )
        auto = self.trace.auto
        if self.trace.enable and auto.enable and auto.phase is not None and not self.timer.enable:
            raise ConfigError(
                "trace.auto.phase",
                auto.phase,
                "None, or a phase name with timer.enable=True",
                "a phase's time comes from the phase timer's records, and the timer is off",
            )

    def check_world_size(self, world_size: int, environ: Mapping[str, str] | None = None) -> None:
        """Raise ConfigError if a rank selection names a rank the job does not have.

        The error names the RANKSCOPE_* variable when the selection came from `environ`.
        """
        try:
            self.trace.rank_set.check_world_size(world_size, "trace.ranks")
            self.timer.rank_set.check_world_size(world_size, "timer.ranks")
            self.memory.rank_set.check_world_size(world_size, "memory.ranks")
            if self.trace.auto.ranks is not None:
                auto_ranks = self.trace.auto.rank_set(self.trace.ranks)
                auto_ranks.check_world_size(world_size, "trace.auto.ranks")
        except ConfigError as exc:
            named = _env.name_variable(exc, _env.config_overrides(environ))
            if named is exc:
                raise
            raise named from None

    # -- building from plain data ------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain nested data (JSON- and YAML-safe); `from_dict(to_dict())` gives an equal config."""
        out = dataclasses.asdict(self)
        activities = out["trace"]["activities"]
        out["trace"]["activities"] = None if activities is None else list(activities)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProfileConfig:
        """Build from nested plain data as written in YAML; unknown keys are errors."""
        if not isinstance(data, Mapping):
            raise ConfigError("config", data, "a mapping of config fields")
        _check_keys("", data, cls)
        kwargs: dict[str, Any] = dict(data)
        if "trace" in kwargs:
            kwargs["trace"] = _trace_from_dict(kwargs["trace"])
        if "timer" in kwargs:
            kwargs["timer"] = _timer_from_dict(kwargs["timer"])
        if "memory" in kwargs and not isinstance(kwargs["memory"], MemoryConfig):
            kwargs["memory"] = MemoryConfig(**_section("memory", kwargs["memory"], MemoryConfig))
        if "hang" in kwargs and not isinstance(kwargs["hang"], HangConfig):
            kwargs["hang"] = HangConfig(**_section("hang", kwargs["hang"], HangConfig))
        return cls(**kwargs)

    @classmethod
    def from_yaml(cls, path: PathLike, key: str | None = None) -> ProfileConfig:
        """Read a YAML file. `key` picks a block ("profiler") from a larger training config;
        a file whose only top-level key is "rankscope" is read from under it."""
        import yaml

        source = Path(path)
        try:
            data = yaml.safe_load(source.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError("path", str(path), "a readable YAML file", str(exc)) from exc
        except UnicodeDecodeError as exc:
            raise ConfigError("path", str(path), "a UTF-8 YAML file", str(exc)) from exc
        except yaml.YAMLError as exc:
            raise ConfigError("path", str(path), "a valid YAML file", str(exc)) from exc
        if data is None:
            data = {}
        if key is not None:
            if not isinstance(data, Mapping) or key not in data:
                raise ConfigError("key", key, f"a top-level key of {path}")
            data = data[key] or {}
        elif isinstance(data, Mapping) and list(data) == ["rankscope"]:
            data = data["rankscope"] or {}
        return cls.from_dict(data)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ProfileConfig:
        """Build from flags that `rankscope.add_arguments(parser)` added and the parser read.

        `--rankscope-config FILE` is read first, the flags given override it; a bad value
        raises ConfigError naming the flag. RANKSCOPE_* variables still win, when the
        Profiler applies them.
        """
        return config_from_args(args)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ProfileConfig:
        """The default config with the RANKSCOPE_* variables applied."""
        return cls().with_env(environ)

    def with_env(self, environ: Mapping[str, str] | None = None) -> ProfileConfig:
        """This config with the RANKSCOPE_* variables applied; the environment wins.

        A bad value raises ConfigError naming the variable.
        """
        overrides = _env.config_overrides(environ)
        if not overrides:
            return self
        data = self.to_dict()
        for override in overrides:
            node = data
            for key in override.path[:-1]:
                node = node[key]
            node[override.path[-1]] = override.value
        try:
            return ProfileConfig.from_dict(data)
        except ConfigError as exc:
            named = _env.name_variable(exc, overrides)
            if named is exc:
                raise
            raise named from None


def _trace_from_dict(data: object) -> TraceConfig:
    if isinstance(data, TraceConfig):
        return data
    kwargs = _section("trace", data, TraceConfig)
    for name, cls in (("schedule", Schedule), ("auto", AutoTrigger)):
        nested = kwargs.get(name)
        if isinstance(nested, Mapping):
            _check_keys(f"trace.{name}.", nested, cls)
            try:
                kwargs[name] = cls(**nested)
            except ConfigError as exc:
                raise exc.under("trace") from None
    return TraceConfig(**kwargs)


def _timer_from_dict(data: object) -> TimerConfig:
    if isinstance(data, TimerConfig):
        return data
    return TimerConfig(**_section("timer", data, TimerConfig))


def _section(name: str, data: object, cls: type) -> dict[str, Any]:
    """The fields of one nested block (`trace:`, `timer:`), checked to be a mapping of known keys."""
    if not isinstance(data, Mapping):
        raise ConfigError(name, data, f"a mapping of {cls.__name__} fields")
    _check_keys(f"{name}.", data, cls)
    return dict(data)


def _check_keys(prefix: str, data: Mapping[str, Any], cls: type) -> None:
    known = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in known:
            close = closest(str(key), known)
            problem = (
                "unknown field"
                if close is None
                else f"unknown field (did you mean {prefix}{close}?)"
            )
            raise ConfigError(
                f"{prefix}{key}", data[key], f"the fields {', '.join(known)}", problem
            )


def _resolve_output_dir(value: object) -> str:
    accepted = "a local directory path (str or os.PathLike)"
    if value is None or isinstance(value, bool) or not isinstance(value, (str, os.PathLike)):
        raise ConfigError("output_dir", value, accepted)
    text = os.fspath(value)
    if not isinstance(text, str) or not text.strip():
        raise ConfigError("output_dir", value, accepted)
    uri = _URI.match(text)
    if uri:
        scheme = uri.group(1).lower()
        why = (
            f"torch.profiler writes through the local filesystem and cannot write to {scheme}://; "
            "write to a local or mounted path and copy the run directory afterwards"
            if scheme in _CLOUD_SCHEMES
            else "a URI, not a path"
        )
        raise ConfigError("output_dir", text, accepted, why)
    try:
        path = Path(text).expanduser()
        resolved = path.resolve()
        probe = resolved
        while not probe.exists() and probe.parent != probe:
            probe = probe.parent
        is_dir = probe.is_dir()
    except (ValueError, RuntimeError, OSError) as exc:
        # A NUL byte, "~nosuchuser", a symlink loop, a path too long for the system.
        raise ConfigError("output_dir", text, accepted, f"not a usable path ({exc})") from None
    if not is_dir:
        raise ConfigError("output_dir", text, accepted, f"{probe} exists and is not a directory")
    if not path.is_absolute():
        logger.info("rankscope: output_dir %r resolved to %s", text, resolved)
    return str(resolved)


def config_fields() -> list[ConfigField]:
    """Every leaf field of ProfileConfig, depth first, in declaration order."""
    return leaf_fields(ProfileConfig)


def config_from_args(args: argparse.Namespace) -> ProfileConfig:
    """The config the parsed flags describe; ConfigError names the flag that was wrong."""
    path = getattr(args, CONFIG_DEST, None)
    given: dict[str, str] = {}
    values: dict[tuple[str, ...], Any] = {}
    for leaf in config_fields():
        # "none" is a value ("--rankscope-timer-end-step none" over a YAML end_step), so
        # a flag left out is told apart by the sentinel, not by None.
        value = getattr(args, dest(leaf), NOT_GIVEN)
        if value is NOT_GIVEN:
            continue
        values[leaf.path] = value
        given[leaf.name] = flag_name(leaf)
    try:
        if path is not None:
            base = ProfileConfig.from_yaml(path)
        elif ("output_dir",) in values:  # the default directory would be resolved (and logged)
            base = ProfileConfig(output_dir=values.pop(("output_dir",)))
        else:
            base = ProfileConfig()
        data = base.to_dict()
        for field_path, value in values.items():
            node = data
            for key in field_path[:-1]:
                node = node[key]
            node[field_path[-1]] = value
        return ProfileConfig.from_dict(data)
    except ConfigError as exc:
        flag = given.get(exc.field)
        if flag is None:
            raise
        raise ConfigError(flag, exc.value, exc.accepted, exc.problem) from None
