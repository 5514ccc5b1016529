"""`rankscope kernels`: the top kernels (or CPU ops) of traces (analysis/_kernels.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..analysis._options import KernelOptions
from ._options import add_options, json_option, options_from
from ._output import print_json, terminal
from ._progress import progress, stage

__all__ = ["add_commands"]


def add_commands(commands: Any) -> None:
    kernels = commands.add_parser("kernels", help="the top kernels (or CPU ops) of traces")
    kernels.add_argument("sources", nargs="+", type=Path, metavar="TRACE_OR_DIR")
    add_options(kernels, KernelOptions)
    json_option(kernels)
    kernels.set_defaults(run=_kernels)


def _kernels(args: argparse.Namespace) -> int:
    from ..analysis import kernel_report

    options = options_from(KernelOptions, args)
    render = None if args.json else terminal("kernels")
    with progress(render, "reading") as update:
        found = kernel_report(args.sources, options, progress=stage(update, "traces"))
    if render is None:
        print_json(found.to_dict(options.top))
    else:
        render.kernels(found, options.top)
    return 0
