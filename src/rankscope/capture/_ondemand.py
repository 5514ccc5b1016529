"""Who asks a running rank for windows, and what they are told: trigger files (answered
in RUN_DIR/triggers), SIGUSR2, and the rank's own slow steps (recorded in RUN_DIR/auto).

Each source turns what it saw into a request through the one door (`WindowRequests`)
and says the answer: in a log line, an answer file or an auto record. Those files are
written inside RUN_DIR only, never through a link (see `_files`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from .._log import get_logger
from .._text import format_steps
from ..rundir._files import append
from ..rundir._layout import (
    SIGNAL_TAG,
    SLOW_STEPS_TAG,
    TRACES,
    auto_path,
    slow_phase_tag,
    window_key,
)
from ..rundir._listing import RunDir
from ..rundir._trigger import Trigger, write_ack
from ._anomaly import AnomalyDetector
from ._auto import SlowSteps
from ._pair import Peer, ask_peer, choose_peer, peer_trigger_id
from ._requests import Asked, WindowRequests
from ._schedule import AddedWindow
from ._trigger import SignalHook, TriggerPoller, install_signal_hook

__all__ = ["SIGNAL", "OnDemand"]

logger = get_logger(__name__)

SIGNAL = "SIGUSR2"


class OnDemand:
    """The run-time sources of windows for one rank.

    `check_every`: how often step() polls RUN_DIR/triggers (0: never; the poller is
    only made where it is not 0). The SIGUSR2 hook is installed by `listen_for_signal`.
    """

    def __init__(self, run_dir: str, rank: int, requests: WindowRequests, check_every: int) -> None:
        self._run_dir = run_dir
        self._rank = rank
        self._requests = requests
        self.check_every = check_every
        self._poller = TriggerPoller(run_dir, rank) if check_every else None
        self.signal: SignalHook | None = None
        self.slow_itself: Callable[[], str | None] | None = None
        """Why this rank is slow itself by its anomaly detector, or None (see AnomalyDetector):
        set by the capture where the rank follows its own steps; a peer that is slow declines."""
        self._auto_failed = False  # writing RUN_DIR/auto failed once: said, not again

    # -- trigger files --------------------------------------------------------------

    def check_triggers(self, step: int) -> None:
        """Answer the triggers that appeared since the last check (on the training thread)."""
        poller = self._poller
        if poller is None:
            return
        answering: Trigger | None = None  # this runs every few steps: nothing else to pay
        try:
            for trigger in poller.poll():
                answering = trigger
                self._answer(trigger, step)
        except Exception as exc:
            # The run directory went away, became unreadable, or holds a link where an
            # answer goes: stop looking, keep training and keep the windows already planned.
            self.check_every = 0
            self.close_triggers()
            what = (
                f"checking {RunDir(self._run_dir).triggers_dir} for triggers"
                if answering is None
                else f"answering trigger {answering.id}"
            )
            logger.warning(
                "rankscope: %s failed (%s: %s); trigger checks are off for the rest of this "
                "run (rank %d), training goes on",
                what,
                type(exc).__name__,
                exc,
                self._rank,
            )

    def close_triggers(self) -> None:
        poller, self._poller = self._poller, None
        if poller is not None:
            try:
                poller.close()
            except OSError:
                logger.debug("rankscope: closing RUN_DIR/triggers failed", exc_info=True)

    def _answer(self, trigger: Trigger, step: int) -> None:
        """Plan the window `trigger` asks for, or decline it, and say which in its answer file."""
        figures: dict[str, Any] = {"by": "trigger", "trigger": trigger.id, "seen_at_step": step}
        if trigger.created is not None:
            figures["created"] = trigger.created
        if trigger.asked_by is not None and trigger.tag is not None:
            # A slow rank's peer (see _pair): its window is the slow rank's, and it counts
            # against that rank's trace.auto.max_captures, not this rank's on-demand bound.
            figures.update(by="peer", asked_by=trigger.asked_by)
            slow = None if self.slow_itself is None else self.slow_itself()
            if slow is not None:
                reason = f"this rank is slow itself ({slow}): not a healthy peer"
                logger.info(
                    "rankscope: rank %d declined trigger %s: %s", self._rank, trigger.id, reason
                )
                declined = {"status": "declined", "reason": reason, "seen_at_step": step}
                write_ack(self._run_dir, trigger, self._rank, declined)
                return
            who = f"rank {trigger.asked_by}'s slow window"
            asked = Asked(who, trigger.window_tag, figures, trigger)
        else:
            asked = Asked(
                f"trigger {trigger.id}", trigger.window_tag, figures, trigger, on_demand=True
            )
        window = self._requests.ask(asked, trigger.start, trigger.steps, step)
        answer: dict[str, Any]
        if window == self._requests.bound_reason:
            answer = self._past_bound(f"trigger {trigger.id}")
        elif isinstance(window, str):
            logger.warning(
                "rankscope: trigger %s declined on rank %d: %s", trigger.id, self._rank, window
            )
            answer = {"status": "declined", "reason": window}
        else:
            logger.info(
                "rankscope: trigger %s: rank %d records steps %d-%d into %s/%s",
                trigger.id,
                self._rank,
                trigger.start,
                trigger.last,
                TRACES,
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

    def _past_bound(self, who: str) -> dict[str, Any]:
        """A request declined by trace.trigger_max_windows: warned about once per run (a
        loop of `rankscope trigger` would otherwise warn at every one), counted, and the
        answer a trigger gets."""
        requests = self._requests
        declined = requests.past_bound
        reason = requests.bound_reason
        if declined == 1:
            logger.warning(
                "rankscope: %s declined on rank %d: %s; later on-demand requests are declined "
                "too (each trigger's answer in %s says so, with the count)",
                who,
                self._rank,
                reason,
                RunDir(self._run_dir).triggers_dir,
            )
        else:
            logger.debug("rankscope: %s declined on rank %d: %s", who, self._rank, reason)
        return {"status": "declined", "reason": reason, "declined_past_bound": declined}

    # -- SIGUSR2 --------------------------------------------------------------------

    def listen_for_signal(self, wake: Callable[[], None]) -> None:
        """Install the SIGUSR2 hook; `wake` makes the next step() look at it."""
        self.signal = install_signal_hook(self._rank)
        if self.signal is not None:
            self.signal.wake = wake

    def on_signal(self, hook: SignalHook, step: int, enabled: bool) -> None:
        """SIGUSR2 arrived before `step`: a window on the next steps, as a trigger would get.

        schedule.active steps (at most trigger_max_steps), after a warm-up step where
        the schedule has one; signals while that window is still ahead or recording add
        no other.
        """
        hook.pending = False  # first: a signal arriving while this runs is seen next step
        if not enabled:
            return
        ahead = self._requests.open_for(SIGNAL, step)
        if ahead is not None:
            logger.info(
                "rankscope: SIGUSR2 received again before step %d on rank %d; the window it "
                "asked for (steps %d-%d) is not over yet, so this one adds none",
                step,
                self._rank,
                ahead.first,
                ahead.last,
            )
            return
        figures = {"by": "SIGUSR2", "received_before_step": step}
        asked = Asked(SIGNAL, SIGNAL_TAG, figures, on_demand=True)
        window = self._requests.ask_next(asked, self._requests.signal_steps, step)
        if window == self._requests.bound_reason:
            self._past_bound(f"SIGUSR2 before step {step}")
            return
        if isinstance(window, str):
            logger.warning(
                "rankscope: SIGUSR2 received before step %d; no window on rank %d: %s",
                step,
                self._rank,
                window,
            )
            return
        logger.info(
            "rankscope: SIGUSR2 received before step %d: rank %d records steps %d-%d into %s/%s",
            step,
            self._rank,
            window.first,
            window.last,
            TRACES,
            self._requests.name(window),
        )

    def signal_ignored(self, hook: SignalHook, step: int, why: str) -> None:
        """A SIGUSR2 came while capture is off: say so once per signal."""
        hook.pending = False
        logger.info(
            "rankscope: SIGUSR2 received before step %d; no window on rank %d: capture is off (%s)",
            step,
            self._rank,
            why,
        )

    def release_signal(self) -> None:
        """Put back the SIGUSR2 handler that was there before, if this one installed one."""
        hook, self.signal = self.signal, None
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

    # -- slow steps (trace.auto) ----------------------------------------------------

    def on_slow_stretches(
        self,
        anomaly: AnomalyDetector,
        found: Sequence[SlowSteps],
        step: int,
        phase: str | None,
        steps: int,
    ) -> None:
        """Ask for the windows of the slow stretches `anomaly` found (on_slow each). Where
        asking fails, the detector goes off; the run and the windows already planned go on."""
        try:
            for slow in found:
                self.on_slow(slow, step, phase, steps)
        except Exception as exc:
            anomaly.give_up(exc)

    def on_slow(self, slow: SlowSteps, step: int, phase: str | None, steps: int) -> None:
        """Ask for `slow`'s window (`steps` steps), and one healthy peer for the same steps
        (see _pair); record why, or why not, in RUN_DIR/auto.

        With a peer the window begins far enough ahead for it to read its trigger in time;
        without one, on the next steps, as SIGUSR2 would.
        """
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
        tag = SLOW_STEPS_TAG if phase is None else slow_phase_tag(phase)
        who = "slow steps" if phase is None else f"slow phase {phase!r}"
        peer = self._peer(step)
        trigger_id = None if peer.rank is None else peer_trigger_id(self._rank, slow.capture)
        record["peer"] = {**peer.to_dict(), "trigger": trigger_id}
        figures = {k: v for k, v in record.items() if k not in ("rank", "capture")}
        asked = Asked(who, tag, {"by": "auto", **figures})
        if peer.rank is None:
            window = self._requests.ask_next(asked, steps, step)
        else:
            window = self._requests.ask(asked, step + peer.lead, steps, step)
        if isinstance(window, str):
            logger.warning(
                "rankscope: %s %s were slow on rank %d (%.4g s and more, median %.4g s); "
                "no window: %s",
                what,
                format_steps(slow_steps),
                self._rank,
                min(slow.seconds),
                slow.median,
                window,
            )
            record.update(status="declined", reason=window)
            if peer.rank is not None:
                record["peer"] = {**peer.to_dict(), "trigger": None, "not_asked": "no window"}
        else:
            name = self._requests.name(window)
            logger.info(
                "rankscope: %s %s were slow on rank %d (%.4g s and more, median %.4g s): "
                "recording steps %d-%d into %s/%s",
                what,
                format_steps(slow_steps),
                self._rank,
                min(slow.seconds),
                slow.median,
                window.first,
                window.last,
                TRACES,
                name,
            )
            record.update(status="accepted", window=name, first=window.first, last=window.last)
            if peer.rank is not None and trigger_id is not None:
                # The tag as the window's name spells it (a phase name may hold characters
                # a file name should not), so the peer's trace lands in the same folder.
                named = window_key(name)
                self._ask_peer(
                    record,
                    trigger_id,
                    peer=peer.rank,
                    tag=tag if named is None else named[1],
                    first=window.first,
                    steps=steps,
                )
        self._write_auto(record)

    def _peer(self, step: int) -> Peer:
        try:
            return choose_peer(self._run_dir, self._rank, step)
        except Exception as exc:
            # The pair is a second trace beside the slow rank's own: a fault while choosing
            # costs the peer, never the slow rank's window or the detector.
            return Peer(None, f"choosing one failed ({type(exc).__name__}: {exc})")

    def _ask_peer(
        self,
        record: dict[str, Any],
        trigger_id: str,
        *,
        peer: int,
        tag: str,
        first: int,
        steps: int,
    ) -> None:
        """Write the peer's trigger; its answer goes to RUN_DIR/triggers/<id>/rank-NNNNN.json."""
        try:
            ask_peer(
                self._run_dir,
                trigger_id,
                rank=self._rank,
                peer=peer,
                tag=tag,
                first=first,
                steps=steps,
            )
        except (OSError, ValueError) as exc:
            record["peer"].update(trigger=None, error=f"writing its trigger failed ({exc})")
            logger.warning(
                "rankscope: rank %d could not ask rank %d to record steps %d-%d too (%s); "
                "its own window is kept",
                self._rank,
                peer,
                first,
                first + steps - 1,
                exc,
            )
            return
        logger.info(
            "rankscope: rank %d asked rank %d (%s) to record steps %d-%d too (trigger %s)",
            self._rank,
            peer,
            record["peer"]["why"],
            first,
            first + steps - 1,
            trigger_id,
        )

    def _write_auto(self, record: dict[str, Any]) -> None:
        """Append one line to this rank's auto records (at most max_captures per run).

        A failure (a full disk, a link where the file or its folder goes) is said once;
        the windows are kept either way.
        """
        path = auto_path(self._run_dir, self._rank)
        try:
            append(self._run_dir, path, (json.dumps(record) + "\n").encode("utf-8"))
        except OSError as exc:
            if self._auto_failed:
                logger.debug("rankscope: could not write %s (%s)", path, exc)
                return
            self._auto_failed = True
            logger.warning(
                "rankscope: could not write %s (%s); the window is kept (later failures to "
                "write it on rank %d are logged at debug level)",
                path,
                exc,
                self._rank,
            )

    # -- windows that will not happen -----------------------------------------------

    def dropped(
        self, dropped: list[tuple[AddedWindow, Asked | None]], step: int, reason: str
    ) -> None:
        """Say why asked-for windows were given up, and tell a trigger's asker."""
        for window, asked in dropped:
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

    def missed(self, step: int) -> None:
        """At stop(): the asked-for windows the run stopped before, and how many on-demand
        requests trace.trigger_max_windows declined."""
        declined = self._requests.past_bound
        if declined:
            logger.info(
                "rankscope: rank %d declined %d on-demand request%s past "
                "trace.trigger_max_windows (%d)",
                self._rank,
                declined,
                "" if declined == 1 else "s",
                self._requests.max_windows,
            )
        for window, asked in self._requests.not_begun(step):
            logger.warning(
                "rankscope: %s asked rank %d for steps %d-%d; the run stopped at step %d",
                asked.who,
                self._rank,
                window.first,
                window.last,
                step,
            )
