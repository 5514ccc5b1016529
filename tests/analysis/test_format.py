"""core/_format.py: every figure's rule, value -> text, and one spelling of a missing
value per medium; and that no other module writes a figure rule of its own."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from rankscope.analysis.core._format import (
    HTML,
    SENTENCE,
    TERMINAL,
    Medium,
    hours_text,
    seconds_text,
)

SRC = Path(__file__).resolve().parents[2] / "src" / "rankscope"
NAN, INF = float("nan"), float("inf")
# What a report read back may hold where a number belongs: each is a missing value.
MISSING = [None, NAN, INF, -INF, "12", True, [], {}]


def _rule(name: str) -> Callable[[Medium], Callable[[object], str]]:
    return lambda medium: getattr(medium, name)


TABLE = [
    # a table's ms cell: 3 decimals under 100, 1 decimal with separators from 100
    ("ms", 0.0123456, "0.012"),
    ("ms", 12, "12.000"),
    ("ms", 99.9994, "99.999"),
    ("ms", 100, "100.0"),
    ("ms", 1234.5678, "1,234.6"),
    ("ms", -3.1, "-3.100"),
    ("signed_ms", 0.0123, "+0.012"),
    ("signed_ms", 0, "+0.000"),
    ("signed_ms", -3.1, "-3.100"),
    ("signed_ms", 1234.56, "+1,234.6"),
    ("signed_ms", -1234.56, "-1,234.6"),
    ("us", 12.34, "12.3"),
    ("us", 12345.67, "12,345.7"),
    # a duration with its unit: 3 significant digits under 100 ms, whole ms above
    ("ms_text", 38.34, "38.3 ms"),
    ("ms_text", 0.012345, "0.0123 ms"),
    ("ms_text", 99.4, "99.4 ms"),
    ("ms_text", 100, "100 ms"),
    ("ms_text", 12345.6, "12,346 ms"),
    ("us_text", 412.3, "412 µs"),
    ("us_text", 1500, "1.5 ms"),
    ("us_text", 123456789, "123,457 ms"),
    # a time against its reference
    ("ratio", 1.41, "+41%"),
    ("ratio", 0.92, "-8%"),
    ("ratio", 0.998, "+0%"),
    ("ratio", 1.999, "+100%"),
    ("ratio", 2.0, "2.0x"),
    ("ratio", 3.96, "4.0x"),
    ("ratio", 212.4, "212x"),
    ("ratio", 12345.6, "12,346x"),
    ("pct_over", 1.1, "10%"),
    ("pct_over", 1.123, "12%"),
    ("share", 0.5, "50%"),
    ("share", 1.0, "100%"),
    ("share", 0.8333, "83.3%"),
    ("share", 0.000412, "0.0412%"),
    ("speedup", 1.678, "1.68x"),
    ("speedup", 1, "1.00x"),
    ("number", 2.1652899999999997, "2.165"),
    ("number", 12345.678, "12346"),
    ("number", 0.000012346, "1.235e-05"),
    ("number", 5.0, "5"),
]


@pytest.mark.parametrize(("rule", "value", "text"), TABLE)
@pytest.mark.parametrize("medium", [TERMINAL, HTML, SENTENCE], ids=repr)
def test_a_figure_reads_the_same_in_every_medium(
    medium: Medium, rule: str, value: object, text: str
) -> None:
    assert _rule(rule)(medium)(value) == text


def test_a_signed_percentage_over() -> None:
    assert TERMINAL.pct_over(1.123, signed=True) == "+12%"
    assert TERMINAL.pct_over(0.9, signed=True) == "-10%"


RULES = sorted({rule for rule, _, _ in TABLE})


@pytest.mark.parametrize("value", MISSING, ids=repr)
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize(
    ("medium", "said"), [(TERMINAL, "-"), (HTML, "none"), (SENTENCE, "none")], ids=repr
)
def test_a_missing_value_is_spelled_once_per_medium(
    medium: Medium, said: str, rule: str, value: object
) -> None:
    assert _rule(rule)(medium)(value) == said


@pytest.mark.parametrize(
    ("hours", "per", "text"),
    [
        (2.5, "", "2.5 h"),
        (1234.56, "", "1,234.6 h"),
        (0.05, "", "3.0 min"),
        (0.001, "", "3.6 s"),
        (4.8, "GPU", "4.8 GPU-hours"),
        (0.05, "GPU", "3.0 GPU-minutes"),
        (0.001, "rank", "3.6 rank-seconds"),
    ],
)
def test_hours_as_people_say_them(hours: float, per: str, text: str) -> None:
    assert hours_text(hours, per) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(45, "45 s"), (119, "119 s"), (240, "4 min"), (9000, "2.5 h"), (3.1 * 86400, "3.1 days")],
)
def test_seconds_as_people_say_them(seconds: float, text: str) -> None:
    assert seconds_text(seconds) == text


# -- the outputs use it ---------------------------------------------------------------------


def test_the_terminal_findings_table_says_a_missing_figure_with_a_dash() -> None:
    """A finding read back with no ratio said "none" in the terminal table beside "-"
    for the other missing figures."""
    from rich.console import Console

    from rankscope.cli._render import _findings_table

    finding = {
        "rank": 1,
        "phase": "forward",
        "role": "slow",
        "median_ratio": None,
        "share_above": 0.8333,
        "lost_ms": 1234.5678,
        "since_step": 3,
        "waits_for": [],
        "cost": {"step_ms_saved": None, "speedup": None},
    }
    console = Console(width=300, record=True)
    console.print(_findings_table([finding], "median", None))
    (row,) = [line for line in console.export_text().splitlines() if "forward" in line]
    assert row.split() == ["1", "forward", "slow", "-", "83.3%", "1,234.6", "3", "-", "-"]


def test_the_pages_say_a_missing_figure_as_none() -> None:
    """The collectives section left a missing figure blank and the diff page said "-":
    both now say "none", as the rest of the report page does."""
    from rankscope.analysis.render._collectives import collectives_section
    from rankscope.analysis.render._diff import render_diff_html

    window = {
        "window": "w",
        "ranks": [{"rank": 3, "host": None, "late_ms": None, "vs_median_ms": -1.5}],
        "collectives": [{"at_ms": 2.0, "skew_ms": None, "name": "allreduce"}],
    }
    page = collectives_section({"collectives": {"windows": [window]}})
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", page)
    assert cells[:8] == ["3", "none", "none", "none", "none", "none", "none", "-1.500"]
    assert cells[8:] == ["2.000", "allreduce", "none", "none", "none", "tie", "none"]
    side = {"path": "a", "ranks": 2, "sampled_steps": 5}
    change = {"what": "phase", "phase": "p", "rank": None, "sync": False, "relative": 0.5}
    change |= {"a": {"median_ms": 2.0, "p90_ms": None}, "b": None, "delta_ms": None}
    data = {"a": side, "b": side, "changes": [{**change, "noise_ms": NAN}], "notes": []}
    data |= {"compared": {"phases": ["p"], "kernels": 0}, "within_noise": 0, "time": "host"}
    page = render_diff_html({**data, "skipped": []})
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", page)
    assert cells == ["phase p", "2.000 (p90 none)", "none", "none", "+50%", "none"]


# -- the rule lives here alone ---------------------------------------------------------------

# A function that turns a figure into text, by its name: ms, _ms, ms_text, signed_ms,
# us_text, ratio_text, share_text, pct_over, speedup_text, _duration, duration, _hours...
FORMATTER = re.compile(
    r"_?(signed_)?(ms|us|ratio|share|pct|percent|speedup|hours?|duration|seconds|number|num)"
    r"(_text|_over|_cell)?"
)


def _text_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return [
        f"{path.relative_to(SRC)}:{node.lineno} {node.name}"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and FORMATTER.fullmatch(node.name)
        and isinstance(node.returns, (ast.Name, ast.Constant))
        and getattr(node.returns, "id", getattr(node.returns, "value", None)) == "str"
    ]


def test_no_other_module_formats_a_figure_of_its_own() -> None:
    """Six `_ms` formatters once spelled a missing value three ways: a rule lives once."""
    home = SRC / "analysis" / "core" / "_format.py"
    assert _text_functions(home)  # the test still sees a formatter where there is one
    own = [
        hit for path in sorted(SRC.rglob("*.py")) if path != home for hit in _text_functions(path)
    ]
    assert own == []
