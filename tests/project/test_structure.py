"""The shape of the source tree: what the restructuring promised stays true.

No file over 700 lines, no class over 25 methods, no import cycle between rankscope's
modules, no run-directory file name spelled outside `_layout.py`, no module of the
job side that reaches the analysis, and no comment citing a document the repository
does not hold.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
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
    """Docstrings may describe the layout; code may not spell it: a file name written in
    two places is two rules that can disagree (docs/run-directory.md is the layout)."""
    spelled = []
    for name, path in MODULES.items():
        if name == "rankscope.rundir._layout":
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


# The code a training job imports: it talks to the analysis through the run directory's
# files alone, so it never needs the analysis's dependencies, nor breaks when it changes.
JOB_SIDE = (
    "rankscope.capture",
    "rankscope.timing",
    "rankscope.watch",
    "rankscope.integrations",
    "rankscope._profiler",
)


def _is_under(name: str, roots: tuple[str, ...]) -> bool:
    return any(name == root or name.startswith(root + ".") for root in roots)


def test_the_job_side_never_imports_the_analysis() -> None:
    """Followed through every module the job side imports, at any depth (shared modules
    such as `_layout` and `_kineto` included): none of it is rankscope.analysis."""
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    job = sorted(name for name in MODULES if _is_under(name, JOB_SIDE))
    assert "rankscope.capture._finalize" in job and "rankscope._profiler" in job
    reached: list[str] = []
    for start in job:
        seen, todo = {start}, [start]
        while todo:
            for nxt in sorted(graph[todo.pop()] - seen):
                if _is_under(nxt, ("rankscope.analysis",)):
                    reached.append(f"{start} -> ... -> {nxt}")
                seen.add(nxt)
                todo.append(nxt)
    assert reached == []


def test_capture_and_analysis_never_import_each_other() -> None:
    """The two sides meet in rundir/ alone (the trigger protocol included: the capture
    answers triggers, the CLI writes them): no module of one imports the other's, either
    way, type-only imports counted."""
    arrows = []
    for name, path in MODULES.items():
        mine = "rankscope.capture" if _is_under(name, ("rankscope.capture",)) else None
        mine = mine or ("rankscope.analysis" if _is_under(name, ("rankscope.analysis",)) else None)
        if mine is None:
            continue
        other = "rankscope.analysis" if mine == "rankscope.capture" else "rankscope.capture"
        tree = _tree(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join([*base, node.module or ""]) if node.level else node.module or ""
                if _is_under(stem.rstrip("."), (other,)):
                    arrows.append(f"{name} -> {stem}")
            elif isinstance(node, ast.Import):
                arrows += [f"{name} -> {a.name}" for a in node.names if _is_under(a.name, (other,))]
    assert arrows == []


def test_a_job_that_captures_loads_no_analysis_module(tmp_path: Path) -> None:
    """The same at run time: a job that times and saves a window with its summary loads no
    rankscope.analysis module (the finaliser's child process runs the module loaded here,
    capture/_finalize.py, and its summariser)."""
    code = f"""
import sys
import rankscope
import rankscope.capture._finalize
config = rankscope.ProfileConfig(
    output_dir={str(tmp_path)!r},
    trace=rankscope.TraceConfig(
        enable=True, schedule=rankscope.Schedule(wait=0, warmup=0, active=1, repeat=1)
    ),
    timer=rankscope.TimerConfig(enable=True, every_n_steps=1),
)
with rankscope.Profiler(config, rank=0, world_size=1) as prof:
    for _ in range(3):
        with prof.phase("work"):
            sum(range(1000))
        prof.step()
print(sorted(m for m in sys.modules if m.startswith("rankscope.analysis")))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    assert out.stdout.strip() == "[]", out.stderr
    assert list(tmp_path.glob("traces/*/*.summary.json")), "no window was saved"


REPO = SRC.parents[1]
# A cited document: "docs/timer.md", "README.md", or "analysis.md" (read in docs/).
_CITED = re.compile(r"[\w./-]+\.md\b")


def test_every_document_the_code_cites_is_in_the_repository() -> None:
    """A reader sent to a file that is not there (a design note kept elsewhere) is lost."""
    code = [
        path
        for folder in ("src", "tests", "bench", "examples")
        for path in (REPO / folder).rglob("*.py")
    ]
    missing = []
    for path in code:
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for cited in _CITED.findall(line):
                if not any((root / cited).is_file() for root in (REPO, REPO / "docs")):
                    missing.append(f"{path.relative_to(REPO)}:{lineno}: {cited}")
    assert missing == []
