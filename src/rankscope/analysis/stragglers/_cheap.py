"""What is left out as not worth fixing: a finding, an uneven phase or a slow group whose
fix would save less than --min-saving of the step (drop_the_cheap), read at a slow
finding's typical step. The prices come from the cost model (_cost.py); what was left out
is said in a note (_findings.py's left_out_note).
"""

from __future__ import annotations

from dataclasses import replace

from ._cost import Costs
from ._model import Cost, StragglerFinding, StragglerReport

__all__ = ["drop_the_cheap"]


def _typical_excess(f: StragglerFinding) -> float:
    """A finding's excess at its typical step: the median where it is known, else the mean."""
    mean = f.lost_ms / max(f.steps, 1)
    return mean if f.median_excess_ms is None else min(mean, max(f.median_excess_ms, 0.0))


def _typical(f: StragglerFinding, cost: Cost | None) -> Cost | None:
    """`cost` as its typical step bears it: scaled by the typical excess over the mean
    (1 for an excess at every step alike, less where a few steps make the mean)."""
    mean = f.lost_ms / max(f.steps, 1)
    if cost is None or mean <= 0:
        return cost
    share = _typical_excess(f) / mean
    return replace(cost, step_ms_saved=cost.step_ms_saved * share) if share < 1 else cost


def drop_the_cheap(
    report: StragglerReport, costs: Costs, floor_ms: float, *, collectives_said: bool = False
) -> bool:
    """Leave out of `report` what fixing would save less than `floor_ms` a step: a slow
    finding (outside a group that is worth it, and, unless `collectives_said`, losing less
    than that a step itself) with the findings that wait for it, a wait priced on its own,
    an uneven phase, a slow group. A busy machine's noise is found now and then; what it
    costs is what tells it from a fault. True where anything was left out.

    `collectives_said`: every top-level phase's records say whether it issued a
    collective, so the price knows where the ranks meet and is taken at its word, even
    where the model's step is off the measured one: a run's untimed work moves the
    model's step more than the differences a fix makes (the demo's optimizer, 4x slow,
    priced 1.9 ms of 17 with the model's step 3.2-3.9 ms off, is worth saying)."""

    def cheap(cost: Cost | None) -> bool:
        return cost is not None and cost.step_ms_saved < floor_ms

    kept_groups = [g for g, c in zip(report.groups, costs.groups, strict=True) if not cheap(c)]
    grouped = {r for g in kept_groups for r in g.slow}
    # Where the records do not say where the ranks meet, a slow rank whose own excess is
    # worth it stands whatever its price: the price of a run whose collectives were not
    # found can be far too low. Where they say, the price stands: a clean 3-rank HF run
    # on two cores had a rank's forward 0.64 ms slower a step, priced 0.27 ms of 23 (its
    # peers' waits for it absorbed the rest), kept by its excess. Both are read at its
    # typical step: a price and an excess that a burst of a few steps makes (a quiet
    # lightning run: 3x for 4 sampled steps of 16, +3% at the rest, priced 6% of the
    # step) are a hiccup of the machine, not a slow rank.
    gone = {
        (f.rank, f.phase)
        for f, c in zip(report.findings, costs.each, strict=True)
        if f.role == "slow"
        and cheap(_typical(f, c))
        and f.rank not in grouped
        and (collectives_said or _typical_excess(f) < floor_ms)
    }
    # A wait priced on its own (no slow finding is its cause) goes by its price alone:
    # its collective was found, so the price is the model's word on it (a clean gloo
    # pipeline's first stage, 2.8 ms a step in its sends, would have saved 0 ms).
    gone |= {
        (f.rank, f.phase)
        for f, c, of in zip(report.findings, costs.each, costs.of, strict=True)
        if f.role == "waits" and of is None and cheap(c)
    }
    findings = [
        f
        for f, of in zip(report.findings, costs.of, strict=True)
        if (f.rank, f.phase) not in gone and of not in gone
    ]
    imbalance = [u for u, c in zip(report.imbalance, costs.imbalance, strict=True) if not cheap(c)]
    dropped = (
        len(findings) < len(report.findings)
        or len(imbalance) < len(report.imbalance)
        or len(kept_groups) < len(report.groups)
    )
    report.findings, report.imbalance, report.groups = findings, imbalance, kept_groups
    return dropped
