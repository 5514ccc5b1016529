"""The docs that are generated from the code stay in sync with it."""

from __future__ import annotations

import os
import re
from pathlib import Path

from rankscope.config._args import config_fields, config_reference
from rankscope.config._env import _OVERRIDES

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_config_reference_is_generated_from_the_dataclasses() -> None:
    path = DOCS / "config.md"
    want = config_reference()
    if os.environ.get("RANKSCOPE_WRITE_DOCS") == "1":
        path.write_text(want, encoding="utf-8")
    assert path.read_text(encoding="utf-8") == want, (
        "docs/config.md is out of date: RANKSCOPE_WRITE_DOCS=1 pytest tests/project/test_docs.py"
    )


def test_the_reference_holds_every_field_flag_and_variable() -> None:
    text = config_reference()
    for field in config_fields():
        assert field.doc and field.doc.replace("|", "\\|") in text, field.name
    for variable in _OVERRIDES:
        assert f"`{variable}`" in text, variable


def test_every_doc_link_points_at_a_file_that_exists() -> None:
    root = DOCS.parent
    for page in [root / "README.md", *DOCS.rglob("*.md")]:
        for target in re.findall(r"\]\(([^)#:]+\.(?:md|py))(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).resolve().exists(), f"{page.name}: {target}"


def test_the_module_map_names_every_module_and_only_modules_that_exist() -> None:
    """docs/architecture.md's module map is where a contributor finds a module: every
    module of the package is in it (by name, under its folder's entry), and every name
    in it is a module the package, its tests or its benchmarks hold."""
    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("## Module map", 1)[1].split("```")[1]
    named = set(re.findall(r"(?<![\w.])(_{0,2}[a-z][a-z0-9_]*\.py)\b", block))
    package = {p.name for p in (root / "src" / "rankscope").rglob("*.py")} - {"__init__.py"}
    assert sorted(package - named) == [], "modules the map leaves out"
    anywhere = {p.name for top in ("src", "tests", "bench") for p in (root / top).rglob("*.py")}
    assert sorted(named - anywhere) == [], "names in the map that are no module"


def test_the_module_map_names_each_module_under_the_folder_that_holds_it() -> None:
    """Each folder's entry in the map (a line `name/` and the lines indented under it)
    names modules that folder holds, and every module of the package is named under its
    own folder: "where is X" is one look, and a module moved is a map to mend."""
    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("## Module map", 1)[1].split("```")[1].splitlines()
    top = root / "src" / "rankscope"
    folders: list[tuple[int, Path]] = [(-1, top)]  # (indent, folder) of the entries open here
    named: set[Path] = set()
    wrong: set[Path] = set()
    for line in block:
        if not line.strip() or line.strip() == "src/rankscope/":
            continue
        indent = len(line) - len(line.lstrip())
        head = re.match(r"\s*([a-z_]+)/\s", line + " ")
        if head:  # a folder's own line
            while len(folders) > 1 and folders[-1][0] >= indent:
                folders.pop()
            folders.append((indent, folders[-1][1] / head.group(1)))
            said = line[line.index("/") + 1 :]
        else:  # a description runs deeper than its folder; a module's line sits under it
            while len(folders) > 1 and indent <= folders[-1][0]:
                folders.pop()
            said = line
        here = folders[-1][1]
        for name in re.findall(r"(?<![\w./])(_{0,2}[a-z][a-z0-9_]*\.py)\b", said):
            (named if (here / name).is_file() else wrong).add(here / name)
    assert sorted(str(p.relative_to(root)) for p in wrong) == [], (
        "named under a folder that lacks it"
    )
    package = {p for p in top.rglob("*.py") if p.name != "__init__.py"}
    left = sorted(str(p.relative_to(root)) for p in package - named)
    assert left == [], f"left out: {left}"


def test_where_to_look_names_places_that_exist() -> None:
    """docs/architecture.md's "Where to look" answers a contributor's first questions in one
    step each: every file a row names exists, and every function, class or method the row
    names (`_group_cost`, `Replay.step_ms`) is defined in one of the row's files."""
    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = text.split("## Where to look", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| Where")]
    assert len(rows) >= 3, "the table holds its rows"
    for row in rows:
        answer = row.split("|")[2]
        files = re.findall(r"`([\w/]+\.py)`", answer)
        assert files, row
        sources = []
        for name in files:
            path = root / "src" / "rankscope" / name
            assert path.is_file(), f"{name}, named in: {row}"
            sources.append(path.read_text(encoding="utf-8"))
        for named in re.findall(r"`((?:[A-Z]\w*\.)?_{0,2}[A-Za-z]\w*(?:\.\w+)?)(?:\(\))?`", answer):
            last = named.split(".")[-1]
            if last in {"py"} or named in {"coll", "gpu_ms", "cpu_ms"}:
                continue
            defined = re.compile(rf"^\s*(?:def|class) {re.escape(last)}\b", re.MULTILINE)
            assert any(defined.search(source) for source in sources), f"{named}, named in: {row}"
