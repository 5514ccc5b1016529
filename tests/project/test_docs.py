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
