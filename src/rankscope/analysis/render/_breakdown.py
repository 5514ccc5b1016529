"""The report's per-rank phase breakdown: one stacked bar per rank, the findings' ranks first.

Waiting for a straggler shows up on every other rank in the phases that end in a
collective (a DDP backward holds its gradient all-reduce), so a straggler has less of
that time than anyone. Ranks are therefore ordered by the findings first, then by their
own work: the phases that neither end in a collective nor are communication.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core._format import HTML
from ..core._values import as_float, as_int, as_ints, as_list, as_map, as_text, esc, plural

__all__ = ["breakdown_section"]

_TOP_RANKS = 32  # rows shown (findings' ranks first) before the median and the fastest rank

# Stacked-bar colours by phase kind, so compute, communication and data read at a glance;
# phases of the same kind take the next shade.
_KIND_COLOURS = {
    "compute": ("#2c5d92", "#5b8fc7", "#9cc0e6", "#1b3a5c"),
    "comm": ("#d9661f", "#f2a154", "#a3470f"),
    "data": ("#3a8a3e", "#7cc47f", "#25602a"),
    "io": ("#7b4fa0", "#b48fd3"),
}
_OTHER_COLOURS = ("#8c6d31", "#bd9e39", "#6b6b6b", "#a6a6a6", "#c46fa0")


def breakdown_section(report: Mapping[str, Any], findings: list[Mapping[str, Any]]) -> str:
    head = '<section id="breakdown">\n<h2>Per-rank phase breakdown</h2>\n'
    bd = as_map(report.get("breakdown"))
    ranks = as_ints(bd.get("ranks"))
    phases = [as_text(p) for p in as_list(bd.get("phases"))]
    kinds = [as_text(k) for k in as_list(bd.get("kinds"))]
    matrix = as_list(bd.get("median_ms"))
    if not ranks or not phases:
        return head + '<p class="none">none (no timings)</p>\n</section>'
    kinds = (kinds + [""] * len(phases))[: len(phases)]
    sync = {as_text(p) for p in as_list(as_map(report.get("stragglers")).get("sync_phases"))}
    waited = [kind == "comm" or phase in sync for phase, kind in zip(phases, kinds, strict=True)]
    rows: list[_RankRow] = []
    for i, rank in enumerate(ranks):
        cells = as_list(matrix[i]) if i < len(matrix) else []
        values = [as_float(cells[j]) if j < len(cells) else None for j in range(len(phases))]
        if any(v is not None for v in values):
            rows.append(_RankRow(rank, values, waited))
    if not rows:
        return head + '<p class="none">none (no phase times for any rank)</p>\n</section>'
    tags = _tags(findings)
    slow = [rank for rank, (kind, _) in tags.items() if kind == "slow"]
    rows.sort(key=lambda row: (-row.own, row.rank))
    median = rows[len(rows) // 2]
    first = {rank: n for n, rank in enumerate(slow)}
    ordered = sorted(rows, key=lambda row: first.get(row.rank, len(first)))  # stable: by own
    if len(ordered) <= _TOP_RANKS + 2:
        shown = [(row, "") for row in ordered]
        what = f"All {len(rows)} rank{plural(len(rows))}"
    else:
        shown = [(row, "") for row in ordered[:_TOP_RANKS]]
        shown += [(median, "median"), (rows[-1], "fastest")]
        what = (
            f"{_TOP_RANKS} of {len(rows)} ranks (the findings' slow ranks, then the most own "
            "work), then the median and the fastest rank"
        )
    own = [p for p, w in zip(phases, waited, strict=True) if not w]
    held = [p for p, w in zip(phases, waited, strict=True) if w]
    what += (
        ": the ranks the findings name as slow first, then by own work"
        + (f" (the sum of {esc(', '.join(own))})" if own else "")
        + "."
    )
    if held:
        one = len(held) == 1
        what += (
            f" {esc(', '.join(held))} end{'s' if one else ''} in a collective, so "
            f"{'it holds' if one else 'they hold'} the time spent waiting for the slowest rank: "
            "a straggler has less of it than the ranks that wait for it."
        )
    if len(rows) < len(ranks):
        without = len(ranks) - len(rows)
        what += f" {without} rank{plural(without)} without phase times not shown."
    colours = _phase_colours(kinds)
    widest = max(row.total for row, _ in shown) or 1.0
    lines = [
        _bar_row(
            row, tag=tag, tags=tags, median=median, phases=phases, colours=colours, widest=widest
        )
        for row, tag in shown
    ]
    legend = "".join(
        f'<span class="key"><span class="swatch" style="background:{colours[j]}"></span>'
        f"{esc(phase)}{f' ({esc(kinds[j])})' if kinds[j] else ''}</span>"
        for j, phase in enumerate(phases)
    )
    return (
        head + f'<p class="note">{what} A bar stacks each phase\'s median over the sampled '
        "steps (a sum of medians, so it need not equal the median step time); hover a "
        "segment for its phase and time.</p>\n"
        f'<div class="keys">{legend}</div>\n'
        '<table class="breakdown">\n<tr><th>rank</th><th></th><th>own work</th>'
        "<th>vs median rank</th><th>all phases</th></tr>\n"
        + "\n".join(lines)
        + "\n</table>\n</section>"
    )


def _tags(findings: list[Mapping[str, Any]]) -> dict[int, tuple[str, str]]:
    """Per rank the findings name: ("slow" or "waits", what to write beside it)."""
    slow: dict[int, list[str]] = {}
    waits: dict[int, list[str]] = {}
    for f in findings:
        rank = as_int(f.get("rank"))
        phase = as_text(f.get("phase"))
        if rank is None:
            continue
        if f.get("role") == "slow":
            slow.setdefault(rank, []).append(
                f"{phase}, {HTML.ratio(as_float(f.get('median_ratio')))}"
            )
        elif f.get("role") == "waits":
            late = as_ints(f.get("waits_for"))
            whom = f" for rank {late[0]}" if late else ""
            waits.setdefault(rank, []).append(f"{phase}{whom}")
    out = {rank: ("slow", "slow in " + "; ".join(texts)) for rank, texts in slow.items()}
    for rank, texts in waits.items():
        out.setdefault(rank, ("waits", "waits in " + "; ".join(texts)))
    return out


def _bar_row(
    row: _RankRow,
    *,
    tag: str,
    tags: dict[int, tuple[str, str]],
    median: _RankRow,
    phases: list[str],
    colours: list[str],
    widest: float,
) -> str:
    segments = "".join(
        f'<span style="width:{v / widest * 100:.3f}%;background:{colours[j]}" '
        f'title="{esc(phases[j])}: {HTML.ms_text(v)}"></span>'
        for j, v in enumerate(row.values)
        if v is not None and v > 0
    )
    label = f"rank {row.rank}" + (f' <span class="tag">{tag}</span>' if tag else "")
    kind, said = tags.get(row.rank, ("", ""))
    if said:
        label += f' <span class="{kind}-tag">{esc(said)}</span>'
    vs = HTML.ratio(row.own / median.own if median.own > 0 else None)  # as the findings say it
    classes = " ".join(
        c for c in ("sep" if tag == "median" else "", f"flag-{kind}" if kind else "") if c
    )
    return (
        f'<tr class="{classes}" data-rank="{row.rank}"><td class="rank">{label}</td>'
        f'<td class="barcell"><div class="bar">{segments}</div></td>'
        f'<td class="num">{HTML.ms_text(row.own)}</td><td class="num">{vs}</td>'
        f'<td class="num">{HTML.ms_text(row.total)}</td></tr>'
    )


class _RankRow:
    """One rank's phase medians, with the sums the breakdown sorts and scales by."""

    def __init__(self, rank: int, values: list[float | None], waited: list[bool]) -> None:
        self.rank = rank
        self.values = [None if v is None else max(v, 0.0) for v in values]
        self.total = sum(v for v in self.values if v is not None)
        own = [v for v, w in zip(self.values, waited, strict=True) if v is not None and not w]
        # a rank timed only in phases that end in a collective still gets an order
        self.own = sum(own) if own else self.total


def _phase_colours(kinds: list[str]) -> list[str]:
    used: dict[str, int] = {}
    colours = []
    for kind in kinds:
        palette = _KIND_COLOURS.get(kind, _OTHER_COLOURS)
        key = kind if kind in _KIND_COLOURS else ""
        colours.append(palette[used.get(key, 0) % len(palette)])
        used[key] = used.get(key, 0) + 1
    return colours
