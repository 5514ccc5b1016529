"""What the terminal renderers share for a table's cells: a long name cut to its column,
ranks listed."""

from __future__ import annotations

from rich.text import Text

from .._text import format_ranks

__all__ = ["cut", "rank_list"]


def cut(text: str, width: int) -> Text:
    """`text` in a column `width` wide: cut with an ellipsis, never wrapped."""
    return Text(text if len(text) <= width else text[: width - 1] + "…", no_wrap=True)


def rank_list(ranks: list[int]) -> str:
    """`ranks 0-3`, `rank 5`; `no ranks` for none."""
    return format_ranks(ranks) if ranks else "no ranks"
