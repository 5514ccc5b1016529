"""What `rankscope top` shows: every rank by step and open phase, the stuck and the slowest first."""

from __future__ import annotations

import os
from typing import Any

from ..read._watch import read_watch
from ._hang_model import STUCK, WAITS, HangReport
from ._hangs import find_hangs
from ._step_order import StepOrders

__all__ = ["top_rows"]

# Rows by role: the cause first, then those that wait for it, then the rest.
_ORDER = {STUCK: 0, WAITS: 1, "running": 2, "stopped": 3, "missing": 4}


def top_rows(
    run_dir: str | os.PathLike[str],
    now_ns: int | None = None,
    orders: StepOrders | None = None,
) -> tuple[HangReport, list[dict[str, Any]]]:
    """The run's hang report, and a row per rank: `rank`, `host`, `role` (stuck, waits,
    running, stopped, missing), `step`, `phase`, `kind` (its innermost open phase), `for_s`
    (in that phase, or since it last moved: until now for a stalled rank, until its
    heartbeat was written for the others) and `heartbeat_age_s`. Sorted stuck first,
    then waiting, then by step (the slowest first), then by how long they sit where they are.
    `orders`: the step order's reader a caller that refreshes holds (see find_hangs).
    """
    report = find_hangs(run_dir, now_ns=now_ns, orders=orders)
    now = report.now_ns
    roles = {finding.rank: finding.role for finding in report.findings}
    rows: list[dict[str, Any]] = []
    for rank, beat in read_watch(run_dir).heartbeats.items():
        if rank in report.earlier_launch:
            continue
        inner = beat.open[-1] if beat.open else None
        since = inner.since_ns if inner is not None else beat.moved_ns
        role = roles.get(rank, "stopped" if beat.stopped else "running")
        # A stalled rank sits where its heartbeat saw it until now; of a running one only
        # its heartbeat's moment is known (a fast job has left that phase long since).
        until = now if role in (STUCK, WAITS) else min(now, beat.written_ns)
        rows.append(
            {
                "rank": rank,
                "host": beat.host,
                "role": role,
                "step": beat.step,
                "phase": None if inner is None else inner.phase,
                "kind": None if inner is None else inner.kind,
                "for_s": round(max(0, until - since) / 1e9, 1),
                "heartbeat_age_s": round(max(0, now - beat.written_ns) / 1e9, 1),
            }
        )
    rows += [
        {"rank": r, "host": None, "role": "missing", "step": None, "phase": None, "kind": None}
        | {"for_s": None, "heartbeat_age_s": None}
        for r in report.missing
    ]
    rows.sort(
        key=lambda row: (
            _ORDER[row["role"]],
            row["step"] if row["step"] is not None else 0,
            -(row["for_s"] or 0.0),
            row["rank"],
        )
    )
    return report, rows
