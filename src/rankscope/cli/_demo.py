"""`rankscope demo`: train with DDP on CPU processes, one rank made slow, and show what
rankscope finds (demo/_job.py)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from .._errors import RankscopeError
from ..rundir._listing import RunDir, is_run_dir
from ._output import not_over_run_data, print_json, terminal
from ._progress import progress, stage

__all__ = ["add_commands"]


def add_commands(commands: Any) -> None:
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
        default=None,
        help="how much slower that phase is: 0.5 = 1.5x its time (default: 1, twice its time)",
    )
    demo.add_argument("--json", action="store_true", help="print the report as JSON for scripts")
    demo.set_defaults(run=_demo)


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
    from ..analysis.render._page import write_page
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
        **({} if args.slowdown is None else {"slowdown": args.slowdown}),
    )
    render = None if args.json else terminal("demo")
    out = args.out or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    if is_run_dir(out):  # its ranks' files would mix with the earlier job's
        raise RankscopeError(
            f"--out {out} holds a run already (its timings, meta or traces): give the demo "
            "a new folder"
        )
    not_over_run_data(out, "--out")
    if render is not None:
        render.demo_start(job, out)
    started = time.perf_counter()
    with progress(render, "demo") as update:
        run_dir = run_demo(job, out, progress=stage(update, "training steps"))
        trained = time.perf_counter() - started
        report = build_report(run_dir, progress=update)
    html = RunDir(run_dir).report_path
    write_page(html, render_html(report))
    report["html"] = str(html)
    if render is None:
        print_json(report)
    else:
        render.demo_end(job, report, trained, time.perf_counter() - started)
    return 0
