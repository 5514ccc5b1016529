"""`rankscope sql`: SQL over a run directory's tables (analysis/_sql.py)."""

from __future__ import annotations

import argparse
import csv
import datetime
import decimal
import math
import sys
import uuid
from pathlib import Path
from typing import Any

from .._text import one_line
from ..analysis.core._format import TERMINAL
from ._output import EXIT_BAD_INPUT, print_json, terminal

__all__ = ["add_commands"]

_SHOWN = 200
"""Rows the terminal table shows; --csv and --json print every row."""


def add_commands(commands: Any) -> None:
    sql = commands.add_parser(
        "sql",
        help="SQL over a run: its timings, meta, kernels, heartbeats and hangs as tables",
        description=(
            "Run a DuckDB query over the run directory's tables (--schema lists them), e.g. "
            'rankscope sql runs/exp1 "select rank, median(cpu_ms) from timings where '
            "phase = 'forward' group by rank order by 2 desc limit 5\". Records are read as "
            "the analysis reads them: bad lines are left out and said, and each record "
            "carries its attempt and whether the figures use it."
        ),
    )
    sql.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    sql.add_argument("query", nargs="?", metavar="QUERY", help="the SQL query")
    form = sql.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print the rows as a JSON array")
    form.add_argument("--csv", action="store_true", help="print the rows as CSV")
    form.add_argument("--schema", action="store_true", help="list the tables and their columns")
    sql.add_argument(
        "--allow-files",
        action="store_true",
        help="let the query read and write files, attach databases and load extensions "
        "(COPY ... TO, read_csv, ATTACH, INSTALL); by default it sees the run's tables only",
    )
    sql.set_defaults(run=_sql)


def _sql(args: argparse.Namespace) -> int:
    from ..analysis._sql import TABLES, open_run_database

    if args.schema:
        for name, (what, columns) in TABLES.items():
            print(f"{name}: {what}")
            for column, kind, doc in columns:
                print(f"  {column:<14} {kind:<8} {doc}".rstrip())
        return 0
    if not args.query:
        print("rankscope sql: give a QUERY (or --schema for the tables)", file=sys.stderr)
        return EXIT_BAD_INPUT
    db = open_run_database(args.run_dir, allow_files=args.allow_files)
    names, rows = db.query(args.query)
    for line in db.skipped:
        print(f"skipped: {line}", file=sys.stderr)
    if args.json:
        print_json([dict(zip(names, map(_plain, row), strict=True)) for row in rows])
    elif args.csv:
        out = csv.writer(sys.stdout, lineterminator="\n")
        out.writerow(names)
        # CSV holds any text, a newline quoted; on a terminal a value's control
        # characters are written out, so that none acts on it.
        shown = _shown if sys.stdout.isatty() else _plain
        out.writerows([shown(v) for v in row] for row in rows)
    else:
        _table(names, rows)
    return 0


def _plain(value: Any) -> Any:
    """A DuckDB value as JSON and CSV can hold it (NaN stays a float: the JSON printer
    makes it null)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    return str(value) if isinstance(value, (datetime.timedelta, uuid.UUID)) else value


def _table(names: list[str], rows: list[tuple[Any, ...]]) -> None:
    render = terminal("sql")  # says which extra brings rich, where it is missing
    from rich.table import Table

    table = Table(*names, show_edge=False, header_style="bold")
    for row in rows[:_SHOWN]:
        table.add_row(*(_cell(_plain(v)) for v in row))
    console = render.console()
    console.print(table)
    if len(rows) > _SHOWN:
        console.print(f"{len(rows) - _SHOWN} more rows (--csv or --json prints them all)")


def _shown(value: Any) -> Any:
    plain = _plain(value)
    return one_line(plain) if isinstance(plain, str) else plain


def _cell(value: Any) -> str:
    """A value as the terminal table shows it: a float by the figures' rule (4 significant
    digits, core/_format.py), since sums of doubles read 2.1652899999999997, and NULL as
    every terminal table spells a missing value; --json and --csv keep every digit."""
    if value is None:
        return TERMINAL.missing
    if isinstance(value, float) and math.isfinite(value):
        return TERMINAL.number(value)
    return one_line(str(value))  # a name's newline or escape sequence is shown, not acted on
