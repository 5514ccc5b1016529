"""`rankscope export`: a run directory's tables kept as Parquet files (analysis/_sql.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ._options import command
from ._output import not_over_run_data

__all__ = ["add_commands"]


def add_commands(commands: Any) -> None:
    export = command(
        commands,
        "export",
        "keep a run's tables as Parquet files",
        "Write each of the run's tables (see `rankscope sql --schema`) as DIR/<table>.parquet.",
    )
    export.add_argument("--parquet", type=Path, required=True, metavar="DIR", help="the folder")
    export.set_defaults(run=_export)


def _export(args: argparse.Namespace) -> int:
    from ..analysis._sql import open_run_database

    not_over_run_data(args.parquet, "--parquet")
    db = open_run_database(args.run_dir)
    for line in db.skipped:
        print(f"skipped: {line}", file=sys.stderr)
    for path in db.export_parquet(args.parquet):
        print(path)
    return 0
