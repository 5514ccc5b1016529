"""`rankscope stragglers`: which rank is slow in which phase, and who waits for it
(analysis/stragglers/_analyse.py)."""

from __future__ import annotations

import argparse
from typing import Any

from ..analysis.core._options import StragglerOptions
from ._options import command, options_from
from ._output import answer
from ._progress import stage

__all__ = ["add_commands"]

_SHOWN = 20
"""Findings the terminal lists without --all; --json gives every one."""


def add_commands(commands: Any) -> None:
    parser = command(
        commands,
        "stragglers",
        "which rank is slow in which phase, and who waits for it",
        options=StragglerOptions,
        scripts=True,
    )
    parser.add_argument(
        "--all", action="store_true", help=f"list every finding (default: {_SHOWN})"
    )
    parser.set_defaults(run=_stragglers)


def _stragglers(args: argparse.Namespace) -> int:
    from ..analysis.stragglers._analyse import analyse_stragglers

    options = options_from(StragglerOptions, args)
    return answer(
        args.json,
        "stragglers",
        lambda update: analyse_stragglers(args.run_dir, options, progress=stage(update, "timings")),
        lambda found: found.to_dict(),
        lambda render, found: render.stragglers(
            found.report,
            found.run.skipped,
            limit=None if args.all else _SHOWN,
            note=found.run.records.attempts.note,
        ),
    )
