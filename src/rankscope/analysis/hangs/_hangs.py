"""Who is stuck, and where: a run's heartbeats and hang files, the stuck rank told apart
from the ranks that wait for it (docs/hangs.md says these rules for users).

- Attempts. A rank's heartbeat is rewritten by each start of that rank, so it is the
  rank's latest attempt. A hang file counts only when its attempt token is the one in
  its rank's heartbeat (without a heartbeat: the one in its meta file; without either,
  the token of its newest hang file); the others are an earlier attempt's, left out
  and counted. Heartbeats of ranks that did not start again in the run's latest launch
  (a job restarted with fewer ranks) are left out too: their starts, from the meta
  files, are matched into launches as the timings' are (`run_attempts`).
- Stalled. A rank whose heartbeat says "running" is stalled when it has an open stall
  (a hang file of its attempt with no `ended_ns`, and its heartbeat still at that
  step), or when it has not moved (no step(), no phase entered or left) for longer
  than its threshold, judged against now: the hang file's `threshold_s`, else the
  heartbeat's, else max(hang.factor x its median step time, hang.after_s), from the
  rank's config in its meta file (the watchdog's own rule and defaults).
- Flight Recorder. Where the ranks' dumps are there (beside their hang files, or given
  by the user), each process group's collectives are matched across them
  (analysis/hangs/_flight.py): a stalled rank that never entered a collective its group
  waits in, and entered none that another rank never entered, is stuck; the ranks in
  such a collective wait. This comes before the rules below, which judge the rest.
- Stuck or waiting. A stalled rank whose innermost open phase is of kind "comm" waits.
  Of the others, those at the earliest place (the lowest step; in it, the earliest
  phase, in the order the run's timings show a step runs its phases) are stuck, and
  those further along wait for them. A stuck candidate in a phase that the timings show
  to end in a collective (its ranks leave it together though they enter apart: a DDP
  backward, analysis/stragglers/_arrivals.py's rule) waits there instead when no stalled rank is
  further along: the rank it waits for is one that is not stalled. Without timings the
  order within a step is unknown: the ranks at the lowest step are stuck.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..._errors import ConfigError, TraceError
from ..core._options import HangOptions
from ..read._flight import FlightDump, FlightDumpError, dumps_at, read_flight_dump
from ..read._run import RunMeta, read_run_meta
from ..read._watch import HangFile, Heartbeat, read_watch
from ._flight import collectives_of
from ._hang_ends import behind_note, last_seen, process_gone
from ._hang_launches import current_hangs, latest_launch, world_size_of
from ._hang_model import (
    EARLIEST,
    FOR_ENDED,
    IN_COMM,
    IN_PENDING,
    IN_SYNC,
    LATER_PHASE,
    LATER_STEP,
    NOT_ENTERED,
    NS_PER_S,
    STALL_FACTOR,
    STALL_FLOOR_S,
    STUCK,
    WAITS,
    GroupCollectives,
    HangFinding,
    HangReport,
)
from ._hang_words import notes_of, state_of, summary_of
from ._step_order import StepOrder, StepOrders

if TYPE_CHECKING:
    from ..read._timed import TimedRun

__all__ = ["find_hangs", "hangs_of"]


def find_hangs(
    run_dir: str | os.PathLike[str],
    options: HangOptions | None = None,
    *,
    now_ns: int | None = None,
    orders: StepOrders | None = None,
    flight_recorder: str | os.PathLike[str] | None = None,
) -> HangReport:
    """Read a run's heartbeats (RUN_DIR/live) and hang files (RUN_DIR/hangs), and the
    Flight Recorder dumps its watchdog saved beside them, and say who is stuck where, and
    who waits for it.

    `flight_recorder`: dumps the user has (a folder of them, or the prefix torch wrote
    them under, `TORCH_FR_DUMP_TEMP_FILE`), read in place of the watchdog's. `now_ns`
    (epoch ns) is the time to judge against; the clock by default. `orders`:
    where a caller asks again and again (`rankscope top`), the reader of the step order
    it holds, which reads the timings again only when they changed. A path that is not a
    run directory is a TraceError; a run without heartbeats or hang files is a report
    whose state is "no heartbeats". Bad files are named in `skipped`.
    """
    if now_ns is not None and (
        isinstance(now_ns, bool) or not isinstance(now_ns, int) or now_ns < 0
    ):
        raise ConfigError("now_ns", now_ns, "epoch nanoseconds, an integer >= 0")
    meta = read_run_meta(run_dir)
    now = time.time_ns() if now_ns is None else now_ns
    report = hangs_of(meta, now, options, orders=orders, flight_recorder=flight_recorder)
    report.skipped[:0] = meta.skipped
    return report


def hangs_of(
    meta: RunMeta,
    now_ns: int,
    options: HangOptions | None = None,
    *,
    run: TimedRun | None = None,
    orders: StepOrders | None = None,
    flight_recorder: str | os.PathLike[str] | None = None,
) -> HangReport:
    """`find_hangs` for a run whose meta files are read already; what the meta files
    could not give is the caller's to say (not in `skipped`). `run`: its timings, where
    the caller read them on host time, so that they are not read a second time."""
    files = read_watch(meta.root)
    beats, earlier = latest_launch(files.heartbeats, meta)
    open_hangs, ended, older = current_hangs(files.hangs, beats, set(earlier), meta)
    world = world_size_of(meta, beats, earlier)
    running = [b.written_ns for b in beats.values() if not b.stopped]
    report = HangReport(
        run_dir=meta.root.resolve(),
        state="",
        summary="",
        now_ns=now_ns,
        world_size=world,
        heartbeats=len(beats),
        newest_heartbeat_ns=max(running) if running else None,
        earlier_launch=earlier,
        older_hang_files=older,
        files_listed=files.listed,
        files_read=len(files.heartbeats) + len(files.hangs),
        skipped=files.skipped,
    )
    present = set(beats) | set(open_hangs) | {h.rank for h in ended}
    size = world if world is not None else max(present, default=-1) + 1
    report.missing = [r for r in range(size) if r not in present]
    stalled = _judge(report, beats, open_hangs, meta)
    if report.gone or any(f.kind != "comm" for f in stalled):  # else no need of the timings
        report.order = (orders or StepOrders())(meta, report.skipped, run)
    timed = report.order.last_step if report.order is not None else {}
    report.gone = {rank: last_seen(beats[rank], timed) for rank in report.gone}
    report.findings = _roles(stalled, report.order)
    dumps = _dumps(open_hangs, flight_recorder, report.skipped)
    if dumps:
        recorded = {
            g.name: (g.desc, g.ranks) for h in open_hangs.values() for g in h.process_groups
        }
        report.dumps = {rank: str(d.path) for rank, d in sorted(dumps.items())}
        report.collectives = collectives_of(dumps, recorded, world)
        report.findings = _flight_roles(report.findings, report.collectives)
    if report.gone:  # the ranks still there wait for the ones that ended
        report.findings = [
            dataclasses.replace(f, role=WAITS, why=FOR_ENDED) for f in report.findings
        ]
    report.stalls_ended = _ended(ended)
    report.state = state_of(report, beats)
    report.summary = summary_of(report)
    report.notes = notes_of(report, HangOptions() if options is None else options)
    behind = behind_note({r: b for r, b in beats.items() if r not in report.running}, timed)
    if behind is not None:
        report.notes.append(behind)
    return report


# -- judging each rank -----------------------------------------------------------------


def _judge(
    report: HangReport,
    beats: dict[int, Heartbeat],
    open_hangs: dict[int, HangFile],
    meta: RunMeta,
) -> list[HangFinding]:
    """The stalled ranks (roles not yet given); fills running, stopped and longest_unmoved."""
    now = report.now_ns
    stalled: list[HangFinding] = []
    for rank in sorted(set(beats) | set(open_hangs)):
        beat, hang = beats.get(rank), open_hangs.get(rank)
        if beat is not None and beat.stopped:
            report.stopped.append(rank)
            report.stopped_steps.append(beat.step)
            if beat.error is not None:
                report.errors[rank] = beat.error
            continue
        if beat is not None and hang is None and process_gone(beat):
            report.gone[rank] = beat.step  # where last seen: set once the timings are read
            continue
        if beat is not None:
            step, phases, moved = beat.step, beat.open, beat.moved_ns
        elif hang is not None:  # no heartbeat: the last it moved is when its phases began
            step, phases = hang.step, hang.open
            moved = max([hang.step_started_ns or 0, *(p.since_ns for p in hang.open)])
        else:
            continue
        threshold = _threshold(beat, hang, meta.meta.get(rank, {}))
        host = (beat.host if beat else None) or (hang.host if hang else None)
        unmoved = max(0, now - moved) / NS_PER_S
        if hang is None and beat is not None and unmoved <= threshold:
            report.running.append(rank)
            # How long it had not moved when its heartbeat was written: past that nothing
            # is known. A job of 30 steps a second moves between two heartbeats, and now
            # less moved_ns would be the heartbeat's age, not a pause of the rank's.
            known = max(0, min(now, beat.written_ns) - moved) / NS_PER_S
            if report.longest_unmoved is None or known > report.longest_unmoved[0]:
                report.longest_unmoved = (known, rank)
            continue
        stalled.append(
            HangFinding(
                rank=rank,
                role=WAITS,
                host=host or meta.hosts.get(rank),
                step=step,
                open=phases,
                since_ns=phases[-1].since_ns if phases else moved,
                now_ns=now,
                moved_ns=moved,
                written_ns=beat.written_ns if beat else None,
                threshold_s=threshold,
                hang=hang,
            )
        )
    return stalled


def _threshold(beat: Heartbeat | None, hang: HangFile | None, meta: dict[str, Any]) -> float:
    """The rank's watchdog threshold: as its hang file or heartbeat states it, else by
    the watchdog's rule from the rank's config (its meta file), else from the defaults."""
    if hang is not None:
        return hang.threshold_s
    if beat is not None and beat.threshold_s is not None:
        return beat.threshold_s
    config = meta.get("config")
    rule = config.get("hang") if isinstance(config, dict) else None
    after = _positive(rule, "after_s", STALL_FLOOR_S)
    factor = _positive(rule, "factor", STALL_FACTOR)
    median = beat.median_step_s if beat is not None else None
    return max(factor * median, after) if median else after


def _positive(rule: object, key: str, default: float) -> float:
    value = rule.get(key) if isinstance(rule, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    return float(value) if math.isfinite(value) and 0 < value <= 1e9 else default


# A rank's place: its step, and the places of its open phases, outermost first, up to
# the first the timings do not know.
_Place = tuple[int, tuple[int, ...]]


def _roles(stalled: list[HangFinding], order: StepOrder | None) -> list[HangFinding]:
    """Stuck: outside a collective, at the earliest place of such ranks; the rest wait
    (the module's docstring says the rule)."""
    places = {f.rank: _place_of(f, order) for f in stalled}
    outside = {places[f.rank] for f in stalled if f.kind != "comm"}
    low = min((step for step, _ in outside), default=None)
    # Within a step, places are few (the step's phases): comparing each pair is cheap.
    first = [p for p in outside if p[0] == low]
    last = max(step for step, _ in places.values()) if places else None
    at_last = {p for p in places.values() if p[0] == last}
    sync = order.sync if order is not None else frozenset()
    out = []
    for f in stalled:
        place = places[f.rank]
        if f.kind == "comm":
            why = IN_COMM
        elif place[0] != low:
            why = LATER_STEP
        elif any(_before(p, place) for p in first):
            why = LATER_PHASE
        elif f.phase in sync and place[0] == last and not any(_before(place, p) for p in at_last):
            why = IN_SYNC  # no stalled rank is past it: it waits for one that is not stalled
        else:
            why = EARLIEST
        out.append(dataclasses.replace(f, role=STUCK if why == EARLIEST else WAITS, why=why))
    return out


def _flight_roles(findings: list[HangFinding], groups: list[GroupCollectives]) -> list[HangFinding]:
    """Where the dumps say: a rank that never entered a collective its group waits in,
    and is inside none that a rank never entered, is stuck; the ranks inside wait."""
    waiting = [g for g in groups if g.state == "waits"]
    inside = {r for g in waiting for r in g.entered}
    absent = {r for g in waiting for r in g.absent}
    out = []
    for f in findings:
        if f.rank in absent and f.rank not in inside:
            out.append(dataclasses.replace(f, role=STUCK, why=NOT_ENTERED))
        elif f.rank in inside:
            out.append(dataclasses.replace(f, role=WAITS, why=IN_PENDING))
        else:
            out.append(f)
    return out


def _dumps(
    hangs: dict[int, HangFile], given: str | os.PathLike[str] | None, skipped: list[str]
) -> dict[int, FlightDump]:
    """The dumps to read: the user's (`given`), else those the watchdog saved beside the
    open stalls' hang files. One that cannot be read is said in `skipped`."""
    paths: dict[int, Path | str]
    if given is not None:
        found, notes = dumps_at(given)
        paths = dict(found)
        skipped.extend(notes)
    else:
        paths = {r: h.flight_recorder for r, h in hangs.items() if h.flight_recorder}
    out = {}
    for rank, path in sorted(paths.items()):
        try:
            out[rank] = read_flight_dump(path, rank)
        except (FlightDumpError, OSError, TraceError) as exc:
            skipped.append(str(exc) if isinstance(exc, FlightDumpError) else f"{path}: {exc}")
    return out


def _place_of(finding: HangFinding, order: StepOrder | None) -> _Place:
    places: list[int] = []
    for p in finding.open:
        place = None if order is None else order.places.get(p.phase)
        if place is None:
            break
        places.append(place)
    return finding.step, tuple(places)


def _before(a: _Place, b: _Place) -> bool:
    """`a` is strictly earlier than `b`. Within a step, places are compared as far as
    both are known: a rank in `train` and one in `train > forward` are at one place."""
    if a[0] != b[0]:
        return a[0] < b[0]
    for x, y in zip(a[1], b[1], strict=False):
        if x != y:
            return x < y
    return False


# -- the step's order, from the timings ----------------------------------------------------


def _ended(ended: list[HangFile]) -> list[dict[str, Any]]:
    by_stall: dict[str, list[HangFile]] = {}
    for hang in ended:
        by_stall.setdefault(hang.stall, []).append(hang)
    out = []
    for stall, files in sorted(by_stall.items()):
        lengths = [h.stalled_s for h in files if h.stalled_s is not None]
        out.append(
            {
                "stall": stall,
                "steps": sorted({h.step for h in files}),
                "ranks": sorted({h.rank for h in files}),
                "longest_s": max(lengths) if lengths else None,
            }
        )
    return out


# -- words -----------------------------------------------------------------------------
