"""`rankscope kernels`: the top kernels (or CPU ops) of traces (analysis/kernels/_kernels.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..analysis.core._options import KernelOptions

# The trace summaries' reader imports neither numpy nor DuckDB: cheap at start-up.
from ..analysis.kernels._kernels import kernel_report
from ._options import command, options_from
from ._output import answer
from ._progress import stage

__all__ = ["add_commands"]


def add_commands(commands: Any) -> None:
    kernels = command(
        commands,
        "kernels",
        "the top kernels (or CPU ops) of traces",
        run_dir=False,
        options=KernelOptions,
        scripts=True,
    )
    kernels.add_argument("sources", nargs="+", type=Path, metavar="TRACE_OR_DIR")
    kernels.set_defaults(run=_kernels)


def _kernels(args: argparse.Namespace) -> int:
    options = options_from(KernelOptions, args)
    return answer(
        args.json,
        "kernels",
        lambda update: kernel_report(args.sources, options, progress=stage(update, "traces")),
        lambda found: found.to_dict(options.top),
        lambda render, found: render.kernels(found, options.top),
    )
