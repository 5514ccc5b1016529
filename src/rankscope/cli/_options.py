"""Command-line options more than one command takes (the straggler analysis's, --json,
numbers >= 1), written once."""

from __future__ import annotations

import argparse

__all__ = ["json_option", "positive", "straggler_options"]


def straggler_options(parser: argparse.ArgumentParser, attempt: bool = True) -> None:
    """--threshold, --min-persistence, --min-share, --time (and --attempt): the straggler
    analysis's options, for every command that runs it."""
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
    if not attempt:
        return
    parser.add_argument(
        "--attempt",
        type=positive,
        metavar="N",
        help="use only attempt N of a run that restarted into one directory "
        "(default: the latest record of each step)",
    )


def json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {text}")
    return value
