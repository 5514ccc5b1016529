"""`rankscope diff`'s words and its page: the lines the terminal (cli/_diff.py) and the page
both show, written once, and the page itself: one small file with no script and nothing
fetched, every string escaped.

Drawn from `RunDiff.to_dict()` (analysis/diff/_diff.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..core._format import HTML, Medium, finite
from ..core._values import esc
from ._page import write_page

__all__ = [
    "SYNC_NOTE",
    "UNJUDGED_TITLE",
    "change_text",
    "figures_text",
    "render_diff_html",
    "side_line",
    "step_line",
    "summary_line",
    "versus_a",
    "write_diff_html",
]

UNJUDGED_TITLE = "Kernel changes not judged against noise (too few traces)"
SYNC_NOTE = "* ends in a collective: the time ranks waited there for the last is taken out"


# -- words and numbers that the terminal and the page share ---------------------------------


def change_text(change: Mapping[str, Any], medium: Medium) -> str:
    """What changed: "phase forward", "rank 5 in phase forward (others -0.011)", "kernel X"."""
    if change["what"] == "kernel":
        kind = "CPU op" if change["kind"] == "cpu_ops" else "kernel"
        return f"{kind} {change['kernel']}"
    where = f"phase {change['phase']}"
    if change["rank"] is None:
        return where
    # Its delta is beyond the others' change: said, so that A + others + delta = B.
    others = medium.signed_ms(change["others_delta_ms"])
    return f"rank {change['rank']} in {where} (others {others})"


def versus_a(relative: Any, medium: Medium) -> str:
    """B against A as `rankscope stragglers` says a ratio ("+41%", "2.5x", "212x"), from
    the delta over A's figure; "new" where A has none."""
    if relative is None:
        return "new"
    number = finite(relative)
    return medium.ratio(None if number is None else 1 + number)


def figures_text(side: Mapping[str, Any] | None, kernel: bool, medium: Medium) -> str:
    """One side's figures: median (p90) for a phase, ms and calls per step for a kernel."""
    if side is None:
        return medium.missing
    if kernel:
        calls = medium.number(side.get("count_per_step", 0))
        return f"{medium.ms(side.get('ms_per_step'))} ({calls}/step)"
    return f"{medium.ms(side.get('median_ms'))} (p90 {medium.ms(side.get('p90_ms'))})"


def side_line(label: str, side: Mapping[str, Any]) -> str:
    where = f"window {side['window']}" if side.get("window") else "run"
    steps = side.get("steps")
    span = f", steps {steps[0]}-{steps[1]}" if steps else ""
    parts = [f"{side['ranks']} ranks", f"{side['sampled_steps']} sampled steps"]
    if side.get("traces"):
        parts.append(f"{side['traces']} traces")
    return f"{label}: {side['path']} ({where}{span}; {', '.join(parts)})"


def step_line(data: Mapping[str, Any], medium: Medium) -> str | None:
    """A's and B's median step time over the same ranks, and B's less A's."""
    step = data.get("step")
    if not step:
        return None
    a, b, delta = step.get("a_ms"), step.get("b_ms"), step.get("delta_ms")
    base = a if isinstance(a, (int, float)) and a > 0 else None
    rel = f", {versus_a(delta / base, medium)}" if base and isinstance(delta, (int, float)) else ""
    within = ""
    if isinstance(delta, (int, float)) and abs(delta) <= step.get("noise_ms", 0):
        within = ", within noise"
    ranks = step.get("ranks")
    fewer = ranks is not None and ranks not in (data["a"]["ranks"], data["b"]["ranks"])
    over = f", the {ranks} ranks in both" if fewer else ""
    return (
        f"step time (median{over}): {medium.ms(a)} ms -> {medium.ms(b)} ms "
        f"({medium.signed_ms(delta)} ms{rel}{within})"
    )


def summary_line(data: Mapping[str, Any]) -> str:
    compared = data["compared"]
    changes = len(data["changes"])
    head = "No change above noise" if not changes else f"{changes} change(s) above noise"
    unjudged = len(data.get("unjudged", []))
    apart = f"; {unjudged} kernel change(s) not judged (too few traces)" if unjudged else ""
    return (
        f"{head}; {data['within_noise']} figure(s) within it "
        f"({len(compared['phases'])} phases and {compared['kernels']} kernels compared, "
        f"{data.get('clock', data['time'] + ' time')}){apart}"
    )


# -- the page ---------------------------------------------------------------------------------

_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { padding: 3px 10px; border-bottom: 1px solid #ddd; text-align: right; }
th:first-child, td:first-child { text-align: left; max-width: 60em; word-break: break-all; }
.up { color: #b00020; } .down { color: #1b7e1b; } .note { color: #8a6d00; }
"""
# Nothing runs and nothing is fetched: the page is text and a table.
_MAX_SKIPPED = 1000  # lines of skipped input the page lists; the count is always in full
_CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


def _table(changes: list[Mapping[str, Any]], judged: bool) -> str:
    rows = []
    for change in changes:
        kernel = change["what"] == "kernel"
        delta = change["delta_ms"]
        css = "up" if isinstance(delta, (int, float)) and delta > 0 else "down"
        mark = " *" if change["sync"] else ""
        noise = f"<td>{HTML.ms(change['noise_ms'])}</td>" if judged else ""
        rows.append(
            f"<tr><td>{esc(change_text(change, HTML))}{mark}</td>"
            f"<td>{esc(figures_text(change['a'], kernel, HTML))}</td>"
            f"<td>{esc(figures_text(change['b'], kernel, HTML))}</td>"
            f"<td class='{css}'>{HTML.signed_ms(delta)}</td>"
            f"<td>{versus_a(change['relative'], HTML)}</td>{noise}</tr>"
        )
    if not rows:
        return ""
    head = "<th>noise ms</th>" if judged else ""
    return (
        "<table><tr><th>change</th><th>A</th><th>B</th><th>delta ms/step</th><th>vs A</th>"
        f"{head}</tr>{''.join(rows)}</table>"
    )


def render_diff_html(data: Mapping[str, Any]) -> str:
    """The diff as one page with no script and no outside asset; every string is escaped."""
    table = _table(data["changes"], judged=True)
    unjudged = _table(data.get("unjudged", []), judged=False)
    sync = any(change["sync"] for change in data["changes"])
    step = step_line(data, HTML)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        f"<title>rankscope diff: {esc(str(data['b']['path']))}</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>rankscope diff</h1>",
        f"<p>{esc(side_line('A', data['a']))}<br>{esc(side_line('B', data['b']))}</p>",
        f"<p>{esc(step)}</p>" if step else "",
        f"<h2>{esc(summary_line(data))}</h2>",
        table,
        f"<p>{esc(SYNC_NOTE)}</p>" if sync else "",
        f"<h2>{esc(UNJUDGED_TITLE)}</h2>{unjudged}" if unjudged else "",
        *(f'<p class="note">note: {esc(note)}</p>' for note in data["notes"]),
    ]
    skipped = data["skipped"]
    if skipped:
        items = "".join(f"<li>{esc(line)}</li>" for line in skipped[:_MAX_SKIPPED])
        more = len(skipped) - _MAX_SKIPPED
        tail = f"<p>... and {more} more (all of them in --json)</p>" if more > 0 else ""
        parts.append(f"<h2>Skipped input ({len(skipped)})</h2><ul>{items}</ul>{tail}")
    parts.append("</body></html>\n")
    return "\n".join(part for part in parts if part)


def write_diff_html(data: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write the page to `path`, whole or not at all (render/_page.py)."""
    write_page(path, render_diff_html(data))
