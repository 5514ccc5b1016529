"""TraceCapture: drives torch.profiler for one rank so that it cannot hurt the job."""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .._config import TraceConfig
from .._layout import (
    nsys_path,
    phase_window_name,
    step_window_name,
    summary_path,
    temp_name,
    trace_path,
)
from .._ranks import RankInfo
from .._torch import import_torch
from ._auto import SlowdownDetector, SlowSteps
from ._faults import OneFault
from ._finalize import FinalizeJob
from ._nsys import NsysWindows, NvtxRange, nsys_unavailable
from ._schedule import Action, AddedWindow, StepPlan, action_at
from ._trigger import (
    SignalHook,
    Trigger,
    TriggerWatcher,
    install_signal_hook,
    why_not_listening,
    write_ack,
)
from ._worker import TraceFinalizer

if TYPE_CHECKING:
    from ..timing import PhaseTimer

__all__ = ["AUTO_DIR", "MAX_BACKLOG", "STOP_TIMEOUT_S", "TraceCapture"]

logger = logging.getLogger(__name__)

_CYCLE_ENDS = (Action.NONE, Action.RECORD_AND_SAVE)

MAX_BACKLOG = 3
"""Windows waiting to be compressed, at most; a window that ends past it is not saved."""

_SIGNAL = "SIGUSR2"


@dataclass(frozen=True, slots=True)
class Asked:
    """Who asked for a window outside the schedule, and with what figures."""

    who: str
    """In words, for log lines: "trigger ID", "SIGUSR2", "slow steps"."""
    tag: str
    """What the window's directory name ends with: "trigger-ID", "sigusr2", "slow-steps"."""
    figures: dict[str, Any] = field(default_factory=dict)
    """What the window's summary records under "captured_because"."""
    trigger: Trigger | None = None


AUTO_DIR = "auto"
"""RUN_DIR/auto/rank-NNNNN.jsonl: one line per anomaly capture asked for, with its figures."""

STOP_TIMEOUT_S = 600.0
"""How long stop() waits for traces still being compressed before it returns anyway."""


class TraceCapture(OneFault):
    """torch.profiler windows on one rank: the schedule's, and those triggers ask for.

    Every call from the training loop is guarded: a fault inside torch.profiler or
    while writing logs one warning, stops the profiler, and leaves capture off for
    the rest of the run. Only the export of a window's raw JSON runs on the calling
    thread; the rest is the worker's (see TraceFinalizer).

    The schedule's windows run on ranks in `config.ranks`; every rank
    `config.involves` holds a capture. Every `trigger_check_every_n_steps` steps the
    capture looks for trigger files (see `_trigger`) and plans the windows they ask
    for; with `on_signal`, SIGUSR2 plans one on the next steps the same way, and with
    `auto.enable` so does a stretch of slow steps or slow phases (see `_auto`). Between
    windows no profiler is held, and one is started for an added window the step
    before it begins. With `tool="nsys"` an NsysWindows stands in for torch.profiler.
    """

    def __init__(self, config: TraceConfig, run_dir: str, rank_info: RankInfo) -> None:
        super().__init__()
        self._part = "trace capture"
        self._torch: ModuleType = import_torch("trace capture")
        self._config = config
        self._run_dir = run_dir
        self._rank = rank_info.rank
        self._target_phase = config.target_phase
        self._scheduled = rank_info.rank in config.rank_set
        # Resolved (and warned about) where windows are certain; elsewhere when one is asked for.
        self._activities: tuple[str, ...] | None = (
            self._resolve_activities() if self._scheduled else None
        )
        self._plan = StepPlan(config.schedule if self._scheduled else None)
        self._nsys = config.tool == "nsys"
        self.enabled = not self._nsys or self._nsys_usable()
        """False once a fault turned capture off (or nsys was asked for without CUDA)."""
        every = config.trigger_check_every_n_steps
        unheard = why_not_listening(config.enable, config.target, every)
        if not self.enabled:
            unheard = "capture is off"
        self._check_every = every if unheard is None else 0
        self._watcher = TriggerWatcher(run_dir, self._rank) if unheard is None else None
        self._asked: dict[AddedWindow, Asked] = {}  # who asked for each added window
        self._signal: SignalHook | None = None  # installed by start() with trace.on_signal
        self._finalizer = TraceFinalizer(self._report_failure)
        self._init_auto(config)
        self.on_window_closed: Callable[[str], None] | None = None
        """Called with a window's name on the training thread when it closes (memory snapshots)."""
        self._prof: Any = None
        self._step = 0
        self._wake_at = 0  # step() has nothing to do before this step (see _next_work)
        self._stopping = False
        self._phase_calls = 0
        self._windows = 0  # windows exported so far
        self._skipped = 0  # windows not saved because the worker fell behind
        self._owner = threading.get_ident()  # the thread that drives torch.profiler
        self._export_error: Exception | None = None  # raised inside torch's on_trace_ready
        self._phase_window: str | None = None  # the open window of a phase target
        self._phase_lock = threading.Lock()
        self._failure: str | None = None
        self.recording = False
        """True while a window records, so phases open record_function (or NVTX) ranges."""
        self.phase_target = self._target_phase is not None
        """Phases must reach phase_enter even while nothing records (a "phase:NAME" target)."""
        self.loop_raised = False
        """Set by the Profiler when the training loop's exception ends the run."""

    # -- lifecycle ---------------------------------------------------------------

    def _init_auto(self, config: TraceConfig) -> None:
        """The anomaly watch's state (trace.auto); its detectors stay None where it is off."""
        auto = config.auto
        use_auto = (
            self.enabled
            and auto.enable
            and self._target_phase is None
            and self._rank in auto.rank_set(config.ranks)
        )
        # Step times, measured here: one perf_counter a step.
        self._detector = SlowdownDetector(auto) if use_auto and auto.phase is None else None
        self._step_began = 0.0  # perf_counter when the current step began (auto only)
        # A phase's times, from the phase timer's records (attach_timer); see _observe_phase.
        self._phase_detector = SlowdownDetector(auto) if use_auto and auto.phase else None
        self._timer: PhaseTimer | None = None
        self._phase_step: int | None = None  # the step whose phase times are being summed
        self._phase_sum = 0.0
        self._profiled: deque[int] = deque(maxlen=256)  # recent steps a profiler ran in

    def _nsys_usable(self) -> bool:
        missing = nsys_unavailable(self._torch)
        if missing is None:
            return True
        logger.warning(
            "rankscope: trace.tool is 'nsys' but %s; no window is recorded on rank %d "
            "(timing and everything else go on)",
            missing,
            self._rank,
        )
        return False

    def attach_timer(self, timer: PhaseTimer | None) -> None:
        """The phase timer of this rank, whose records of trace.auto.phase feed the watch."""
        if self._phase_detector is None:
            return
        if timer is None:
            self._phase_detector = None
            logger.warning(
                "rankscope: trace.auto.phase is %r but the phase timer does not run on rank %d "
                "(not in timer.ranks, or timer off); this rank does not watch its phase times",
                self._config.auto.phase,
                self._rank,
            )
            return
        self._timer = timer
        timer.watch(self._config.auto.phase)

    def start(self) -> None:
        self._owner = threading.get_ident()
        self._step_began = time.perf_counter()
        if self._config.on_signal and self._target_phase is None:
            # Installed even where capture is off (nsys without CUDA): the promise was that
            # SIGUSR2 asks for a window, and its default action would end the process.
            self._signal = install_signal_hook(self._rank)
            if self._signal is not None:
                self._signal.wake = self._wake
        if self._target_phase is not None or not self._scheduled or not self.enabled:
            return  # phase windows start at their phase, added ones at their step
        if not self._nsys and self._other_profiler_active():
            return
        self._prof = self._new_profiler(step_target=True)
        if self._guarded("start", self._prof.start):
            self.recording = self._plan.action(0) is not Action.NONE

    def step(self) -> None:
        if self._step + 1 < self._wake_at:
            self._step += 1  # idle: no check, no window and no watch until then
            return
        detector = self._detector
        if detector is not None:
            try:
                self._observe(detector, time.perf_counter())
            except Exception as exc:
                self._detector = None  # a fault in the watch must not cost the run its windows
                self._watch_failed("step times", exc)
        if self._phase_detector is not None:
            try:
                self._observe_phase(self._phase_detector)
            except Exception as exc:
                self._stop_phase_watch()
                self._watch_failed(f"phase {self._config.auto.phase!r}", exc)
        self._step += 1
        if self._failure is not None:
            self.fault(self._failure)  # already warned on the worker thread
            return
        if self._target_phase is not None:
            return  # phase windows, which steps do not drive
        step = self._step
        prof = self._prof
        if prof is not None:
            if not self._on_owner_thread("step()") or not self._advance(prof, step):
                return
        elif not self.enabled:
            hook = self._signal
            if hook is not None and hook.pending:
                hook.pending = False
                logger.info(
                    "rankscope: SIGUSR2 received before step %d; no window on rank %d: capture "
                    "is off (%s)",
                    step,
                    self._rank,
                    self.fault_reason or "see the warning at start",
                )
            return
        check = self._check_every and step % self._check_every == 0
        hook = self._signal
        signalled = hook is not None and hook.pending
        if check or signalled:
            if prof is None and not self._on_owner_thread("step()"):
                return
            if check:
                self._check_triggers(step)
            if hook is not None and signalled:
                self._on_signal(hook, step)
        plan = self._plan
        plan.forget_before(step)
        if self._prof is not None:
            # Between windows: release the profiler so the steps until the next cost nothing.
            if plan.idle(step) and self._guarded("step", self._prof.stop):
                self._prof = None
        elif plan.next_added is not None and plan.next_added <= step + 1 and self.enabled:
            self._begin_triggered(step)
        if self._detector is not None:
            # Measured from here: rankscope's own work in step() (an export) is not the job's.
            self._step_began = time.perf_counter()
        self._wake_at = self._next_work(step)
        signal_hook = self._signal
        if signal_hook is not None and signal_hook.pending:
            self._wake_at = 0  # a signal that came during this step() must not wait for a check

    def _wake(self) -> None:
        """Make the next step() do its work (SIGUSR2 arrived: an assignment, safe in a handler)."""
        self._wake_at = 0

    def _next_work(self, step: int) -> int:
        """The next step whose step() has work to do, when every step until then is idle
        (no profiler held, nothing watched each step); 0 when the next one may. A signal
        resets it (`_wake`)."""
        plan = self._plan
        if (
            self._prof is not None
            or self._detector is not None
            or self._phase_detector is not None
            or not plan.schedule_over(step)
        ):
            return 0
        wake = sys.maxsize
        if self._check_every:
            wake = (step // self._check_every + 1) * self._check_every
        if plan.next_added is not None:
            wake = min(wake, plan.next_added - 1)
        return wake

    def _advance(self, prof: Any, step: int) -> bool:
        """torch.profiler's step(); False if it faulted (capture is off then)."""
        plan = self._plan
        action = plan.action(step)
        if action is not Action.NONE and plan.action(step - 1) in _CYCLE_ENDS:
            with warnings.catch_warnings():
                # Starting a second cycle, torch warns that key_averages() sees only the
                # last one; rankscope never calls key_averages(), so it would only alarm.
                warnings.filterwarnings("ignore", message="Warning: Profiler clears events")
                stepped = self._guarded("step", prof.step)
        else:
            stepped = self._guarded("step", prof.step)
        if stepped:
            self.recording = action is not Action.NONE
        return stepped

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Close and save an open window, then wait for the background work."""
        self._stopping = True
        self._release_signal()
        self._close_watcher()
        if self._prof is not None and self._on_owner_thread("stop()"):
            if self._phase_window is not None:
                self._guarded("stop", self._close_phase_window)
            elif self._guarded("stop", self._prof.stop):
                self._prof = None
        self.recording = False
        self._check_phase_watch()
        if self.enabled and self._windows == 0 and self._scheduled:
            logger.warning(
                "rankscope: trace capture is on but captured nothing: %s", self._why_empty()
            )
        for window in self._plan.added:
            if self._step >= window.first:
                continue
            asked = self._asked.get(window)
            if asked is not None:
                logger.warning(
                    "rankscope: %s asked rank %d for steps %d-%d; the run stopped at step %d",
                    asked.who,
                    self._rank,
                    window.first,
                    window.last,
                    self._step,
                )
        self._finalizer.drain(timeout)

    def _why_empty(self) -> str:
        """Why no window was recorded: config that silently did nothing is worth a line."""
        sched = self._config.schedule
        first_call = sched.skip_first + sched.wait + sched.warmup
        if self._target_phase is not None:
            return (
                f"phase {self._target_phase!r} was entered {self._phase_calls} time(s); "
                f"the schedule records invocation {first_call} first"
            )
        window = (
            f"the schedule's first window is steps {first_call}-{first_call + sched.active - 1}"
        )
        if self.loop_raised:
            return f"the training loop raised during step {self._step}; {window}"
        return f"stopped during step {self._step}; {window} (is step() called once per iteration?)"

    @property
    def last_summary(self) -> dict[str, Any] | None:
        return self._finalizer.last_summary

    # -- triggers ------------------------------------------------------------------

    def _check_triggers(self, step: int) -> None:
        """Answer the triggers that appeared since the last check (on the training thread)."""
        watcher = self._watcher
        if watcher is None:
            return
        try:
            for trigger in watcher.poll():
                self._answer(trigger, step)
        except Exception as exc:
            # The run directory went away or became unreadable: stop looking, keep training
            # and keep the windows already planned.
            self._check_every = 0
            self._close_watcher()
            logger.warning(
                "rankscope: checking %s for triggers failed (%s: %s); trigger checks are off "
                "for the rest of this run (rank %d), training goes on",
                Path(self._run_dir) / "triggers",
                type(exc).__name__,
                exc,
                self._rank,
            )

    def _close_watcher(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            try:
                watcher.close()
            except OSError:
                logger.debug("rankscope: closing RUN_DIR/triggers failed", exc_info=True)

    def _why_not(self, first: int, steps: int, step: int) -> str | None:
        """Why a window of `steps` steps from `first`, asked for during `step`, cannot be
        planned (a trigger's or a signal's: the same rules); None when it can."""
        cfg = self._config
        if steps > cfg.trigger_max_steps:
            return f"it asks for {steps} steps; trace.trigger_max_steps is {cfg.trigger_max_steps}"
        if first <= step:
            return f"seen at step {step}, too late for its start step {first}"
        return self._plan.conflict(first, first + steps - 1)

    def _answer(self, trigger: Trigger, step: int) -> None:
        """Plan the window `trigger` asks for, or decline it, and say which in its answer file."""
        cfg = self._config
        reason = self._why_not(trigger.start, trigger.steps, step)
        if reason is not None:
            logger.warning(
                "rankscope: trigger %s declined on rank %d: %s", trigger.id, self._rank, reason
            )
            answer: dict[str, Any] = {"status": "declined", "reason": reason}
        else:
            window = self._plan.add(
                trigger.start, trigger.last, warmup=cfg.schedule.warmup > 0, after=step
            )
            figures = {"by": "trigger", "trigger": trigger.id, "seen_at_step": step}
            if trigger.created is not None:
                figures["created"] = trigger.created
            self._asked[window] = Asked(
                f"trigger {trigger.id}", f"trigger-{trigger.id}", figures, trigger
            )
            logger.info(
                "rankscope: trigger %s: rank %d records steps %d-%d into traces/%s",
                trigger.id,
                self._rank,
                trigger.start,
                trigger.last,
                trigger.window,
            )
            answer = {
                "status": "accepted",
                "window": trigger.window,
                "first": window.first,
                "last": window.last,
                "warmup": window.warmup,
            }
        write_ack(self._run_dir, trigger, self._rank, {**answer, "seen_at_step": step})

    def _on_signal(self, hook: SignalHook, step: int) -> None:
        """SIGUSR2 arrived before `step`: plan a window on the next steps, as a trigger would.

        schedule.active steps (at most trigger_max_steps), after a warm-up step where
        the schedule has one; signals while that window is still ahead or recording add
        no other.
        """
        hook.pending = False  # first: a signal arriving while this runs is seen next step
        if not self.enabled:
            return
        ahead = [w for w, a in self._asked.items() if a.who == _SIGNAL and w.last >= step]
        if ahead:
            window = ahead[0]
            logger.info(
                "rankscope: SIGUSR2 received again before step %d on rank %d; the window it "
                "asked for (steps %d-%d) is not over yet, so this one adds none",
                step,
                self._rank,
                window.first,
                window.last,
            )
            return
        cfg = self._config
        warmup = cfg.schedule.warmup > 0
        first = step + 1 + int(warmup)
        steps = min(cfg.schedule.active, cfg.trigger_max_steps)
        reason = self._why_not(first, steps, step)
        if reason is not None:
            logger.warning(
                "rankscope: SIGUSR2 received before step %d; no window on rank %d: %s",
                step,
                self._rank,
                reason,
            )
            return
        window = self._plan.add(first, first + steps - 1, warmup=warmup, after=step)
        figures = {"by": "SIGUSR2", "received_before_step": step}
        self._asked[window] = Asked(_SIGNAL, "sigusr2", figures)
        logger.info(
            "rankscope: SIGUSR2 received before step %d: rank %d records steps %d-%d "
            "into traces/%s",
            step,
            self._rank,
            window.first,
            window.last,
            step_window_name(window.first, window.last, "sigusr2"),
        )

    # -- anomaly windows -----------------------------------------------------------

    def _observe(self, detector: SlowdownDetector, now: float) -> None:
        """Feed the time of the step ending now; plan a window when it ends a slow stretch."""
        step = self._step  # the step that just ended
        if self._was_profiled(step) or not self.enabled:
            # A profiled step is slow because it is profiled: not the job's own time.
            self._step_began = now
            return
        slow = detector.observe(step, now - self._step_began)
        if detector.exhausted and slow is None:
            self._detector = None  # nothing more to ask for: stop measuring
        if slow is not None:
            self._on_slow(slow, step + 1)

    def _was_profiled(self, step: int) -> bool:
        """True when a window recorded or warmed up during `step` (the step just ended).

        Between windows no profiler is held, so most steps cost one attribute check.
        """
        return self.recording or (
            self._prof is not None and self._plan.action(step) is not Action.NONE
        )

    def _observe_phase(self, detector: SlowdownDetector) -> None:
        """Feed the watched phase's times that the timer wrote since the last step.

        The timer writes a sampled step's records some steps later (at its flush, once
        the device has passed them); the times of one step are summed (a phase may run
        several times a step) and fed once a later step's arrive.
        """
        step = self._step  # the step that just ended
        if self._was_profiled(step):
            self._profiled.append(step)
        timer = self._timer
        if timer is None:
            return
        for sampled, seconds in timer.take_watched():
            if sampled == self._phase_step:
                self._phase_sum += seconds
                continue
            done, total = self._phase_step, self._phase_sum
            self._phase_step, self._phase_sum = sampled, seconds
            if done is None or done in self._profiled or not self.enabled:
                continue
            slow = detector.observe(done, total)
            if slow is not None:
                self._on_slow(slow, step + 1)
            if detector.exhausted:
                self._stop_phase_watch()
                return

    def _check_phase_watch(self) -> None:
        """At stop(): a watched phase that never got a timing record is config that did
        nothing (a misspelt name, a phase never entered, a timer past its end_step)."""
        timer = self._timer
        if self._phase_detector is None or timer is None:
            return
        if self._phase_step is None and not timer.take_watched():
            logger.warning(
                "rankscope: trace.auto.phase is %r but the phase timer recorded no phase of "
                "that name on rank %d in %d steps (is it entered, and spelt so?); its time "
                "was never watched",
                self._config.auto.phase,
                self._rank,
                self._step,
            )

    def _stop_phase_watch(self) -> None:
        self._phase_detector = None
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.watch(None)

    def _watch_failed(self, what: str, exc: Exception) -> None:
        logger.warning(
            "rankscope: watching %s failed (%s: %s); anomaly windows are off for the rest of "
            "this run (rank %d), training goes on",
            what,
            type(exc).__name__,
            exc,
            self._rank,
        )

    def _on_slow(self, slow: SlowSteps, step: int) -> None:
        """Plan `slow`'s window on the next steps, as SIGUSR2 would; record why, or why not."""
        cfg = self._config
        warmup = cfg.schedule.warmup > 0
        first = step + 1 + int(warmup)
        steps = cfg.auto.window_steps
        reason = self._why_not(first, steps, step)
        phase = cfg.auto.phase
        measured = "step" if phase is None else f"phase {phase}"
        slow_steps = list(slow.steps)
        record: dict[str, Any] = {
            "rank": self._rank,
            "capture": slow.capture,
            "seen_at_step": step,
            "measured": measured,
            "slow_steps": slow_steps,
            "step_s": [round(s, 6) for s in slow.seconds],
            "median_s": round(slow.median, 6),
            "ratio": slow.ratio,
        }
        what = "steps" if phase is None else f"phase {phase!r} on steps"
        if reason is not None:
            logger.warning(
                "rankscope: %s %s were slow on rank %d (%.4g s and more, median %.4g s); "
                "no window: %s",
                what,
                _steps_text(slow_steps),
                self._rank,
                min(slow.seconds),
                slow.median,
                reason,
            )
            record.update(status="declined", reason=reason)
        else:
            window = self._plan.add(first, first + steps - 1, warmup=warmup, after=step)
            tag = "slow-steps" if phase is None else f"slow-{phase}"
            name = step_window_name(window.first, window.last, tag)
            who = "slow steps" if phase is None else f"slow phase {phase!r}"
            figures = {k: v for k, v in record.items() if k not in ("rank", "capture")}
            self._asked[window] = Asked(who, tag, {"by": "auto", **figures})
            logger.info(
                "rankscope: %s %s were slow on rank %d (%.4g s and more, median %.4g s): "
                "recording steps %d-%d into traces/%s",
                what,
                _steps_text(slow_steps),
                self._rank,
                min(slow.seconds),
                slow.median,
                window.first,
                window.last,
                name,
            )
            record.update(status="accepted", window=name, first=window.first, last=window.last)
        self._write_auto(record)

    def _write_auto(self, record: dict[str, Any]) -> None:
        """Append one line to RUN_DIR/auto/rank-NNNNN.jsonl (at most max_captures per run)."""
        path = Path(self._run_dir) / AUTO_DIR / f"rank-{self._rank:05d}.jsonl"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as out:
                out.write(json.dumps(record) + "\n")
        except OSError as exc:
            logger.warning("rankscope: could not write %s (%s); the window is kept", path, exc)

    def _release_signal(self) -> None:
        """Put back the SIGUSR2 handler that start() found, if start() installed one."""
        hook, self._signal = self._signal, None
        if hook is None:
            return
        try:
            if not hook.release():
                logger.debug("rankscope: another SIGUSR2 handler replaced rankscope's; left alone")
        except Exception as exc:  # ValueError: stop() ran on a thread other than the main one
            logger.warning(
                "rankscope: could not put back the SIGUSR2 handler found at start() (%s); "
                "rankscope's stays installed on rank %d and only passes signals on to it",
                exc,
                self._rank,
            )

    def _begin_triggered(self, step: int) -> None:
        """Start a profiler during `step` for the added window that begins at the next step."""
        if not self._nsys and self._torch.autograd._profiler_enabled():
            # Kineto runs one profiler per process: never take over one the user started.
            self._drop_triggered(step, "another torch.profiler was running in this process")
            return
        made: list[Any] = []
        if not self._guarded("step", lambda: made.append(self._new_profiler(True, base=step))):
            return
        self._prof = made[0]
        if self._guarded("step", self._prof.start):
            self.recording = False

    def _drop_triggered(self, step: int, reason: str) -> None:
        """Give up the triggered windows that were to begin at the next step, and say why."""
        plan = self._plan
        for window in [w for w in plan.added if plan.next_added in (w.warmup, w.first)]:
            plan.drop(window, step)
            asked = self._asked.pop(window, None)
            logger.warning(
                "rankscope: the %s window (steps %d-%d) not captured on rank %d: %s",
                "added" if asked is None else asked.who,
                window.first,
                window.last,
                self._rank,
                reason,
            )
            trigger = None if asked is None else asked.trigger
            if trigger is None:
                continue
            try:
                write_ack(
                    self._run_dir,
                    trigger,
                    self._rank,
                    {"status": "declined", "reason": reason, "at_step": step},
                )
            except OSError:
                logger.debug(
                    "rankscope: rewriting the answer to %s failed", trigger.id, exc_info=True
                )

    # -- phases --------------------------------------------------------------------

    def phase_enter(self, name: str) -> tuple[Any, bool] | None:
        """Open what a phase needs: its own window for a "phase:NAME" target, and a
        record_function range while recording. Returns what phase_exit closes."""
        token: list[tuple[Any, bool] | None] = [None]

        def enter() -> None:
            owns_window = name == self._target_phase and self._open_phase_window(name)
            if self.recording:
                if self._nsys:
                    rf: Any = NvtxRange(self._torch.cuda.nvtx, name)
                else:
                    rf = self._torch.profiler.record_function(name)
                rf.__enter__()
                token[0] = (rf, owns_window)
            elif owns_window:
                token[0] = (None, True)

        self._guarded(f"phase {name!r}", enter)
        return token[0]

    def phase_exit(self, token: tuple[Any, bool]) -> None:
        rf, owns_window = token

        def leave() -> None:
            if rf is not None:
                rf.__exit__(None, None, None)
            if owns_window:
                self._close_phase_window()

        self._guarded("phase exit", leave)

    def _open_phase_window(self, name: str) -> bool:
        with self._phase_lock:
            if self._phase_window is not None or not self.enabled or self._stopping:
                return False  # a nested invocation belongs to the open window
            if not self._scheduled:
                return False  # a rank outside trace.ranks records only what triggers ask for
            if threading.get_ident() != self._owner:
                return False  # torch.profiler windows must open and close on one thread
            call = self._phase_calls
            self._phase_calls += 1
            if action_at(self._config.schedule, call) not in (
                Action.RECORD,
                Action.RECORD_AND_SAVE,
            ):
                return False
            prof = self._new_profiler(step_target=False)
            self._prof = prof
            self._phase_window = phase_window_name(name, call)
            prof.start()
            self.recording = True
            return True

    def _close_phase_window(self) -> None:
        """Stop and export the open phase window, if it is still open."""
        with self._phase_lock:
            window, prof = self._phase_window, self._prof
            if window is None or prof is None:
                return
            self.recording = False
            self._phase_window = None
            prof.stop()
            self._prof = None
            self._export(prof, window)

    # -- torch.profiler ----------------------------------------------------------

    def _new_profiler(self, step_target: bool, base: int | None = None) -> Any:
        """A torch.profiler.profile (an NsysWindows with tool="nsys"); with `base`, one made
        during step `base` that counts steps from there and records nothing before base + 1."""
        torch = self._torch
        cfg = self._config
        if self._nsys:
            plan, live = self._plan, 0 if base is None else base + 1
            windows = NsysWindows(
                torch,
                (lambda step: plan.action(step) if step >= live else Action.NONE)
                if step_target
                else None,
                self._on_trace_ready if step_target else None,
            )
            windows.step_num = self._step if base is None else base
            return windows
        if self._activities is None:
            self._activities = self._resolve_activities()
        kinds = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU"}
        activities = [getattr(torch.profiler.ProfilerActivity, kinds[a]) for a in self._activities]
        schedule = None
        on_ready = None
        if step_target:
            actions = {a: getattr(torch.profiler.ProfilerAction, a.name) for a in Action}
            plan = self._plan
            first_live = 0 if base is None else base + 1

            def schedule(step: int) -> Any:
                return actions[plan.action(step) if step >= first_live else Action.NONE]

            on_ready = self._on_trace_ready
        prof = torch.profiler.profile(
            activities=activities,
            schedule=schedule,
            on_trace_ready=on_ready,
            record_shapes=cfg.record_shapes,
            profile_memory=cfg.profile_memory,
            with_stack=cfg.with_stack,
            with_flops=cfg.with_flops,
            with_modules=cfg.with_modules,
        )
        if base is not None:
            # Count as the run does, so the trace's ProfilerStep#N is global step N.
            prof.step_num = base
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()) and hasattr(
            prof, "preset_metadata_json"
        ):
            # torch writes distributedInfo only for an initialised process group; a Ray
            # worker or a test that passed its rank explicitly gets it from us.
            info = {"rank": self._rank, "backend": None}
            prof.preset_metadata_json("distributedInfo", json.dumps(info))
        return prof

    def _on_trace_ready(self, prof: Any) -> None:
        # torch calls this inside prof.step() after counting the new step, or inside stop().
        # It must not raise into torch: torch is midway through its own list of actions,
        # and cutting that list short leaves a profiler that crashes when stopped.
        last = self._step if self._stopping else self._step - 1
        first = self._plan.window_start(last)
        asked = next((a for w, a in self._asked.items() if w.first == first), None)
        try:
            if asked is None:
                self._export(prof, step_window_name(first, last))
            else:
                self._export(prof, step_window_name(first, last, asked.tag), asked.figures)
        except Exception as exc:
            self._export_error = exc

    def _export(self, prof: Any, window: str, why: dict[str, Any] | None = None) -> None:
        """Export on the calling thread (torch.profiler's own cost), finalise in the background.

        `why`: who asked for the window and the figures that made them, for its summary.
        """
        try:
            if self._nsys:
                self._note_nsys_range(prof, window, why)
            else:
                self._export_trace(prof, window, why)
        finally:
            closed = self.on_window_closed
            if closed is not None:
                try:
                    closed(window)
                except Exception:  # its own faults are its own to report
                    logger.debug("rankscope: the window-closed hook failed", exc_info=True)

    def _note_nsys_range(self, prof: NsysWindows, window: str, why: dict[str, Any] | None) -> None:
        """RUN_DIR/nsys/<window>/rank-NNNNN.json: the steps and times a cudaProfilerApi range
        covered, so the report can say which nsys report holds which window."""
        path = nsys_path(self._run_dir, window, self._rank)
        # A step window is saved in the step() after its last step; a phase window, or one
        # that stop() cut short, during the step it ends in.
        last = self._step - 1 if prof.stepped and not self._stopping else self._step
        record = {
            "rank": self._rank,
            "window": window,
            "first": prof.first_step,
            "last": last,
            "start_ns": prof.start_ns,
            "end_ns": prof.end_ns,
            "pid": os.getpid(),
            "host": socket.gethostname(),
        }
        if why is not None:
            record["captured_because"] = why
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_name(path, str(os.getpid()))
        tmp.write_text(json.dumps(record, indent=1), encoding="utf-8")
        os.replace(tmp, path)
        self._windows += 1

    def _export_trace(self, prof: Any, window: str, why: dict[str, Any] | None) -> None:
        backlog = self._finalizer.backlog
        if backlog >= MAX_BACKLOG:
            _let_go(prof)
            # Windows end faster than they are saved (repeat=0 with short cycles and big
            # traces): queueing more would grow disk use and the wait at stop() without end.
            self._skipped += 1
            if self._skipped == 1:
                logger.warning(
                    "rankscope: trace window %s on rank %d not saved: %d earlier windows are "
                    "still being compressed (windows end faster than they can be saved; raise "
                    "schedule.wait or lower schedule.repeat); later windows are skipped the same way",
                    window,
                    self._rank,
                    backlog,
                )
            return
        cfg = self._config
        trace = trace_path(self._run_dir, window, self._rank, cfg.gzip)
        raw = temp_name(trace_path(self._run_dir, window, self._rank, False), f"raw-{os.getpid()}")
        raw.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(raw))
        _let_go(prof)
        if not raw.is_file() or raw.stat().st_size == 0:
            # Kineto logs a failed write and returns normally; a missing file is our signal.
            # It may leave its own partial file beside ours.
            for leftover in (raw, raw.with_name(raw.name + ".tmp")):
                leftover.unlink(missing_ok=True)
            raise OSError(f"torch.profiler exported nothing to {raw} (disk full or not writable?)")
        self._windows += 1
        self._finalizer.submit(
            FinalizeJob(
                raw=str(raw),
                trace=str(trace),
                summary=str(summary_path(self._run_dir, window, self._rank)),
                rank=self._rank,
                window=window,
                why=why,
            )
        )

    def _resolve_activities(self) -> tuple[str, ...]:
        requested = self._config.activities
        cuda = bool(self._torch.cuda.is_available())
        if requested is None:
            return ("cpu", "cuda") if cuda else ("cpu",)
        chosen = tuple(requested)
        if "cuda" in chosen and not cuda:
            logger.warning(
                "rankscope: trace.activities asks for cuda but CUDA is not available; "
                "capturing %s only",
                ", ".join(a for a in chosen if a != "cuda") or "cpu",
            )
            chosen = tuple(a for a in chosen if a != "cuda") or ("cpu",)
        return chosen

    # -- faults --------------------------------------------------------------------

    def _guarded(self, where: str, call: Any) -> bool:
        """Run a torch.profiler call; True if it and any export it triggered succeeded.

        A fault turns capture off. An interrupt (KeyboardInterrupt, SystemExit) leaves
        torch's half-switched state alone, stops collection, and propagates.
        """
        self._export_error = None
        try:
            call()
        except Exception as exc:
            self._fail(where, exc)
            return False
        except BaseException:
            self._drop()
            raise
        error = self._take_export_error()
        if error is not None:
            self._fail(where, error)
            return False
        return True

    def _take_export_error(self) -> Exception | None:
        error, self._export_error = self._export_error, None
        return error

    def _on_owner_thread(self, what: str) -> bool:
        """torch.profiler windows belong to the thread that opened them; from any other
        thread rankscope drops capture rather than touch the profiler."""
        if threading.get_ident() == self._owner:
            return True
        self._switch_off(f"{what} was called from another thread than start()")
        self.enabled = False
        self.recording = False
        self._prof = None  # touching it from this thread can crash the process
        return False

    def _other_profiler_active(self) -> bool:
        """Kineto runs one profiler per process: never take over one the user started."""
        if not self._torch.autograd._profiler_enabled():
            return False
        self._switch_off("another torch.profiler is already running in this process")
        self.enabled = False
        return True

    def _drop(self) -> None:
        """Forget the profiler without calling into its state machine; stop collection."""
        self.enabled = False
        self.recording = False
        self._phase_window = None
        prof, self._prof = self._prof, None
        if prof is not None:
            prof.on_trace_ready = None
            _let_go(prof)
            if isinstance(prof, NsysWindows):
                prof.abort()
        self._disable_autograd_profiler()

    def fault(self, what: str) -> None:
        """Turn capture off for the rest of the run: one warning naming `what`, profiler stopped."""
        self._switch_off(what)
        self.enabled = False
        self.recording = False
        self._failure = None
        prof, self._prof = self._prof, None
        self._abandon(prof)

    def _report_failure(self, cause: str) -> None:
        """Called by the worker thread; the training thread acts on it at its next step."""
        if self._switch_off(f"writing a trace failed ({cause})"):
            self._failure = cause

    def _fail(self, where: str, exc: BaseException) -> None:
        self.fault(f"trace capture failed in {where} ({type(exc).__name__}: {exc})")

    def _abandon(self, prof: Any) -> None:
        """Stop a profiler after a fault without exporting, so it cannot keep collecting."""
        if prof is None:
            return
        prof.on_trace_ready = None
        try:
            if isinstance(prof, NsysWindows):
                prof.abort()  # no synchronize: the device may be what failed
            else:
                prof.stop()
        except Exception:
            logger.debug("rankscope: stopping a faulty profiler failed", exc_info=True)
        _let_go(prof)
        self._disable_autograd_profiler()

    def _disable_autograd_profiler(self) -> None:
        """Switch off the profiler torch keeps on this thread, whatever state it is in."""
        autograd = self._torch.autograd
        try:
            if autograd._profiler_enabled():
                autograd._disable_profiler()
        except Exception:
            logger.debug("rankscope: disabling the autograd profiler failed", exc_info=True)


def _steps_text(steps: list[int]) -> str:
    """ "11-13" for a run of steps, "10, 20, 30" otherwise."""
    if steps == list(range(steps[0], steps[0] + len(steps))):
        return f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else str(steps[0])
    return ", ".join(map(str, steps))


def _let_go(prof: Any) -> None:
    """Drop the results a torch.profiler keeps after its window was exported.

    With record_shapes, with_stack or with_flops they hold a weak reference to every
    tensor an op received, and until the profile object is collected (a cyclic
    garbage-collector pass, whenever that comes) torch.utils.swap_tensors fails on
    those tensors: FSDP2 moving parameters, module.to() under swap-on-conversion.
    torch makes a new one at the next window's start.
    """
    if getattr(prof, "profiler", None) is not None:
        prof.profiler = None
