"""What the peer view reads of the run directory: the new end of each rank's timings, and
each rank's heartbeat, in bounded reads.

The files are written by other processes while they are read, and are untrusted: a read
takes at most `TAIL_BYTES` from a file's end, a line that is not a whole timing record
is passed over, a file that vanishes or is replaced is read again from its end, and
nothing here raises for what a file holds. Only the latest `KEPT_STEPS` sampled steps
of a rank are kept.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any, TypeGuard

from .._errors import TraceError
from ..rundir._layout import open_regular
from ..timing._record import STEP_PHASE

__all__ = [
    "KEPT_STEPS",
    "TAIL_BYTES",
    "StepTimes",
    "TimingTail",
    "read_heartbeat",
]

TAIL_BYTES = 256 * 1024
"""The most read of a file at once: what a rank appended since the last read, or its end.
A rank writes about 150 bytes a phase and a step, so this holds hundreds of steps."""
KEPT_STEPS = 32
"""Sampled steps kept per rank: the figures are about the latest few."""
HEARTBEAT_BYTES = 256 * 1024
"""A heartbeat is a few hundred bytes (its open phases); a bigger file is not one."""


class StepTimes:
    """One rank's sampled step: its time between step() calls, and ms per phase
    (the phase's records of that step summed), with the phase's kind."""

    __slots__ = ("phases", "step_ms")

    def __init__(self) -> None:
        self.step_ms: float | None = None
        self.phases: dict[str, tuple[str, float]] = {}


class TimingTail:
    """Follows one rank's timings file: each `read()` takes in what was appended since.

    Records count from `since_ns` (epoch ns, this process's start): those that began
    earlier are an earlier start's, still in the file. A new attempt line (the rank's
    process started again) forgets the rank's earlier steps.
    """

    def __init__(self, since_ns: int) -> None:
        self._since_ns = since_ns
        self._file: tuple[int, int] | None = None  # (device, inode) of the file last read
        self._offset = 0  # where the next read starts: after the last whole line
        self._attempt: object = None
        self.steps: dict[int, StepTimes] = {}
        """The latest KEPT_STEPS sampled steps read, by step."""
        self.skipped = 0
        """Lines passed over: not a record (torn, foreign, of another version)."""

    def read(self, path: os.PathLike[str] | str) -> bool:
        """Take in what was appended to `path` since the last read; False when there is no
        such file (any more) or it is not a regular file."""
        try:
            st = os.stat(path)
        except OSError:
            return False
        identity = (st.st_dev, st.st_ino)
        if identity != self._file or st.st_size < self._offset:
            # Another file under the name, or one cut short: read it from its end.
            self._file, self._offset, self._attempt = identity, 0, None
            self.steps = {}
        if st.st_size == self._offset:
            return True
        start = max(self._offset, st.st_size - TAIL_BYTES)
        try:
            with open_regular(path) as file:
                file.seek(start)
                data = file.read(st.st_size - start)
        except (OSError, TraceError):  # gone, or no longer a regular file
            return False
        whole = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        lines = data[:whole].split(b"\n")
        if start > self._offset and lines:
            lines = lines[1:]  # the read began inside a line
        self._offset = start + whole
        for line in lines:
            if line:
                self._take(line)
        return True

    def _take(self, line: bytes) -> None:
        try:
            record = json.loads(line)
        except ValueError:
            self.skipped += 1
            return
        if not isinstance(record, dict):
            self.skipped += 1
            return
        if "phase" not in record and isinstance(record.get("attempt"), str):
            if record["attempt"] != self._attempt and self._attempt is not None:
                self.steps = {}  # the rank's process started again
            self._attempt = record["attempt"]
            return
        parsed = _record(record)
        if parsed is None:
            self.skipped += 1
            return
        if parsed[0] < self._since_ns:
            return
        _, step, phase, kind, ms = parsed
        times = self.steps.get(step)
        if times is None:
            times = self.steps[step] = StepTimes()
            if len(self.steps) > KEPT_STEPS:
                del self.steps[min(self.steps)]
        if phase == STEP_PHASE and kind == STEP_PHASE:
            times.step_ms = ms
        else:
            _, before = times.phases.get(phase, (kind, 0.0))
            times.phases[phase] = (kind, before + ms)


def _record(record: Mapping[str, Any]) -> tuple[int, int, str, str, float] | None:
    """(start_ns, step, phase, kind, ms) of a timing record, or None for anything else.

    A phase is read on the longer of its host and device times, as the analysis's
    "auto" clock reads a phase (analysis/_clocks.py): device time where the GPU does
    the work, host time where the host does.
    """
    start, step, phase, kind = (record.get(k) for k in ("start_ns", "step", "phase", "kind"))
    if record.get("v") != 1 or not isinstance(phase, str) or not isinstance(kind, str):
        return None
    if not (_is_int(start) and _is_int(step)) or step < 0:
        return None
    ms = _ms(record.get("cpu_ms"))
    if ms is None:
        return None
    gpu = _ms(record.get("gpu_ms"))
    return start, step, phase, kind, ms if gpu is None else max(ms, gpu)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _ms(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    ms = float(value)
    return ms if math.isfinite(ms) and ms >= 0 else None


def read_heartbeat(path: os.PathLike[str] | str) -> dict[str, Any] | None:
    """A rank's heartbeat (watch/_watchdog.py writes it whole, by rename), or None where
    there is none or it is not a JSON object of a readable size."""
    try:
        with open_regular(path) as file:
            data = file.read(HEARTBEAT_BYTES + 1)
    except (OSError, TraceError):
        return None
    if len(data) > HEARTBEAT_BYTES:
        return None
    try:
        beat = json.loads(data)
    except ValueError:
        return None
    return beat if isinstance(beat, dict) else None
