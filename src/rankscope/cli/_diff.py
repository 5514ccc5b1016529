"""`rankscope diff A B`: what changed between two runs or two windows (analysis/diff/_diff.py),
in the terminal, as JSON, or as a small self-contained HTML page (analysis/render/_diff.py)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..analysis.core._options import DiffOptions
from ..rundir._layout import TRACES
from ._options import add_options, json_option, options_from, positive
from ._output import not_over_run_data, print_json, terminal

__all__ = ["add_commands"]

_SHOWN = 20
"""Changes the terminal shows by default; --json and --html hold them all."""


def add_commands(commands: Any) -> None:
    diff = commands.add_parser(
        "diff",
        help="what changed between two runs (or two trace windows), biggest first",
        description=(
            "Compare run B with run A (or window B with window A, "
            f"RUN_DIR/{TRACES}/<window>): each phase's median and p90, each rank against "
            "the others, each kernel's time and count, all in ms per step. Changes are "
            "listed by how much step time they explain, biggest first; a change within "
            "the noise (how much the figure varies from step to step, what chance makes of "
            "its medians, and --min-share of the step time) is left out."
        ),
    )
    diff.add_argument("a", type=Path, metavar="A", help="the run (or window) to compare against")
    diff.add_argument("b", type=Path, metavar="B", help="the run (or window) that changed")
    add_options(diff, DiffOptions)
    diff.add_argument(
        "--top", type=positive, default=_SHOWN, help=f"changes shown (default: {_SHOWN})"
    )
    diff.add_argument("--html", type=Path, metavar="FILE", help="also write the diff as a page")
    json_option(diff)
    diff.set_defaults(run=_diff)


def _diff(args: argparse.Namespace) -> int:
    from ..analysis.diff._diff import diff_runs
    from ..analysis.render._diff import write_diff_html

    render = None if args.json else terminal("diff")  # says which extra brings rich
    if args.html is not None:
        not_over_run_data(args.html, "--html")
    found = diff_runs(args.a, args.b, options_from(DiffOptions, args))
    data = found.to_dict()
    if args.html is not None:
        write_diff_html(data, args.html)
        data["html"] = str(args.html)
    if render is None:
        print_json(data)
    else:
        _terminal(data, args.top)
    return 0


# -- the terminal -----------------------------------------------------------------------------


def _terminal(data: Mapping[str, Any], top: int) -> None:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from ..analysis.core._format import TERMINAL
    from ..analysis.render._diff import (
        SYNC_NOTE,
        UNJUDGED_TITLE,
        change_text,
        figures_text,
        side_line,
        step_line,
        summary_line,
        versus_a,
    )

    console = terminal("diff").console(soft_wrap=False)
    console.print(Text("rankscope diff", style="bold"))
    console.print(Text(side_line("A", data["a"])))
    console.print(Text(side_line("B", data["b"])))
    step = step_line(data, TERMINAL)
    if step:
        console.print(Text(step))
    changes = data["changes"]
    titles = (
        ("Changes above noise, in ms per step, biggest first", changes, True),
        (UNJUDGED_TITLE, data.get("unjudged", []), False),
    )
    for title, listed, judged in titles:
        if not listed:
            continue
        table = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left")
        columns = ("change", "A", "B", "delta ms", "vs A") + (("noise ms",) if judged else ())
        for column in columns:
            table.add_column(column, justify="left" if column == "change" else "right")
        for change in listed[:top]:
            kernel = change["what"] == "kernel"
            name = change_text(change, TERMINAL) + (" *" if change["sync"] else "")
            cells = [
                figures_text(change["a"], kernel, TERMINAL),
                figures_text(change["b"], kernel, TERMINAL),
                TERMINAL.signed_ms(change["delta_ms"]),
                versus_a(change["relative"], TERMINAL),
            ]
            table.add_row(
                Text(name if len(name) <= 70 else name[:69] + "…", no_wrap=True),
                *cells,
                *([TERMINAL.ms(change["noise_ms"])] if judged else []),
            )
        console.print(table)
        if len(listed) > top:
            console.print(f"  ... {len(listed) - top} more (--top N, --json or --html)")
    if any(change["sync"] for change in changes):
        console.print(f"  {SYNC_NOTE}")
    console.print(Text(summary_line(data), style="bold"))
    for note in data["notes"]:
        console.print(Text(f"note: {note}", style="yellow"))
    skipped = data["skipped"]
    if skipped:
        console.print(f"\n[yellow]Skipped input ({len(skipped)}):[/yellow]")
        for line in skipped[:5]:
            console.print(Text(f"  {line}"))
        if len(skipped) > 5:
            console.print(f"  ... and {len(skipped) - 5} more (all of them in --json)")
    if data.get("html"):
        console.print(Text(f"\nHTML: {data['html']}"))
