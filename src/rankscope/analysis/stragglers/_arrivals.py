"""When each rank reaches a phase, and whom it waits for in one that ends in a collective.

Waiting is told apart by when ranks arrive. A phase that ends in a collective (kind
"comm", or a phase whose ranks leave it together although they entered it apart, such as
a DDP backward with its gradient all-reduce inside) lasts longer on the ranks that
arrive early: their excess there is waiting, and the rank that arrives last is the one
they wait for. Arrival is the host wall clock at phase entry, corrected by each rank's
clock offset where comm phases show one; with device times it is the device time spent
in the step before the phase. Lateness a rank carries in, having left the last
collective (or entered the step) after the others, is not its own: on one host that is
the order the scheduler woke them in. It waits for a rank only when that rank made most
of its lateness in its own work.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from ..collectives._collective_clocks import clock_offsets
from ..core._chance import binomial_tail, steps_needed
from ..read._matrix import STEP, PhaseMatrices, nanmedian, quiet

__all__ = [
    "arrivals",
    "ends_in_a_collective",
    "ends_in_collective",
    "first_arrival",
    "last_arrivals",
    "lateness",
    "times_of",
    "whom_it_waits_for",
]

Matrix = npt.NDArray[np.float64]
Vector = npt.NDArray[np.float64]

# A phase is taken to end in a collective at a step when its exits spread across ranks
# by less than this share of how far its entries spread...
_SYNC_SPREAD = 0.25
# ...judged only at steps where entries spread by at least this share of its time.
_CONCLUSIVE = 0.05
# A phase that issued a collective ends in it unless its exits spread by more than
# this share of its time (and twice its entries) at most steps: work follows the collective.
_APART = 0.25
# ...on this many steps or more (fewer cannot overturn what the records say).
_OVERTURN = 5
# ...and one rank last there at more of them than this chance allows ranks in any order.
_BY_CHANCE = 0.01
# A late rank is late by its own work when, at its typical late step, it made at least
# this share of its lateness after the ranks were last together (the step began, or they
# left a collective).
_EXPLAINED = 0.5


def ends_in_collective(m: PhaseMatrices, hosts: Mapping[int, str] | None = None) -> list[str]:
    """The phases of `m` that end in a collective: kind "comm", or ranks that leave the
    phase together although they entered it apart (a DDP backward). The one rule the
    stragglers, the hangs and the diff share."""
    timeline = m.on_timeline()
    arrive, leave = arrivals(timeline, hosts)
    return [
        phase
        for p, (phase, kind) in enumerate(zip(m.phases, m.kinds, strict=True))
        if phase != STEP
        and ends_in_a_collective(m, p, arrive[p], leave[p], timeline.ms[p], timeline)
    ]


def ends_in_a_collective(  # noqa: PLR0917 - the phase, its times, and the timeline they are on
    m: PhaseMatrices,
    p: int,
    arrive: Matrix,
    leave: Matrix,
    d: Matrix,
    timeline: PhaseMatrices | None = None,
) -> bool:
    """Phase `p` ends in a collective: kind "comm"; else where its records say whether
    a collective was issued in it, what they say; else where ranks leave it together
    though they entered it apart (a guess that a busy machine's late wake-ups defeat).
    In a pipeline (a comm phase runs more than once in
    a rank's step: its sends and recvs), a work phase that runs once per microbatch does
    not: each run is followed by a send, and on device time, where arrivals are the time
    spent before a phase, two stages' backwards were taken to leave together.

    Where the records say a collective was issued and the ranks leave apart (a rank's work
    after the collective is longer: _leave_apart), the phase still ends in it where the
    ranks that reached it far apart left it together (_waited_there): they waited there.
    Reached: after the work nested in the phase before it, on `timeline` (a Trainer's
    batch fetch before its all-gather)."""
    if m.kinds[p] == "comm":
        return True
    if m.pipelined and m.phases[p] in m.repeats:
        return False
    said = m.issued.get(m.phases[p])
    if said is not None:  # the records say (timing/_collectives.py)
        if not said or not _leave_apart(arrive, leave, d):
            return bool(said)
        return _waited_there(_reached(timeline, p, arrive), leave)
    return _ends_together(arrive, leave, d)


def _waited_there(reached: Matrix, leave: Matrix) -> bool:
    """Ranks that reached a phase's collective far apart left it together: at the steps
    where they reached it spread by more than twice the phase's typical spread of exits,
    their exits are spread by less than half of that, at most of those steps (and
    `_OVERTURN` of them at least). A real HF job, one rank's collator 20 ms slow from
    step 40: its ranks reached the all-gather 18-24 ms apart and left 1-6 ms apart; before
    the fault one rank, sharing a core, left its work after the all-gather last at 10 of
    12 steps, which alone overturned the records and hid the fault."""
    entered, left = _spreads(reached), _spreads(leave)
    with quiet():
        usual = float(np.nanmedian(left)) if np.isfinite(left).any() else math.nan
    far = np.isfinite(entered) & np.isfinite(left) & (entered > 2 * usual)
    if far.sum() < _OVERTURN:
        return False
    return bool(np.mean(left[far] < 0.5 * entered[far]) >= 0.5)


def _reached(timeline: PhaseMatrices | None, p: int, arrive: Matrix) -> Matrix:
    """When each rank reached phase `p`'s collective: its arrival, plus the work nested in
    the phase before it (work_inside), where the timeline is known."""
    if timeline is None:
        return arrive
    held = timeline.work_inside({timeline.phases[p]}).get(p)
    return arrive if held is None else arrive + held[1] * 1e6


def arrivals(
    m: PhaseMatrices, hosts: Mapping[int, str] | None
) -> tuple[list[Matrix], list[Matrix]]:
    """Per phase, when each rank entered and left it, on one clock for all ranks."""
    if m.on_device:
        # No device timestamps: arrival is the time the step spent before the phase, each
        # phase on its own clock (host time where the host is the work).
        arrive, leave = [], []
        before = np.zeros((len(m.ranks), len(m.steps)))
        for p, depth in enumerate(m.depths):
            d = np.nan_to_num(m.ms[p]) * 1e6  # ns, as host arrivals are
            arrive.append(before.copy())
            leave.append(before + d)
            if depth == 0 and m.phases[p] != STEP:
                before = before + d
        return arrive, leave
    offset = clock_offsets(m, hosts)
    if not offset.any():  # one clock already: the records' own times, not copies (78 MB)
        return list(m.start_ns), list(m.end_ns)
    if offset.ndim == 1:  # one offset a rank for the whole run
        offset = offset[:, None]
    return [s - offset for s in m.start_ns], [e - offset for e in m.end_ns]


def _leave_apart(arrive: Matrix, leave: Matrix, d: Matrix) -> bool:
    """Ranks leave the phase much further apart than they entered it, and one rank leaves
    last at most of those steps: its collective comes first and that rank's work after
    it is longer (FSDP's all-gathers open a forward; one rank's compute after them is
    slow), so the phase does not end in it. What the records say (a collective was
    issued) is overturned only where that one rank left last on `_OVERTURN` such steps
    or more, more often than chance would put one of the ranks last, and over a stretch
    (_a_stretch). A busy machine's late wake-ups after a collective spread the exits too,
    by more than `_APART` of a 0.1 ms DDP backward, but a different rank's each time, or
    one rank's at steps scattered over the run.

    Not "at most steps of the run": a fault from the middle of a run spreads the exits
    of the steps after it only (a real FSDP job, one rank 15 ms slow after its forward's
    all-gathers from step 80 of 160, left apart at 15 of 32 sampled steps, rank 1 last
    at all 15, and was read as ending in a collective: no finding at all)."""
    entered, left = _spreads(arrive), _spreads(leave)
    with quiet():
        typical = nanmedian(d, 0) * 1e6
    known = np.isfinite(entered) & np.isfinite(left) & np.isfinite(typical)
    if not known.any():
        return False
    apart = known & (left > 2 * entered) & (left > _APART * typical)
    if apart.sum() < _OVERTURN:
        return False
    exits = leave[:, apart]
    last = np.argmax(np.where(np.isfinite(exits), exits, -np.inf), axis=0)
    counts = np.bincount(last)
    most = int(counts.max())
    # Beyond chance among the ranks there: of two ranks one is last at half the steps
    # whatever the order (a clean 2-rank Lightning job was overturned at 3 of 10 runs).
    ranks = max(2, int(np.median(np.sum(np.isfinite(exits), axis=0))))
    chance = binomial_tail(most, len(last), 1 / ranks)
    if most < _OVERTURN or most < 0.5 * len(last) or chance >= _BY_CHANCE:
        return False
    # And over a stretch, as a slow rank is: `_OVERTURN` of its steps or more, at half the
    # known steps or more from the first of them to the last. A rank's longer work after
    # the collective lasts while its cause does; a busy machine's late wake-ups come and go
    # (a 4-rank DDP job on 2 cores beside a test suite: one rank left its backward last at
    # 6 of 100 sampled steps, scattered over them, and the all-reduce its records say was
    # overturned).
    its = np.flatnonzero(apart)[last == int(np.argmax(counts))]
    return _a_stretch(its, np.cumsum(known))


def _a_stretch(at: npt.NDArray[np.int64], known_so_far: npt.NDArray[np.int64]) -> bool:
    """Some run of `at` (sorted step indices), `_OVERTURN` long or more, covers half the
    known steps or more from its first step to its last (`known_so_far`: the cumulative
    count of known steps). The run from the i-th to the j-th holds j - i + 1 of them and
    spans K[at[j]] - K[at[i] - 1] known steps: it qualifies where 2i - K[at[i] - 1] <=
    2j + 2 - K[at[j]], so one pass with the least left side so far tells (in time and
    memory linear in `at`, for runs of any length)."""
    if len(at) < _OVERTURN:
        return False
    index = np.arange(len(at))
    before = np.where(at > 0, known_so_far[np.maximum(at - 1, 0)], 0)
    least = np.minimum.accumulate(2 * index - before)  # over the starts up to each index
    ends = index[_OVERTURN - 1 :]
    return bool(np.any(least[ends - (_OVERTURN - 1)] <= 2 * ends + 2 - known_so_far[at[ends]]))


def _ends_together(arrive: Matrix, leave: Matrix, d: Matrix) -> bool:
    """Ranks leave the phase together though they entered it apart, at most conclusive steps."""
    entered, left = _spreads(arrive), _spreads(leave)
    with quiet():
        typical = nanmedian(d, 0) * 1e6
    conclusive = entered > _CONCLUSIVE * typical
    if not conclusive.any():
        return False
    together = left[conclusive] < _SYNC_SPREAD * entered[conclusive]
    return bool(together.mean() >= 0.5)


def _spreads(times: Matrix) -> Vector:
    """Per step, how far apart the ranks' times are (ns; NaN where no rank has one)."""
    with quiet():
        spread: Vector = np.nanmax(times, axis=0) - np.nanmin(times, axis=0)
    return spread


def last_arrivals(arrive: Matrix) -> npt.NDArray[np.int64]:
    """Per step, the index of the rank that entered last; -1 where fewer than two did."""
    present = np.sum(~np.isnan(arrive), axis=0)
    last = np.argmax(np.where(np.isnan(arrive), -np.inf, arrive), axis=0)
    return np.where(present >= 2, last, -1)


def first_arrival(m: PhaseMatrices, arrive: list[Matrix]) -> Matrix:
    """Per rank and step, when it entered the step's first top-level phase."""
    for p, depth in enumerate(m.depths):
        if depth == 0 and m.phases[p] != STEP:
            return arrive[p]
    return np.full((len(m.ranks), len(m.steps)), np.nan)


def lateness(arrive: Matrix, since: Matrix, last: npt.NDArray[np.int64]) -> tuple[Vector, Vector]:
    """Per step, how late the last rank to arrive was, and how much of that it made since `since`.

    Both are against the median rank, in ns; NaN where a record is missing.
    """
    cols = np.arange(arrive.shape[1])
    at = np.maximum(last, 0)
    own = arrive - since
    with quiet():
        late = arrive[at, cols] - nanmedian(arrive, 0)
        made = own[at, cols] - nanmedian(own, 0)
    return late, made


def _late_by_own_work(late: Vector, made: Vector) -> bool:
    """Most of the lateness was made in the rank's own work, not carried in.

    A rank that left the previous collective after the others, or entered the step after
    them, carries that lateness in: on one host that is the scheduler waking it last (or
    the collective releasing ranks in a fixed order), not its own work.

    Medians, not sums: one warm-up step 30 ms late for the group's first collective
    outweighed 40 steps of a rank late by its own work (a real gloo job whose slow rank
    made 0.55-0.76 of its typical lateness was judged on sums of 0.50-0.62).
    """
    known = np.isfinite(late) & np.isfinite(made)
    if not known.any():
        return True  # nothing to tell it by: as before this was checked
    typical = float(np.median(np.clip(late[known], 0, None)))
    return typical <= 0 or float(np.median(made[known])) >= _EXPLAINED * typical


def whom_it_waits_for(
    r: int,
    cols: npt.NDArray[np.int64],
    last: npt.NDArray[np.int64],
    late_ns: Vector,
    made_ns: Vector,
    *,
    ranks: int,
    tests: int,
) -> tuple[tuple[int, ...], tuple[int, int, int] | None]:
    """The ranks that row `r` waits for over the steps `cols` (() where it is not
    waiting), and where only more sampled steps could tell: (times the same rank was
    last, about how many steps would tell, that rank's index).

    Waiting for whoever is late this time is jitter, not a straggler: the same rank must
    arrive last far more often than one time in len(ranks) (a binomial test at 1% over
    all the rows tried), and be late by its own work, not by leaving a collective late.
    """
    window = last[cols]
    waits_for = _often(window, r)
    if not waits_for:
        return (), None
    hits = window == waits_for[0]
    if not _late_by_own_work(late_ns[cols[hits]], made_ns[cols[hits]]):
        return (), None
    k, n = int(np.sum(hits)), len(window)
    if binomial_tail(k, n, 1 / ranks) < 0.01 / tests or _since_a_change(hits, ranks, tests):
        return waits_for, None
    needed = steps_needed(k, n, lambda _: 1 / ranks, lambda m: tests * m / n)
    return (), None if needed is None else (k, needed, waits_for[0])


def _since_a_change(hits: npt.NDArray[np.bool_], ranks: int, tests: int) -> bool:
    """The same rank arrived last beyond chance from some step of the window on.

    A waiting row's own onset can come early: on a busy machine the rank's waits before
    the slow rank turned slow look as long as those after, and its window then holds
    steps where whoever arrived last was chance (a real HF Trainer job under load: the
    slow rank last at 29 of 50 steps, at nearly every one of the last 30). Each later
    start is tried, at 1% over all the rows and every start tried.
    """
    n = len(hits)
    if n < 2:
        return False
    # From each start on: how many hits, over how many steps. The best start is a hit
    # that follows a miss (a leading miss only makes a window longer); the few starts
    # whose Chernoff bound on the tail is smallest get the exact test.
    k_from = np.cumsum(hits[::-1])[::-1].astype(np.float64)
    n_from = (n - np.arange(n)).astype(np.float64)
    starts = np.flatnonzero(hits & np.concatenate(([False], ~hits[:-1])))
    if not len(starts):
        return False
    q = 1 / ranks
    share = np.clip(k_from[starts] / n_from[starts], 1e-12, 1 - 1e-12)
    kl = share * np.log(share / q) + (1 - share) * np.log((1 - share) / (1 - q))
    bound = np.where(share > q, -n_from[starts] * kl, 0.0)  # log of the Chernoff bound
    alpha = 0.01 / (tests * (n - 1))
    for i in np.argsort(bound, kind="stable")[:3].tolist():
        start = int(starts[i])
        if binomial_tail(int(k_from[start]), int(n_from[start]), q) < alpha:
            return True
    return False


def times_of(d: Matrix, who: npt.NDArray[np.int64]) -> Vector:
    """Per step, the time of rank index `who` (NaN where it is -1)."""
    times = np.take_along_axis(d, np.maximum(who, 0)[None, :], axis=0)[0]
    return np.where(who >= 0, times, np.nan)


def _often(last: npt.NDArray[np.int64], r: int) -> tuple[int, ...]:
    """Ranks (other than `r`) that arrived last at 30% of these steps or more, most often first."""
    last = last[(last >= 0) & (last != r)]
    if not len(last):
        return ()
    counts = np.bincount(last)
    order = np.argsort(-counts, kind="stable")
    return tuple(order[counts[order] >= 0.3 * len(last)].tolist())
