"""`rankscope` entry point. The CLI owns the terminal: logging handlers and printing live here.

Every command takes `--json` (one JSON document on stdout, no terminal extras needed);
bad input is one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from .._errors import ConfigError, RankscopeError
from .._version import __version__
from . import (
    _collectives,
    _demo,
    _diff,
    _export,
    _hang,
    _hosts,
    _import,
    _kernels,
    _merge,
    _report,
    _sql,
    _stragglers,
    _top,
    _trigger,
)
from ._lines import ReaderGone
from ._options import OPTION_FIELDS
from ._output import EXIT_BAD_INPUT

__all__ = ["main"]

# ConfigError fields that are this CLI's options (the analyses' and the demo's).
_OPTIONS = OPTION_FIELDS | {
    "ranks",
    "steps",
    "every",
    "straggler_rank",
    "straggler_phase",
    "slowdown",
}
# Each command's module adds its parser; `rankscope` alone lists them in this order.
_COMMANDS = (
    _demo,
    _report,
    _stragglers,
    _kernels,
    _merge,
    _hang,
    _top,
    _trigger,
    _sql,
    _export,
    _collectives,
    _hosts,
    _diff,
    _import,
)


class _Parser(argparse.ArgumentParser):
    """argparse, with its complaint on one line like every other bad input, a list of
    the commands for `rankscope` alone, and "did you mean" for a misspelled command."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {message} (see {self.prog} --help)\n")

    _intermixing = False

    def parse_known_args(  # type: ignore[override]  # typeshed's overloads, one behaviour
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        # A command's options go anywhere among its positionals (`sql RUN --csv QUERY`, as
        # the docs write it): argparse alone stops filling positionals at the first option.
        # The intermixed parse calls back here, and takes no parser that has commands.
        if self._intermixing or any(
            isinstance(a, argparse._SubParsersAction) for a in self._actions
        ):
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False

    def command_list(self) -> str:
        """The commands, one line each, with the help each was added with."""
        # argparse keeps a command's help only on this (private, long-stable) list.
        rows = [(a.dest, a.help or "") for a in self._commands()._choices_actions]
        width = max(len(name) for name, _ in rows)
        return "\n".join(
            [
                f"usage: {self.prog} COMMAND ...   ({self.prog} COMMAND --help: its options)",
                "",
                self.description or "",
                "",
                "commands:",
                *(f"  {name:<{width}}  {text}" for name, text in rows),
                "",
            ]
        )

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # argparse's own complaint lists every choice and suggests nothing (before 3.14).
        if isinstance(action, argparse._SubParsersAction) and value not in action.choices:
            names = list(action.choices)
            close = difflib.get_close_matches(value, names, n=1)
            hint = (
                f"did you mean {close[0]!r}?"
                if close
                else f"the commands are {', '.join(names)} (see {self.prog} --help)"
            )
            self.exit(EXIT_BAD_INPUT, f"{self.prog}: unknown command {value!r}; {hint}\n")
        super()._check_value(action, value)

    def _commands(self) -> argparse._SubParsersAction[Any]:
        (commands,) = (a for a in self._actions if isinstance(a, argparse._SubParsersAction))
        return commands


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _run(argv)
        # What is still buffered goes now: a reader gone by then is seen here, where the
        # interpreter's own flush at exit would print a complaint and exit 120.
        sys.stdout.flush()
        return code
    except (BrokenPipeError, ReaderGone):
        # The reader went away (`| head -1`) with all it wanted: nothing failed, so exit 0
        # and say nothing, for every command. stdout goes to devnull so that nothing
        # written after this (the interpreter's flush) meets the closed pipe again.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _run(argv: Sequence[str] | None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a bad argument (already said)
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    if args.command is None:  # `rankscope` alone: what it can do, as `pip` or `docker` say
        sys.stdout.write(parser.command_list())
        return 0
    _configure_logging(args.verbose)
    missing = _missing_extras(args)
    if missing:
        # Said before any work, once, with the one extra that brings all of it: a base
        # install's report wrote a page of "no timings were read" over a good one.
        print(
            f"rankscope {args.command}: needs {' and '.join(missing)}, not installed: "
            "pip install 'rankscope[cli]'",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    command: Callable[[argparse.Namespace], int] = args.run
    try:
        return command(args)
    except (RankscopeError, OSError, ImportError) as exc:  # ConfigError is a RankscopeError
        if isinstance(exc, BrokenPipeError):
            raise
        print(f"rankscope {args.command}: {_error_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT


_READS_TIMINGS = frozenset({"stragglers", "report", "diff", "hosts", "export", "sql", "demo"})
"""Commands that read timings, through DuckDB (the analysis extra)."""
_PLAIN_OUTPUTS = ("json", "csv", "schema")
"""Flags whose output is plain text: no terminal tables (rich) needed."""


def _missing_extras(args: argparse.Namespace) -> list[str]:
    """The packages of the `cli` extra the command needs and cannot import: DuckDB where it
    reads timings, rich where it draws on the terminal."""
    wanted = ["duckdb"] if args.command in _READS_TIMINGS else []
    if args.command != "export" and not any(getattr(args, f, False) for f in _PLAIN_OUTPUTS):
        wanted.append("rich")
    missing = []
    for name in wanted:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append({"duckdb": "DuckDB"}.get(name, name))
    return missing


def _error_line(exc: Exception) -> str:
    """What went wrong, in one line, naming the option the user typed where it was one."""
    if isinstance(exc, ConfigError):
        if exc.field not in _OPTIONS:
            return str(exc)
        # Name the option the user typed, not the keyword argument it became.
        problem = f": {exc.problem}" if exc.problem else ""
        flag = f"--{exc.field.replace('_', '-')}"
        return f"{flag} {exc.value!r} is not valid{problem}; accepted: {exc.accepted}"
    if isinstance(exc, OSError) and not isinstance(exc, RankscopeError):
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror or exc}"
    return str(exc)


def _parser() -> _Parser:
    parser = _Parser(prog="rankscope", description="Profile distributed PyTorch training safely.")
    parser.add_argument("--version", action="version", version=f"rankscope {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log rankscope's INFO messages"
    )
    # Not required: `rankscope` alone lists the commands (main).
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", title="commands", parser_class=_Parser
    )
    for module in _COMMANDS:
        module.add_commands(commands)
    return parser


def _configure_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("rankscope")
    log.addHandler(handler)
    log.setLevel(logging.INFO if verbose else logging.WARNING)
