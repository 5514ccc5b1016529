"""`rankscope report`: the run at a glance, and its HTML report (analysis/_report.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..analysis._options import StragglerOptions
from ..rundir._layout import REPORT, RunDir
from ._options import add_options, json_option, options_from
from ._output import print_json, terminal
from ._progress import progress

__all__ = ["add_commands"]


def add_commands(commands: Any) -> None:
    parser = commands.add_parser("report", help=f"the run at a glance, and RUN_DIR/{REPORT}")
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    parser.add_argument("--no-html", action="store_true", help="do not write the HTML report")
    parser.add_argument("-o", "--output", type=Path, help=f"HTML path (default: RUN_DIR/{REPORT})")
    add_options(parser, StragglerOptions)
    json_option(parser)
    parser.set_defaults(run=_report)


def _report(args: argparse.Namespace) -> int:
    from ..analysis import build_report, render_html
    from ..analysis.render._page import write_page

    options = options_from(StragglerOptions, args)
    render = None if args.json else terminal("report")
    with progress(render, "reading") as update:
        report = build_report(args.run_dir, options, progress=update)
    html = None
    if not args.no_html:
        html = args.output or RunDir(report["run_dir"]).report_path
        write_page(html, render_html(report))
        report["html"] = str(html)
    if render is None:
        print_json(report)
    else:
        render.report(report, html)
    return 0
