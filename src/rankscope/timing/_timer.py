"""PhaseTimer: host and device time per phase on sampled steps, appended to one JSONL file per rank."""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
import time
from types import ModuleType
from typing import Any

from .._log import get_logger
from .._torch import import_torch
from ..config._config import TimerConfig
from ..config._ranks import RankInfo
from ..rundir._attempt import current_attempt
from ..rundir._files import open_append, write_all
from ..rundir._layout import timing_path
from ._clock import CudaEventClock, DeviceClock
from ._collectives import CollectiveCount
from ._device_writer import FLUSH_RECORDS as _FLUSH_RECORDS
from ._device_writer import DeviceTimeWriter, Ready
from ._health import GpuSource, HealthSampler, gpu_source
from ._record import STEP_PHASE, Span, format_attempt, format_record, meta_json, safe_str
from ._runqueue import RunQueueWait
from ._sampling import is_sampled

__all__ = ["AUTO", "PhaseTimer"]

logger = get_logger(__name__)

AUTO: Any = object()
"""`clock=AUTO`: CUDA events where CUDA is available, else no device clock."""

_STOP_TIMEOUT_S = 30.0  # how long stop() waits for the background writer (a stuck disk)
_HEALTH_STOP_S = 5.0  # and for the health sampler: a stuck NVML call holds no record back


_NO_WAIT_NS = 20_000
"""A span off the CPU for less than this has waited for one no longer: its wait is said as
0 without a second read of the counter (about 1 us)."""


class PhaseTimer:
    """Times phases on one rank; every method is safe to call from the training loop.

    Device time comes from marks on the current stream (CUDA events) that are read only
    at flush points and only once the device has passed them, so the training thread
    never waits for the GPU except once, at stop(). With a device clock, the training
    thread makes the two marks of each phase and no other device call: at a flush point
    it hands the finished spans to a DeviceTimeWriter, whose thread reads their device
    times, formats and writes them. Without one it formats and writes at the flush point
    itself. A fault (the file cannot be written, the device clock raises) logs one
    warning and turns the timer off; training goes on.
    """

    def __init__(
        self,
        config: TimerConfig,
        run_dir: str,
        rank_info: RankInfo,
        clock: DeviceClock | None = AUTO,
        gpu: GpuSource | None = AUTO,
    ) -> None:
        """`gpu`: whose health to sample at sampled steps (timing/_health.py); AUTO: this
        rank's CUDA device through pynvml, where both are at hand; None: none."""
        torch: ModuleType = import_torch("the phase timer")
        self._config = config
        self._rank = rank_info.rank
        self._host = rank_info.host
        self._world = rank_info.world_size
        self._run_dir = run_dir
        self.path = timing_path(run_dir, rank_info.rank)
        """Where this rank's records go: RUN_DIR/timings/rank-NNNNN.jsonl."""
        cuda = torch.cuda.is_available()
        if clock is AUTO:
            clock = CudaEventClock(torch) if cuda else None
        self._clock: DeviceClock | None = clock
        # Which GPU is this rank's is asked at start(): a job may pick its device after
        # making its Profiler (torch.cuda.set_device(local_rank)), and until then every
        # rank's current device is 0.
        self._gpu: Any = gpu if config.health else None
        self._torch = torch
        self._health: HealthSampler | None = None  # between start() and stop()
        # NVTX ranges of the same names, for Nsight Systems; free when no tool listens.
        self._nvtx: Any = torch.cuda.nvtx if cuda else None
        self._profiler_enabled = torch.autograd._profiler_enabled
        self._record_function = torch.profiler.record_function
        self._collectives = CollectiveCount(torch)
        self._runq: RunQueueWait | None = None  # opened by start(), on the thread that times
        # The depth of the next phase, per thread and per asyncio task: coroutines that
        # run interleaved on one thread must not see each other's nesting.
        self._depth: contextvars.ContextVar[int] = contextvars.ContextVar(
            "rankscope_depth", default=0
        )
        self._owner = threading.get_ident()
        # A record's start is wall time (hosts' records are lined up by it) read off the
        # monotonic clock its duration is measured on: one clock, so a phase nested in
        # another ends inside it even where the wall clock is stepped (NTP, a VM resumed)
        # between the two. The wall clock is read once, here.
        self._wall0 = time.time_ns()
        self._perf0 = time.perf_counter_ns()
        self._lock = threading.Lock()  # guards the spans below, which phases on any thread add to
        self._write_lock = threading.Lock()  # one flush writes at a time
        self._ready: Ready = []  # finished without device marks, waiting to be written
        self._pending: list[Span] = []  # finished with device marks, not handed over yet
        self._writer: DeviceTimeWriter | None = None  # with a clock, between start() and stop()
        self._step = 0
        self._sampled: int | None = None  # the current step while it is sampled, else None
        self._step_span: Span | None = None
        self._file: Any = None
        # Opens every write (_write), so a start that records nothing adds nothing.
        self._opening = self._attempt_line()
        self._end: int | None = None  # the file's size after our last write
        self._shared = False  # another process was seen appending (said once)
        self._followed_phase: str | None = None  # the phase whose times `take_followed` hands out
        self._followed: list[tuple[int, float]] = []
        self._warned = False
        self.fault_reason: str | None = None
        """Why a fault turned the timer off (None: it did not)."""
        self.enabled = False
        """True between a successful start() and stop(), unless a fault turned the timer off."""
        self.flushes = 0
        """How many times the records were handed to be written (metrics()'s reader reads
        the file again after one)."""

    # -- lifecycle (training thread) ---------------------------------------------

    def start(self, first_step: int = 0) -> bool:
        """Open the file and begin `first_step` (a resumed job's global step, else 0).
        Returns whether that step is sampled."""
        self._owner = threading.get_ident()
        try:
            # Never through a link: the file stays under RUN_DIR (see _files).
            self._file = open_append(self._run_dir, self.path)
            self._end_torn_line()
            self._end = os.fstat(self._file.fileno()).st_size
            self._runq = RunQueueWait()
        except OSError as exc:
            self.fault(f"cannot open {self.path} ({exc.strerror or exc})")
            return False
        if self._clock is not None:
            self._writer = DeviceTimeWriter(
                self._clock, self._config.max_pending_events, self._write_ready, self.fault
            )
        self.enabled = True
        try:
            gpu = self._gpu
            if gpu is AUTO:
                gpu = self._gpu = gpu_source(self._torch)
            if gpu is not None and not isinstance(gpu, str):
                self._health = HealthSampler(
                    gpu, self._run_dir, self._rank, self._host, self._config.health_every_s
                )
                self._health.start()
        except Exception as exc:  # health is extra: the timer goes on without it
            gpu, self._health = f"it cannot start ({type(exc).__name__}: {exc})", None
        if isinstance(gpu, str):
            logger.info("rankscope: no GPU health on rank %d: %s", self._rank, gpu)
            self._gpu = None  # said once
        return self._begin_step(first_step)

    def step(self) -> bool:
        """End the current step and begin the next. Returns whether the new step is sampled."""
        if not self.enabled:
            return False
        try:
            span = self._step_span
            if span is not None:
                self._step_span = None
                self._finish(span, error=False)
            step = self._step + 1
            if step % self._config.flush_every_n_steps == 0 or len(self._ready) >= _FLUSH_RECORDS:
                self._flush()
            return self._begin_step(step)
        except Exception as exc:
            self.fault(f"step {self._step + 1} failed", exc)
            return False

    def stop(self) -> None:
        """Resolve every device time (one synchronize), write everything, close the file,
        and end the background writer."""
        writer = self._writer
        if not self.enabled:
            if writer is not None:  # a fault abandoned it; it ends on its own, promptly
                writer.close(0.5)
            return
        try:
            span, self._step_span = self._step_span, None
            if writer is not None and span is not None and span.dev_start is not None:
                writer.discard(span.dev_start)  # a step cut short by stop() is not a step
            clock = self._clock
            if writer is not None and clock is not None and self.pending:
                clock.synchronize()
            self._flush()
            self._stop_health()
            if writer is not None and not writer.close(_STOP_TIMEOUT_S):
                self.fault(f"the background writer did not finish within {_STOP_TIMEOUT_S:.0f} s")
                return
        except Exception as exc:
            self.fault("stop() failed to write the last records", exc)
            return
        self.enabled = False
        self._sampled = None
        self._close()

    # -- phases (any thread) -------------------------------------------------------

    def enter(self, name: str, kind: str, meta: dict[str, Any] | None, ranged: bool) -> Span | None:
        """Open a span for a phase on a sampled step. `ranged`: the capture already opened a
        range of this name (record_function or NVTX), so the timer opens neither."""
        step = self._sampled  # read once: step() may move on while this thread runs
        if step is None or not self.enabled:
            return None
        try:
            depth = self._depth.get()
            ident = threading.get_ident()
            thread = None if ident == self._owner else threading.current_thread().name
            span = Span(step, safe_str(name), safe_str(kind), None, depth, thread)
            span.raw_meta = meta
            if not ranged and self._profiler_enabled():
                # Someone's torch.profiler is running: give it a range of the same name.
                span.range = self._record_function(span.phase)
                span.range.__enter__()
            if self._nvtx is not None and not ranged:
                span.nvtx = self._nvtx.range_start(span.phase)
            if self._clock is not None:
                span.dev_start = self._clock.mark()
            issued = self._collectives.now()
            if issued is not None:
                span.coll = issued
            self._depth.set(depth + 1)
            span.ident = ident
            runq = self._runq
            if thread is None and runq is not None and runq.fd >= 0:
                span.q0 = runq.now()
            span.c0 = time.thread_time_ns()
            span.t0 = time.perf_counter_ns()
            span.start_ns = self._wall0 + (span.t0 - self._perf0)
            return span
        except Exception as exc:
            self.fault(f"phase {name!r} failed to start", exc)
            return None

    def exit(self, span: Span, error: bool) -> None:
        """Close a span from enter(); `error` says the phase raised."""
        t1 = time.perf_counter_ns()
        c1 = time.thread_time_ns()
        try:
            span.cpu_ns = t1 - span.t0
            if threading.get_ident() == span.ident:
                span.oncpu_ns = max(0, c1 - span.c0)
                self._waited(span)
            span.error = error
            if span.coll >= 0:
                issued = self._collectives.now()
                span.coll = -1 if issued is None else max(0, issued - span.coll)
            if self._clock is not None and span.dev_start is not None and self.enabled:
                span.dev_end = self._clock.mark()
            if span.nvtx is not None:
                self._nvtx.range_end(span.nvtx)
                span.nvtx = None
            if span.range is not None:
                span.range.__exit__(None, None, None)
                span.range = None
            self._depth.set(span.depth)
            if self.enabled:
                span.meta = meta_json(span.raw_meta)
                span.raw_meta = None
                if self._queue(span):
                    self._flush()
        except Exception as exc:
            self.fault(f"phase {span.phase!r} failed to end", exc)

    # -- a followed phase (trace.auto.phase) ------------------------------------------

    def follow(self, phase: str | None) -> None:
        """Keep each record of `phase` for `take_followed` (None: stop keeping them)."""
        self._followed_phase = None if phase is None else safe_str(phase)
        if phase is None:
            with self._lock:
                self._followed = []

    def take_followed(self) -> list[tuple[int, float]]:
        """(step, seconds) of each record of the followed phase written since the last call,
        in the order written: device time where there is one, else host time."""
        if not self._followed:
            return []
        with self._lock:
            out, self._followed = self._followed, []
        return out

    # -- faults --------------------------------------------------------------------

    def fault(self, what: str, exc: BaseException | None = None) -> None:
        """Log one warning and turn the timer off for the rest of the run."""
        self.enabled = False
        self._sampled = None
        if not self._warned:
            self._warned = True
            cause = f": {type(exc).__name__}: {exc}" if exc is not None else ""
            self.fault_reason = what + cause
            logger.warning(
                "rankscope: phase timer off for the rest of the run on rank %d: %s%s",
                self._rank,
                what,
                cause,
            )
        with self._lock:
            self._ready.clear()
            self._pending.clear()
        if self._writer is not None:
            self._writer.abandon()
        self._stop_health(wait=False)
        self._close()

    # -- GPU health (timing/_health.py) --------------------------------------------

    def _stop_health(self, wait: bool = True) -> None:
        health, self._health = self._health, None
        if health is None:
            return
        if not wait:
            health.abandon()
        elif not health.close(_HEALTH_STOP_S):
            logger.warning(
                "rankscope: the GPU health sampler did not end within %.0f s (NVML stuck?); "
                "left behind",
                _HEALTH_STOP_S,
            )

    # -- inside --------------------------------------------------------------------

    def _begin_step(self, step: int) -> bool:
        self._step = step
        if not is_sampled(self._config, step):
            self._sampled = None
            return False
        self._sampled = step
        if self._health is not None:
            self._health.at(step)
        span = Span(step, STEP_PHASE, STEP_PHASE, None, 0, None)
        if self._clock is not None:
            span.dev_start = self._clock.mark()
        span.ident = threading.get_ident()
        runq = self._runq
        if runq is not None and runq.fd >= 0 and span.ident == self._owner:
            span.q0 = runq.now()
        span.c0 = time.thread_time_ns()
        span.t0 = time.perf_counter_ns()
        span.start_ns = self._wall0 + (span.t0 - self._perf0)
        self._step_span = span
        return True

    def _finish(self, span: Span, error: bool) -> None:
        span.cpu_ns = time.perf_counter_ns() - span.t0
        if threading.get_ident() == span.ident:
            span.oncpu_ns = max(0, time.thread_time_ns() - span.c0)
            self._waited(span)
        span.error = error
        if self._clock is not None and span.dev_start is not None:
            span.dev_end = self._clock.mark()
        self._queue(span)

    def _waited(self, span: Span) -> None:
        """The span's wait for a CPU (timing/_runqueue.py), where it was read at its entry:
        only on the thread that opened the file, which the span entered and left on."""
        runq = self._runq
        if span.q0 < 0 or runq is None or runq.fd < 0:
            return
        off = span.cpu_ns - max(0, span.oncpu_ns)
        if off < _NO_WAIT_NS:
            span.runq_ns = 0  # it ran all along: what it can have waited is under 20 us
            return
        q1 = runq.now()
        if q1 >= 0:
            # A wait for a core just outside the span (between its clock and this read)
            # is counted here too: never more than the span's time off the CPU.
            span.runq_ns = max(0, min(q1 - span.q0, off))

    def _queue(self, span: Span) -> bool:
        """Hold a finished span; True when so many wait that they should be written now."""
        with self._lock:
            writer = self._writer
            if span.dev_end is None or writer is None:
                self._ready.append((span, None))
                return len(self._ready) >= _FLUSH_RECORDS
            self._pending.append(span)
            if 2 * (len(self._pending) + writer.waiting) > self._config.max_pending_events:
                # The bound: the writer resolves what the device passed, drops the oldest rest.
                spans, self._pending = self._pending, []
                writer.hand(spans, write=False)
            return False

    def _flush(self) -> None:
        self.flushes += 1
        with self._lock:
            ready, self._ready = self._ready, []
            spans, self._pending = self._pending, []
        if self._writer is not None:
            # Even with no new span: those it holds may be done now.
            self._writer.hand(spans, write=True)
        if ready:
            self._write_ready(ready, 0)

    def _write_ready(self, ready: Ready, dropped: int) -> None:
        """Format and append finished records (the training thread or the writer's)."""
        followed = self._followed_phase
        if followed is not None:
            with self._lock:
                self._followed.extend(
                    (span.step, span.cpu_ns / 1e9 if gpu_ms is None else gpu_ms / 1e3)
                    for span, gpu_ms in ready
                    if span.phase == followed
                )
        lines = []
        for span, gpu_ms in ready:
            lines.append(format_record(self._rank, span, gpu_ms, dropped))
            dropped = 0
        with self._write_lock:
            self._write("".join(lines).encode("utf-8", "backslashreplace"))

    def _write(self, data: bytes) -> None:
        file = self._file
        if file is None:
            return
        st = os.fstat(file.fileno())
        size = st.st_size
        if st.st_nlink == 0:
            # Someone removed the file mid-run: what we write would vanish with it.
            logger.warning("rankscope: %s was removed during the run; writing a new one", self.path)
            self._close()
            file = self._file = open_append(self._run_dir, self.path)
            size = os.fstat(file.fileno()).st_size
        elif self._end is not None and size != self._end and not self._shared:
            self._shared = True
            logger.warning(
                "rankscope: another process appends to %s at the same time (another job "
                "with this output_dir?): the records stay apart by attempt and the analysis "
                "says so, but give each job its own output_dir",
                self.path,
            )
        # Every write opens with the attempt line, in one append: records of two jobs
        # that write into one file at once interleave by whole writes, each of which
        # says whose records follow (read/_timings.py tells them apart by token).
        payload = self._opening + data
        write_all(file, payload)
        self._end = size + len(payload)  # another process's append since shows at the next

    def _attempt_line(self) -> bytes:
        """The line that says which attempt wrote the records after it, and on which host."""
        attempt = current_attempt().to_dict()
        return format_attempt(self._rank, attempt, self._host, self._world).encode()

    def _end_torn_line(self) -> None:
        """A crash may have left half a line at the end: start ours on a line of their own."""
        file = self._file
        size = os.fstat(file.fileno()).st_size
        if size and os.pread(file.fileno(), 1, size - 1) != b"\n":  # not by path: no link
            file.write(b"\n")

    def forget_after_fork(self) -> None:
        """In a forked child: drop the parent's records unwritten and stop, silently."""
        self.enabled = False
        self._sampled = None
        self._lock = threading.Lock()  # another thread may have held it at the fork
        self._write_lock = threading.Lock()
        self._ready = []
        self._pending = []
        self._writer = None  # its thread was not forked: only the parent has it
        self._health = None  # nor was the health sampler's
        self._step_span = None
        self._close()

    def _close(self) -> None:
        runq, self._runq = self._runq, None
        if runq is not None:
            runq.close()
        file, self._file = self._file, None
        if file is not None:
            with contextlib.suppress(OSError):
                file.close()

    @property
    def pending(self) -> int:
        """Spans whose device time is not known yet."""
        writer = self._writer
        return len(self._pending) + (writer.waiting if writer is not None else 0)

    def wait_written(self, timeout: float = 10.0) -> bool:
        """Wait until the background writer has handled every span handed to it so far
        (tests and benchmarks; stop() does it itself). False if `timeout` passed first.
        The health sampler reads on its own clock: stop() has it read the last step."""
        writer = self._writer
        return writer is None or writer.wait(timeout)
