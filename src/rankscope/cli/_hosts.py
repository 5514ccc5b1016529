"""`rankscope hosts`: which host keeps holding a slow rank (analysis/hosts/_hosts.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..analysis.core._options import HostOptions
from ._options import add_options, json_option, options_from
from ._output import print_json, terminal

__all__ = ["add_commands"]

_SHOWN = 20
"""Hosts the terminal table shows; --json gives every one."""


def add_commands(commands: Any) -> None:
    hosts = commands.add_parser(
        "hosts",
        help="which host keeps holding a slow rank: across runs, attempts and windows",
        description=(
            "Find the slow ranks of each run directory (each attempt of a restarted run on "
            "its own, and each window of consecutive sampled steps), place them on the hosts "
            "they ran on (from the timings' attempt lines, else the meta files), and say "
            "which host holds a slow rank again and again, "
            'e.g. "node-17 held a slow rank in 3 of 4 runs: consider draining it". Only the '
            "slow ranks count, never the ranks that wait for them."
        ),
    )
    hosts.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    # Every attempt is analysed on its own: no --attempt.
    add_options(hosts, HostOptions, skip=("attempt",))
    json_option(hosts)
    hosts.set_defaults(run=_hosts)


def _hosts(args: argparse.Namespace) -> int:
    from ..analysis.hosts._hosts import find_recurring_hosts

    if not args.json:
        terminal("hosts")  # says which extra brings rich, where it is missing
    found = find_recurring_hosts(args.run_dirs, options_from(HostOptions, args))
    data = found.to_dict()
    if args.json:
        print_json(data)
    else:
        _show(data)
    return 0


def _show(data: dict[str, Any]) -> None:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    # Piped output has no width to fit: wide enough that the sentences stay whole.
    console = terminal("hosts").console()
    counts, options = data["counts"], data["options"]
    runs = len(data["runs"])
    console.print(
        Text(
            f"Hosts that held a slow rank, over {_many(runs, 'run')} "
            f"({_many(counts['attempts'], 'attempt')} and {_many(counts['windows'], 'window')} "
            f"with hosts to compare; {_clock(options['time'])}, "
            f"threshold {options['threshold']:.2f})",
            style="bold",
        )
    )
    for sentence in data["summary"]:
        console.print(Text(f"  {sentence}", style="bold"))
    if data["hosts"]:
        table = Table(box=box.SIMPLE_HEAD, title_justify="left")
        for column in ("host", "runs", "attempts", "windows", "ranks", "phases"):
            table.add_column(column, justify="right" if column in _COUNTS else "left")
        for host in data["hosts"][:_SHOWN]:
            table.add_row(
                Text(host["host"]),
                f"{host['runs']}/{counts['runs']}",
                f"{host['attempts']}/{counts['attempts']}",
                f"{host['windows']}/{counts['windows']}",
                Text(_ranks(host["ranks"], runs)),
                Text(", ".join(host["phases"])),
            )
        console.print(table)
        if len(data["hosts"]) > _SHOWN:
            console.print(f"  ... {len(data['hosts']) - _SHOWN} more hosts (--json)")
    for run in data["runs"]:
        attempts = run["attempts"]
        if len(run["no_device_times"]) == attempts:  # its hosts unread: nothing compared
            where = ": no device times"
        else:
            where = f" on {_many(len(run['hosts']), 'known host')}"
        line = f"run {run['label']}: ranks {run['ranks']}{where}"
        if attempts > 1:
            line += f", {attempts} attempts"
        console.print(Text(line))
        for note in run["notes"]:
            console.print(Text(f"  {note}"))
    skipped = data["skipped"]
    if skipped:
        console.print(Text(f"\nSkipped input ({len(skipped)}):", style="yellow"))
        for line in skipped[:_SHOWN]:
            console.print(Text(f"  {line}"))
        if len(skipped) > _SHOWN:
            console.print(f"  ... and {len(skipped) - _SHOWN} more (all of them in --json)")


_COUNTS = ("runs", "attempts", "windows")


def _many(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _ranks(ranks: list[dict[str, Any]], runs: int) -> str:
    """'3, 5' in one run; '3 (a), 11 (b)' across runs; attempts named where there are several."""
    parts = []
    for r in ranks[:8]:
        where = [r["run"]] if runs > 1 else []
        if r["attempt"] > 1 or any(o["attempt"] > 1 for o in ranks if o["run"] == r["run"]):
            where.append(f"attempt {r['attempt']}")
        parts.append(f"{r['rank']} ({', '.join(where)})" if where else str(r["rank"]))
    return ", ".join(parts) + (f", {len(ranks) - 8} more" if len(ranks) > 8 else "")


def _clock(time: str) -> str:
    """The basis the windows were read on (auto: each phase on the clock of its work)."""
    return "each phase on its own clock" if time == "auto" else f"{time} time"
