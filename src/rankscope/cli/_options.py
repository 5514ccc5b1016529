"""Command-line options: the analyses' flags derived from their options objects
(analysis/core/_options.py), as `_fields.py` derives ProfileConfig's; --json; numbers >= 1.

A flag is named after its field (`--min-persistence` for `min_persistence`), its help is
the docstring under the field and its default is the field's: none of them is written
here. A nested options object (HostOptions.stragglers) gives its fields' flags unprefixed.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

from ..analysis.core._options import ANALYSIS_OPTIONS
from ..config._fields import field_docs

__all__ = [
    "OPTION_FIELDS",
    "add_options",
    "command",
    "json_option",
    "options_from",
    "positive",
]

Options = TypeVar("Options")


def _nested(f: dataclasses.Field[Any]) -> type | None:
    """The options class a field holds, where it holds one (HostOptions.stragglers)."""
    factory: Any = f.default_factory
    if isinstance(factory, type) and dataclasses.is_dataclass(factory):
        return factory
    return None


def _leaves(cls: type) -> Iterator[tuple[type, dataclasses.Field[Any]]]:
    for f in dataclasses.fields(cls):
        nested = _nested(f)
        if nested is not None:
            yield from _leaves(nested)
        else:
            yield cls, f


OPTION_FIELDS = frozenset(f.name for cls in ANALYSIS_OPTIONS for _, f in _leaves(cls))
"""Every analysis option's field name: a ConfigError on one of them names the flag."""


def add_options(parser: argparse.ArgumentParser, cls: type, *, skip: tuple[str, ...] = ()) -> None:
    """A flag for each field of the options class `cls` (and of the options it nests)."""
    for owner, f in _leaves(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        doc = field_docs(owner).get(f.name, "")
        doc = doc[:1].lower() + doc[1:]  # argparse's own help lines start in lower case
        default = f.default
        kind = str(f.type)
        said = "(default:" in doc  # the docstring says what no value means
        shown = "" if said else f" (default: {'none' if default is None else default})"
        help_text = f"{doc.rstrip('.')}{shown}"
        if kind == "bool":
            parser.add_argument(flag, action="store_true", help=doc)
            continue
        choices = f.metadata.get("choices")
        convert: Any = {"float": float, "int": positive, "int | None": positive}.get(kind, str)
        parser.add_argument(
            flag,
            type=convert,
            choices=choices,
            default=default,
            metavar=None if choices else ("N" if convert is positive else None),
            help=help_text,
        )


def options_from(cls: type[Options], args: argparse.Namespace) -> Options:
    """The options object of `cls` from parsed flags (its own checks raise ConfigError)."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        nested = _nested(f)
        if nested is not None:
            values[f.name] = options_from(nested, args)
        elif hasattr(args, f.name):
            values[f.name] = getattr(args, f.name)
    return cls(**values)


def command(
    commands: Any,
    name: str,
    help: str,
    description: str | None = None,
    *,
    run_dir: bool = True,
    options: type | None = None,
    scripts: bool = False,
) -> argparse.ArgumentParser:
    """A command's parser, with the RUN_DIR every command over a run takes first, the
    flags of its `options` class and, for `scripts`, --json."""
    parser: argparse.ArgumentParser = commands.add_parser(name, help=help, description=description)
    if run_dir:
        parser.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    if options is not None:
        add_options(parser, options)
    if scripts:
        json_option(parser)
    return parser


def json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {text}")
    return value
