"""`rankscope` entry point. The CLI owns the terminal: logging handlers and printing live here."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .._errors import RankscopeError
from .._version import __version__

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rankscope", description="Profile distributed PyTorch training safely."
    )
    parser.add_argument("--version", action="version", version=f"rankscope {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log rankscope's INFO messages"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run a real multi-rank capture on CPU processes")
    demo.add_argument(
        "--out", type=Path, default=None, help="run directory (default: runs/demo-TIME)"
    )
    demo.add_argument("--ranks", type=int, default=2, help="number of processes (default: 2)")
    demo.add_argument("--steps", type=int, default=8, help="training steps (default: 8)")
    args = parser.parse_args(argv)
    _configure_logging(args.verbose)
    try:
        if args.command == "demo":
            return _demo(args)
    except RankscopeError as exc:
        print(f"rankscope: {exc}", file=sys.stderr)
        return 2
    return 2


def _configure_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("rankscope")
    log.addHandler(handler)
    log.setLevel(logging.INFO if verbose else logging.WARNING)


def _demo(args: argparse.Namespace) -> int:
    from ..demo._capture_demo import load_summary, phase_medians, run_capture_demo

    if args.ranks < 1 or args.steps < 5:
        print(
            "rankscope demo: needs --ranks >= 1 and --steps >= 5 (the window is steps 3-4)",
            file=sys.stderr,
        )
        return 2
    out = args.out or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    print(
        f"rankscope demo: training a small MLP with DDP on {args.ranks} CPU processes (gloo), "
        f"{args.steps} steps; every rank timed on every other step, rank 0 traced for steps 3-4 ...",
        flush=True,
    )
    started = time.perf_counter()
    result = run_capture_demo(out, world_size=args.ranks, steps=args.steps)
    print(f"done in {time.perf_counter() - started:.1f} s\n")
    print(f"run directory   {result.run_dir}")
    for meta in result.meta:
        print(f"rank meta       {meta.relative_to(result.run_dir)}")
    for trace in result.traces:
        print(
            f"trace           {trace.relative_to(result.run_dir)}  ({trace.stat().st_size / 1024:.0f} KiB)"
        )
    for summary_file in result.summaries:
        summary = load_summary(summary_file)
        what = "GPU kernels" if summary["kind"] == "gpu_kernels" else "top-level CPU ops"
        print(f"summary         {summary_file.relative_to(result.run_dir)}")
        print(f"\n  rank {summary['rank']}, window {summary['window']}: {what} by total time")
        print(f"  {'name':<44} {'count':>6} {'total ms':>9} {'share':>6}")
        for item in summary["items"][:8]:
            print(
                f"  {item['name'][:44]:<44} {item['count']:>6} "
                f"{item['total_us'] / 1000:>9.2f} {item['share']:>6.1%}"
            )
    for timing_file in result.timings:
        medians = phase_medians(timing_file)
        print(f"\ntimings         {timing_file.relative_to(result.run_dir)}")
        print(f"  {'phase':<20} {'records':>8} {'median host ms':>15}")
        for name, (count, median) in medians.items():
            print(f"  {name:<20} {count:>8} {median:>15.3f}")
    if not result.traces:
        print("no trace was written; run with -v to see why", file=sys.stderr)
        return 1
    print(
        "\nOpen a trace: go to https://ui.perfetto.dev, click 'Open trace file' and pick the "
        ".pt.trace.json.gz file above (Perfetto reads it compressed)."
    )
    return 0
