"""The step model the costs run (_cost.py says it in full): a run's steps as segments of
work that end in a collective, each segment as long as its slowest rank's work plus the
collective's own time, fitted to the measured steps; `StepModel.saved` is what a fix to
some (rank, phase, step) cells takes off the step.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ..pipeline._replay import Replay
from ..read._matrix import STEP, PhaseMatrices, nanmedian, quiet
from ._model import ROUGH_FIT, Cost, StragglerFinding

__all__ = ["MS_PER_HOUR", "Cell", "StepModel", "hidden_work"]

Matrix = npt.NDArray[np.float64]
Vector = npt.NDArray[np.float64]
MS_PER_HOUR = 3.6e6
Cell = tuple[int, int, int, bool]
"""A fix: (rank index, phase index, the step it applies from, balanced): balanced, the
phase's load made even (analysis/stragglers/_imbalance.py balanced); not, the rank made like the
others (their median). One rank's phase fixed both ways takes the faster at each step."""
_DRAWS = 8
_FIT_ROUNDS = 10
"""Halvings in fitting the hidden work's scale: to a thousandth."""
_FIT_STEPS = 5
"""Sampled steps before a fix's first that the hidden work's scale is fitted on."""
_LOCAL = 9
"""Sampled steps around each that its hidden work's typical time is taken over."""
_DRAWS_OFF = 0.05
"""How much longer than the measured step the whole draws may make the model's, over a
run with a fault from the start, before they are fitted to it: a simulated run, its
draws right, is 0.6% long; real DDP jobs on a quiet machine 3-6%, beside a test suite
10-26%."""


class StepModel:
    """A run's steps as segments of work that end in a collective (see the module)."""

    def __init__(
        self,
        m: PhaseMatrices,
        sync: set[str],
        replay: Replay | None = None,
        cpu_waits: Matrix | None = None,
    ) -> None:
        self.m = m
        self.cpu_waits = cpu_waits  # rank x step, where ranks share cores: _turns_shift
        self.segments: list[list[int]] = [[]]
        """Each segment's work phases (indices into m.phases), in the order they run."""
        self.segment_of: dict[int, int] = {}
        self.closing: dict[str, int] = {}
        """A collective's name -> the segment it closes."""
        top = [p for p, d in enumerate(m.depths) if d == 0 and m.phases[p] != STEP]
        held = m.holders()
        self.parent = {p: q for p, (q, _) in held.items() if m.phases[q] not in sync}
        """A nested phase -> the top-level work phase it runs inside (at most steps)."""
        inside = m.work_inside(sync)
        self.inside = {p: q for q, (phases, _) in inside.items() for p in phases}
        """A work phase nested in a phase that ends in a collective -> that phase: its
        time is work of the segment that collective closes."""
        collective = np.zeros(len(m.steps))
        self.hidden: dict[int, npt.NDArray[np.float32]] = {}
        """Per segment closed by a phase that holds work and a collective, draws of the
        work each rank does inside it (see hidden_work)."""
        for p in top:
            if m.phases[p] in sync:
                self.closing[m.phases[p]] = len(self.segments) - 1
                own = inside[p][1] if p in inside else 0.0
                with quiet():  # the last to arrive waits for no one: its time is the collective's
                    last = np.nanmin(m.ms[p] - own, axis=0)
                collective += np.nan_to_num(last)
                if m.kinds[p] != "comm":
                    draws = hidden_work(last, len(m.ranks))
                    if draws is not None:
                        self.hidden[len(self.segments) - 1] = draws
                self.segments.append([])
            else:
                self.segment_of[p] = len(self.segments) - 1
                self.segments[-1].append(p)
        self.collective = collective
        self.work = np.zeros((len(self.segments), len(m.ranks), len(m.steps)))
        for p, k in self.segment_of.items():
            self.work[k] += np.nan_to_num(m.ms[p])
        for q, (_, own) in inside.items():
            self.work[self.closing[m.phases[q]]] += own
        self.measured = self._measured_steps(top)
        self.span = _steps_each_stands_for(m.steps)
        self.now = self._modelled(self.work)
        self.unfit: str | None = None
        """Why the pipeline's replay is not used, where it was built and does not fit."""
        self.replay = self._fitting(replay)
        """The pipeline's replay, where it fits the measured steps (then it gives `now` and
        the savings at the steps it replayed)."""
        if self.replay is not None:
            self.now = np.where(self.replay.ok, self.replay.steps, self.now)
        self.known: dict[frozenset[Cell], Vector] = {}
        self.scales: dict[int, float] = {}
        """The hidden work's scale for a fix from a step on (see _hidden_scale)."""
        self.rank_index = {rank: i for i, rank in enumerate(m.ranks)}
        self.targets: dict[int, Matrix] = {}
        """Per phase found uneven (analysis/stragglers/_imbalance.py), what balancing it makes each
        rank's times (a balanced cell's target); a fix of a slow rank makes it the median
        of the others, in an uneven phase too: balancing keeps a slow stage's pace."""

    def _fitting(self, replay: Replay | None) -> Replay | None:
        """`replay`, where its steps are within ROUGH_FIT of the measured ones (`unfit`
        says so where not). It is taken over the segment model even where that fits
        closer: a model's step fitting the measured one does not make it price a fix
        right (the segment model's step fits a 1F1B pipeline's exactly and prices its
        slow first stage 41% too high)."""
        if replay is None or STEP not in self.m.phases:
            return None
        ok = replay.ok & np.isfinite(replay.steps) & np.isfinite(self.measured)
        if not ok.any():
            return None
        replayed, measured = float(np.mean(replay.steps[ok])), float(np.mean(self.measured[ok]))
        if abs(replayed / measured - 1) <= ROUGH_FIT:
            return replay
        self.unfit = (
            f"the pipeline's replay gives a {replayed:.3g} ms step against {measured:.3g} ms "
            f"measured ({replayed / measured:.2f}x): its savings are the step model's"
        )
        return None

    def _measured_steps(self, top: list[int]) -> Vector:
        """Per sampled step, the step time measured (the step record's median over ranks);
        the model's where there is no step record. Time outside any phase joins the last
        segment's work."""
        if STEP not in self.m.phases:
            return self._modelled(self.work)
        step = self.m.ms[self.m.index(STEP)]
        phases = np.zeros_like(step)
        for p in top:
            phases += np.nan_to_num(self.m.ms[p])
        outside = np.clip(np.nan_to_num(step - phases), 0, None)
        self.work[-1] += outside
        with quiet():
            measured: Vector = nanmedian(step, 0)
        return np.where(np.isfinite(measured), measured, self._modelled(self.work))

    def _modelled(self, work: Matrix, scale: float = 1.0) -> Vector:
        """Per sampled step, the model's step time for `work` (segment x rank x step): the
        slowest rank's work of each segment (with the work hidden inside its collective,
        the mean over the draws, scaled by `scale`), plus the collectives."""
        total: Vector = self.collective.copy()
        for k in range(len(work)):
            hidden = self.hidden.get(k)
            if hidden is None:
                total += np.max(work[k], axis=0)
            else:
                # a draw at a time: one rank x step array at a time, not all the draws'
                slowest = [np.max(work[k] + scale * draw, axis=0) for draw in hidden]
                total += np.mean(slowest, axis=0)
        return total

    def _hidden_scale(self, before: int) -> float:
        """What the hidden work's draws are scaled by for a fix from step `before` on: the
        scale (0 to 1) at which the model's mean step over the sampled steps before it is
        the measured one, where it is longer with the whole draws. With fewer than
        `_FIT_STEPS` such steps (a fault from the start), over the whole run, and only
        where the whole draws make the model's step longer than the measured one by more
        than `_DRAWS_OFF`: the fault's own steps, its ranks arriving apart, say less of how
        the draws stray together (a simulated job's uneven data, whose draws were right,
        was priced 1.19x the truth fitted on them), but a model that far off is off by
        the machine (a loaded DDP job's uneven data, its model 1.10-1.26x the measured
        step, was priced 1.0-2.8 ms against 4-10 measured unfitted, 4.5-5.2 fitted).

        The draws stand for how far the ranks' work inside a collective phase strays when
        they arrive together, which is how a fix leaves them; the steps before the fault
        are such steps, and say how much the slowest of those strays really adds. The last
        arriver's time holds more than its work's jitter on a busy machine (the
        scheduler's delays, common to every rank at a step): a 4-rank FSDP job on two
        cores strayed by 8 ms there, and a fix worth 15.7 ms was priced at 7.4."""
        if before in self.scales:
            return self.scales[before]
        scale = 1.0
        ok = np.isfinite(self.measured) & (np.asarray(self.m.steps) < before)
        off = 1.0  # how far the whole draws may take the model's step past the measured
        if int(ok.sum()) < _FIT_STEPS:  # a fault from the start: the run as it is
            ok, off = np.isfinite(self.measured), 1.0 + _DRAWS_OFF
        if self.hidden and int(ok.sum()) >= _FIT_STEPS and STEP in self.m.phases:
            measured = float(np.mean(self.measured[ok]))

            def mean_step(at: float) -> float:
                return float(np.mean(self._modelled(self.work, at)[ok]))

            if mean_step(1.0) > off * measured:
                low, high = 0.0, 1.0
                if mean_step(0.0) >= measured:
                    high = 0.0
                for _ in range(_FIT_ROUNDS if high > 0 else 0):
                    mid = (low + high) / 2
                    low, high = (mid, high) if mean_step(mid) < measured else (low, mid)
                scale = (low + high) / 2
        self.scales[before] = scale
        return scale

    def modelled_step_ms(self, since_step: int) -> float:
        """The model's step time, mean over the sampled steps from `since_step` on (the
        steps `cost` measures the step time over)."""
        after = self._after(since_step)
        return float(np.mean(self.now[after])) if after.any() else 0.0

    def _after(self, since_step: int) -> npt.NDArray[np.bool_]:
        after = np.asarray(self.m.steps) >= since_step
        if not after.any():
            after[:] = True
        return after

    def fixes(self, finding: StragglerFinding) -> set[Cell] | str:
        """The (rank index, phase index, from step) cells a fix of `finding` sets to the
        median, from the step its finding began on (before it, the rank was as the
        others and a fix would only take out its noise); why it cannot be costed where
        it cannot."""
        ranks, since = self.rank_index, finding.since_step
        if finding.role == "slow":
            p = self.m.index(finding.phase)
            if self.segment(p) is not None:
                return {(ranks[finding.rank], p, since, False)}
            return (
                "it runs inside a phase that ends in a collective and is no work the model "
                "places before it (a collective of its own, or nested two levels down)"
            )
        segment = self.closing.get(finding.phase)
        late = ranks.get(finding.waits_for[0]) if finding.waits_for else None
        if segment is None:
            return "the model takes only top-level phases for collectives"
        if late is None:
            return "no rank is named as the one it waits for"
        held = [p for p, q in self.inside.items() if self.m.phases[q] == finding.phase]
        return {(late, p, since, False) for p in [*self.segments[segment], *held]}

    def segment(self, p: int) -> tuple[int, int] | None:
        """The segment whose work phase `p`'s time is, and the top-level phase that holds
        it (`p` itself where it is top-level work); None where the model cannot see it."""
        if p in self.segment_of:
            return self.segment_of[p], p
        if p in self.parent:
            return self.segment_of[self.parent[p]], self.parent[p]
        if p in self.inside:
            q = self.inside[p]
            return self.closing[self.m.phases[q]], q
        return None

    def _scales(self, cuts: dict[tuple[int, int], Vector]) -> dict[tuple[int, int], Vector]:
        """Per (rank, top-level phase), what a fix that takes `cuts` off it multiplies its
        ops' times by, at each step."""
        out = {}
        for (r, top), cut in cuts.items():
            whole = np.nan_to_num(self.m.ms[top][r])
            with quiet():
                out[r, top] = np.where(whole > 0, 1 - cut / whole, 1.0)
        return out

    def cost(self, cells: set[Cell], since_step: int, basis: int, gpus: bool | None) -> Cost:
        """What the fix of `cells` saves: per step over the steps from `basis` on, in hours
        over those from `since_step` on."""
        earliest: dict[tuple[int, int, bool], int] = {}  # fixed by two findings: the earlier
        for r, p, step, even in cells:
            earliest[r, p, even] = min(step, earliest.get((r, p, even), step))
        saved = self._saved(
            frozenset((r, p, step, even) for (r, p, even), step in earliest.items())
        )
        over = self._after(basis)
        per_step = max(0.0, float(np.mean(saved[over])))
        now = float(np.mean(self.measured[over]))
        after = self._after(since_step)
        hours = max(0.0, float(np.sum(saved[after] * self.span[after]))) / MS_PER_HOUR
        ranks = _significant(hours * len(self.m.ranks))
        return Cost(
            step_ms_saved=round(per_step, 3),
            run_hours_saved=_significant(hours),
            rank_hours_saved=ranks,
            gpu_hours_saved=ranks if gpus else None,
            speedup=round(now / (now - per_step), 4) if now > per_step > 0 else 1.0,
            step_ms=round(now, 3),
            steps_from=int(np.asarray(self.m.steps)[over][0]),
        )

    def _saved(self, cells: frozenset[Cell]) -> Vector:
        """Per sampled step, the step time a fix of `cells` saves. Many findings share a
        fix (every rank that waits for one rank): each is worked out once."""
        if cells not in self.known:
            work = self.work.copy() if cells else self.work
            fixed: dict[tuple[int, int], Vector] = {}  # (rank, phase) -> its time fixed
            for r, p, since, even in sorted(cells):
                d = self.m.ms[p]
                if even:
                    target = self.targets[p][r]
                else:
                    with quiet():
                        target = nanmedian(np.delete(d, r, 0), axis=0)
                mine = np.fmin(d[r], target)  # never slower than it was
                mine = np.where(np.asarray(self.m.steps) >= since, mine, d[r])
                fixed[r, p] = np.fmin(fixed.get((r, p), d[r]), mine)
            cuts: dict[tuple[int, int], Vector] = {}  # (rank, top-level phase) -> ms taken off
            for (r, p), mine in fixed.items():
                # A nested phase's time is its parent's: the fix shortens the parent.
                segment, top = self.segment(p) or (-1, p)
                cut = np.nan_to_num(self.m.ms[p][r] - mine)  # NaN (no record): as it was
                work[segment, r] -= cut
                cuts[r, top] = cuts.get((r, top), 0.0) + cut
            scale = self._hidden_scale(min((c[2] for c in cells), default=0))
            now = self.now if scale == 1.0 else self._modelled(self.work, scale)
            saved = now - self._modelled(work, scale)
            replayed = self.replay.step_ms(self._scales(cuts)) if self.replay is not None else None
            if self.replay is not None and replayed is not None:
                saved = np.where(self.replay.ok, self.now - replayed, saved)
            if cells:
                saved = self._turns_undone(saved, cells)
            self.known[cells] = saved
        return self.known[cells]

    def _turns_undone(self, saved: Vector, cells: frozenset[Cell]) -> Vector:
        """`saved` (per sampled step, for the fix of `cells`) less what the ranks' turns on
        shared cores changed from the fix's start on (_turns_shift): the work after the
        onset, which the model holds, was shorter by the CPU the slow rank left to the
        others (or longer), and a fix takes that back. The shift is held to the fix's
        own saving either way: a fix that saves nothing changes no one's turns. A fix of
        findings that began at different steps saves, at each step, at least what the
        fix of those that began at any one of them does (fixing more never saves less)."""
        onsets = sorted({c[2] for c in cells})
        since = onsets[0]
        shift = self._turns_shift(since)
        after = np.asarray(self.m.steps) >= since
        if shift != 0.0 and after.any():
            most = max(0.0, float(np.mean(saved[after])))
            saved = saved - np.where(after, min(max(shift, -most), most), 0.0)
        if self.cpu_waits is not None and len(onsets) > 1:
            for onset in onsets:
                saved = np.maximum(saved, self._saved(frozenset(c for c in cells if c[2] == onset)))
        return saved

    def _turns_shift(self, since: int) -> float:
        """How much less each rank waited for a CPU a step from `since` on than before it
        (negative: more), the median over the ranks read of the change in their median
        wait; 0 without the waits, on device time (the host's waits are not the GPU's), or
        with fewer than `_FIT_STEPS` sampled steps on either side. The fixed rank's own
        count too: its other phases, which the model holds as they ran after the onset,
        ran with the others' turns (the slow rank of a 3-rank HF job waited 6.7 ms a step
        less once it slept, the others 3.8 and 9.2).

        Where ranks share cores, a rank that sleeps or waits (a slow loader, a slow
        collator) leaves its core to the others, and a fault that puts the ranks in step
        has them all want a core at once: either way the others' work after the onset is
        not what it would be without the fault. A 3-rank HF job on 2 cores, beside a test
        suite, had rank 1's 20 ms forward sleep priced at 12.5-16.3 ms against a step
        5.3-14.5 ms longer: the ranks' wait for a CPU fell by 1.8-8.5 ms a step at the
        onset. On a machine with a core per rank the waits are near 0 and so is this."""
        waits = self.cpu_waits
        if waits is None or waits.shape != (len(self.m.ranks), len(self.m.steps)):
            return 0.0
        if self.m.on_device:
            return 0.0
        after = np.asarray(self.m.steps) >= since
        earlier, later = waits[:, ~after], waits[:, after]
        read = (np.sum(np.isfinite(earlier), axis=1) >= _FIT_STEPS) & (
            np.sum(np.isfinite(later), axis=1) >= _FIT_STEPS
        )
        if not read.any():
            return 0.0
        shifts = nanmedian(earlier[read], 1) - nanmedian(later[read], 1)
        return float(np.median(shifts))


def hidden_work(last: Vector, ranks: int) -> npt.NDArray[np.float32] | None:
    """Draws (draw x rank x step) of how each rank's work inside a phase that holds work
    and ends in a collective (a DDP backward) strays from the typical. The timings cannot
    show it: every rank leaves the phase together, and only the last rank to arrive,
    which waits for no one, shows its own time there. Its time over the sampled steps
    is taken as what any rank's might have been (drawn with a fixed seed: the same run
    gives the same figures). Without it the next slowest rank after a fix would be found
    among too few, and a fix would look to save more than it does (1.2x to 1.8x too much
    on 8 to 256 simulated ranks)."""
    seen = last[np.isfinite(last)]
    if len(seen) < 2:
        return None
    strays = (seen - _local_median(seen)).astype(np.float32)
    rng = np.random.default_rng(0)
    return rng.choice(strays, size=(_DRAWS, ranks, len(last)))


def _local_median(values: Vector) -> Vector:
    """Per value, the median of the `_LOCAL` values around it (fewer at the ends): where a
    fault changed which rank arrives last, the typical time before it and after it differ,
    and strays from one median over both would be that change, not the work's jitter
    (on a 4-rank DDP job slowed part-way, strays from 5 ms below to 6 ms above, twice the
    jitter either side of the change)."""
    if len(values) <= _LOCAL:
        return np.full_like(values, np.median(values))
    half = _LOCAL // 2
    padded = np.pad(values, half, mode="edge")
    windows = np.lib.stride_tricks.sliding_window_view(padded, _LOCAL)
    out: Vector = np.median(windows, axis=1)
    return out


def _significant(value: float, digits: int = 4) -> float:
    """`value` to `digits` significant digits: hours saved range from seconds to days."""
    return float(f"{value:.{digits}g}")


def _steps_each_stands_for(steps: list[int]) -> Vector:
    """Per sampled step, how many steps of the run it stands for: the gap to the next
    sampled step (the last one: the typical gap)."""
    if not steps:
        return np.zeros(0)
    at = np.asarray(steps, np.float64)
    gaps = np.diff(at)
    typical = float(np.median(gaps)) if len(gaps) else 1.0
    return np.append(gaps, typical)
