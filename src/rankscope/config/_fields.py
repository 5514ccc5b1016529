"""The config's fields as data: their paths, types, defaults and docstrings.

The dataclasses in `_config` document each field with a docstring under it. Python
keeps no such attribute docstrings at run time, so they are read from the module's
source here, once, and shared by the argparse flags (`add_arguments`) and the
generated config reference (docs/config.md). Generic over dataclasses: it imports no
other part of rankscope, so `_config` (below `_args`) can use it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CONFIG_DEST",
    "NOT_GIVEN",
    "PREFIX",
    "ConfigField",
    "dest",
    "field_docs",
    "flag_name",
    "leaf_fields",
]


@dataclass(frozen=True)
class ConfigField:
    """One leaf of ProfileConfig: `trace.schedule.active` and what it holds."""

    path: tuple[str, ...]
    type: str
    """The annotation as written in `_config` ("int", "bool", "int | None", ...)."""
    default: Any
    doc: str
    owner: str
    """The dataclass that declares it."""

    @property
    def name(self) -> str:
        return ".".join(self.path)


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its docstring (whitespace folded), read from `cls`'s source."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):  # no source shipped (a frozen app): no help text
        return {}
    tree = ast.parse(inspect.cleandoc("\n" + source))
    node = tree.body[0] if tree.body else None
    if not isinstance(node, ast.ClassDef):
        return {}
    docs: dict[str, str] = {}
    body = node.body
    for here, after in itertools.pairwise(body):
        if (
            isinstance(here, ast.AnnAssign)
            and isinstance(here.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[here.target.id] = " ".join(after.value.value.split())
    return docs


def leaf_fields(root: type) -> list[ConfigField]:
    """Every leaf field of the dataclass `root`, depth first, in declaration order."""
    out: list[ConfigField] = []
    _walk(root, (), out)
    return out


def _walk(cls: type, prefix: tuple[str, ...], out: list[ConfigField]) -> None:
    """The leaves of `cls` in declaration order, then each nested dataclass's."""
    docs = field_docs(cls)
    nested: list[tuple[type, tuple[str, ...]]] = []
    for f in dataclasses.fields(cls):
        # The declared default ("runs/rankscope"), not what construction makes of it.
        factory: Any = f.default_factory
        value = factory() if f.default is dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(value):
            nested.append((type(value), (*prefix, f.name)))
            continue
        out.append(
            ConfigField(
                path=(*prefix, f.name),
                type=str(f.type),
                default=value,
                doc=docs.get(f.name, ""),
                owner=cls.__name__,
            )
        )
    for child, path in nested:
        _walk(child, path, out)


# -- flags: one per field, named after its path --------------------------------------

PREFIX = "rankscope"
CONFIG_DEST = f"{PREFIX}_config"


def flag_name(field: ConfigField) -> str:
    """`--rankscope-trace-schedule-active` for `trace.schedule.active`."""
    return "--" + "-".join((PREFIX, *field.path)).replace("_", "-")


def dest(field: ConfigField) -> str:
    return "_".join((PREFIX, *field.path))


class _NotGiven:
    """The default of every generated flag: the flag was left out."""

    def __repr__(self) -> str:
        return "<not given>"


NOT_GIVEN: Any = _NotGiven()
