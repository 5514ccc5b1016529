"""TraceCapture: drives torch.profiler for one rank so that it cannot hurt the job.

The capture holds the lifecycle (start, step, stop, phases) and the profiler's state
machine; each other concern is an object of its own: the plan of windows and the one
door to it (`_requests`), who asks at run time (`_ondemand`), the anomaly detector
(`_anomaly`), making profilers (`_profile`) and saving windows (`_export`).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .._log import get_logger
from .._torch import import_torch
from ..config._ranks import RankInfo
from ..config._trace import TraceConfig
from ..rundir._layout import phase_window_name, step_window_name
from ..rundir._trigger import why_not_listening
from ._anomaly import AnomalyDetector
from ._export import MAX_BACKLOG, WindowExporter, let_go
from ._faults import OneFault
from ._nsys import NsysWindows, NvtxRange, nsys_unavailable
from ._ondemand import OnDemand
from ._profile import ProfilerMaker, abandon, disable_autograd_profiler
from ._requests import WindowRequests
from ._schedule import Action, StepPlan

if TYPE_CHECKING:
    from ..timing import PhaseTimer

__all__ = ["MAX_BACKLOG", "STOP_TIMEOUT_S", "TraceCapture"]

logger = get_logger(__name__)

_CYCLE_ENDS = (Action.NONE, Action.RECORD_AND_SAVE)

STOP_TIMEOUT_S = 600.0
"""How long stop() waits for traces still being compressed before it returns anyway."""


class TraceCapture(OneFault):
    """torch.profiler windows on one rank: the schedule's, and those asked for at run time.

    Every call from the training loop is guarded: a fault inside torch.profiler or
    while writing logs one warning, stops the profiler, and leaves capture off for
    the rest of the run. Only the export of a window's raw JSON runs on the calling
    thread; the rest is the finaliser's (see WindowExporter).

    The schedule's windows run on ranks in `config.ranks`; every rank
    `config.involves` holds a capture. Every `trigger_check_every_n_steps` steps the
    capture looks for trigger files and plans the windows they ask for; with
    `on_signal`, SIGUSR2 plans one on the next steps the same way, and with
    `auto.enable` so does a stretch of slow steps or slow phases. Between windows no
    profiler is held, and one is started for an added window the step before it
    begins. With `tool="nsys"` an NsysWindows stands in for torch.profiler.
    """

    def __init__(self, config: TraceConfig, run_dir: str, rank_info: RankInfo) -> None:
        super().__init__()
        self._part = "trace capture"
        self._torch: ModuleType = import_torch("trace capture")
        self._config = config
        self._rank = rank = rank_info.rank
        self._target_phase = config.target_phase
        self._scheduled = rank in config.rank_set
        self._plan = StepPlan(config.schedule if self._scheduled else None)
        self._nsys = config.tool == "nsys"
        self.enabled = not self._nsys or _nsys_usable(self._torch, rank)
        """False once a fault turned capture off (or nsys was asked for without CUDA)."""
        self._maker = ProfilerMaker(config, self._torch, rank, self._plan, self._scheduled)
        self._requests = WindowRequests(config, self._plan)
        every = config.trigger_check_every_n_steps
        unheard = why_not_listening(config.enable, config.target, every)
        if not self.enabled:
            unheard = "capture is off"
        self._asking = OnDemand(run_dir, rank, self._requests, every if unheard is None else 0)
        self._exporter = WindowExporter(run_dir, rank, config.gzip, self._report_failure)
        auto = config.auto
        detecting = (
            self.enabled
            and auto.enable
            and self._target_phase is None
            and rank in auto.rank_set(config.ranks)
        )
        self._anomaly: AnomalyDetector | None = AnomalyDetector(auto, rank) if detecting else None
        if self._anomaly is not None:
            self._asking.slow_itself = self._anomaly.slow_itself  # a slow peer declines
        self.on_window_closed: Callable[[str], None] | None = None
        """Called with a window's name on the training thread when it closes (memory snapshots)."""
        self._prof: Any = None
        self._step = 0
        self._wake_at = 0  # step() has nothing to do before this step (see _next_work)
        self._stopping = False
        self._resumed_past = False  # started (resumed) past the schedule's last window
        self._first_step = 0  # a window that began before it recorded from it on only
        self._phase_calls = 0
        self._owner = threading.get_ident()  # the thread that drives torch.profiler
        self._export_error: Exception | None = None  # raised inside torch's on_trace_ready
        self._phase_window: str | None = None  # the open window of a phase target or caller
        self._by_caller = config.target == "caller"  # windows where trace_window() says
        self._held_from: int | None = None  # the first step of the caller's open window
        self._phase_lock = threading.Lock()
        self._failure: str | None = None
        self.recording = False
        """True while a window records, so phases open record_function (or NVTX) ranges."""
        self.phase_target = self._target_phase is not None
        """Phases must reach phase_enter even while nothing records (a "phase:NAME" target)."""
        self.loop_raised = False
        """Set by the Profiler when the training loop's exception ends the run."""

    # -- lifecycle ---------------------------------------------------------------

    def attach_timer(self, timer: PhaseTimer | None) -> None:
        """The phase timer of this rank, whose records of trace.auto.phase feed the anomaly
        detector."""
        if self._anomaly is not None:
            self._anomaly.attach_timer(timer)
            if not self._anomaly.detecting:
                self._anomaly = None

    def start(self, first_step: int = 0) -> None:
        """Begin at `first_step`: a resumed job's global step (the schedule counts from 0)."""
        self._owner = threading.get_ident()
        self._step = self._first_step = first_step
        if self._anomaly is not None:
            self._anomaly.step_began = time.perf_counter()
        if self._config.on_signal and self._target_phase is None:
            # Installed even where capture is off (nsys without CUDA): the promise was that
            # SIGUSR2 asks for a window, and its default action would end the process.
            self._asking.listen_for_signal(self._wake)
        if self._target_phase is not None or self._by_caller:
            return  # phase windows start at their phase, a caller's where it says
        if not self._scheduled or not self.enabled:
            return  # added ones at their step
        if not self._nsys and self._other_profiler_active():
            return
        if self._plan.schedule_over(first_step):
            self._resumed_past = True
            logger.info(
                "rankscope: rank %d resumed at step %d, past the schedule's windows; "
                "windows come from triggers, signals and trace.auto only",
                self._rank,
                first_step,
            )
            return
        self._prof = self._maker.new(self._on_trace_ready, first_step)
        if self._guarded("start", self._prof.start):
            self.recording = self._plan.action(first_step) is not Action.NONE

    def step(self) -> None:
        if self._step + 1 < self._wake_at:
            self._step += 1  # idle: no trigger check, no window and no slow-step check until then
            return
        anomaly = self._anomaly
        if anomaly is not None:
            # Inline, not a method of its own: this runs every step of a detecting rank.
            # A step a window recorded or warmed up in is not fed (see AnomalyDetector).
            profiled = self.recording or (
                self._prof is not None and self._plan.action(self._step) is not Action.NONE
            )
            now = time.perf_counter() if anomaly.steps is not None else 0.0
            found = anomaly.observe(self._step, now, profiled, self.enabled)
            if found:
                auto = self._config.auto
                self._asking.on_slow_stretches(
                    anomaly, found, self._step + 1, auto.phase, auto.window_steps
                )
            if not anomaly.detecting:
                self._anomaly = None
        self._step += 1
        if self._failure is not None:
            self.fault(self._failure)  # already warned on the worker thread
            return
        if self._target_phase is not None or self._by_caller:
            return  # phase or caller windows, which steps do not drive
        step = self._step
        prof = self._prof
        asking = self._asking
        if prof is not None:
            if not self._on_owner_thread("step()") or not self._advance(prof, step):
                return
        elif not self.enabled:
            hook = asking.signal
            if hook is not None and hook.pending:
                asking.signal_ignored(hook, step, self.fault_reason or "see the warning at start")
            return
        check = asking.check_every and step % asking.check_every == 0
        hook = asking.signal
        signalled = hook is not None and hook.pending
        if check or signalled:
            if prof is None and not self._on_owner_thread("step()"):
                return
            if check:
                asking.check_triggers(step)
            if hook is not None and signalled:
                asking.on_signal(hook, step, self.enabled)
        plan = self._plan
        plan.forget_before(step)
        if self._prof is not None:
            # Between windows: release the profiler so the steps until the next cost nothing.
            if plan.idle(step) and self._guarded("step", self._prof.stop):
                self._prof = None
        elif plan.next_added is not None and plan.next_added <= step + 1 and self.enabled:
            self._begin_added(step)
        anomaly = self._anomaly
        if anomaly is not None and anomaly.steps is not None:
            # Measured from here: rankscope's own work in step() (an export) is not the job's.
            anomaly.step_began = time.perf_counter()
        # Until the next step with work, step() only counts (a signal resets it: _wake).
        idle = self._prof is None and self._anomaly is None
        self._wake_at = plan.next_work(step, asking.check_every) if idle else 0
        hook = asking.signal
        if hook is not None and hook.pending:
            self._wake_at = 0  # a signal that came during this step() must not wait for a check

    def _wake(self) -> None:
        """Make the next step() do its work (SIGUSR2 arrived: an assignment, safe in a handler)."""
        self._wake_at = 0

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
        self._asking.release_signal()
        self._asking.close_triggers()
        if self._prof is not None and self._on_owner_thread("stop()"):
            if self._phase_window is not None:
                self._guarded("stop", self.close_window)
            elif self._guarded("stop", self._prof.stop):
                self._prof = None
        self.recording = False
        if self._anomaly is not None:
            self._anomaly.stop(self._step)
        if (
            self.enabled
            and self._exporter.saved == 0
            and self._scheduled
            and not self._resumed_past
        ):
            logger.warning(
                "rankscope: trace capture is on but captured nothing: %s",
                _why_empty(self._config, self._phase_calls, self._step, self.loop_raised),
            )
        self._asking.missed(self._step)
        self._exporter.drain(timeout)

    @property
    def last_summary(self) -> dict[str, Any] | None:
        return self._exporter.last_summary

    def _begin_added(self, step: int) -> None:
        """Start a profiler during `step` for the added window that begins at the next step."""
        if not self._nsys and self._torch.autograd._profiler_enabled():
            # Kineto runs one profiler per process: never take over one the user started.
            reason = "another torch.profiler was running in this process"
            self._asking.dropped(self._requests.drop_next(step), step, reason)
            return
        made: list[Any] = []
        if not self._guarded(
            "step", lambda: made.append(self._maker.new(self._on_trace_ready, step, base=step))
        ):
            return
        self._prof = made[0]
        if self._guarded("step", self._prof.start):
            self.recording = False

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
                self.close_window()

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
            if not self._plan.records_invocation(call):
                return False
            prof = self._maker.new(None, self._step)
            self._prof = prof
            self._phase_window = phase_window_name(name, call)
            prof.start()
            self.recording = True
            return True

    def open_window(self, tag: str) -> str | None:
        """With trace.target "caller", record from now until close_window(): a window its
        caller opens and closes (on the thread that started the capture), named by its
        steps and `tag`. None where it opened; else why not (this rank is not in
        trace.ranks, capture is off, a window is open, another torch.profiler runs)."""
        with self._phase_lock:
            why = None
            if not self._by_caller:
                why = f'trace.target is {self._config.target!r}, not "caller"'
            elif not self._scheduled:
                why = f"rank {self._rank} is not in trace.ranks ({self._config.ranks})"
            elif not self.enabled or self._stopping:
                why = "capture is off"
            elif self._phase_window is not None:
                why = "a window is open"
            elif threading.get_ident() != self._owner:
                why = "torch.profiler windows open and close on the thread that started rankscope"
            elif not self._nsys and self._torch.autograd._profiler_enabled():
                why = "another torch.profiler is running in this process"
            if why is not None:
                return why
            made: list[Any] = []
            if not self._guarded(
                "trace_window", lambda: made.append(self._maker.new(None, self._step))
            ):
                return self.fault_reason or "capture failed"
            self._prof = made[0]
            if not self._guarded("trace_window", self._prof.start):
                return self.fault_reason or "capture failed"
            self._phase_window, self._held_from = tag, self._step
            self.recording = True
            return None

    def close_window(self) -> None:
        """Stop and export the open phase or caller window, if it is still open."""
        with self._phase_lock:
            window, prof = self._phase_window, self._prof
            if window is None or prof is None:
                return
            self.recording = False
            self._phase_window = None
            prof.stop()
            self._prof = None
            if self._held_from is not None:  # a caller's: its steps are known now
                window = step_window_name(self._held_from, self._step, window)
                self._held_from = None
            self._export(prof, window)

    # -- saving a window -----------------------------------------------------------

    def _on_trace_ready(self, prof: Any) -> None:
        # torch calls this inside prof.step() after counting the new step, or inside stop().
        # It must not raise into torch: torch is midway through its own list of actions,
        # and cutting that list short leaves a profiler that crashes when stopped.
        last = self._step if self._stopping else self._step - 1
        first = max(self._plan.window_start(last), self._first_step)
        asked = self._requests.by_first(first)
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
                # A step window is saved in the step() after its last step; a phase window,
                # or one that stop() cut short, during the step it ends in.
                last = self._step - 1 if prof.stepped and not self._stopping else self._step
                self._exporter.note_nsys_range(prof, window, last, why)
            else:
                self._exporter.export_trace(prof, window, why)
        finally:
            closed = self.on_window_closed
            if closed is not None:
                try:
                    closed(window)
                except Exception:  # its own faults are its own to report
                    logger.debug("rankscope: the window-closed hook failed", exc_info=True)

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
            self.fault(f"trace capture failed in {where} ({type(exc).__name__}: {exc})")
            return False
        except BaseException:
            self._drop()
            raise
        error = self._take_export_error()
        if error is not None:
            self.fault(f"trace capture failed in {where} ({type(error).__name__}: {error})")
            return False
        return True

    def _take_export_error(self) -> Exception | None:
        """The error on_trace_ready kept during the call (a method: read inline after the
        call, the attribute would still look None to the type checker)."""
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
            let_go(prof)
            if isinstance(prof, NsysWindows):
                prof.abort()
        disable_autograd_profiler(self._torch)

    def fault(self, what: str) -> None:
        """Turn capture off for the rest of the run: one warning naming `what`, profiler stopped."""
        self._switch_off(what)
        self.enabled = False
        self.recording = False
        self._failure = None
        prof, self._prof = self._prof, None
        abandon(prof, self._torch)

    def _report_failure(self, cause: str) -> None:
        """Called by the worker thread; the training thread acts on it at its next step."""
        if self._switch_off(f"writing a trace failed ({cause})"):
            self._failure = cause


def _why_empty(config: TraceConfig, phase_calls: int, step: int, loop_raised: bool) -> str:
    """Why no window was recorded by `step`: config that silently did nothing is worth a line."""
    sched = config.schedule
    first_call = sched.skip_first + sched.wait + sched.warmup
    if config.target == "caller":
        return f'trace.target is "caller" and no window was opened by step {step}'
    if config.target_phase is not None:
        return (
            f"phase {config.target_phase!r} was entered {phase_calls} time(s); "
            f"the schedule records invocation {first_call} first"
        )
    window = f"the schedule's first window is steps {first_call}-{first_call + sched.active - 1}"
    if loop_raised:
        return f"the training loop raised during step {step}; {window}"
    return f"stopped during step {step}; {window} (is step() called once per iteration?)"


def _nsys_usable(torch: ModuleType, rank: int) -> bool:
    missing = nsys_unavailable(torch)
    if missing is None:
        return True
    logger.warning(
        "rankscope: trace.tool is 'nsys' but %s; no window is recorded on rank %d "
        "(timing and everything else go on)",
        missing,
        rank,
    )
    return False
