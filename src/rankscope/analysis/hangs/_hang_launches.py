"""Which heartbeats and hang files are the run's current ones: the latest launch of a
restarted run, each rank's current attempt, and the world size that launch states."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..read._attempts import ONE_LAUNCH_NS, AttemptMark, mark_of, run_attempts
from ..read._run import RunMeta
from ..read._watch import HangFile, Heartbeat

__all__ = ["current_hangs", "latest_launch", "world_size_of"]


@dataclass(frozen=True)
class _Starts:
    """What `run_attempts` reads of a rank: its starts (here one, its latest)."""

    attempts: list[AttemptMark]


def _meta_attempt(meta: RunMeta, rank: int) -> dict[str, Any] | None:
    attempt = meta.meta.get(rank, {}).get("attempt")
    return attempt if isinstance(attempt, dict) else None


def latest_launch(
    beats: dict[int, Heartbeat], meta: RunMeta
) -> tuple[dict[int, Heartbeat], list[int]]:
    """The heartbeats of the run's latest launch, and the ranks whose heartbeat is of an
    earlier one. A start is known from the heartbeat's `started_ns`, or from the rank's
    meta file when it names the heartbeat's attempt; a rank whose start is not known is
    kept."""
    starts: dict[int, _Starts] = {}
    for rank, beat in beats.items():
        mark: AttemptMark | str | None = None
        attempt = _meta_attempt(meta, rank)
        if attempt is not None and attempt.get("attempt") == beat.attempt:
            mark = mark_of(attempt)
        if (not isinstance(mark, AttemptMark) or mark.started_ns is None) and beat.started_ns:
            mark = AttemptMark(token=beat.attempt, started_ns=beat.started_ns)
        if isinstance(mark, AttemptMark) and mark.started_ns is not None:
            starts[rank] = _Starts([mark])
    if len(starts) < 2 or _one_launch([s.attempts[0] for s in starts.values()]):
        return beats, []
    launches, _ = run_attempts(starts)
    if len(launches) < 2:
        return beats, []
    latest = {rank for rank, _ in launches[-1]}
    earlier = sorted(set(starts) - latest)
    return {r: b for r, b in beats.items() if r not in earlier}, earlier


def _one_launch(marks: list[AttemptMark]) -> bool:
    """The common case, seen without pairing every rank with every other (`run_attempts`
    does, which 4096 ranks make seconds): one launcher key, starts within its window."""
    keys = {(m.launcher, m.job, m.restart) if m.job is not None else None for m in marks}
    starts = [m.started_ns or 0 for m in marks]
    return len(keys) == 1 and max(starts) - min(starts) < ONE_LAUNCH_NS


def current_hangs(
    hangs: list[HangFile], beats: dict[int, Heartbeat], earlier: set[int], meta: RunMeta
) -> tuple[dict[int, HangFile], list[HangFile], int]:
    """(each rank's open stall of its current attempt, the stalls of that attempt that
    ended, how many hang files were an earlier attempt's)."""
    by_rank: dict[int, list[HangFile]] = {}
    for hang in hangs:
        by_rank.setdefault(hang.rank, []).append(hang)
    open_hangs: dict[int, HangFile] = {}
    ended: list[HangFile] = []
    older = 0
    for rank, files in sorted(by_rank.items()):
        if rank in earlier:
            older += len(files)
            continue
        beat = beats.get(rank)
        attempt = _meta_attempt(meta, rank)
        if beat is not None:
            token = beat.attempt
        elif attempt is not None and isinstance(attempt.get("attempt"), str):
            token = attempt["attempt"]
        else:
            token = max(files, key=lambda h: h.detected_ns).attempt
        mine = [h for h in files if h.attempt == token]
        older += len(files) - len(mine)
        still = [h for h in mine if _still_open(h, beat)]
        ended.extend(h for h in mine if h not in still)
        if still:
            named = [h for h in still if beat is not None and h.stall == beat.hang]
            pick = (named or sorted(still, key=lambda h: h.detected_ns))[-1]
            open_hangs[rank] = pick
            ended.extend(h for h in still if h is not pick)
    return open_hangs, ended, older


def _still_open(hang: HangFile, beat: Heartbeat | None) -> bool:
    """A stall that has not ended: no ended_ns, and the rank's heartbeat (if any) is
    running and still in that step (the watchdog's own rule: a stall lasts until the
    step changes; its rewrite with ended_ns may not have landed, or the rank died)."""
    if hang.ended_ns is not None:
        return False
    return beat is None or (not beat.stopped and beat.step == hang.step)


def world_size_of(meta: RunMeta, beats: dict[int, Heartbeat], earlier: list[int]) -> int | None:
    """The world size the meta files state; after a launch with fewer ranks, the one the
    latest launch's ranks state."""
    if not earlier:
        return meta.world_size
    sizes = [
        size
        for rank in beats
        if isinstance(size := meta.meta.get(rank, {}).get("world_size"), int)
        and not isinstance(size, bool)
        and rank < size <= (1 << 20)
    ]
    return max(sizes) if sizes else meta.world_size
