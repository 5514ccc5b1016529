"""The report page's "Last arrivals at collectives" section: for the latest captured
window, which rank arrived last how often and by how much, and the collectives with the
largest skew.

Drawn from `report["collectives"]` (`collectives_of_run`: per window, the data of
`rankscope collectives --json`), which may come from anywhere: every part may be absent
or of the wrong type, and every string is escaped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..collectives._collective_clocks import ALIGNMENTS
from ..core._format import HTML
from ..core._values import as_float, as_int, as_list, as_map, as_text, esc, plural

__all__ = ["collectives_section"]

_RANKS = 20  # ranks listed per window, the most often last first
_SKEWED = 10  # collectives listed per window, the largest skew first


def collectives_section(report: Mapping[str, Any]) -> str:
    """The section, or "" when the report has no collectives part, or None there (no window
    holds the traces of two ranks)."""
    if report.get("collectives") is None:
        return ""
    part = as_map(report.get("collectives"))
    windows = [as_map(w) for w in as_list(part.get("windows"))]
    parts = [
        '<section id="collectives">\n<h2>Last arrivals at collectives</h2>',
        '<p class="rule">Each collective is matched across the ranks of a window (NCCL '
        "kernels by their start on the GPU; without them, the c10d calls on the CPU), per "
        "process group and in order. Skew: the last arrival less the first. Late: the last "
        "rank's arrival less the median arrival of the others, summed per rank over the "
        "collectives it arrived last at. Ranks on different hosts are put on one clock with "
        "each host's clock offset as the run's timings show it, where they have comm "
        "phases; the window says how its clocks were aligned. Only the latest window is read: "
        "<code>rankscope collectives</code> reads any.</p>",
    ]
    if not windows:
        parts.append('<p class="none">none (no window holds the traces of two ranks)</p>')
    parts.extend(_window(w) for w in windows)
    left_out = [as_text(w) for w in as_list(part.get("left_out"))]
    if left_out:
        parts.append(
            f'<p class="note">{len(left_out)} earlier window{plural(len(left_out))} not shown '
            f"({esc(', '.join(left_out[:6]))}{', ...' if len(left_out) > 6 else ''}): "
            "<code>rankscope collectives RUN_DIR/traces/WINDOW</code> reads one.</p>"
        )
    parts.append("</section>")
    return "\n".join(parts)


def _window(found: Mapping[str, Any]) -> str:
    name = esc(as_text(found.get("window")) or "window not named")
    error = as_text(found.get("error"))
    if error:
        return f'<h3>{name}</h3>\n<p class="none">not matched: {esc(error)}</p>'
    not_read = as_text(found.get("not_read"))
    if not_read:
        return f'<h3>{name}</h3>\n<p class="none">not read: {esc(not_read)}</p>'
    alignment = as_text(found.get("alignment"))
    rows = [as_map(c) for c in as_list(found.get("collectives"))]
    source = "NCCL kernels" if found.get("source") == "gpu" else "c10d calls"
    parts = [
        f"<h3>{name}</h3>",
        f'<p class="meta">{len(rows)} collective{plural(len(rows))} matched, from {source}; '
        f"clocks: {esc(ALIGNMENTS.get(alignment, alignment) or 'not said')}</p>",
        f"<p>{esc(as_text(found.get('summary')) or 'no summary')}</p>",
        _ranks(as_list(found.get("ranks"))),
        _skewed(rows),
    ]
    said = [
        *(as_text(as_map(u).get("reason")) for u in as_list(found.get("unmatched"))),
        *(as_text(n) for n in as_list(found.get("notes"))),
    ]
    if said:
        parts.append("<ul>\n" + "\n".join(f"<li>{esc(s)}</li>" for s in said if s) + "\n</ul>")
    return "\n".join(part for part in parts if part)


def _count(value: object) -> str:
    number = as_int(value)
    return HTML.missing if number is None else str(number)


def _ranks(ranks: list[Any]) -> str:
    rows = [as_map(r) for r in ranks]
    if not rows:
        return ""
    rows.sort(
        key=lambda r: (-(as_int(r.get("arrived_last")) or 0), -(as_float(r.get("late_ms")) or 0.0))
    )
    top = (as_int(rows[0].get("arrived_last")) or 0) > 0
    lines = []
    for i, r in enumerate(rows[:_RANKS]):
        lines.append(
            f'<tr class="{"slow" if i == 0 and top else ""}"><td class="num">{_count(r.get("rank"))}</td>'
            f"<td>{esc(as_text(r.get('host'))) or HTML.missing}</td>"
            f'<td class="num">{_count(r.get("collectives"))}</td>'
            f'<td class="num">{_count(r.get("arrived_last"))}</td>'
            f'<td class="num">{HTML.ms(r.get("late_ms"))}</td>'
            f'<td class="num">{HTML.ms(r.get("late_ms_mean"))}</td>'
            f'<td class="num">{HTML.ms(r.get("late_ms_max"))}</td>'
            f'<td class="num">{HTML.signed_ms(r.get("vs_median_ms"))}</td></tr>'
        )
    more = (
        f'<p class="note">The first {_RANKS} of {len(rows)} ranks; '
        "<code>rankscope collectives --json</code> has them all.</p>"
        if len(rows) > _RANKS
        else ""
    )
    return (
        '<table class="data collective-ranks">\n<tr><th>rank</th><th>host</th><th>collectives</th>'
        "<th>arrived last</th><th>late ms</th><th>mean</th><th>max</th><th>vs median ms</th></tr>\n"
        + "\n".join(lines)
        + f"\n</table>{more}"
    )


def _skewed(rows: list[Mapping[str, Any]]) -> str:
    if not rows:
        return ""
    worst = sorted(rows, key=lambda c: -(as_float(c.get("skew_ms")) or 0.0))[:_SKEWED]
    lines = []
    for c in worst:
        last = as_int(c.get("last_rank"))
        lines.append(
            f'<tr><td class="num">{HTML.ms(c.get("at_ms"))}</td>'
            f"<td>{esc(as_text(c.get('name')))}</td><td>{esc(as_text(c.get('group'))) or HTML.missing}</td>"
            f'<td class="num">{HTML.ms(c.get("skew_ms"))}</td>'
            f'<td class="num">{_count(c.get("first_rank"))}</td>'
            f'<td class="num">{"tie" if last is None else last}</td>'
            f'<td class="num">{HTML.ms(c.get("late_ms"))}</td></tr>'
        )
    return (
        f"<h4>The {len(worst)} largest skews</h4>\n"
        '<table class="data collective-skews">\n<tr><th>at ms</th><th>collective</th>'
        "<th>group</th><th>skew ms</th><th>first</th><th>last</th><th>late ms</th></tr>\n"
        + "\n".join(lines)
        + "\n</table>"
    )
