"""`rankscope top`: every rank by step and open phase, live (analysis/hangs/_top.py)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from .._errors import TraceError
from ..rundir._layout import LIVE
from ._options import command, json_option, positive
from ._output import print_json, terminal

__all__ = ["add_commands"]


def add_commands(commands: Any) -> None:
    top = command(
        commands,
        "top",
        "every rank by step and open phase, live: the stuck and the slowest first",
        (
            f"Show the ranks' heartbeats (RUN_DIR/{LIVE}) as a table refreshed every second "
            "until Ctrl-C: each rank's step, innermost open phase, how long it has been "
            "there and how old its heartbeat is, the stuck ranks first, then the ranks that "
            "wait for them, then the slowest."
        ),
    )
    top.add_argument("--once", action="store_true", help="print the table once and exit")
    top.add_argument(
        "--rows", type=positive, default=40, help="ranks shown (default: 40; the rest counted)"
    )
    top.add_argument(
        "--interval", type=float, default=1.0, help="seconds between refreshes (default: 1)"
    )
    json_option(top)
    top.set_defaults(run=_top)


def _top(args: argparse.Namespace) -> int:
    from ..analysis.hangs._step_order import StepOrders
    from ..analysis.hangs._top import top_rows

    orders = StepOrders()  # the timings read again only when they change
    report, rows = top_rows(args.run_dir, orders=orders)
    if report.files_read == 0:
        raise TraceError(f"{report.run_dir}: no heartbeats ({LIVE}/) to show: the watch was off")
    if args.json:  # one frame
        print_json({"state": report.state, "summary": report.summary, "ranks": rows})
        return 0
    render = terminal("top")
    if args.once or not sys.stdout.isatty():
        # Piped, a live view redraws nothing a reader sees: one frame, as with --once.
        render.top(report.to_dict(), rows, args.rows, live=None)
        return 0
    with render.live_view() as live:
        try:
            while True:
                render.top(report.to_dict(), rows, args.rows, live=live)
                time.sleep(max(0.1, args.interval))
                report, rows = top_rows(args.run_dir, orders=orders)
        except KeyboardInterrupt:
            return 0
