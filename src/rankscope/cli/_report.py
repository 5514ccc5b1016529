"""`rankscope report`: the run at a glance, and its HTML report (analysis/_report.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..analysis._options import StragglerOptions
from ..rundir._layout import REPORT, RunDir
from ._options import add_options, command, json_option, options_from
from ._output import answer
from ._progress import Progress

__all__ = ["add_commands"]


def add_commands(commands: Any) -> None:
    parser = command(commands, "report", f"the run at a glance, and RUN_DIR/{REPORT}")
    parser.add_argument("--no-html", action="store_true", help="do not write the HTML report")
    parser.add_argument("-o", "--output", type=Path, help=f"HTML path (default: RUN_DIR/{REPORT})")
    add_options(parser, StragglerOptions)
    json_option(parser)
    parser.set_defaults(run=_report)


def _report(args: argparse.Namespace) -> int:
    from ..analysis import build_report, render_html
    from ..analysis.render._page import write_page

    options = options_from(StragglerOptions, args)

    def work(update: Progress | None) -> tuple[dict[str, Any], Path | None]:
        report = build_report(args.run_dir, options, progress=update)
        if args.no_html:
            return report, None
        html: Path = args.output or RunDir(report["run_dir"]).report_path
        write_page(html, render_html(report))
        report["html"] = str(html)
        return report, html

    return answer(
        args.json,
        "report",
        work,
        lambda done: done[0],
        lambda render, done: render.report(*done),
    )
