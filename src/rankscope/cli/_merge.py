"""`rankscope merge`: one timeline from several ranks' traces (analysis/merge/)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._options import json_option
from ._output import answer, not_over_run_data
from ._progress import Progress, stage

__all__ = ["add_commands"]


def add_commands(commands: Any) -> None:
    merge = commands.add_parser("merge", help="one timeline from several ranks' traces")
    merge.add_argument("sources", nargs="+", type=Path, metavar="TRACE")
    merge.add_argument(
        "-o", "--output", type=Path, required=True, help="the merged trace (.json or .json.gz)"
    )
    json_option(merge)
    merge.set_defaults(run=_merge)


def _merge(args: argparse.Namespace) -> int:
    from ..analysis import merge_traces

    not_over_run_data(args.output, "-o", inputs=list(args.sources))

    def work(update: Progress | None) -> Any:
        total = sum(p.stat().st_size for p in args.sources if p.is_file())
        step = stage(update, "bytes")
        return merge_traces(
            args.sources,
            args.output,
            progress=None if step is None else lambda done: step(done, total),
        )

    return answer(
        args.json,
        "merge",
        work,
        lambda result: result.to_dict(),
        lambda render, result: render.merged(result),
        doing="merging",
    )
