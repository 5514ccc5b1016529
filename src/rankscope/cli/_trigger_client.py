"""Asking a running job for a trace window from outside it, and seeing who answered.

What `rankscope trigger` does, for any Python caller (a Ray driver, a notebook): check
the request against the ranks' meta files and the run's timings, then write the trigger
file each rank's TriggerPoller looks for (capture/_trigger.py, the job's side; the
files' format: rundir/_trigger.py). Imports no torch. A rank's config comes from its meta file; a field the
file leaves out reads as the config's own default (`config_in_meta`).

Errors name the argument as the CLI spells its option (`--ranks`, `--steps`, `--at`),
so the command and a Python caller see the same message.
"""

from __future__ import annotations

import importlib.util
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import ConfigError, TraceError
from ..config._ranks import RankSet, parse_ranks
from ..rundir._layout import META_FILES, NSYS, TRACES
from ..rundir._listing import RunDir
from ..rundir._trigger import (
    Trigger,
    config_in_meta,
    new_trigger_id,
    rank_listens,
    read_acks,
    read_trigger,
    write_trigger,
)

if TYPE_CHECKING:
    from ..analysis.read._run import RunMeta

__all__ = ["Progress", "ask_for_window", "latest_step", "run_progress", "trigger_status"]

_STATES = ("saved", "accepted", "declined", "waiting", "not_listening")


def ask_for_window(
    run_dir: str | os.PathLike[str],
    *,
    steps: int | None = None,
    ranks: str | None = None,
    at: int | None = None,
    in_steps: int | None = None,
) -> dict[str, Any]:
    """Write a trigger asking the run's ranks to record a window; what was written, and who listens.

    `ranks` is a rank spec (default: the run's own trace.ranks) and `steps` at most the
    run's trace.trigger_max_steps (default: 2). The window starts at step `at`, or
    `in_steps` after the latest step in the run's timings, or by default far enough
    ahead for every selected rank to see the trigger in time. Nothing is written when
    the request does not fit the run.
    """
    if at is not None and in_steps is not None:
        raise ConfigError("--at", at, "--at or --in, not both", f"--in {in_steps} is given too")
    for option, value in (("--steps", steps), ("--at", at), ("--in", in_steps)):
        if value is not None and value < 1:
            raise ConfigError(option, value, "a number >= 1")
    meta = _run_meta(run_dir)
    world = _world_size(meta)
    spec = config_in_meta(meta.meta[min(meta.meta)], "trace")["ranks"] if ranks is None else ranks
    rank_set = parse_ranks(spec, "--ranks")
    rank_set.check_world_size(world, "--ranks")
    selected = list(range(world)) if rank_set.everything else sorted(rank_set.ranks)
    listening, unheard = _who_listens(meta, selected, rank_set)
    traces = [config_in_meta(meta.meta[r], "trace") for r in listening]
    timers = [config_in_meta(meta.meta[r], "timer") for r in listening]
    max_steps = min(int(t["trigger_max_steps"]) for t in traces)
    steps = min(2, max_steps) if steps is None else steps
    if steps > max_steps:
        raise ConfigError(
            "--steps",
            steps,
            f"1 to {max_steps}",
            f"the run's trace.trigger_max_steps is {max_steps}",
        )
    check = max(int(t["trigger_check_every_n_steps"]) for t in traces)
    progress = run_progress(run_dir)
    if progress.state == "finished":
        raise TraceError(f"{run_dir}: {progress.note}; no rank is left to see a trigger")
    latest = progress.step
    lead = progress.lag + check + 2 if progress.source == "heartbeat" else _lead(timers, check)
    start = _start(run_dir, latest, lead, at, in_steps)
    trigger = Trigger(
        new_trigger_id(),
        start,
        steps,
        rank_set.spec(),
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    path = write_trigger(run_dir, trigger)
    note = progress.note
    if latest is None:
        note = (
            "the run has no heartbeat or timings, so whether this step is still ahead is not known"
        )
    elif note is None and start < latest + lead:
        note = (
            f"ranks may first see this trigger as late as step {latest + lead - 2}; "
            f"a rank that sees it at step {start} or later declines it"
        )
    # With trace.tool="nsys", nsys writes the reports; rankscope notes each range there.
    folder = NSYS if all(t["tool"] == "nsys" for t in traces) else TRACES
    return {
        **trigger.to_dict(),
        "run_dir": str(run_dir),
        "path": str(path),
        "last": trigger.last,
        "window": trigger.window,
        "traces": str(Path(run_dir) / folder / trigger.window),
        "latest_step": latest,
        "run": progress.to_dict(),
        "selected": selected,
        "listening": listening,
        "not_listening": {str(r): why for r, why in unheard.items()},
        "check_every": check,
        "note": note,
    }


def trigger_status(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Every trigger in the run and, per rank it selects, where it stands.

    A rank's state is one of saved (with the file it saved), accepted, declined (with
    its reason), waiting, or not_listening (with the reason its config gives). Trigger
    files that cannot be read are listed under "skipped".
    """
    meta = _run_meta(run_dir)
    world = _world_size(meta)
    run = RunDir(run_dir)
    found: list[dict[str, Any]] = []
    skipped: list[str] = []
    for path in run.triggers():
        try:
            trigger = read_trigger(path)
        except (OSError, ValueError) as exc:
            skipped.append(f"{path}: not a valid trigger file ({exc})")
            continue
        rank_set = parse_ranks(trigger.ranks, "ranks")
        acks = read_acks(run_dir, trigger.id)
        states: dict[str, list[int]] = {state: [] for state in _STATES}
        reasons: dict[str, str] = {}
        saved: dict[str, str] = {}
        for rank in (r for r in range(world) if r in rank_set):
            ack = acks.get(rank)
            if ack is not None and ack.get("status") == "accepted":
                done = run.saved(str(ack.get("window", trigger.window)), rank)
                if done:
                    states["saved"].append(rank)
                    saved[str(rank)] = str(done[0])
                else:
                    states["accepted"].append(rank)
            elif ack is not None:
                states["declined"].append(rank)
                reasons[str(rank)] = str(ack.get("reason"))
            else:
                why = rank_listens(meta.meta.get(rank))
                if why is None:
                    states["waiting"].append(rank)
                else:
                    states["not_listening"].append(rank)
                    reasons[str(rank)] = why
        found.append(
            {
                **trigger.to_dict(),
                "path": str(path),
                "last": trigger.last,
                "window": trigger.window,
                "ranks_by_state": states,
                "reasons": reasons,
                "saved": saved,
            }
        )
    progress = run_progress(run_dir)
    return {
        "run_dir": str(run_dir),
        "run": progress.to_dict(),
        "triggers": found,
        "skipped": skipped,
    }


@dataclass
class Progress:
    """How far a run has come, from its heartbeats (or, without any, its timings)."""

    state: str
    """"running", "finished" (every heartbeat says its rank's stop() ran), "stale" (no
    heartbeat moved for a long time: finished without stop(), or hung), "unknown"."""
    step: int | None = None
    """The latest step a running rank is in (or the timings reached)."""
    lag: int = 0
    """Steps the run may have gone on since the heartbeats said `step`."""
    source: str | None = None
    """"heartbeat" or "timings"."""
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "step": self.step, "source": self.source, "note": self.note}


# No heartbeat moved for this long: the run looks over (a live rank rewrites its
# heartbeat every few seconds whenever it steps or enters a phase).
_STALE_S = 300.0


def run_progress(run_dir: str | os.PathLike[str], now_ns: int | None = None) -> Progress:
    """Where the run stands: its heartbeats say it from the first step on."""
    from ..analysis.read._watch import read_watch

    beats = read_watch(run_dir).heartbeats
    if not beats:
        latest = latest_step(run_dir)
        return Progress("unknown" if latest is None else "running", latest, source="timings")
    now = time.time_ns() if now_ns is None else now_ns
    if all(beat.stopped for beat in beats.values()):
        last = max(beat.stopped_ns or beat.written_ns for beat in beats.values())
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last / 1e9))
        return Progress(
            "finished",
            max(beat.step for beat in beats.values()),
            source="heartbeat",
            note=f"the run looks finished: every rank's stop() ran (the last at {when})",
        )
    running = [beat for beat in beats.values() if not beat.stopped]
    moved = max(beat.moved_ns for beat in running)
    step = max(beat.step for beat in running)
    if (now - moved) / 1e9 > _STALE_S:
        minutes = (now - moved) / 60e9
        return Progress(
            "stale",
            step,
            source="heartbeat",
            note=f"no heartbeat has moved for {minutes:.0f} min: the run looks finished or "
            "hung (rankscope hang says which)",
        )
    # Steps the ranks may have taken since their heartbeats were written.
    oldest = min(beat.written_ns for beat in running)
    medians = [b.median_step_s for b in running if b.median_step_s]
    lag = math.ceil((now - oldest) / 1e9 / min(medians)) + 1 if medians else 10
    return Progress("running", step, lag=min(lag, 10_000), source="heartbeat")


def latest_step(run_dir: str | os.PathLike[str]) -> int | None:
    """The latest step in the run's timings; None without any. Read by DuckDB where the
    analysis extra is installed (seconds for thousands of ranks), else line by line."""
    from ..analysis.read._engine import read_run_records
    from ..analysis.read._timings import read_timings

    try:
        if importlib.util.find_spec("duckdb") is not None:
            steps = list(read_run_records(run_dir).last_step.values())
        else:
            timings = read_timings(run_dir)
            steps = [int(t.step.max()) for t in timings.ranks.values() if len(t)]
    except TraceError:
        return None
    return max(steps) if steps else None


def _run_meta(run_dir: str | os.PathLike[str]) -> RunMeta:
    from ..analysis.read._run import read_run_meta

    meta = read_run_meta(run_dir)
    if not meta.meta:
        raise TraceError(f"{run_dir}: not a run directory (no {META_FILES} in it)")
    return meta


def _world_size(meta: RunMeta) -> int:
    return meta.world_size if meta.world_size is not None else max(meta.meta) + 1


def _who_listens(
    meta: RunMeta, selected: list[int], rank_set: RankSet
) -> tuple[list[int], dict[int, str]]:
    """The selected ranks that check for triggers, and why each other one does not."""
    listening: list[int] = []
    unheard: dict[int, str] = {}
    for rank in selected:
        reason = rank_listens(meta.meta.get(rank))
        if reason is None:
            listening.append(rank)
        else:
            unheard[rank] = reason
    if not listening:
        first = min(unheard)
        raise ConfigError(
            "--ranks",
            rank_set.spec(),
            "ranks whose config checks for triggers",
            f"no selected rank checks for triggers (rank {first}: {unheard[first]})",
        )
    return listening, unheard


def _lead(timers: list[dict[str, Any]], check: int) -> int:
    """How far past the latest step in the timings a window must start for every rank to see
    its trigger in time: the timings lag the run by up to one sampling interval and one flush
    interval, a rank looks every check interval, and the step before the window warms the
    profiler up."""
    lag = max(
        int(t["every_n_steps"]) + int(t["flush_every_n_steps"]) if t["enable"] else 0
        for t in timers
    )
    return lag + check + 2


def _start(
    run_dir: str | os.PathLike[str],
    latest: int | None,
    lead: int,
    at: int | None,
    in_steps: int | None,
) -> int:
    if at is not None:
        if latest is not None and at <= latest:
            raise ConfigError(
                "--at",
                at,
                f"a step after {latest}",
                f"the run's timings have reached step {latest} already",
            )
        return at
    if latest is None:
        raise TraceError(
            f"{run_dir}: no heartbeat or timings to tell which step the run has reached "
            "(is hang.enable off?); give the first step with --at STEP"
        )
    return latest + (lead if in_steps is None else in_steps)
