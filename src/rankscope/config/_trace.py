"""The trace window's configuration: what records a window (torch.profiler or nsys),
when (a schedule, triggers, anomaly windows), checked at construction."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from .._errors import ConfigError
from .._log import get_logger
from ._checks import check_bool, check_int
from ._ranks import RankSet, RankSpec, parse_ranks

__all__ = ["ACTIVITIES", "TOOLS", "AutoTrigger", "Schedule", "TraceConfig"]

logger = get_logger(__name__)

ACTIVITIES = ("cpu", "cuda", "xpu")
"""Activity names `TraceConfig.activities` accepts (torch.profiler.ProfilerActivity members)."""

TOOLS = ("torch", "nsys")
"""What records a window (`TraceConfig.tool`)."""

# TraceConfig fields that only torch.profiler reads: with tool="nsys" they would do nothing.
_TORCH_ONLY = ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")


@dataclass(frozen=True, kw_only=True, slots=True)
class Schedule:
    """Which steps a trace window covers, with torch.profiler.schedule's exact semantics.

    Steps count from 0. After `skip_first` steps the cycle wait -> warmup -> active
    repeats `repeat` times; the `active` steps of each cycle are one window.
    """

    skip_first: int = 0
    """Steps to skip once, before the first cycle (let compilation and warm caches settle)."""
    wait: int = 0
    """Steps at the start of every cycle with the profiler idle."""
    warmup: int = 1
    """Steps profiled and thrown away before recording, so start-up cost does not skew the window."""
    active: int = 1
    """Steps recorded per window (>= 1). Trace size and host memory grow with it."""
    repeat: int = 1
    """Number of cycles (windows); 0 means keep cycling until the profiler stops."""

    def __post_init__(self) -> None:
        for name in ("skip_first", "wait", "warmup", "repeat"):
            check_int(f"schedule.{name}", getattr(self, name), 0)
        check_int("schedule.active", self.active, 1)


@dataclass(frozen=True, kw_only=True, slots=True)
class AutoTrigger:
    """Capture a window when this rank's own steps turn slow (anomaly-triggered windows).

    The measurement is the wall-clock time between step() calls, taken by the capture
    itself (one perf_counter per step; nothing at all when disabled). Each rank compares
    itself with its own rolling median, so no collective call is needed.
    """

    enable: bool = False
    """Watch step times and capture a window after a slow stretch. Off by default."""
    ratio: float = 1.5
    """A step is slow when it takes more than ratio x the rolling median (> 1)."""
    consecutive: int = 3
    """Slow steps in a row that fire a capture, so one hiccup (GC, a checkpoint) does not."""
    window_steps: int = 2
    """Steps recorded per anomaly window (at most trace.trigger_max_steps)."""
    history_steps: int = 50
    """Step times the rolling median is taken over (>= 3)."""
    warmup_steps: int = 20
    """Step times measured before any can count as slow (>= 3; start-up and compilation are slow)."""
    max_captures: int = 3
    """Anomaly windows per run on this rank, at most, so a job slow everywhere cannot trace forever."""
    cooldown_steps: int = 200
    """Steps after a capture fired during which no other fires."""
    phase: str | None = None
    """Measure this phase instead of the whole step: its time on the phase timer's sampled steps
    (device time where CUDA is in use, else host time), summed over the step. A rank slow in its
    own compute fires; ranks that only wait for it in a "comm" phase do not. Needs the timer on
    the detecting ranks; warmup_steps, history_steps and consecutive then count sampled steps."""
    ranks: RankSpec | None = None
    """Ranks that watch themselves, in the forms of TraceConfig.ranks; None means trace.ranks.
    "all" lets whichever rank turns slow capture itself (pair it with `phase`, or every rank
    that waits for the slow one fires too)."""

    def __post_init__(self) -> None:
        check_bool("auto.enable", self.enable)
        ratio = self.ratio
        if (
            isinstance(ratio, bool)
            or not isinstance(ratio, (int, float))
            or not math.isfinite(ratio)
            or ratio <= 1
        ):
            raise ConfigError("auto.ratio", ratio, "a finite number > 1")
        object.__setattr__(self, "ratio", float(ratio))
        check_int("auto.consecutive", self.consecutive, 1)
        check_int("auto.window_steps", self.window_steps, 1)
        check_int("auto.history_steps", self.history_steps, 3)
        check_int("auto.warmup_steps", self.warmup_steps, 3)
        check_int("auto.max_captures", self.max_captures, 1)
        check_int("auto.cooldown_steps", self.cooldown_steps, 0)
        phase = self.phase
        if phase is not None and (not isinstance(phase, str) or not phase.strip()):
            raise ConfigError("auto.phase", phase, "None or a phase name")
        if self.ranks is not None:
            object.__setattr__(self, "ranks", parse_ranks(self.ranks, "auto.ranks").spec())

    def rank_set(self, trace_ranks: RankSpec) -> RankSet:
        """The ranks that watch themselves (`ranks`, or `trace_ranks` where it is None)."""
        if self.ranks is None:
            return parse_ranks(trace_ranks, "trace.ranks")
        return parse_ranks(self.ranks, "auto.ranks")


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceConfig:
    """torch.profiler trace capture: on which ranks, for which steps, recording what."""

    enable: bool = False
    """Capture traces at all. Off by default; RANKSCOPE_TRACE=1 turns it on."""
    ranks: RankSpec = "0"
    """Ranks that capture: 0, "0,8,16", "0-7", "0-7,16", "all" or [0, 8]. Kept in canonical form ("0-7,16")."""
    schedule: Schedule = field(default_factory=Schedule)
    """Which steps (or phase invocations) are recorded; see Schedule."""
    target: str = "step"
    """What the schedule counts: "step" counts step() calls; "phase:NAME" counts invocations of phase NAME
    and records only inside them, each recorded invocation its own window; "caller": no schedule,
    windows open and close where the code says (Profiler.trace_window), as a framework that picks
    its own profiled steps does (verl's start_profile and stop_profile)."""
    activities: Sequence[str] | None = None
    """Profiler activities from ACTIVITIES; None means cpu, plus cuda where CUDA is available."""
    tool: str = "torch"
    """What records a window: "torch" writes a torch.profiler (Kineto) trace per window;
    "nsys" calls cudaProfilerStart/Stop at the window's edges and opens NVTX ranges for
    steps and phases inside it, for a job run under `nsys profile --capture-range=cudaProfilerApi`
    (docs/nsys.md). The torch.profiler options below do not apply to "nsys"."""
    record_shapes: bool = False
    """Record input shapes of ops. Costs host memory per op; off by default."""
    profile_memory: bool = False
    """Track tensor allocations. Costs host memory per allocation; off by default."""
    with_stack: bool = False
    """Record Python stacks per op. The main cause of host OOM in long windows; off by default."""
    with_flops: bool = False
    """Estimate FLOPs of matmul and conv ops (implies shape recording for them); off by default."""
    with_modules: bool = False
    """Record the nn.Module hierarchy of ops (TorchScript only in most torch versions); off by default."""
    gzip: bool = True
    """Write traces as .json.gz (compressed in the background, never on the training thread)."""
    trigger_check_every_n_steps: int = 10
    """Look for on-demand windows (`rankscope trigger`) every this many steps: one stat of
    RUN_DIR/triggers, and a scan of it only when it changed. 0 turns triggers off."""
    trigger_max_steps: int = 5
    """The most steps one trigger may record; a trigger asking for more is declined. Bounds
    the size of a triggered window's trace, as schedule.active does for scheduled ones."""
    trigger_max_windows: int = 10
    """On-demand windows (triggers and SIGUSR2) per run on this rank, at most: a request past
    it is declined and answered so, and the rank warns once. Bounds what repeated requests
    cost a job, as auto.max_captures does for anomaly windows."""
    on_signal: bool = False
    """Capture a window when the process receives SIGUSR2 (`kill -USR2 PID`): schedule.active steps
    (at most trigger_max_steps) from the next step that can start one. The handler is installed by
    start() on the main thread and the previous one put back by stop(). Needs target "step"."""
    auto: AutoTrigger = field(default_factory=AutoTrigger)
    """Anomaly-triggered windows: capture when this rank's step times exceed its own rolling
    median; see AutoTrigger. Needs target "step"."""

    def __post_init__(self) -> None:
        check_bool("trace.enable", self.enable)
        object.__setattr__(self, "ranks", self.rank_set.spec())
        if not isinstance(self.schedule, Schedule):
            raise ConfigError("trace.schedule", self.schedule, "a Schedule")
        if not isinstance(self.target, str) or not (
            self.target in ("step", "caller")
            or (self.target.startswith("phase:") and self.target[6:].strip())
        ):
            raise ConfigError("trace.target", self.target, '"step", "phase:NAME" or "caller"')
        if self.activities is not None:
            object.__setattr__(self, "activities", _parse_activities(self.activities))
        for name in _TORCH_ONLY:
            check_bool(f"trace.{name}", getattr(self, name))
        if self.tool not in TOOLS:
            raise ConfigError("trace.tool", self.tool, " or ".join(repr(t) for t in TOOLS))
        if self.tool == "nsys":
            _check_nsys_options(self)
        check_bool("trace.gzip", self.gzip)
        check_int("trace.trigger_check_every_n_steps", self.trigger_check_every_n_steps, 0)
        check_int("trace.trigger_max_steps", self.trigger_max_steps, 1)
        check_int("trace.trigger_max_windows", self.trigger_max_windows, 1)
        check_bool("trace.on_signal", self.on_signal)
        if self.on_signal and self.target != "step":
            raise ConfigError(
                "trace.on_signal",
                self.on_signal,
                'False, or True with trace.target="step"',
                f"a SIGUSR2 window records steps, and trace.target is {self.target!r}",
            )
        if not isinstance(self.auto, AutoTrigger):
            raise ConfigError("trace.auto", self.auto, "an AutoTrigger")
        if self.auto.enable and self.target != "step":
            raise ConfigError(
                "trace.auto.enable",
                True,
                'False, or True with trace.target="step"',
                f"an anomaly window records steps, and trace.target is {self.target!r}",
            )
        if self.auto.enable and self.auto.window_steps > self.trigger_max_steps:
            raise ConfigError(
                "trace.auto.window_steps",
                self.auto.window_steps,
                f"an int <= trace.trigger_max_steps ({self.trigger_max_steps})",
            )

    @property
    def rank_set(self) -> RankSet:
        """The parsed `ranks`."""
        return parse_ranks(self.ranks, "trace.ranks")

    def involves(self, rank: int) -> bool:
        """True when rank `rank` needs a capture: it is in `ranks`, or it may be asked for
        a window (a trigger, SIGUSR2 or its own slow steps), which targets "step" allow."""
        if not self.enable:
            return False
        if rank in self.rank_set:
            return True
        if self.target != "step":
            return False
        auto = self.auto.enable and rank in self.auto.rank_set(self.ranks)
        return self.trigger_check_every_n_steps > 0 or self.on_signal or auto

    @property
    def target_phase(self) -> str | None:
        """NAME for a "phase:NAME" target, None for "step"."""
        return self.target[6:].strip() if self.target.startswith("phase:") else None


def _check_nsys_options(trace: TraceConfig) -> None:
    """With tool="nsys", a torch.profiler option would silently do nothing: say so instead."""
    why = "it is a torch.profiler option; with trace.tool='nsys', nsys's own flags choose what is recorded"
    for name in _TORCH_ONLY:
        if getattr(trace, name):
            raise ConfigError(f"trace.{name}", True, "False with trace.tool='nsys'", why)
    if trace.activities is not None:
        raise ConfigError(
            "trace.activities", list(trace.activities), "None with trace.tool='nsys'", why
        )
    if not trace.gzip:
        raise ConfigError(
            "trace.gzip", False, "True with trace.tool='nsys'", "nsys writes its own reports"
        )


def _parse_activities(value: object) -> tuple[str, ...]:
    accepted = f"a non-empty list drawn from {', '.join(ACTIVITIES)} (or None for the default)"
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, Sequence) or not items:
        raise ConfigError("trace.activities", value, accepted)
    out: list[str] = []
    for item in items:
        name = item.strip().lower() if isinstance(item, str) else item
        if name not in ACTIVITIES:
            raise ConfigError("trace.activities", value, accepted, f"unknown activity {item!r}")
        if name not in out:
            out.append(name)
    return tuple(out)
