"""`rankscope import`: timings another tool already wrote, as a run directory
(integrations/: lmms-engine's CUDA-event files)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["add_commands"]


def add_commands(commands: Any) -> None:
    imported = commands.add_parser(
        "import",
        help="another tool's timings as a run directory (lmms-engine's CUDA-event files)",
        description=(
            "Write a run directory from timings another tool wrote, for every other "
            "command to read. lmms-engine: the cuda_events_rank_N.jsonl files of its "
            "CUDA-event profiler (trainer_args.enable_cuda_event_profiler)."
        ),
    )
    imported.add_argument("tool", choices=("lmms-engine",), help="whose files")
    imported.add_argument(
        "source", type=Path, help="its output_dir (or the cuda_event_profiler folder in it)"
    )
    imported.add_argument("run_dir", type=Path, help="the run directory to write (a new one)")
    imported.set_defaults(run=_import)


def _import(args: argparse.Namespace) -> int:
    from ..integrations.lmms_engine import import_cuda_events

    done = import_cuda_events(args.source, args.run_dir)
    print(done.summary())
    print(f"next: rankscope stragglers {args.run_dir}")
    return 0
