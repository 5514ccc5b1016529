"""The report's evidence lines: under the findings, the ops that grew on each slow rank
against a healthy peer (analysis/stragglers/_evidence.py words them, for the terminal too)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core._values import esc
from ..stragglers._evidence import evidence_line

__all__ = ["evidence_list"]

_SHOWN = 8  # findings whose evidence the page lists, as many as their causes


def evidence_list(findings: list[Mapping[str, Any]]) -> str:
    """A list item per slow finding with evidence, or nothing."""
    lines = [line for f in findings if f.get("role") == "slow" and (line := evidence_line(f))]
    items = "".join(f"<li>{esc(line)}</li>" for line in lines[:_SHOWN])
    return f'<ul class="evidence">{items}</ul>\n' if items else ""
