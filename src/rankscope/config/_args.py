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
from typing import Any

from . import _env
from ._config import STACKS, config_fields, config_from_args
from ._fields import CONFIG_DEST, NOT_GIVEN, PREFIX, ConfigField, dest, flag_name
from ._trace import TOOLS

__all__ = [
    "PREFIX",
    "add_arguments",
    "config_fields",
    "config_from_args",
    "config_reference",
    "flag_name",
]


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
        dest=CONFIG_DEST,
        metavar="FILE",
        default=None,
        help="a YAML file of ProfileConfig fields, read before the flags below",
    )
    for field in config_fields():
        kwargs: dict[str, Any] = {
            "dest": dest(field),
            "default": NOT_GIVEN,
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


def _choices() -> dict[str, tuple[str, ...]]:
    """Fields with a fixed set of words: the help shows them (the config checks them)."""
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


def config_reference() -> str:
    """docs/config.md: every field with its default, flag, environment variable and docstring."""
    variables = {".".join(path): name for name, (path, _) in _env._OVERRIDES.items()}
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated from the dataclasses' docstrings by rankscope.config._args.config_reference();",
        "     tests/project/test_docs.py keeps it in sync (RANKSCOPE_WRITE_DOCS=1 rewrites it). -->",
        "",
        "A `ProfileConfig` is built in code, from a dict or YAML file (`from_dict`,",
        "`from_yaml`), from command-line flags (`rankscope.add_arguments(parser)`, then",
        "`ProfileConfig.from_args(args)`; `--rankscope-config FILE` reads a YAML file first) or",
        "from the environment (`from_env`). Whatever built it, the RANKSCOPE_* variables",
        "below override it when the Profiler starts. Every value is checked when the config",
        "is built; a bad one raises `ConfigError` naming the field (or flag, or variable),",
        "the value and what is accepted.",
        "",
        "```yaml",
        "# profile.yaml: the fields below, nested as in ProfileConfig",
        "output_dir: runs/exp1",
        "timer: {enable: true, every_n_steps: 10}",
        "trace:",
        "  enable: true",
        '  ranks: "0,8"',
        "  schedule: {wait: 5, warmup: 1, active: 2}",
        "```",
    ]
    section = None
    for field in config_fields():
        owner = ".".join(field.path[:-1]) or "ProfileConfig"
        if owner != section:
            section = owner
            out += [
                "",
                f"## `{field.owner}`" + (f" (`{owner}`)" if owner != "ProfileConfig" else ""),
            ]
            out += [
                "",
                "| field | default | flag | variable | meaning |",
                "| --- | --- | --- | --- | --- |",
            ]
        flag = flag_name(field)
        variable = variables.get(field.name, "")
        doc = field.doc.replace("|", "\\|")
        out.append(
            f"| `{field.path[-1]}` | `{field.default!r}` | `{flag}` | "
            f"{f'`{variable}`' if variable else ''} | {doc} |"
        )
    return "\n".join(out) + "\n"
