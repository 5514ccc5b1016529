"""Terminal output of the commands that watch a running job: `top`, `hang`, and
`trigger` (what was asked, and who answered)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from ..analysis.core._format import TERMINAL, seconds_text
from ._columns import rank_list
from ._render_flight import flight_recorder_lines
from ._terminal import name as _name
from ._terminal import out as _console
from ._terminal import skipped as _skipped

__all__ = ["hang", "live_view", "top", "trigger_status", "trigger_written"]


# -- hangs ---------------------------------------------------------------------

_STATE_STYLES = {"hung": "bold red", "ended": "yellow", "no heartbeats": "yellow"}
_STACKS_SHOWN = 4  # stuck ranks whose frames are printed; --json has them all


def _utc(epoch_s: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch_s))


def _for(seconds: float) -> str:
    return seconds_text(seconds)


def live_view() -> Any:
    """A region of the terminal that `top` redraws in place."""
    from rich.live import Live

    return Live(console=_console, auto_refresh=False, screen=False)


def top(data: dict[str, Any], rows: list[dict[str, Any]], limit: int, live: Any) -> None:
    """`rankscope top`: a table per refresh, the stuck and the slowest first."""
    table = Table(
        box=box.SIMPLE_HEAD,
        title=f"rankscope top: {data['run_dir']} ({data['state']}): {data['summary']}",
        title_justify="left",
    )
    for column in ("rank", "host", "role", "step", "phase", "kind", "for", "heartbeat"):
        table.add_column(column, justify="right" if column in ("rank", "step") else "left")
    style = {"stuck": "bold red", "waits": "yellow", "missing": "dim"}
    missing = TERMINAL.missing
    for row in rows[:limit]:
        table.add_row(
            str(row["rank"]),
            row["host"] or missing,
            row["role"],
            missing if row["step"] is None else str(row["step"]),
            _name(row["phase"] or missing, 30),
            row["kind"] or missing,
            missing if row["for_s"] is None else _for(row["for_s"]),
            missing if row["heartbeat_age_s"] is None else f"{_for(row['heartbeat_age_s'])} ago",
            style=style.get(row["role"]),
        )
    if len(rows) > limit:
        table.caption = f"... and {len(rows) - limit} more ranks (--rows N)"
    if live is None:
        _console.print(table)
    else:
        live.update(table, refresh=True)


def hang(data: dict[str, Any], title: bool = True) -> None:
    """`rankscope hang`, or the hangs part of `rankscope report` (title=False)."""
    if title:
        _console.print(Text(f"rankscope hang: {data['run_dir']}", style="bold"))
    age = data["newest_heartbeat_age_s"]
    newest = "" if age is None else f"; the newest heartbeat of a running rank is {_for(age)} old"
    _console.print(Text(f"as of {_utc(data['as_of'])}{newest}"))
    state = data["state"]
    line = Text(f"{state}: ", style=_STATE_STYLES.get(state, "green"))
    line.append(data["summary"])
    _console.print(line)
    groups = data["groups"]
    if groups:
        table = Table(box=box.SIMPLE_HEAD, title="Stalled ranks", title_justify="left")
        for column in ("role", "ranks", "phase", "kind", "step", "for", "since"):
            table.add_column(column, justify="right" if column in ("step", "for") else "left")
        for g in groups:
            table.add_row(
                g["role"],
                _name(rank_list(g["ranks"]), 40),
                _name(g["phase"] or "(outside any phase)", 30),
                g["kind"] or TERMINAL.missing,
                str(g["step"]),
                _for(g["for_s"]),
                _utc(g["since"]),
            )
        _console.print(table)
    stuck = [f for f in data["findings"] if f["role"] == "stuck"]
    for f in stuck[:_STACKS_SHOWN]:
        _stuck(f)
    if len(stuck) > _STACKS_SHOWN:
        _console.print(f"  ... {len(stuck) - _STACKS_SHOWN} more stuck ranks (--json has them)")
    recorder = data.get("flight_recorder") or {"groups": [], "dumps": {}}
    for part in flight_recorder_lines(recorder):
        _console.print(part)
    ranks = data["ranks"]
    if ranks["missing"]:
        _console.print(Text(f"no heartbeat: {rank_list(ranks['missing'])}", style="yellow"))
    for note in data["notes"]:
        _console.print(Text(f"note: {note}", style="yellow"))
    _skipped(data.get("skipped", []))


def _stuck(f: dict[str, Any]) -> None:
    host = f" on {f['host']}" if f["host"] else ""
    path = " > ".join(p["phase"] for p in f["open"]) or "no open phase"
    _console.print(Text(f"stuck rank {f['rank']}{host}, step {f['step']}: {path}", style="bold"))
    frames = f.get("frames") or []
    if frames:
        _console.print(Text(f"  innermost frames of its training thread ({f['thread']}):"))
        for frame in frames:
            _console.print(Text(f"    {frame['file']}:{frame['line']} in {frame['function']}"))
            if frame["code"]:
                _console.print(Text(f"      {frame['code']}"))
    elif f["hang_file"] is None:
        _console.print(
            Text(
                f"  no hang file: its watchdog writes one with the stacks after "
                f"{_for(f['threshold_s'])} without a step()"
            )
        )
    if f["flight_recorder"]:
        _console.print(Text(f"  Flight Recorder dump: {f['flight_recorder']}"))
    elif f["flight_recorder_skipped"]:
        _console.print(Text(f"  no Flight Recorder dump: {f['flight_recorder_skipped']}"))


# -- triggers ------------------------------------------------------------------


def _grouped(reasons: dict[str, str], ranks: list[int]) -> list[tuple[list[int], str]]:
    """Ranks that share a reason, together: one line per reason, not per rank."""
    by_reason: dict[str, list[int]] = {}
    for rank in ranks:
        by_reason.setdefault(reasons.get(str(rank), ""), []).append(rank)
    return [(group, reason) for reason, group in by_reason.items()]


def trigger_written(data: dict[str, Any]) -> None:
    _console.print(Text(f"rankscope trigger: wrote {data['path']}", style="bold"))
    latest = data["latest_step"]
    said = "heartbeats say it is in" if data["run"]["source"] == "heartbeat" else "timings reached"
    reached = "" if latest is None else f"; the run's {said} step {latest}"
    _console.print(
        Text(
            f"  window {data['window']}: steps {data['start']}-{data['last']} "
            f"({data['steps']} step(s)){reached}"
        )
    )
    _console.print(
        Text(
            f"  {rank_list(data['listening'])} will record it (ranks look for triggers "
            f"every {data['check_every']} steps)"
        )
    )
    unheard = data["not_listening"]
    for group, reason in _grouped(unheard, [int(r) for r in unheard]):
        _console.print(Text(f"  {rank_list(group)} will not: {reason}", style="yellow"))
    if data["note"]:
        _console.print(Text(f"  note: {data['note']}", style="yellow"))
    _console.print(Text(f"  traces: {data['traces']}/"))
    _console.print(Text(f"  who answered: rankscope trigger {data['run_dir']} --status"))


_STATES = {
    "saved": "saved",
    "accepted": "accepted, not saved yet",
    "declined": "declined",
    "waiting": "no answer yet",
    "not_listening": "will not answer",
}


def trigger_status(data: dict[str, Any]) -> None:
    note = data["run"]["note"]
    if note is not None:
        _console.print(Text(note, style="yellow"))
    triggers = data["triggers"]
    if not triggers:
        _console.print(Text(f"no triggers in {data['run_dir']}"))
    for t in triggers:
        created = f", written {t['created']}" if t.get("created") else ""
        _console.print(
            Text(
                f"trigger {t['id']}: steps {t['start']}-{t['last']} on ranks {t['ranks']}{created}",
                style="bold",
            )
        )
        for state, label in _STATES.items():
            ranks = t["ranks_by_state"][state]
            if not ranks:
                continue
            if state == "saved":
                where = str(Path(t["saved"][str(ranks[0])]).parent)
                _console.print(Text(f"  {label}: {rank_list(ranks)} -> {where}/"))
            elif state in ("declined", "not_listening"):
                for group, reason in _grouped(t["reasons"], ranks):
                    _console.print(Text(f"  {label}: {rank_list(group)}: {reason}"))
            else:
                _console.print(Text(f"  {label}: {rank_list(ranks)}"))
    _skipped(data["skipped"])
