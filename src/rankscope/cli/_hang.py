"""`rankscope hang`: which rank is stuck where, and which ranks wait for it (analysis/hangs/_hangs.py)."""

from __future__ import annotations

import argparse
from typing import Any

from .._errors import TraceError
from ..analysis.core._options import HangOptions
from ..rundir._layout import HANGS, LIVE
from ._options import add_options, command, json_option, options_from
from ._output import print_json, terminal

__all__ = ["add_commands"]


def add_commands(commands: Any) -> None:
    hang = command(
        commands,
        "hang",
        "which rank is stuck where, and which ranks wait for it",
        (
            f"Read the ranks' heartbeats (RUN_DIR/{LIVE}) and hang files (RUN_DIR/{HANGS}) and "
            "say whether the job is hung, which rank is stuck in which phase at which step "
            "since when, and which ranks wait for it. Where torch's Flight Recorder dumps "
            "are there (the watchdog saves one beside each hang file), each process group's "
            "collectives are matched across the ranks: the last every rank completed, the "
            "first some rank never entered, calls that do not match. Exit 0 whenever they "
            "could be read, hung or not; 2 when there is none to read."
        ),
    )
    hang.add_argument(
        "--flight-recorder",
        metavar="PATH",
        help=(
            "Flight Recorder dumps you have, read in place of the watchdog's: a folder of "
            "them, or the prefix torch wrote them under (TORCH_FR_DUMP_TEMP_FILE; files "
            "<prefix><rank>), pickled or JSON"
        ),
    )
    add_options(hang, HangOptions)
    json_option(hang)
    hang.set_defaults(run=_hang)


def _hang(args: argparse.Namespace) -> int:
    from ..analysis import find_hangs

    render = None if args.json else terminal("hang")
    found = find_hangs(
        args.run_dir, options_from(HangOptions, args), flight_recorder=args.flight_recorder
    )
    if found.files_read == 0 and not found.dumps:
        first = " ".join(found.skipped[0].split()) if found.skipped else ""  # one line
        why = f"; {len(found.skipped)} skipped, first {first}" if first else ""
        raise TraceError(
            f"{found.run_dir}: no heartbeats ({LIVE}/) or hang files ({HANGS}/) to read: "
            f"the watch was off, or the run predates it{why}"
        )
    if render is None:
        print_json(found.to_dict())
    else:
        render.hang(found.to_dict())
    return 0
