"""Windows for Nsight Systems: cudaProfilerStart/Stop at a window's edges, NVTX ranges inside.

`trace.tool="nsys"` keeps everything that decides *when* a window is (the schedule,
triggers, SIGUSR2, anomaly windows) and changes only *what records it*: instead of a
torch.profiler, TraceCapture drives an `NsysWindows`, which answers to the same calls
(start, step, stop, step_num, on_trace_ready) with the same transitions, so a window
opens and closes at exactly the steps a torch.profiler window would record. A job run
under ``nsys profile --capture-range=cudaProfilerApi --capture-range-end=repeat ...``
is then recorded inside those ranges only (docs/nsys.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ._schedule import Action

__all__ = ["NsysWindows", "NvtxRange", "nsys_unavailable"]

_RECORDING = (Action.RECORD, Action.RECORD_AND_SAVE)


def nsys_unavailable(torch: ModuleType) -> str | None:
    """Why this process cannot drive nsys ranges (no CUDA); None when it can."""
    if not torch.cuda.is_available():
        return "CUDA is not available in this process"
    return None


class NvtxRange:
    """One NVTX range, opened and closed like torch.profiler.record_function (any thread)."""

    __slots__ = ("_id", "_name", "_nvtx")

    def __init__(self, nvtx: Any, name: str) -> None:
        self._nvtx = nvtx
        self._name = name
        self._id: int | None = None

    def __enter__(self) -> NvtxRange:
        self._id = self._nvtx.range_start(self._name)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._id is not None:
            self._nvtx.range_end(self._id)
            self._id = None


class NsysWindows:
    """The part of torch.profiler.profile that TraceCapture uses, for Nsight Systems.

    `schedule(step)` gives each step's Action, as torch.profiler's schedule does; None
    records from start() to stop() (a phase window). A window starts with
    cudaProfilerStart at its first recorded step and ends at the end of its last one
    with a device synchronize (so its kernels finish inside the range) and
    cudaProfilerStop, after which `on_trace_ready(self)` is called, as torch.profiler
    calls it when a window is saved. Each recorded step is an NVTX range
    "ProfilerStep#N", the name torch.profiler gives steps in its traces (a phase window
    holds just its phase's range, which the capture opens).
    """

    def __init__(
        self,
        torch: ModuleType,
        schedule: Callable[[int], Action] | None,
        on_trace_ready: Callable[[Any], None] | None,
    ) -> None:
        self._cuda = torch.cuda
        self._nvtx = torch.cuda.nvtx
        self._schedule = schedule
        self.on_trace_ready = on_trace_ready
        self.step_num = 0
        self._action = Action.NONE
        self._step_range: int | None = None
        self.first_step: int | None = None
        """The first step of the range now open or last closed."""
        self.start_ns = 0
        """Wall clock (epoch ns) at the last cudaProfilerStart."""
        self.end_ns = 0
        """Wall clock (epoch ns) at the last cudaProfilerStop."""

    @property
    def stepped(self) -> bool:
        """True for a window over steps; False for a phase window (one invocation)."""
        return self._schedule is not None

    def _at(self, step: int) -> Action:
        return Action.RECORD if self._schedule is None else self._schedule(step)

    def start(self) -> None:
        self._action = self._at(self.step_num)
        if self._action in _RECORDING:
            self._begin()

    def step(self) -> None:
        before = self._action
        self.step_num += 1
        self._action = now = self._at(self.step_num)
        if before in _RECORDING:
            if before is Action.RECORD_AND_SAVE or now not in _RECORDING:
                self._end()
            else:
                self._next_step_range()
        if now in _RECORDING and (before is Action.RECORD_AND_SAVE or before not in _RECORDING):
            self._begin()

    def stop(self) -> None:
        if self._action in _RECORDING:
            self._end()
        self._action = Action.NONE

    def _begin(self) -> None:
        self.first_step = self.step_num
        self.start_ns = time.time_ns()
        self._cuda.profiler.start()
        if self._schedule is not None:  # a phase window is one phase, not steps
            self._next_step_range()

    def _next_step_range(self) -> None:
        if self._step_range is not None:
            self._nvtx.range_end(self._step_range)
        self._step_range = self._nvtx.range_start(f"ProfilerStep#{self.step_num}")

    def abort(self) -> None:
        """Close an open range without waiting for the device or saving anything (after a
        fault or an interrupt): nsys must not go on recording what follows."""
        recording, self._action = self._action in _RECORDING, Action.NONE
        try:
            if self._step_range is not None:
                self._nvtx.range_end(self._step_range)
                self._step_range = None
        finally:
            if recording:
                self._cuda.profiler.stop()

    def _end(self) -> None:
        try:
            if self._step_range is not None:
                self._nvtx.range_end(self._step_range)
                self._step_range = None
            self._cuda.synchronize()  # the window's kernels finish inside the range
        finally:
            self._cuda.profiler.stop()  # whatever failed above, the range ends
        self.end_ns = time.time_ns()
        ready = self.on_trace_ready
        if ready is not None:
            ready(self)
