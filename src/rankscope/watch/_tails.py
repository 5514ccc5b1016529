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
import os
import re
from typing import Any

from .._errors import TraceError
from ..rundir._clocks import on_device
from ..rundir._listing import open_regular
from ..timing._record import STEP_PHASE

__all__ = [
    "KEPT_STEPS",
    "PHASES_KEPT",
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
PHASES_KEPT = 256
"""Phase names kept per step: a file that makes up new ones cannot grow the view."""
_FOREVER_MS = 1e12  # 30 years: a longer phase is no measurement
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

    Records count from `since_ns` (epoch ns, about this launch's start): those that
    began earlier are an earlier start's, still in the file. A new attempt line (the rank's
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
        text = data[:whole].decode("utf-8", "replace")
        if start > self._offset:
            text = text[text.find("\n") + 1 :]  # the read began inside a line: its end
        self._offset = start + whole
        self._take(text)
        return True

    def _take(self, text: str) -> None:
        # One pass of the training job's own records, of every rank, every read: kept flat.
        taken = 0
        since, steps = self._since_ns, self.steps
        for attempt, step, quoted, quoted_kind, begun, cpu, gpu in _LINE.findall(text):
            if attempt:
                taken += 1
                if attempt != self._attempt and self._attempt is not None:
                    steps = self.steps = {}  # the rank's process started again
                self._attempt = attempt
                continue
            try:
                ms = float(cpu)
                if gpu != "null" and on_device(float(gpu), ms):
                    ms = float(gpu)
            except ValueError:
                continue
            if not 0 <= ms < _FOREVER_MS:  # NaN and infinities too
                continue
            taken += 1
            if int(begun) < since:
                continue
            phase = quoted[1:-1] if "\\" not in quoted else _text(quoted)
            kind = quoted_kind[1:-1] if "\\" not in quoted_kind else _text(quoted_kind)
            number = int(step)
            times = steps.get(number)
            if times is None:
                times = steps[number] = StepTimes()
                if len(steps) > KEPT_STEPS:
                    del steps[min(steps)]
            if phase == STEP_PHASE and kind == STEP_PHASE:
                times.step_ms = ms
            elif phase in times.phases:
                times.phases[phase] = (kind, times.phases[phase][1] + ms)
            elif len(times.phases) < PHASES_KEPT:
                times.phases[phase] = (kind, ms)
        self.skipped += text.count("\n") - taken


# The records as timing/_record.py writes them, every field in its order, matched in one
# pass: a phase on device time where its GPU works through half its host time or more,
# as the analysis's "auto" clock reads a phase (rundir/_clocks.py). Matching reads 1024 ranks' flush several
# times faster than json.loads a line (bench/live_figures.py). A line that is not whole,
# or not of this form, is passed over.
_QUOTED = r'"(?:[^"\\\n]|\\.)*"'
_NUMBER = r"[0-9.eE+-]+"
_LINE = re.compile(
    r'^\{"v":1,"rank":\d+,(?:"attempt":"([0-9a-zA-Z_-]+)"|'
    rf'"step":(\d+),"phase":({_QUOTED}),"kind":({_QUOTED}),"start_ns":(\d+),'
    rf'"cpu_ms":({_NUMBER}),"gpu_ms":({_NUMBER}|null),"depth":)',
    re.MULTILINE,
)


def _text(quoted: str) -> str:
    """A quoted name with escapes in it, as json reads it."""
    try:
        text = json.loads(quoted)
    except ValueError:
        return quoted[1:-1]
    return text if isinstance(text, str) else quoted[1:-1]


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
