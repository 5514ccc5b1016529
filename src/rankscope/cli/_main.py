"""`rankscope` entry point. The CLI owns the terminal: logging handlers and printing live here.

Every command takes `--json` (one JSON document on stdout, no terminal extras needed);
bad input is one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from .._errors import ConfigError, RankscopeError, TraceError
from .._layout import HANGS, LIVE, REPORT, TRIGGERS, RunDir
from .._version import __version__
from . import _collectives, _diff, _hosts, _sql
from ._options import json_option, positive, straggler_options
from ._output import EXIT_BAD_INPUT, print_json, terminal

__all__ = ["main"]

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a command a pipe cut short
# ConfigError fields that are this CLI's options (the analysis's and the demo's).
_OPTIONS = {
    "threshold",
    "min_persistence",
    "min_share",
    "ranks",
    "steps",
    "every",
    "straggler_rank",
    "straggler_phase",
    "slowdown",
}


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
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a bad argument (already said)
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    if args.command is None:  # `rankscope` alone: what it can do, as `pip` or `docker` say
        sys.stdout.write(parser.command_list())
        return 0
    _configure_logging(args.verbose)
    command: Callable[[argparse.Namespace], int] = args.run
    try:
        return command(args)
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, as a command killed by SIGPIPE would.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except (RankscopeError, OSError, ImportError) as exc:  # ConfigError is a RankscopeError
        print(f"rankscope {args.command}: {_error_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _error_line(exc: Exception) -> str:
    """What went wrong, in one line, naming the option the user typed where it was one."""
    if isinstance(exc, ConfigError):
        if exc.field not in _OPTIONS:
            return str(exc)
        # Name the option the user typed, not the keyword argument it became.
        return (
            f"--{exc.field.replace('_', '-')} {exc.value!r} is not valid; accepted: {exc.accepted}"
        )
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

    demo = commands.add_parser(
        "demo",
        help="train with DDP on CPU processes, one rank made slow, and show what rankscope finds",
    )
    demo.add_argument(
        "--out", type=Path, default=None, help="run directory (default: runs/demo-TIME)"
    )
    demo.add_argument("--ranks", type=int, default=4, help="processes, 2-16 (default: 4)")
    demo.add_argument("--steps", type=int, default=60, help="training steps (default: 60)")
    demo.add_argument(
        "--every", type=int, default=2, help="time one step in this many (default: 2)"
    )
    demo.add_argument(
        "--straggler-rank",
        type=_rank_or_none,
        default=_DEFAULT_STRAGGLER,
        metavar="RANK|none",
        help="the rank to slow down; none for a clean run (default: 2, or the last rank if fewer)",
    )
    demo.add_argument(
        "--straggler-phase",
        default="forward",
        choices=["host_to_device", "forward", "backward", "optimizer", "loss_allreduce"],
        help="the phase to slow down (default: forward)",
    )
    demo.add_argument(
        "--slowdown",
        type=float,
        default=0.5,
        help="how much slower that phase is: 0.5 = 1.5x its time (default: 0.5)",
    )
    demo.add_argument("--json", action="store_true", help="print the report as JSON for scripts")
    demo.set_defaults(run=_demo)

    report = commands.add_parser("report", help=f"the run at a glance, and RUN_DIR/{REPORT}")
    report.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    report.add_argument("--no-html", action="store_true", help="do not write the HTML report")
    report.add_argument("-o", "--output", type=Path, help=f"HTML path (default: RUN_DIR/{REPORT})")
    straggler_options(report)
    json_option(report)
    report.set_defaults(run=_report)

    stragglers = commands.add_parser(
        "stragglers", help="which rank is slow in which phase, and who waits for it"
    )
    stragglers.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    straggler_options(stragglers)
    stragglers.add_argument("--all", action="store_true", help="list every finding (default: 20)")
    json_option(stragglers)
    stragglers.set_defaults(run=_stragglers)

    kernels = commands.add_parser("kernels", help="the top kernels (or CPU ops) of traces")
    kernels.add_argument("sources", nargs="+", type=Path, metavar="TRACE_OR_DIR")
    kernels.add_argument("--top", type=positive, default=20, help="rows to show (default: 20)")
    kernels.add_argument("--by", choices=("name", "category"), default="name")
    kernels.add_argument("--window", help="only traces of this window (step-000003-000004)")
    json_option(kernels)
    kernels.set_defaults(run=_kernels)

    merge = commands.add_parser("merge", help="one timeline from several ranks' traces")
    merge.add_argument("sources", nargs="+", type=Path, metavar="TRACE")
    merge.add_argument(
        "-o", "--output", type=Path, required=True, help="the merged trace (.json or .json.gz)"
    )
    json_option(merge)
    merge.set_defaults(run=_merge)

    _hang_command(commands)

    trigger = commands.add_parser(
        "trigger",
        help="ask a running job to record a window now, or (--status) who answered",
        description=(
            "Write a trigger file into RUN_DIR asking the job's ranks to record a trace "
            "window from an absolute step. Ranks look for triggers every "
            f"trace.trigger_check_every_n_steps steps; each answers in RUN_DIR/{TRIGGERS}/ID/."
        ),
    )
    trigger.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    trigger.add_argument(
        "--steps",
        type=positive,
        help="steps to record (default: 2, at most trace.trigger_max_steps)",
    )
    trigger.add_argument(
        "--ranks", help="ranks that record: 0, 0,8, 0-7, all (default: the run's trace.ranks)"
    )
    when = trigger.add_mutually_exclusive_group()
    when.add_argument("--at", type=_step, metavar="STEP", help="the first step to record")
    when.add_argument(
        "--in",
        dest="in_steps",
        type=positive,
        metavar="N",
        help="start N steps after the latest step in the run's timings "
        "(default: far enough ahead for every rank to see the trigger in time)",
    )
    trigger.add_argument(
        "--status", action="store_true", help="list the run's triggers and which ranks answered"
    )
    json_option(trigger)
    trigger.set_defaults(run=_trigger)
    return parser


def _hang_command(commands: Any) -> None:
    hang = commands.add_parser(
        "hang",
        help="which rank is stuck where, and which ranks wait for it",
        description=(
            f"Read the ranks' heartbeats (RUN_DIR/{LIVE}) and hang files (RUN_DIR/{HANGS}) and "
            "say whether the job is hung, which rank is stuck in which phase at which step "
            "since when, and which ranks wait for it. Exit 0 whenever they could be read, "
            "hung or not; 2 when there is none to read."
        ),
    )
    hang.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    json_option(hang)
    hang.set_defaults(run=_hang)
    top = commands.add_parser(
        "top",
        help="every rank by step and open phase, live: the stuck and the slowest first",
        description=(
            f"Show the ranks' heartbeats (RUN_DIR/{LIVE}) as a table refreshed every second "
            "until Ctrl-C: each rank's step, innermost open phase, how long it has been "
            "there and how old its heartbeat is, the stuck ranks first, then the ranks that "
            "wait for them, then the slowest."
        ),
    )
    top.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    top.add_argument("--once", action="store_true", help="print the table once and exit")
    top.add_argument(
        "--rows", type=positive, default=40, help="ranks shown (default: 40; the rest counted)"
    )
    top.add_argument(
        "--interval", type=float, default=1.0, help="seconds between refreshes (default: 1)"
    )
    json_option(top)
    top.set_defaults(run=_top)
    _sql.add_commands(commands)
    _collectives.add_commands(commands)
    _hosts.add_commands(commands)
    _diff.add_commands(commands)


def _step(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a step >= 1, got {text}")
    return value


def _configure_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("rankscope")
    log.addHandler(handler)
    log.setLevel(logging.INFO if verbose else logging.WARNING)


# -- commands ------------------------------------------------------------------


def _report(args: argparse.Namespace) -> int:
    from ..analysis import build_report, render_html

    render = None if args.json else terminal("report")
    with _progress(render, "reading") as progress:
        report = build_report(
            args.run_dir,
            threshold=args.threshold,
            min_persistence=args.min_persistence,
            min_share=args.min_share,
            time_base=args.time,
            attempt=args.attempt,
            progress=progress,
        )
    html = None
    if not args.no_html:
        html = args.output or RunDir(report["run_dir"]).report_path
        html.write_text(render_html(report), encoding="utf-8")
        report["html"] = str(html)
    if render is None:
        print_json(report)
    else:
        render.report(report, html)
    return 0


def _stragglers(args: argparse.Namespace) -> int:
    from ..analysis import find_stragglers, matrices_of, read_run_meta, read_run_records
    from ..analysis.read._values import read_phase_values

    render = None if args.json else terminal("stragglers")
    meta = read_run_meta(args.run_dir)
    with _progress(render, "reading") as progress:
        timings = read_run_records(
            args.run_dir,
            time=args.time,
            attempt=args.attempt,
            progress=progress and (lambda d, t: progress("timings", d, t)),
        )
    m = matrices_of(timings)
    found = find_stragglers(
        m,
        threshold=args.threshold,
        min_persistence=args.min_persistence,
        min_share=args.min_share,
        hosts=meta.hosts,
        groups=meta.groups,
        values=lambda phases: read_phase_values(
            args.run_dir, m.ranks, m.steps, phases & timings.valued
        ),
    )
    skipped = meta.skipped + timings.skipped + meta.say_missing(timings.ranks)
    attempts = timings.attempts
    if render is None:
        print_json({**found.to_dict(), "attempts": attempts.to_dict(), "skipped": skipped})
    else:
        render.stragglers(found, skipped, limit=None if args.all else 20, note=attempts.note)
    return 0


def _kernels(args: argparse.Namespace) -> int:
    from ..analysis import kernel_report

    render = None if args.json else terminal("kernels")
    with _progress(render, "reading") as progress:
        found = kernel_report(
            args.sources,
            by=args.by,
            window=args.window,
            progress=_stage(progress, "traces"),
        )
    if render is None:
        print_json(found.to_dict(args.top))
    else:
        render.kernels(found, args.top)
    return 0


def _merge(args: argparse.Namespace) -> int:
    from ..analysis import merge_traces

    render = None if args.json else terminal("merge")
    with _progress(render, "merging") as progress:
        total = sum(p.stat().st_size for p in args.sources if p.is_file())
        step = _stage(progress, "bytes")
        result = merge_traces(
            args.sources,
            args.output,
            progress=None if step is None else lambda done: step(done, total),
        )
    if render is None:
        print_json(result.to_dict())
    else:
        render.merged(result)
    return 0


def _stage(
    progress: Callable[[str, int, int], None] | None, stage: str
) -> Callable[[int, int], None] | None:
    """A (done, total) callback for one stage of a progress display, if there is one."""
    if progress is None:
        return None
    return lambda done, total: progress(stage, done, total)


class _progress:
    """A progress bar on stderr while reading, where there is a terminal to draw it on."""

    def __init__(self, render: Any, what: str) -> None:
        self._bar = render.Progress(what) if render is not None and sys.stderr.isatty() else None

    def __enter__(self) -> Callable[[str, int, int], None] | None:
        if self._bar is None:
            return None
        self._bar.__enter__()
        return self._bar.update  # type: ignore[no-any-return]

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)


_DEFAULT_STRAGGLER = -1  # rank 2, or the last rank of a smaller demo


def _rank_or_none(text: str) -> int | None:
    if text.strip().lower() == "none":
        return None
    try:
        rank = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rank or none") from None
    if rank < 0:  # and so never the default's marker
        raise argparse.ArgumentTypeError(f"{text!r} is not a rank or none")
    return rank


def _demo(args: argparse.Namespace) -> int:
    from ..analysis import build_report, render_html
    from ..demo._job import DemoJob, run_demo

    job = DemoJob(
        world_size=args.ranks,
        steps=args.steps,
        every_n_steps=args.every,
        straggler_rank=(
            min(2, args.ranks - 1)
            if args.straggler_rank == _DEFAULT_STRAGGLER
            else args.straggler_rank
        ),
        straggler_phase=args.straggler_phase,
        slowdown=args.slowdown,
    )
    render = None if args.json else terminal("demo")
    out = args.out or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    if render is not None:
        render.demo_start(job, out)
    started = time.perf_counter()
    with _progress(render, "demo") as progress:
        run_dir = run_demo(job, out, progress=_stage(progress, "training steps"))
        trained = time.perf_counter() - started
        report = build_report(run_dir, progress=progress)
    html = RunDir(run_dir).report_path
    html.write_text(render_html(report), encoding="utf-8")
    report["html"] = str(html)
    if render is None:
        print_json(report)
    else:
        render.demo_end(job, report, trained, time.perf_counter() - started)
    return 0


def _hang(args: argparse.Namespace) -> int:
    from ..analysis import find_hangs

    render = None if args.json else terminal("hang")
    found = find_hangs(args.run_dir)
    if found.files_read == 0:
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


def _top(args: argparse.Namespace) -> int:
    from ..analysis._top import top_rows

    report, rows = top_rows(args.run_dir)
    if report.files_read == 0:
        raise TraceError(f"{report.run_dir}: no heartbeats ({LIVE}/) to show: the watch was off")
    if args.json:  # one frame
        print_json({"state": report.state, "summary": report.summary, "ranks": rows})
        return 0
    render = terminal("top")
    if args.once:
        render.top(report.to_dict(), rows, args.rows, live=None)
        return 0
    with render.live_view() as live:
        try:
            while True:
                render.top(report.to_dict(), rows, args.rows, live=live)
                time.sleep(max(0.1, args.interval))
                report, rows = top_rows(args.run_dir)
        except KeyboardInterrupt:
            return 0


def _trigger(args: argparse.Namespace) -> int:
    from ..capture._ask import ask_for_window, trigger_status

    render = None if args.json else terminal("trigger")
    if args.status:
        given = [
            f"--{name.replace('_steps', '')}"
            for name in ("steps", "ranks", "at", "in_steps")
            if getattr(args, name) is not None
        ]
        if given:
            raise ConfigError(
                "--status", True, "--status alone", f"it cannot be combined with {', '.join(given)}"
            )
        status = trigger_status(args.run_dir)
        if render is None:
            print_json(status)
        else:
            render.trigger_status(status)
        return 0
    written = ask_for_window(
        args.run_dir, steps=args.steps, ranks=args.ranks, at=args.at, in_steps=args.in_steps
    )
    if render is None:
        print_json(written)
    else:
        render.trigger_written(written)
    return 0
