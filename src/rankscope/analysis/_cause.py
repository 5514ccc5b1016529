"""Why a rank is slow, in words, with its evidence: a cause class for every slow finding.

- **data-driven**: the rank is slow where the work it was given is larger. It needs a
  per-step value recorded with the phase (`prof.phase("forward", tokens=n)`): per unit
  of that value the rank runs as fast as the others (within the threshold), while at
  its slow steps it had more of it than they did.
- **partitioning**: several ranks are slow together in the phase, and they are what a
  parallel group (the `groups` a rank gave its Profiler, e.g. the last pipeline stage)
  holds, or every rank of a host; for a host, the machine and the way work is split
  across hosts both fit, and the text says so.
- **persistent** (the machine): slow at nearly every sampled step since it began, its
  fastest steps included.
- **intermittent**: it comes and goes (a shared or busy machine).

Where the evidence cannot tell causes apart, `could_be` names them and the text says
what would: data-driven slowness looks persistent or intermittent until a per-step
value is recorded.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from .._text import format_ranks
from ._findings import Cause, StragglerFinding, ratio_text
from ._matrix import PhaseMatrices, nanmedian, quiet
from .read._values import PhaseValues

__all__ = ["PERSISTENT_SHARE", "causes_of"]

Matrix = npt.NDArray[np.float64]

PERSISTENT_SHARE = 0.9
"""A rank above at this share of its steps since the onset, or more, is persistent."""
_GROUP_SHARE = 0.75
"""A group is slow together when this share of its ranks, or more, are slow there."""
_FEWEST = 3
"""Steps with a value, on the rank and the others, to judge by a value at all."""


def causes_of(
    m: PhaseMatrices,
    findings: list[StragglerFinding],
    *,
    threshold: float,
    steady: set[tuple[int, str]],
    values: PhaseValues | None = None,
    hosts: Mapping[int, str] | None = None,
    groups: Mapping[int, Mapping[str, object]] | None = None,
) -> list[Cause | None]:
    """A cause for each slow finding (None for the ranks that wait). `steady`: the slow
    (rank, phase) pairs slow at their fastest steps too (find_stragglers knows)."""
    slow_in: dict[str, set[int]] = {}
    for f in findings:
        if f.role == "slow":
            slow_in.setdefault(f.phase, set()).add(f.rank)
    out: list[Cause | None] = []
    for f in findings:
        if f.role != "slow":
            out.append(None)
            continue
        data = _data_driven(m, f, threshold, values)
        if isinstance(data, Cause):
            out.append(data)
            continue
        group = _partition(m, f, slow_in[f.phase], hosts, groups)
        if group is not None:
            out.append(group)
            continue
        out.append(_machine(f, (f.rank, f.phase) in steady, data))
    return out


def _machine(f: StragglerFinding, steady: bool, evidence: tuple[str, bool] | None) -> Cause:
    """Persistent or intermittent; with what the recorded values said (`evidence`: the
    words, whether they rule the data out; None where none was recorded)."""
    since = f" since step {f.since_step}" if f.since_step else ""
    if evidence is None:
        evidence = (
            "no per-step value is recorded with this phase, so uneven work (longer "
            f'sequences) is not ruled out: record one, e.g. prof.phase("{f.phase}", tokens=n)',
            False,
        )
    data, ruled_out = evidence
    unsure: tuple[str, ...] = () if ruled_out else ("data-driven",)
    if f.share_above >= PERSISTENT_SHARE and steady:
        text = (
            f"persistent: slow at {f.share_above:.0%} of sampled steps{since}, its fastest "
            f"steps included: the machine (or its device) more than the data; {data}"
        )
        return Cause("persistent", text, ("persistent", *unsure) if unsure else ())
    text = (
        f"intermittent: slow at {f.share_above:.0%} of sampled steps{since}"
        f"{'' if steady else ', not at its fastest'}: it comes and goes, as on a shared or "
        f"busy machine; {data}"
    )
    return Cause("intermittent", text, ("intermittent", *unsure) if unsure else ())


def _data_driven(
    m: PhaseMatrices, f: StragglerFinding, threshold: float, values: PhaseValues | None
) -> Cause | tuple[str, bool] | None:
    """A data-driven cause where a value recorded with the phase explains the excess;
    else (what the values said, whether they rule the data out); None without values."""
    recorded = values.of(f.phase) if values is not None else {}
    if not recorded:
        return None
    p, r = m.index(f.phase), m.ranks.index(f.rank)
    after = np.asarray(m.steps) >= f.since_step
    d = m.ms[p][:, after]
    said: list[str] = []
    unjudged: list[str] = []
    for name, matrix in sorted(recorded.items()):
        v = matrix[:, after]
        with quiet():
            per_unit = np.where(v > 0, d / v, np.nan)
            others_unit = nanmedian(np.delete(per_unit, r, 0), axis=0)
            others_value = nanmedian(np.delete(v, r, 0), axis=0)
            others_time = nanmedian(np.delete(d, r, 0), axis=0)
            unit = per_unit[r] / others_unit
            slow = d[r] / others_time > threshold
            more = v[r] / others_value
        judged = np.isfinite(unit) & np.isfinite(more)
        if int(judged.sum()) < _FEWEST:
            unjudged.append(name)
            continue
        unit_ratio = float(np.median(unit[judged]))
        at_slow = judged & slow
        value_ratio = float(np.median(more[at_slow])) if at_slow.any() else 1.0
        if unit_ratio <= threshold and value_ratio > threshold:
            return Cause(
                "data-driven",
                f"data-driven: at its slow steps its {name} was {value_ratio:.2f}x the other "
                f"ranks', and per {name} it runs at {ratio_text(unit_ratio)} vs them: the "
                "work it is given, not the rank, makes it slow (balance the data across ranks)",
            )
        if unit_ratio > threshold:
            said.append(f"per {name} it is still {ratio_text(unit_ratio)} vs the others")
        else:
            said.append(f"its {name} was no larger than the others' at its slow steps")
    if said:
        return "; ".join(said), True
    names = ", ".join(unjudged)
    return (
        f"its {names} cannot tell: fewer than {_FEWEST} of its steps have a value above 0 "
        "beside the other ranks'",
        False,
    )


def _partition(
    m: PhaseMatrices,
    f: StragglerFinding,
    slow: set[int],
    hosts: Mapping[int, str] | None,
    groups: Mapping[int, Mapping[str, object]] | None,
) -> Cause | None:
    """A partitioning cause where the ranks slow in the phase make up a group: a
    parallel group the ranks named, else every rank of a host."""
    if len(slow) < 2:
        return None
    fields = sorted({name for g in (groups or {}).values() for name in g})
    for name in fields:
        member = _slow_group(
            m.ranks, slow, f.rank, {r: g.get(name) for r, g in (groups or {}).items()}
        )
        if member is not None:
            value, ranks = member
            return Cause(
                "partitioning",
                f"partitioning: ranks {format_ranks(sorted(ranks & slow))} are slow together "
                f"in {f.phase}, the ranks with {name}={value}: the work that group is given "
                "(e.g. the last pipeline stage), not one machine",
            )
    member = _slow_group(m.ranks, slow, f.rank, dict(hosts or {}))
    if member is None:
        return None
    host, ranks = member
    return Cause(
        "unclear",
        f"ranks {format_ranks(sorted(ranks & slow))} are slow together in {f.phase}, every "
        f"rank of host {host}: the machine, or how the work is split across hosts; the "
        "timings do not tell them apart (name the ranks' parallel groups, "
        "Profiler(groups=...), to check the split)",
        ("persistent", "partitioning"),
    )


def _slow_group(
    ranks: list[int], slow: set[int], rank: int, label: Mapping[int, object]
) -> tuple[object, set[int]] | None:
    """(the label, its ranks) of `rank`'s group where the group is slow together: two
    ranks or more, most of them slow, and some group with none slow."""
    mine = label.get(rank)
    if mine is None:
        return None
    by_label: dict[object, set[int]] = {}
    for r in ranks:
        if label.get(r) is not None:
            by_label.setdefault(label[r], set()).add(r)
    group = by_label.get(mine, set())
    clean = any(not (members & slow) for members in by_label.values())
    if len(group) >= 2 and len(group & slow) >= _GROUP_SHARE * len(group) and clean:
        return mine, group
    return None
