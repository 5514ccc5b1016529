"""`rankscope trigger`: ask a running job to record a window now, or say who answered."""

from __future__ import annotations

import argparse
from typing import Any

from .._errors import ConfigError
from ..rundir._layout import TRIGGERS
from ._options import command, json_option, positive
from ._output import print_json, terminal

__all__ = ["add_commands"]


def add_commands(commands: Any) -> None:
    trigger = command(
        commands,
        "trigger",
        "ask a running job to record a window now, or (--status) who answered",
        (
            "Write a trigger file into RUN_DIR asking the job's ranks to record a trace "
            "window from an absolute step. Ranks look for triggers every "
            f"trace.trigger_check_every_n_steps steps; each answers in RUN_DIR/{TRIGGERS}/ID/."
        ),
    )
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


def _step(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a step >= 1, got {text}")
    return value


def _trigger(args: argparse.Namespace) -> int:
    from ._trigger_client import ask_for_window, trigger_status

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
