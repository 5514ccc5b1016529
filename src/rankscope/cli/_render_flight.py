"""`rankscope hang`'s Flight Recorder part on the terminal: the process groups as the
ranks' dumps show them (analysis/hangs/_flight.py), and where each hung call was issued."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from ..analysis.core._format import TERMINAL
from ._columns import cut, rank_list

__all__ = ["flight_recorder_lines"]


def flight_recorder_lines(recorder: dict[str, Any]) -> list[Table | Text]:
    """The process groups as the Flight Recorder dumps show them, those that hang first."""
    groups = recorder["groups"]
    if not groups:
        return []
    out: list[Table | Text] = []
    table = Table(
        box=box.SIMPLE_HEAD,
        title=f"Collectives by process group ({len(recorder['dumps'])} Flight Recorder dumps)",
        title_justify="left",
    )
    for column in (
        "group",
        "state",
        "last completed",
        "hangs in",
        "inside",
        "never entered",
        "no dump",
    ):
        table.add_column(column)
    for g in groups:
        desc = f" ({g['desc']})" if g["desc"] and g["desc"] != "undefined" else ""
        done = g["last_completed"]
        pending = g["pending"]
        table.add_row(
            cut(f"{g['group']}{desc}", 30),
            g["state"],
            TERMINAL.missing
            if done is None
            else f"{g['last_completed_op'] or 'collective'} #{done}",
            TERMINAL.missing
            if pending is None
            else f"{g['pending_op'] or 'collective'} #{pending}",
            rank_list(g["entered"]) if g["entered"] else TERMINAL.missing,
            rank_list([n["rank"] for n in g["never_entered"]]) if g["never_entered"] else "",
            rank_list(g["missing"]) if g["missing"] else "",
        )
    out.append(table)
    for g in groups:
        for m in g["mismatches"][:1]:
            ways = "; ".join(f"{rank_list(w['ranks'])}: {w['value']}" for w in m["ways"])
            out.append(
                Text(
                    f"  group {g['group']}, collective #{m['seq']}: the {m['what']} differ ({ways})"
                )
            )
        if g["state"] == "done":
            continue
        # Where the calls were issued: one rank's of each different op.
        shown: dict[str, tuple[str, dict[str, Any]]] = {}
        for rank, call in g["calls"].items():
            shown.setdefault(call["op"], (rank, call))
        for rank, call in shown.values():
            frame = _callers_frame(call["frames"])
            if frame is not None:
                out.append(
                    Text(
                        f"  group {g['group']}: rank {rank} called {call['op']} at "
                        f"{frame['file']}:{frame['line']} in {frame['function']}"
                    )
                )
    return out


def _callers_frame(frames: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The innermost frame outside torch: where the user's code issued the collective."""
    for frame in reversed(frames):
        if "/torch/" not in str(frame["file"]).replace("\\", "/"):
            return dict(frame)
    return dict(frames[-1]) if frames else None
