"""PeerView: rankscope's figures for a trainer's logs, kept fresh by a background thread.

The thread reads the run directory every `REFRESH_S` (the new end of each rank's
timings, each rank's heartbeat: watch/_tails.py) and works out the figures
(watch/_figures.py); `metrics()` on the training thread copies the latest. Ranks meet
in files only, never through a collective: a rank that hangs or dies leaves its files
as they were, which is what the figures then say.

A fault (the run directory removed under the job, anything that raises while reading)
logs one warning and turns the view off: `metrics()` returns {} from then on; training
goes on. Lines of a timings file that are not whole records are passed over, and the
first file that holds one is named in one warning.
"""

from __future__ import annotations

import threading
import time

from .._log import get_logger
from ..config._ranks import RankInfo
from ..rundir._attempt import current_attempt
from ..rundir._listing import RunDir
from ._figures import Figures, across_figures, health_figures, own_figures
from ._tails import TimingTail, read_heartbeat

__all__ = ["PACE", "REFRESH_S", "PeerView"]

logger = get_logger(__name__)

REFRESH_S = 2.0
"""How often the view reads the run directory, at most."""
PACE = 40
"""Between two reads the thread waits at least this many times the CPU time the last read
took, so it takes at most 1/PACE of a core: a read of 1024 ranks' files takes about
0.1 s with the timer's defaults, 0.35 s timing every step (bench/live_figures.py)."""
LAUNCH_SKEW_NS = 600 * 10**9
"""How long before this process another rank of the same launch may have started (and
timed its first phases: another rank's first step can begin before this one asked for
its attempt). Records and heartbeats older than this process's start less this are an
earlier start's. An earlier start's records newer than that are read until the rank's
first write of this start, whose attempt line sets them aside (watch/_tails.py)."""
_STOP_TIMEOUT_S = 5.0


class PeerView:
    """The figures of one rank and of every rank whose files are in the run directory."""

    def __init__(self, run_dir: str, rank_info: RankInfo, refresh_s: float = REFRESH_S) -> None:
        self._run_dir = RunDir(run_dir)
        self._rank = rank_info.rank
        self._world = rank_info.world_size
        self._refresh_s = refresh_s
        # What began before is an earlier start's, left in the files, and is not read.
        self._since_ns = current_attempt().started_ns - LAUNCH_SKEW_NS
        self._tails: dict[int, TimingTail] = {}
        self._saw_timings = False
        self._said_torn = False
        # (across-rank figures, this rank's figures, the latest step those cover): replaced
        # whole by the thread, so the training thread reads one consistent triple.
        self._latest: tuple[Figures, Figures, int] = ({}, {}, -1)
        self._handed = -1  # this rank's figures up to this step went out already
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._done = threading.Condition()
        self._begun = self._finished = 0  # refreshes begun and finished
        self._rested = 0.0  # (monotonic s) the pace's end after the last read
        self._poked = False  # new records since the last read began
        self._thread: threading.Thread | None = None
        self.enabled = True
        self.fault_reason: str | None = None
        """Why a fault turned the view off (None: it did not)."""

    # -- the training thread ---------------------------------------------------------

    def start(self) -> None:
        thread = threading.Thread(
            target=self._run, name=f"rankscope-figures-{self._rank}", daemon=True
        )
        try:
            thread.start()
        except Exception as exc:  # no thread to be had: no figures, the run goes on
            self._fault(f"no thread for the figures ({type(exc).__name__}: {exc})")
            return
        self._thread = thread

    def stop(self) -> None:
        """End the thread (it finishes the read it is in, at most `_STOP_TIMEOUT_S`)."""
        thread, self._thread = self._thread, None
        self._stopping.set()
        self._wake.set()
        if thread is not None:
            thread.join(_STOP_TIMEOUT_S)

    def metrics(self) -> dict[str, float]:
        """A copy of the latest figures. This rank's per-phase medians come once: a second
        call before the thread read new steps gives the across-rank figures alone."""
        if not self.enabled:
            return {}
        across, own, upto = self._latest
        out = dict(across)
        if upto > self._handed:
            out.update(own)
            self._handed = upto
        return out

    def poke(self) -> None:
        """New records are in this rank's file (its timer wrote them): read them now rather
        than at the next turn, where the pace allows (a short job's figures came only
        from reads every REFRESH_S, after its first logs). Never waits."""
        self._poked = True
        if time.monotonic() >= self._rested:
            self._wake.set()

    def wait_fresh(self, timeout: float = 10.0) -> bool:
        """Wait for a read of the directory that began after this call (tests and
        benchmarks: a log call never waits). False if `timeout` passed first."""
        with self._done:
            wanted = self._begun + 1
            self._wake.set()
            return self._done.wait_for(
                lambda: self._finished >= wanted or not self.enabled, timeout
            )

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            with self._done:
                self._wake.clear()
                self._poked = False
                self._begun += 1
            began = time.thread_time()
            try:
                self.refresh()
            except Exception as exc:  # nothing may reach the job
                self._fault(f"reading the run directory failed: {type(exc).__name__}: {exc}")
            with self._done:
                self._finished = self._begun
                self._done.notify_all()
            if not self.enabled:
                return
            # The pace counts the read's CPU time, what it takes from the job: a read that
            # a busy machine kept waiting for a core took nothing meanwhile.
            rest = PACE * (time.thread_time() - began)
            self._rested = time.monotonic() + rest  # no poke wakes it before
            if self._wake.wait(rest) or self._poked:
                continue  # woken (stop, wait_fresh), or poked while it rested: read now
            self._wake.wait(max(0.0, self._refresh_s - rest))

    def refresh(self) -> None:
        """Read what the ranks wrote since the last refresh and work the figures out."""
        files = [f for f in self._run_dir.timings() if f.rank < self._world]
        if not files and self._saw_timings:
            self._fault(f"{self._run_dir.timings_dir} is gone (removed by another process?)")
            return
        self._saw_timings = self._saw_timings or bool(files)
        listed = {f.rank for f in files}
        for rank in [r for r in self._tails if r not in listed]:
            del self._tails[rank]
        for file in files:
            tail = self._tails.get(file.rank)
            if tail is None:
                tail = self._tails[file.rank] = TimingTail(self._since_ns)
            if not tail.read(file.path):
                del self._tails[file.rank]  # gone since it was listed
            elif tail.skipped and not self._said_torn:
                self._said_torn = True
                logger.warning(
                    "rankscope: %s holds %d line(s) that are not whole timing records (torn "
                    "by a crash, or written by something else); rankscope's figures pass them "
                    "over (said once, for the first such file)",
                    file.path,
                    tail.skipped,
                )
        beats = (read_heartbeat(f.path) for f in self._run_dir.heartbeats() if f.rank < self._world)
        across = across_figures({rank: tail.steps for rank, tail in self._tails.items()})
        across.update(
            health_figures((b for b in beats if b is not None), time.time_ns(), self._since_ns)
        )
        mine = self._tails.get(self._rank)
        own, upto = own_figures(mine.steps, self._handed) if mine is not None else ({}, -1)
        self._latest = (across, own, upto)

    def _fault(self, what: str) -> None:
        if not self.enabled:
            return
        self.enabled = False
        self.fault_reason = what
        self._latest = ({}, {}, -1)
        logger.warning(
            "rankscope: %s; rankscope's figures for the trainer's logs are off for the rest "
            "of this run (rank %d), training goes on",
            what,
            self._rank,
        )
