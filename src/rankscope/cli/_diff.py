"""`rankscope diff A B`: what changed between two runs or two windows (analysis/_diff.py),
in the terminal, as JSON, or as a small self-contained HTML page."""

from __future__ import annotations

import argparse
import html
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._layout import TRACES
from ._options import json_option, positive
from ._output import print_json, terminal

__all__ = ["add_commands", "render_diff_html"]

_SHOWN = 20
"""Changes the terminal shows by default; --json and --html hold them all."""


def add_commands(commands: Any) -> None:
    diff = commands.add_parser(
        "diff",
        help="what changed between two runs (or two trace windows), biggest first",
        description=(
            "Compare run B with run A (or window B with window A, "
            f"RUN_DIR/{TRACES}/<window>): each phase's median and p90, each rank against "
            "the others, each kernel's time and count, all in ms per step. Changes are "
            "listed by how much step time they explain, biggest first; a change within "
            "the noise (how much the figure varies from step to step, what chance makes of "
            "its medians, and --min-share of the step time) is left out."
        ),
    )
    diff.add_argument("a", type=Path, metavar="A", help="the run (or window) to compare against")
    diff.add_argument("b", type=Path, metavar="B", help="the run (or window) that changed")
    diff.add_argument(
        "--time",
        choices=("host", "device"),
        default="host",
        help="compare host times (cpu_ms) or device times (gpu_ms) (default: host)",
    )
    diff.add_argument(
        "--noise",
        type=_noise,
        default=1.0,
        metavar="K",
        help="scale the noise estimate: 2 lists only changes twice as clear (default: 1)",
    )
    diff.add_argument(
        "--min-share",
        type=_share,
        default=0.01,
        metavar="SHARE",
        help="leave out changes below this share of the shorter step time, A's or B's (default: 0.01)",
    )
    diff.add_argument(
        "--top", type=positive, default=_SHOWN, help=f"changes shown (default: {_SHOWN})"
    )
    diff.add_argument("--html", type=Path, metavar="FILE", help="also write the diff as a page")
    json_option(diff)
    diff.set_defaults(run=_diff)


def _noise(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return value


def _share(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a share in [0, 1), got {text}")
    return value


def _diff(args: argparse.Namespace) -> int:
    from ..analysis._diff import diff_runs

    render = None if args.json else terminal("diff")  # says which extra brings rich
    found = diff_runs(args.a, args.b, time=args.time, noise=args.noise, min_share=args.min_share)
    data = found.to_dict()
    if args.html is not None:
        args.html.write_text(render_diff_html(data), encoding="utf-8")
        data["html"] = str(args.html)
    if render is None:
        print_json(data)
    else:
        _terminal(data, args.top)
    return 0


# -- words and numbers that the terminal and the page share ---------------------------------


def _what(change: Mapping[str, Any]) -> str:
    if change["what"] == "kernel":
        kind = "CPU op" if change["kind"] == "cpu_ops" else "kernel"
        return f"{kind} {change['kernel']}"
    where = f"phase {change['phase']}"
    if change["rank"] is None:
        return where
    # Its delta is beyond the others' change: said, so that A + others + delta = B.
    return f"rank {change['rank']} in {where} (others {_signed(change['others_delta_ms'])})"


def _ms(value: Any) -> str:
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return "-"
    return f"{value:.3f}" if abs(value) < 100 else f"{value:,.1f}"


def _signed(value: Any) -> str:
    text = _ms(value)
    return text if text == "-" or text.startswith("-") else f"+{text}"


def _percent(value: Any) -> str:
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return "new" if value is None else "-"
    return f"{value:+.0%}"


def _figures(side: Mapping[str, Any] | None, kernel: bool) -> str:
    """One side's figures: median (p90) for a phase, ms and calls per step for a kernel."""
    if side is None:
        return "none"
    if kernel:
        return f"{_ms(side.get('ms_per_step'))} ({side.get('count_per_step', 0):.3g}/step)"
    return f"{_ms(side.get('median_ms'))} (p90 {_ms(side.get('p90_ms'))})"


def _side_line(label: str, side: Mapping[str, Any]) -> str:
    where = f"window {side['window']}" if side.get("window") else "run"
    steps = side.get("steps")
    span = f", steps {steps[0]}-{steps[1]}" if steps else ""
    parts = [f"{side['ranks']} ranks", f"{side['sampled_steps']} sampled steps"]
    if side.get("traces"):
        parts.append(f"{side['traces']} traces")
    return f"{label}: {side['path']} ({where}{span}; {', '.join(parts)})"


def _step_line(data: Mapping[str, Any]) -> str | None:
    """A's and B's median step time over the same ranks, and B's less A's."""
    step = data.get("step")
    if not step:
        return None
    a, b, delta = step.get("a_ms"), step.get("b_ms"), step.get("delta_ms")
    base = a if isinstance(a, (int, float)) and a > 0 else None
    rel = f", {delta / base:+.1%}" if base and isinstance(delta, (int, float)) else ""
    within = ""
    if isinstance(delta, (int, float)) and abs(delta) <= step.get("noise_ms", 0):
        within = ", within noise"
    ranks = step.get("ranks")
    fewer = ranks is not None and ranks not in (data["a"]["ranks"], data["b"]["ranks"])
    over = f", the {ranks} ranks in both" if fewer else ""
    return (
        f"step time (median{over}): {_ms(a)} ms -> {_ms(b)} ms ({_signed(delta)} ms{rel}{within})"
    )


def _summary(data: Mapping[str, Any]) -> str:
    compared = data["compared"]
    changes = len(data["changes"])
    head = "No change above noise" if not changes else f"{changes} change(s) above noise"
    unjudged = len(data.get("unjudged", []))
    apart = f"; {unjudged} kernel change(s) not judged (too few traces)" if unjudged else ""
    return (
        f"{head}; {data['within_noise']} figure(s) within it "
        f"({len(compared['phases'])} phases and {compared['kernels']} kernels compared, "
        f"{data['time']} time){apart}"
    )


_UNJUDGED = "Kernel changes not judged against noise (too few traces)"


# -- the terminal -----------------------------------------------------------------------------


def _terminal(data: Mapping[str, Any], top: int) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 160)
    console.print(Text("rankscope diff", style="bold"))
    console.print(Text(_side_line("A", data["a"])))
    console.print(Text(_side_line("B", data["b"])))
    step = _step_line(data)
    if step:
        console.print(Text(step))
    changes = data["changes"]
    titles = (
        ("Changes above noise, in ms per step, biggest first", changes, True),
        (_UNJUDGED, data.get("unjudged", []), False),
    )
    for title, listed, judged in titles:
        if not listed:
            continue
        table = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left")
        columns = ("change", "A", "B", "delta ms", "vs A") + (("noise ms",) if judged else ())
        for column in columns:
            table.add_column(column, justify="left" if column == "change" else "right")
        for change in listed[:top]:
            kernel = change["what"] == "kernel"
            name = _what(change) + (" *" if change["sync"] else "")
            cells = [
                _figures(change["a"], kernel),
                _figures(change["b"], kernel),
                _signed(change["delta_ms"]),
                _percent(change["relative"]),
            ]
            table.add_row(
                Text(name if len(name) <= 70 else name[:69] + "…", no_wrap=True),
                *cells,
                *([_ms(change["noise_ms"])] if judged else []),
            )
        console.print(table)
        if len(listed) > top:
            console.print(f"  ... {len(listed) - top} more (--top N, --json or --html)")
    if any(change["sync"] for change in changes):
        console.print(
            "  * ends in a collective: the time ranks waited there for the last is taken out"
        )
    console.print(Text(_summary(data), style="bold"))
    for note in data["notes"]:
        console.print(Text(f"note: {note}", style="yellow"))
    skipped = data["skipped"]
    if skipped:
        console.print(f"\n[yellow]Skipped input ({len(skipped)}):[/yellow]")
        for line in skipped[:5]:
            console.print(Text(f"  {line}"))
        if len(skipped) > 5:
            console.print(f"  ... and {len(skipped) - 5} more (all of them in --json)")
    if data.get("html"):
        console.print(Text(f"\nHTML: {data['html']}"))


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


def _html_table(changes: list[Mapping[str, Any]], judged: bool) -> str:
    e = html.escape
    rows = []
    for change in changes:
        kernel = change["what"] == "kernel"
        delta = change["delta_ms"]
        css = "up" if isinstance(delta, (int, float)) and delta > 0 else "down"
        mark = " *" if change["sync"] else ""
        noise = f"<td>{e(_ms(change['noise_ms']))}</td>" if judged else ""
        rows.append(
            f"<tr><td>{e(_what(change))}{mark}</td><td>{e(_figures(change['a'], kernel))}</td>"
            f"<td>{e(_figures(change['b'], kernel))}</td><td class='{css}'>{e(_signed(delta))}</td>"
            f"<td>{e(_percent(change['relative']))}</td>{noise}</tr>"
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
    e = html.escape
    table = _html_table(data["changes"], judged=True)
    unjudged = _html_table(data.get("unjudged", []), judged=False)
    sync = any(change["sync"] for change in data["changes"])
    step = _step_line(data)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        f"<title>rankscope diff: {e(str(data['b']['path']))}</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>rankscope diff</h1>",
        f"<p>{e(_side_line('A', data['a']))}<br>{e(_side_line('B', data['b']))}</p>",
        f"<p>{e(step)}</p>" if step else "",
        f"<h2>{e(_summary(data))}</h2>",
        table,
        (
            "<p>* ends in a collective: the time ranks waited there for the last is taken out</p>"
            if sync
            else ""
        ),
        f"<h2>{e(_UNJUDGED)}</h2>{unjudged}" if unjudged else "",
        *(f'<p class="note">note: {e(note)}</p>' for note in data["notes"]),
    ]
    skipped = data["skipped"]
    if skipped:
        items = "".join(f"<li>{e(line)}</li>" for line in skipped[:_MAX_SKIPPED])
        more = len(skipped) - _MAX_SKIPPED
        tail = f"<p>... and {more} more (all of them in --json)</p>" if more > 0 else ""
        parts.append(f"<h2>Skipped input ({len(skipped)})</h2><ul>{items}</ul>{tail}")
    parts.append("</body></html>\n")
    return "\n".join(part for part in parts if part)
