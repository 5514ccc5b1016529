"""Command-line flags for a training script: `add_arguments(parser)`, then `ProfileConfig.from_args(args)`.

Every config field gets a flag named after its path (`trace.schedule.active` ->
`--rankscope-trace-schedule-active`), generated from the dataclasses so that flags and
fields cannot drift apart. `--rankscope-config FILE` reads a YAML file first; flags
given on the command line override it; RANKSCOPE_* variables, applied when the
Profiler is built, override both.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._errors import ConfigError
from ._fields import ConfigField, config_fields

if TYPE_CHECKING:
    from ._config import ProfileConfig

__all__ = ["PREFIX", "add_arguments", "config_from_args", "flag_name"]

PREFIX = "rankscope"
_CONFIG_DEST = f"{PREFIX}_config"


def flag_name(field: ConfigField) -> str:
    """`--rankscope-trace-schedule-active` for `trace.schedule.active`."""
    return "--" + "-".join((PREFIX, *field.path)).replace("_", "-")


def _dest(field: ConfigField) -> str:
    return "_".join((PREFIX, *field.path))


def add_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Add rankscope's flags to `parser` (in their own help group) and return the group.

    Every flag defaults to "not given", so `ProfileConfig.from_args` can tell a flag
    set to its default from one left out.
    """
    group = parser.add_argument_group(
        "rankscope",
        "profiling (flags override --rankscope-config; RANKSCOPE_* variables override both)",
    )
    group.add_argument(
        f"--{PREFIX}-config",
        dest=_CONFIG_DEST,
        metavar="FILE",
        default=None,
        help="a YAML file of ProfileConfig fields, read before the flags below",
    )
    for field in config_fields():
        kwargs: dict[str, Any] = {
            "dest": _dest(field),
            "default": _NOT_GIVEN,
            "help": _help(field),
        }
        if field.type == "bool":
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = _PARSERS.get(field.type, str)
            choices = _choices().get(field.name)
            kwargs["metavar"] = (
                "{" + ",".join(choices) + "}" if choices else _METAVARS.get(field.type, "VALUE")
            )
        group.add_argument(flag_name(field), **kwargs)
    return group


def config_from_args(args: argparse.Namespace) -> ProfileConfig:
    """The config the parsed flags describe; ConfigError names the flag that was wrong."""
    from ._config import ProfileConfig

    path = getattr(args, _CONFIG_DEST, None)
    given: dict[str, str] = {}
    values: dict[tuple[str, ...], Any] = {}
    for field in config_fields():
        # "none" is a value ("--rankscope-timer-end-step none" over a YAML end_step), so
        # a flag left out is told apart by the sentinel, not by None.
        value = getattr(args, _dest(field), _NOT_GIVEN)
        if value is _NOT_GIVEN:
            continue
        values[field.path] = value
        given[field.name] = flag_name(field)
    try:
        if path is not None:
            base = ProfileConfig.from_yaml(path)
        elif ("output_dir",) in values:  # the default directory would be resolved (and logged)
            base = ProfileConfig(output_dir=values.pop(("output_dir",)))
        else:
            base = ProfileConfig()
        data = base.to_dict()
        for field_path, value in values.items():
            node = data
            for key in field_path[:-1]:
                node = node[key]
            node[field_path[-1]] = value
        return ProfileConfig.from_dict(data)
    except ConfigError as exc:
        flag = given.get(exc.field)
        if flag is None:
            raise
        raise ConfigError(flag, exc.value, exc.accepted, exc.problem) from None


class _NotGiven:
    """The default of every generated flag: the flag was left out."""

    def __repr__(self) -> str:
        return "<not given>"


_NOT_GIVEN: Any = _NotGiven()


def _choices() -> dict[str, tuple[str, ...]]:
    """Fields with a fixed set of words: the help shows them (the config checks them)."""
    from ._config import STACKS, TOOLS

    return {"trace.tool": TOOLS, "memory.stacks": STACKS}


def _help(field: ConfigField) -> str:
    first = re.split(r"\. |; off by default", field.doc)[0].rstrip(".")
    # argparse treats % as a format character in help text.
    return f"{first} (default: {field.default!r})".replace("%", "%%")


def _optional_int(text: str) -> int | None:
    if text.strip().lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an int or none") from None


def _optional_text(text: str) -> str | None:
    return None if text.strip().lower() == "none" else text


def _words(text: str) -> list[str] | None:
    if text.strip().lower() == "none":
        return None
    return [word.strip() for word in text.split(",") if word.strip()]


_PARSERS: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "int | None": _optional_int,
    "str | None": _optional_text,
    "RankSpec | None": _optional_text,
    "Sequence[str] | None": _words,
}
_METAVARS = {
    "int": "N",
    "float": "X",
    "int | None": "N|none",
    "RankSpec": "RANKS",
    "RankSpec | None": "RANKS|none",
    "str | None": "NAME|none",
    "PathLike": "DIR",
    "Sequence[str] | None": "A,B",
}
