"""The watchdog thread: the heartbeat file, and a hang file once per stall.

It polls the training thread's Pulse (about once a second) and keeps every time
itself, so the training thread reads no clock for it: a step's start is when the
watchdog first saw its number, a phase's start when it first saw the phase open
(both to within one poll). It writes:

- RUN_DIR/live/rank-NNNNN.json: at most every `heartbeat_s` when something changed,
  once a minute when nothing did (a stuck rank is alive; a killed one is not), and once
  more at stop() with state "stopped";
- RUN_DIR/hangs/step-NNNNNN-<attempt>/rank-NNNNN.json: when a step has not ended after
  max(after_s, factor x the median step), with the open phases, the last completed
  step, the Python stack of every thread, the process groups the rank is in and, where
  torch.distributed is in use (NCCL, gloo), torch's Flight Recorder dump beside it
  (watch/_flight.py); rewritten with `ended_ns` when the rank moves again.

Every write goes through `_files` (under RUN_DIR, no link followed). A failure is
warned about once and the watchdog goes on; it never raises into the job, never stops
it, and never calls a collective.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
import traceback
from collections import deque
from typing import Any

from .._log import get_logger
from ..config._config import HangConfig
from ..config._ranks import RankInfo
from ..rundir._attempt import current_attempt
from ..rundir._files import write_atomic
from ..rundir._layout import flight_recorder_path, hang_path, live_path, stall_name
from ._flight import dump_flight_recorder, no_flight_recorder, process_groups
from ._pulse import Pulse

__all__ = ["Watchdog"]

logger = get_logger(__name__)

_VERSION = 1
_STEPS_KEPT = 64  # step times the median is taken over
_FRAMES_KEPT = 64  # innermost frames kept per thread in a hang file
# Rewritten this often even when nothing changed: a rank stuck but alive keeps its
# written_ns moving (moved_ns does not), so a reader tells it from a killed one.
_KEEPALIVE_NS = 60 * 10**9
# What a hang file says of the dump while torch writes it: one that still says so later
# is one whose dump never finished (NCCL itself stuck).
_ASKED = {"skipped": "asked for; torch has not finished it"}


class Watchdog:
    """Watches one rank's Pulse from a daemon thread; see the module's docstring."""

    def __init__(self, config: HangConfig, run_dir: str, rank_info: RankInfo, pulse: Pulse) -> None:
        self._config = config
        self._run_dir = run_dir
        self._rank = rank_info.rank
        self._host = rank_info.host
        self._pulse = pulse
        self._poll = min(1.0, config.after_s / 4, config.heartbeat_s)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False
        # What the watchdog has seen (its own clock, epoch ns).
        self._step = pulse.step
        self._step_seen = time.time_ns()  # epoch, for the files
        self._step_seen_at = time.monotonic_ns()  # for intervals: a clock step moves no stall
        self._moved = self._step_seen
        self._steps: deque[float] = deque(maxlen=_STEPS_KEPT)  # seconds per step
        # The Phase objects seen open, with when each was first seen: held, so that a new
        # phase cannot take a freed one's address and pass for it.
        self._seen: list[tuple[Any, int, int]] = []  # (phase, epoch ns, monotonic ns)
        # (name, kind, since epoch ns, since monotonic ns), outermost first: the epoch for
        # the files, the monotonic clock for how long (a wall-clock step moves no interval).
        self._open: list[tuple[str, str, int, int]] = []
        self._stall_at = 0  # monotonic ns: the stalled step's start
        self._stall: dict[str, Any] | None = None  # the hang file of the stall under way
        self.ended_by: str | None = None
        """The error the training loop left on ("RuntimeError: ..."), said by the last heartbeat."""
        self._written_at = -(10**18)  # monotonic ns of the last heartbeat written: long ago
        self._changed = True

    # -- lifecycle (training thread) ------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"rankscope-watchdog-{self._rank}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """End the thread and write the last heartbeat: state "stopped", a clean end."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stopping.set()
        thread.join(timeout=5.0)
        if thread.is_alive():
            return  # stuck in a write: it would race ours; its last heartbeat stands
        try:
            now = time.time_ns()
            self._look(now)
            if self._stall is not None:  # the run ended inside a stall: that ends it too
                self._end_stall(now)
            self._write_heartbeat(now, stopped=True)
        except Exception as exc:
            self._warn("the last heartbeat", exc)
        self._seen = []

    def forget_after_fork(self) -> None:
        """In a forked child: the thread is not there; write nothing for the parent."""
        self._thread = None

    # -- the thread -----------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.wait(self._poll):
            try:
                now = time.time_ns()
                self._look(now)
                self._watch(now)
                since = time.monotonic_ns() - self._written_at
                if (
                    self._changed and since >= self._config.heartbeat_s * 1e9
                ) or since >= _KEEPALIVE_NS:
                    self._write_heartbeat(now, stopped=False)
            except Exception as exc:  # nothing may reach the job; the next poll tries again
                self._warn("watching", exc)

    def _look(self, now: int) -> None:
        """Take in what the training thread did since the last poll."""
        pulse = self._pulse
        step = pulse.step
        stepped = step != self._step
        if stepped:
            at = time.monotonic_ns()
            if step > self._step:
                self._steps.append((at - self._step_seen_at) / 1e9 / (step - self._step))
            self._step, self._step_seen, self._moved, self._changed = step, now, now, True
            self._step_seen_at = at
            if self._stall is not None:
                self._end_stall(now)
        phases = list(pulse.open)
        earlier = self._seen
        # A phase open across step() counts from the step's start: a Phase object that
        # a loop enters anew each step is the same object.
        mono = time.monotonic_ns()
        seen = [
            (p, now, mono)
            if stepped
            else next(((q, t, m) for q, t, m in earlier if q is p), (p, now, mono))
            for p in phases
        ]
        if len(seen) != len(earlier) or any(
            p is not q for (p, _, _), (q, _, _) in zip(seen, earlier, strict=True)
        ):
            self._moved, self._changed = now, True
        self._seen = seen
        self._open = [(str(p._name), str(p._kind), since, at) for p, since, at in seen]

    def _threshold(self) -> float:
        median = self.median_step_s
        config = self._config
        return config.after_s if median is None else max(config.after_s, config.factor * median)

    @property
    def median_step_s(self) -> float | None:
        return statistics.median(self._steps) if self._steps else None

    def _watch(self, now: int) -> None:
        waited = (time.monotonic_ns() - self._step_seen_at) / 1e9
        if self._stall is None and waited > self._threshold():
            self._begin_stall(now)

    # -- the files --------------------------------------------------------------------

    @property
    def _token(self) -> str:
        return current_attempt().token

    def _identity(self) -> dict[str, Any]:
        return {
            "v": _VERSION,
            "rank": self._rank,
            "host": self._host,
            "pid": os.getpid(),
            "attempt": current_attempt().token,
        }

    def _open_phases(self, open_s: bool = False) -> list[dict[str, Any]]:
        out = []
        mono = time.monotonic_ns()
        for depth, (name, kind, since, at) in enumerate(self._open):
            entry: dict[str, Any] = {"phase": name, "kind": kind, "since_ns": since, "depth": depth}
            if open_s:
                entry["open_s"] = round((mono - at) / 1e9, 3)
            out.append(entry)
        return out

    def _write_heartbeat(self, now: int, stopped: bool) -> None:
        median = self.median_step_s
        data = {
            **self._identity(),
            "written_ns": now,
            "moved_ns": self._moved,
            "step": self._step,
            "step_started_ns": self._step_seen,
            "median_step_s": None if median is None else round(median, 6),
            "threshold_s": round(self._threshold(), 3),
            "started_ns": current_attempt().started_ns,
            "open": self._open_phases(),
            "state": "stopped" if stopped else "running",
            "stopped_ns": now if stopped else None,
            "hang": None if self._stall is None else stall_name(self._step, self._token),
        }
        if stopped and self.ended_by is not None:
            data["error"] = self.ended_by
        self._write(live_path(self._run_dir, self._rank), data, "the heartbeat")
        self._written_at, self._changed = time.monotonic_ns(), False

    def _begin_stall(self, now: int) -> None:
        step = self._step
        self._stall_at = self._step_seen_at
        median = self.median_step_s
        self._stall = {
            **self._identity(),
            "step": step,
            "last_completed_step": step - 1 if step > 0 else None,
            "step_started_ns": self._step_seen,
            "detected_ns": now,
            "threshold_s": round(self._threshold(), 3),
            "median_step_s": None if median is None else round(median, 6),
            "open": self._open_phases(open_s=True),
            "threads": _stacks(self._pulse.owner),
            "process_groups": process_groups(),
            # Why there is no dump is known at once (no process group).
            "flight_recorder": no_flight_recorder() or _ASKED,
            "ended_ns": None,
            "stalled_s": None,
        }
        path = hang_path(self._run_dir, step, self._rank, self._token)
        self._write(path, self._stall, "a hang file")  # first: the dump below may be slow
        if self._stall["flight_recorder"] is _ASKED:
            self._stall["flight_recorder"] = self._flight_recorder(step)
            self._write(path, self._stall, "a hang file")
        self._changed = True
        self._write_heartbeat(now, stopped=False)  # says the stall at once
        logger.warning(
            "rankscope: rank %d has not finished step %d in %.0f s (in %s); wrote %s",
            self._rank,
            step,
            (time.monotonic_ns() - self._step_seen_at) / 1e9,
            " > ".join(name for name, _, _, _ in self._open) or "no phase",
            path,
        )

    def _end_stall(self, now: int) -> None:
        stall, self._stall = self._stall, None
        if stall is None:
            return
        stall["ended_ns"] = now
        stall["stalled_s"] = round((time.monotonic_ns() - self._stall_at) / 1e9, 3)
        path = hang_path(self._run_dir, stall["step"], self._rank, self._token)
        self._write(path, stall, "a hang file")

    def _flight_recorder(self, step: int) -> dict[str, str]:
        """torch's Flight Recorder dump, beside the hang file."""
        path = flight_recorder_path(self._run_dir, step, self._rank, self._token)
        return dump_flight_recorder(self._run_dir, path)

    def _write(self, path: Any, data: dict[str, Any], what: str) -> None:
        try:
            text = json.dumps(data, indent=1, allow_nan=False, default=str)
            write_atomic(self._run_dir, path, text.encode(), str(os.getpid()))
        except Exception as exc:
            self._warn(f"writing {what}", exc)

    def _warn(self, doing: str, exc: BaseException) -> None:
        if self._warned:
            return
        self._warned = True
        logger.warning(
            "rankscope: the hang watchdog of rank %d failed %s (%s: %s); it keeps watching, "
            "and training goes on",
            self._rank,
            doing,
            type(exc).__name__,
            exc,
        )


def _stacks(training: int) -> list[dict[str, Any]]:
    """The Python stack of every thread, outermost frame first (innermost kept)."""
    names = {t.ident: t for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        thread = names.get(ident)
        frames = traceback.extract_stack(frame)[-_FRAMES_KEPT:]
        out.append(
            {
                "name": thread.name if thread is not None else f"thread {ident}",
                "ident": ident,
                "daemon": bool(thread.daemon) if thread is not None else None,
                "training": ident == training,
                "stack": [
                    {"file": f.filename, "line": f.lineno, "function": f.name, "code": f.line}
                    for f in frames
                ],
            }
        )
    out.sort(key=lambda t: not t["training"])  # the training thread first
    return out
