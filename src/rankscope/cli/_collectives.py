"""`rankscope collectives`: who arrives last at each collective of a window
(analysis/collectives/_collectives.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..analysis.core._options import CollectiveOptions
from ._options import add_options, json_option, options_from
from ._output import print_json, terminal

__all__ = ["add_commands"]


def add_commands(commands: Any) -> None:
    parser = commands.add_parser(
        "collectives",
        help="who arrives last at each collective, from the traces of one window",
        description=(
            "Match each collective across the ranks of one captured window (NCCL kernels "
            "on GPU, c10d calls on CPU), put the ranks on one clock, and say per rank how "
            "often it arrived last and by how much (its arrival less the median arrival "
            "of the others), and per collective its skew (last arrival less first). Where "
            "the ranks span hosts, each host's clock offset is taken from the run's "
            "timings. Give the window's folder, RUN_DIR/traces/<window>, or trace files "
            "of one window."
        ),
    )
    parser.add_argument("sources", nargs="+", type=Path, metavar="WINDOW_DIR_OR_TRACE")
    add_options(parser, CollectiveOptions)
    json_option(parser)
    parser.set_defaults(run=_collectives)


def _collectives(args: argparse.Namespace) -> int:
    from ..analysis.collectives._collectives import find_collectives

    if not args.json:
        terminal("collectives")  # says which extra brings rich, where it is missing
    found = find_collectives(args.sources).to_dict()
    if args.json:
        print_json(found)
    else:
        _show(found, options_from(CollectiveOptions, args).rows)
    return 0


def _show(found: dict[str, Any], rows: int) -> None:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from ..analysis.collectives._collective_clocks import ALIGNMENTS
    from ..analysis.core._format import TERMINAL

    console = terminal("collectives").console()
    source = "NCCL kernels (GPU)" if found["source"] == "gpu" else "c10d calls (CPU)"
    window = f"window {found['window']}" if found["window"] else "the traces given"
    console.print(
        Text(
            f"Collectives of {window}: {len(found['collectives'])} matched across "
            f"{len(found['ranks'])} ranks, from {source}",
            style="bold",
        )
    )
    console.print(Text(found["summary"]))
    console.print(Text(f"clocks: {ALIGNMENTS.get(found['alignment'], found['alignment'])}"))
    ranks = sorted(found["ranks"], key=lambda r: (-r["arrived_last"], -r["late_ms"], r["rank"]))
    table = Table(
        box=box.SIMPLE_HEAD, title="Ranks, the most often last first", title_justify="left"
    )
    for column in ("rank", "host", "collectives", "last at", "late ms", "mean", "max", "vs median"):
        table.add_column(column, justify="left" if column == "host" else "right")
    for r in ranks[:rows]:
        table.add_row(
            str(r["rank"]),
            Text(r["host"] or TERMINAL.missing),
            str(r["collectives"]),
            str(r["arrived_last"]),
            TERMINAL.ms(r["late_ms"]),
            TERMINAL.ms(r["late_ms_mean"]),
            TERMINAL.ms(r["late_ms_max"]),
            TERMINAL.signed_ms(r["vs_median_ms"]),
        )
    console.print(table)
    if len(ranks) > rows:
        console.print(f"  ... {len(ranks) - rows} more ranks (--rows N, or --json)")
    skewed = sorted(found["collectives"], key=lambda c: -c["skew_ms"])[:rows]
    if skewed:
        table = Table(
            box=box.SIMPLE_HEAD, title="Collectives, the largest skew first", title_justify="left"
        )
        for column in ("at ms", "collective", "group", "#", "skew ms", "first", "last", "late ms"):
            table.add_column(
                column, justify="left" if column in ("collective", "group") else "right"
            )
        for c in skewed:
            table.add_row(
                TERMINAL.ms(c["at_ms"]),
                Text(c["name"]),
                Text(c["group"] or TERMINAL.missing),
                str(c["index"] if c["seq"] is None else c["seq"]),
                TERMINAL.ms(c["skew_ms"]),
                str(c["first_rank"]),
                "tie" if c["last_rank"] is None else str(c["last_rank"]),
                TERMINAL.ms(c["late_ms"]),
            )
        console.print(table)
    for entry in found["unmatched"]:
        console.print(Text(f"unmatched: {entry['reason']}", style="yellow"))
    for note in found["notes"]:
        console.print(Text(f"note: {note}", style="yellow"))
    for line in found["skipped"]:
        console.print(Text(f"skipped: {line}", style="yellow"))
