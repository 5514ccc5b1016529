"""The shape of the source tree: what the restructuring promised stays true.

No file over 700 lines, no class over 25 methods, no import cycle between rankscope's
modules, and no run-directory file name spelled outside `_layout.py`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "rankscope"
MAX_LINES = 700
MAX_METHODS = 25
# Pieces of the run directory's file names: only _layout.py may spell them.
NAME_PIECES = ("rank-", ".pt.trace", "summary.json")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_is_over_700_lines(name: str) -> None:
    lines = MODULES[name].read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"{name}: {lines} lines"


def test_no_class_has_over_25_methods() -> None:
    crowded = []
    for name, path in MODULES.items():
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef):
                methods = [
                    n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                ]
                if len(methods) > MAX_METHODS:
                    crowded.append(f"{name}.{node.name}: {len(methods)} methods")
    assert crowded == []


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(name: str, path: Path) -> set[str]:
    """The rankscope modules `name` imports, at any depth (a function's imports too),
    leaving out what only type checkers read."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - child.level + 1]
                    stem = ".".join(base + ([child.module] if child.module else []))
                else:
                    stem = child.module or ""
                found.add(stem)
                found.update(f"{stem}.{a.name}" for a in child.names)
            visit(child)

    visit(_tree(path))
    return {m for m in found if m in MODULES and m != name}


def test_no_import_cycle_between_modules() -> None:
    """A package's __init__ re-exporting its modules is not a cycle: a module importing
    from its own package's __init__ is followed only to the names that __init__ imports
    eagerly, which this graph holds as edges too."""
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if nxt.startswith(node + ".") or node.startswith(nxt + "."):
                continue  # a package and its own modules
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                walk(nxt)
        path.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name)
    assert cycles == []


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the string constants that are docstrings (module, class, function, attribute)."""
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for stmt in body:
            if (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str)
            ):
                ids.add(id(stmt.value))
    return ids


def test_run_directory_names_are_spelled_in_layout_alone() -> None:
    """Docstrings may describe the layout; code may not spell it (STYLE.md, habit 13)."""
    spelled = []
    for name, path in MODULES.items():
        if name == "rankscope._layout":
            continue
        tree = _tree(path)
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
                continue
            if id(node) in docs:
                continue
            for piece in NAME_PIECES:
                if piece in node.value:
                    spelled.append(f"{name}:{node.lineno}: {node.value[:60]!r}")
    assert spelled == []
