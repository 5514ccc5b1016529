"""`rankscope stragglers`: which rank is slow in which phase, and who waits for it
(analysis/_analyse.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..analysis._options import StragglerOptions
from ._options import add_options, json_option, options_from
from ._output import print_json, terminal
from ._progress import progress, stage

__all__ = ["add_commands"]

_SHOWN = 20
"""Findings the terminal lists without --all; --json gives every one."""


def add_commands(commands: Any) -> None:
    parser = commands.add_parser(
        "stragglers", help="which rank is slow in which phase, and who waits for it"
    )
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    add_options(parser, StragglerOptions)
    parser.add_argument(
        "--all", action="store_true", help=f"list every finding (default: {_SHOWN})"
    )
    json_option(parser)
    parser.set_defaults(run=_stragglers)


def _stragglers(args: argparse.Namespace) -> int:
    from ..analysis._analyse import analyse_stragglers

    options = options_from(StragglerOptions, args)
    render = None if args.json else terminal("stragglers")
    with progress(render, "reading") as update:
        found = analyse_stragglers(args.run_dir, options, progress=stage(update, "timings"))
    if render is None:
        print_json(found.to_dict())
    else:
        render.stragglers(
            found.report,
            found.run.skipped,
            limit=None if args.all else _SHOWN,
            note=found.run.records.attempts.note,
        )
    return 0
