"""The config's fields as data: their paths, types, defaults and docstrings.

The dataclasses in `_config` document each field with a docstring under it. Python
keeps no such attribute docstrings at run time, so they are read from the module's
source here, once, and shared by the argparse flags (`add_arguments`) and the
generated config reference (docs/config.md).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
from dataclasses import dataclass
from typing import Any

__all__ = ["ConfigField", "config_fields", "field_docs"]


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


def config_fields() -> list[ConfigField]:
    """Every leaf field of ProfileConfig, depth first, in declaration order."""
    from ._config import ProfileConfig

    out: list[ConfigField] = []
    _walk(ProfileConfig, (), out)
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


def config_reference() -> str:
    """docs/config.md: every field with its default, flag, environment variable and docstring."""
    from . import _args, _env

    variables = {".".join(path): name for name, (path, _) in _env._OVERRIDES.items()}
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated from the dataclasses' docstrings by rankscope._fields.config_reference();",
        "     tests/test_docs.py keeps it in sync (RANKSCOPE_WRITE_DOCS=1 rewrites it). -->",
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
        flag = _args.flag_name(field)
        variable = variables.get(field.name, "")
        doc = field.doc.replace("|", "\\|")
        out.append(
            f"| `{field.path[-1]}` | `{field.default!r}` | `{flag}` | "
            f"{f'`{variable}`' if variable else ''} | {doc} |"
        )
    return "\n".join(out) + "\n"
