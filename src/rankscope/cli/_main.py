"""`rankscope` entry point. The CLI owns the terminal: logging handlers and printing live here.

Every command takes `--json` (one JSON document on stdout, no terminal extras needed);
bad input is one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from .._errors import ConfigError, RankscopeError, TraceError
from .._version import __version__

__all__ = ["main"]

EXIT_BAD_INPUT = 2
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
    """argparse, with its complaint on one line like every other bad input."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {message} (see {self.prog} --help)\n")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a bad argument (already said)
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
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


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rankscope", description="Profile distributed PyTorch training safely.")
    parser.add_argument("--version", action="version", version=f"rankscope {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log rankscope's INFO messages"
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

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

    report = commands.add_parser("report", help="the run at a glance, and RUN_DIR/report.html")
    report.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    report.add_argument("--no-html", action="store_true", help="do not write the HTML report")
    report.add_argument(
        "-o", "--output", type=Path, help="HTML path (default: RUN_DIR/report.html)"
    )
    _straggler_options(report)
    _json_option(report)
    report.set_defaults(run=_report)

    stragglers = commands.add_parser(
        "stragglers", help="which rank is slow in which phase, and who waits for it"
    )
    stragglers.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    _straggler_options(stragglers)
    stragglers.add_argument("--all", action="store_true", help="list every finding (default: 20)")
    _json_option(stragglers)
    stragglers.set_defaults(run=_stragglers)

    kernels = commands.add_parser("kernels", help="the top kernels (or CPU ops) of traces")
    kernels.add_argument("sources", nargs="+", type=Path, metavar="TRACE_OR_DIR")
    kernels.add_argument("--top", type=_positive, default=20, help="rows to show (default: 20)")
    kernels.add_argument("--by", choices=("name", "category"), default="name")
    kernels.add_argument("--window", help="only traces of this window (step-000003-000004)")
    _json_option(kernels)
    kernels.set_defaults(run=_kernels)

    merge = commands.add_parser("merge", help="one timeline from several ranks' traces")
    merge.add_argument("sources", nargs="+", type=Path, metavar="TRACE")
    merge.add_argument(
        "-o", "--output", type=Path, required=True, help="the merged trace (.json or .json.gz)"
    )
    _json_option(merge)
    merge.set_defaults(run=_merge)

    trigger = commands.add_parser(
        "trigger",
        help="ask a running job to record a window now, or (--status) who answered",
        description=(
            "Write a trigger file into RUN_DIR asking the job's ranks to record a trace "
            "window from an absolute step. Ranks look for triggers every "
            "trace.trigger_check_every_n_steps steps; each answers in RUN_DIR/triggers/ID/."
        ),
    )
    trigger.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    trigger.add_argument(
        "--steps",
        type=_positive,
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
        type=_positive,
        metavar="N",
        help="start N steps after the latest step in the run's timings "
        "(default: far enough ahead for every rank to see the trigger in time)",
    )
    trigger.add_argument(
        "--status", action="store_true", help="list the run's triggers and which ranks answered"
    )
    _json_option(trigger)
    trigger.set_defaults(run=_trigger)
    return parser


def _straggler_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--threshold",
        type=float,
        default=1.10,
        help="a rank's time over the reference that counts as slow (default: 1.10)",
    )
    parser.add_argument(
        "--min-persistence",
        type=float,
        default=0.5,
        help="share of sampled steps above the threshold to report (default: 0.5)",
    )
    parser.add_argument(
        "--min-share",
        type=float,
        default=0.01,
        help="ignore excess below this share of the step time (default: 0.01)",
    )
    parser.add_argument(
        "--time",
        choices=("host", "device"),
        default="host",
        help="compare host times (cpu_ms) or device times (gpu_ms) (default: host)",
    )


def _json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {text}")
    return value


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


def _print_json(data: Any) -> None:
    # One line: reports of 1000 ranks are large, and scripts read them with a parser.
    json.dump(data, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


def _terminal(command: str) -> Any:
    """The rich renderer, or an ImportError that says which extra brings it."""
    try:
        from . import _render
    except ImportError as exc:
        raise ImportError(
            f'terminal output needs rich: pip install "rankscope[cli]" (or use --json) ({exc})'
        ) from None
    return _render


# -- commands ------------------------------------------------------------------


def _report(args: argparse.Namespace) -> int:
    from ..analysis._report import build_report
    from ..analysis.render._html import render_html

    render = None if args.json else _terminal("report")
    with _progress(render, "reading") as progress:
        report = build_report(
            args.run_dir,
            threshold=args.threshold,
            min_persistence=args.min_persistence,
            min_share=args.min_share,
            time_base=args.time,
            progress=progress,
        )
    html = None
    if not args.no_html:
        html = args.output or Path(report["run_dir"]) / "report.html"
        html.write_text(render_html(report), encoding="utf-8")
        report["html"] = str(html)
    if render is None:
        _print_json(report)
    else:
        render.report(report, html)
    return 0


def _stragglers(args: argparse.Namespace) -> int:
    from ..analysis._matrix import phase_matrices
    from ..analysis._stragglers import find_stragglers
    from ..analysis.read._run import read_run_meta
    from ..analysis.read._timings import read_timings

    render = None if args.json else _terminal("stragglers")
    meta = read_run_meta(args.run_dir)
    with _progress(render, "reading") as progress:
        timings = read_timings(
            args.run_dir, progress=progress and (lambda d, t: progress("timings", d, t))
        )
    found = find_stragglers(
        phase_matrices(timings, args.time),
        threshold=args.threshold,
        min_persistence=args.min_persistence,
        min_share=args.min_share,
        hosts=meta.hosts,
    )
    skipped = meta.skipped + timings.skipped
    skipped += [f"rank {r}: no timings" for r in meta.missing(sorted(timings.ranks))]
    if render is None:
        _print_json({**found.to_dict(), "skipped": skipped})
    else:
        render.stragglers(found, skipped, limit=None if args.all else 20)
    return 0


def _kernels(args: argparse.Namespace) -> int:
    from ..analysis._kernels import kernel_report

    render = None if args.json else _terminal("kernels")
    with _progress(render, "reading") as progress:
        found = kernel_report(
            args.sources,
            by=args.by,
            window=args.window,
            progress=_stage(progress, "traces"),
        )
    if render is None:
        _print_json(found.to_dict(args.top))
    else:
        render.kernels(found, args.top)
    return 0


def _merge(args: argparse.Namespace) -> int:
    from ..analysis._merge import merge_traces

    render = None if args.json else _terminal("merge")
    with _progress(render, "merging") as progress:
        total = sum(p.stat().st_size for p in args.sources if p.is_file())
        step = _stage(progress, "bytes")
        result = merge_traces(
            args.sources,
            args.output,
            progress=None if step is None else lambda done: step(done, total),
        )
    if render is None:
        _print_json(result.to_dict())
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
    from ..analysis._report import build_report
    from ..analysis.render._html import render_html
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
    render = None if args.json else _terminal("demo")
    out = args.out or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    if render is not None:
        render.demo_start(job, out)
    started = time.perf_counter()
    with _progress(render, "demo") as progress:
        run_dir = run_demo(job, out, progress=_stage(progress, "training steps"))
        trained = time.perf_counter() - started
        report = build_report(run_dir, progress=progress)
    html = run_dir / "report.html"
    html.write_text(render_html(report), encoding="utf-8")
    report["html"] = str(html)
    if render is None:
        _print_json(report)
    else:
        render.demo_end(job, report, trained, time.perf_counter() - started)
    return 0


def _trigger(args: argparse.Namespace) -> int:
    from ..analysis.read._run import read_run_meta

    meta = read_run_meta(args.run_dir)
    if not meta.meta:
        raise TraceError(f"{args.run_dir}: not a run directory (no meta/rank-*.json in it)")
    render = None if args.json else _terminal("trigger")
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
        status = _trigger_status(args.run_dir, meta)
        if render is None:
            _print_json(status)
        else:
            render.trigger_status(status)
        return 0
    written = _new_trigger(args, meta)
    if render is None:
        _print_json(written)
    else:
        render.trigger_written(written)
    return 0


def _new_trigger(args: argparse.Namespace, meta: Any) -> dict[str, Any]:
    """Check the request against the run, then write the trigger; nothing is written on an error."""
    from .._ranks import parse_ranks
    from ..capture._trigger import Trigger, new_trigger_id, rank_listens, write_trigger

    world = meta.world_size if meta.world_size is not None else max(meta.meta) + 1
    spec = args.ranks
    if spec is None:  # the ranks the run's own config names for capture
        config = meta.meta[min(meta.meta)].get("config") or {}
        spec = (config.get("trace") or {}).get("ranks", "0")
    rank_set = parse_ranks(spec, "--ranks")
    rank_set.check_world_size(world, "--ranks")
    selected = list(range(world)) if rank_set.everything else sorted(rank_set.ranks)
    listening: list[int] = []
    unheard: dict[int, str] = {}
    for rank in selected:
        reason = rank_listens(meta.meta.get(rank))
        if reason is None:
            listening.append(rank)
        else:
            unheard[rank] = reason
    if not listening:
        first = min(unheard)
        raise ConfigError(
            "--ranks",
            rank_set.spec(),
            "ranks whose config checks for triggers",
            f"no selected rank checks for triggers (rank {first}: {unheard[first]})",
        )
    traces = [meta.meta[r]["config"]["trace"] for r in listening]
    # With trace.tool="nsys", nsys writes the reports; rankscope notes each range here.
    folder = "nsys" if all(t.get("tool") == "nsys" for t in traces) else "traces"
    timers = [meta.meta[r]["config"].get("timer") or {} for r in listening]
    max_steps = min(int(t.get("trigger_max_steps", 1)) for t in traces)
    steps = min(2, max_steps) if args.steps is None else args.steps
    if steps > max_steps:
        raise ConfigError(
            "--steps",
            steps,
            f"1 to {max_steps}",
            f"the run's trace.trigger_max_steps is {max_steps}",
        )
    # How far ahead a trigger must start for every rank to see it in time: the timings
    # lag the run by up to one sampling interval and one flush interval, a rank looks
    # every check interval, and the step before the window warms the profiler up.
    lag = max(
        int(t.get("every_n_steps", 1)) + int(t.get("flush_every_n_steps", 1))
        if t.get("enable")
        else 0
        for t in timers
    )
    check = max(int(t["trigger_check_every_n_steps"]) for t in traces)
    lead = lag + check + 2
    latest = _latest_step(args.run_dir)
    if args.at is not None:
        start = args.at
        if latest is not None and start <= latest:
            raise ConfigError(
                "--at",
                start,
                f"a step after {latest}",
                f"the run's timings have reached step {latest} already",
            )
    elif latest is None:
        raise TraceError(
            f"{args.run_dir}: no timings to tell which step the run has reached "
            "(is the timer on?); give the first step with --at STEP"
        )
    else:
        start = latest + (lead if args.in_steps is None else args.in_steps)
    trigger = Trigger(
        new_trigger_id(),
        start,
        steps,
        rank_set.spec(),
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    path = write_trigger(args.run_dir, trigger)
    note = None
    if latest is None:
        note = "the run has no timings, so whether this step is still ahead is not known"
    elif start < latest + lead:
        note = (
            f"ranks may first see this trigger as late as step {latest + lead - 2}; "
            f"a rank that sees it at step {start} or later declines it"
        )
    return {
        **trigger.to_dict(),
        "run_dir": str(args.run_dir),
        "path": str(path),
        "last": trigger.last,
        "window": trigger.window,
        "traces": str(Path(args.run_dir) / folder / trigger.window),
        "latest_step": latest,
        "selected": selected,
        "listening": listening,
        "not_listening": {str(r): why for r, why in unheard.items()},
        "check_every": check,
        "note": note,
    }


def _saved_window(run_dir: Path, window: str, rank: int) -> list[Path]:
    """The trace (or nsys record) `rank` saved for the window announced as `window`, which
    stop() may have cut short (and so named after an earlier last step)."""
    from .._layout import rank_name, window_key

    key = window_key(window)
    found: list[Path] = []
    for folder, pattern in (("traces", ".pt.trace.json*"), ("nsys", ".json")):
        for path in sorted((run_dir / folder).glob(f"*/{rank_name(rank)}{pattern}")):
            name = path.parent.name
            if name == window or (key is not None and window_key(name) == key):
                found.append(path)
    return found


def _latest_step(run_dir: Path) -> int | None:
    """The latest step in the run's timings; None without any."""
    from ..analysis.read._timings import read_timings

    try:
        timings = read_timings(run_dir)
    except TraceError:
        return None
    steps = [int(t.step.max()) for t in timings.ranks.values() if len(t)]
    return max(steps) if steps else None


def _trigger_status(run_dir: Path, meta: Any) -> dict[str, Any]:
    """Every trigger in the run and, per selected rank, where it stands."""
    from .._ranks import parse_ranks
    from ..capture._trigger import rank_listens, read_acks, read_trigger, trigger_dir

    world = meta.world_size if meta.world_size is not None else max(meta.meta) + 1
    folder = trigger_dir(run_dir)
    found: list[dict[str, Any]] = []
    skipped: list[str] = []
    paths = sorted(folder.glob("*.json")) if folder.is_dir() else []
    for path in paths:
        if path.name.startswith("."):
            continue
        try:
            trigger = read_trigger(path)
        except (OSError, ValueError) as exc:
            skipped.append(f"{path}: not a valid trigger file ({exc})")
            continue
        rank_set = parse_ranks(trigger.ranks, "ranks")
        selected = [r for r in range(world) if r in rank_set]
        acks = read_acks(run_dir, trigger.id)
        states: dict[str, list[int]] = {
            state: [] for state in ("saved", "accepted", "declined", "waiting", "not_listening")
        }
        reasons: dict[str, str] = {}
        saved: dict[str, str] = {}
        for rank in selected:
            ack = acks.get(rank)
            if ack is not None and ack.get("status") == "accepted":
                window = str(ack.get("window", trigger.window))
                done = _saved_window(Path(run_dir), window, rank)
                if done:
                    states["saved"].append(rank)
                    saved[str(rank)] = str(done[0])
                else:
                    states["accepted"].append(rank)
            elif ack is not None:
                states["declined"].append(rank)
                reasons[str(rank)] = str(ack.get("reason"))
            else:
                why = rank_listens(meta.meta.get(rank))
                if why is None:
                    states["waiting"].append(rank)
                else:
                    states["not_listening"].append(rank)
                    reasons[str(rank)] = why
        found.append(
            {
                **trigger.to_dict(),
                "path": str(path),
                "last": trigger.last,
                "window": trigger.window,
                "ranks_by_state": states,
                "reasons": reasons,
                "saved": saved,
            }
        )
    return {"run_dir": str(run_dir), "triggers": found, "skipped": skipped}
