"""`rankscope report`: the run at a glance, and its HTML report (analysis/_report.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..analysis.core._options import StragglerOptions
from ..rundir._layout import REPORT
from ..rundir._listing import RunDir
from ._options import add_options, command, json_option, options_from
from ._output import answer, not_over_run_data
from ._progress import Progress

__all__ = ["EXIT_NO_PAGE", "add_commands"]

EXIT_NO_PAGE = 1
"""The answer was printed, but the HTML page could not be written."""


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
    if args.output is not None:
        not_over_run_data(args.output, "-o")
    failed: list[str] = []

    def work(update: Progress | None) -> tuple[dict[str, Any], Path | None]:
        report = build_report(args.run_dir, options, progress=update)
        if args.no_html:
            return report, None
        html: Path = args.output or RunDir(report["run_dir"]).report_path
        try:
            write_page(html, render_html(report))
        except OSError as exc:
            # The answer is worth more than the page: it is printed all the same, and
            # the page's failure said after it (write_page leaves nothing half-written).
            why = f"{html}: {exc.strerror or exc}"
            report["html_error"] = why
            failed.append(why)
            return report, None
        report["html"] = str(html)
        return report, html

    code = answer(
        args.json,
        "report",
        work,
        lambda done: done[0],
        lambda render, done: render.report(*done),
    )
    if failed:
        sys.stdout.flush()  # the answer first, where both go to one terminal or file
        print(
            f"rankscope report: the HTML report was not written ({failed[0]}); "
            "the answer above stands (-o PATH writes the page elsewhere)",
            file=sys.stderr,
        )
        return EXIT_NO_PAGE
    return code
