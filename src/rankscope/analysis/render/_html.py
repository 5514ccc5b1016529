"""The HTML report: one self-contained file (inline CSS and JS, no network) that opens from file://.

The page's style and script are report.css and report.js beside this module, inlined.

Sections: the summary (the stragglers in words), hangs where the run had the watch on
(render/_hangs.py), a rank x sampled-step heatmap drawn on a canvas with the slow ranks
marked (the finding's picture, on the first screen), the run and its findings (ranks,
steps, the findings' rule, causes, costs and table, phases), the phases over steps, the
per-rank phase breakdown, the top kernels per captured window, and the input that was
skipped. Every name from the data is HTML-escaped in the page, the data embedded for the
script is safe inside <script>, the script inserts text with textContent only, and a
Content-Security-Policy lets no other script run.

Size: the heatmap values dominate, at 4 significant digits about 6 bytes a cell: 1024
ranks x 200 steps x 7 metrics (step time and 6 phases) makes a 8.9 MB page (7.5 MB with
6 metrics); everything else is tens of kB. Rendering it takes about 2 s in Python;
Chromium opens it in about 0.3 s and draws a metric in under 20 ms.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import math
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any

from ..._text import format_ranks, number_ranges, printable
from ..core._format import HTML
from ..core._values import (
    as_float,
    as_int,
    as_ints,
    as_list,
    as_map,
    as_text,
    esc,
    int_of,
    plural,
)
from ..stragglers._findings import cost_lines, in_groups
from ._breakdown import breakdown_section
from ._charts import charts_section
from ._collectives import collectives_section
from ._evidence import evidence_list
from ._hangs import hangs_section
from ._kernels import kernels_section

__all__ = ["render_html"]

_MAX_FINDINGS = 20  # rows of the findings table: a slow rank can have 1023 waiting for it
_MAX_SKIPPED = 1000  # skipped-input lines listed; the count is always given in full
# The heatmap's colours span these percentiles, so a warm-up step (3% of the cells at 30
# sampled steps) cannot wash out the rest; values beyond take the end colours (a straggler
# included: it stays the brightest) and the legend says so.
_CLIP = (0.05, 0.95)


def render_html(report: Mapping[str, Any]) -> str:
    """The whole page for a report (the plain JSON data of `rankscope report --json`).

    Any part may be absent, empty or malformed: that part reads "none" and the rest renders.
    """
    run_dir = as_text(report.get("run_dir")) or "(run directory not given)"
    findings = [as_map(f) for f in as_list(as_map(report.get("stragglers")).get("findings"))]
    hosts = {
        str(k): as_text(v) for k, v in as_map(as_map(report.get("ranks")).get("hosts")).items()
    }
    heatmap_html, heatmap_data = _heatmap(report, findings, hosts)
    data = _script_json({"heatmap": heatmap_data})
    hung = as_map(report.get("hangs")).get("state") == "hung"
    body = "\n".join(
        [
            _header(report, run_dir),
            # A hung run opens on who is stuck; any other on the finding in words, then its
            # picture, on the first screen; the tables after (a finished run's heartbeats too).
            *([hangs_section(report)] if hung else []),
            _summary(report, findings),
            heatmap_html,
            _details(report, findings, hosts),
            charts_section(report, findings),
            breakdown_section(report, findings),
            *([hangs_section(report)] if "hangs" in report and not hung else []),
            kernels_section(report),
            collectives_section(report),
            _skipped(report),
        ]
    )
    # A name that is not valid UTF-8 (its bytes as lone surrogates) reads as "\\xff" on
    # the page, as in the terminal: written as it is, it could not be saved as UTF-8.
    return printable(
        "<!doctype html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<link rel="icon" href="data:,">\n'
        f"<title>rankscope report: {esc(run_dir)}</title>\n"
        f"<style>{_CSS}</style>\n</head>\n<body>\n{body}\n"
        '<div id="tip" class="tip" hidden></div>\n'
        f'<script id="rankscope-data" type="application/json">{data}</script>\n'
        f"<script>{_SCRIPT}</script>\n</body>\n</html>\n"
    )


# ---------------------------------------------------------------------------- sections


def _header(report: Mapping[str, Any], run_dir: str) -> str:
    generated = as_text(report.get("generated_at"))
    version = report.get("v")
    meta = [f"generated {esc(generated)}" if generated else "generation time not given"]
    if version is not None:
        meta.append(f"report schema v{esc(as_text(version))}")
    hangs = '<a href="#hangs">hangs</a>' if "hangs" in report else ""
    collectives = '<a href="#collectives">collectives</a>' if report.get("collectives") else ""
    return (
        "<header>\n<h1>rankscope report</h1>\n"
        f'<p class="run"><code>{esc(run_dir)}</code></p>\n'
        f'<p class="meta">{" · ".join(meta)}</p>\n'
        f'<nav><a href="#summary">summary</a>{hangs}<a href="#heatmap">heatmap</a>'
        '<a href="#details">run and findings</a><a href="#over-steps">phases over steps</a><a href="#breakdown">breakdown</a><a href="#kernels">kernels</a>'
        f"{collectives}"
        '<a href="#skipped">skipped input</a></nav>\n</header>'
    )


def _summary(report: Mapping[str, Any], findings: list[Mapping[str, Any]]) -> str:
    """The findings in a few sentences: what the page opens on, with the heatmap below."""
    return (
        f'<section id="summary">\n<h2>Summary</h2>\n{_finding_words(report, findings)}\n</section>'
    )


def _details(
    report: Mapping[str, Any], findings: list[Mapping[str, Any]], hosts: dict[str, str]
) -> str:
    ranks = as_map(report.get("ranks"))
    steps = as_map(report.get("steps"))
    skipped = as_list(report.get("skipped"))
    note = as_map(report.get("attempts")).get("note")
    rows = [
        ("ranks", _ranks_line(ranks)),
        ("hosts", _hosts_line(hosts)),
        ("sampled steps", _steps_line(steps)),
        (
            "attempts",
            f'<span class="warn">{esc(note)}</span>'
            if isinstance(note, str)
            else ("one" if report.get("attempts") else "not known (no timings)"),
        ),
        (
            "skipped input",
            f'<a href="#skipped">{len(skipped)} line{plural(len(skipped))} or file{plural(len(skipped))}</a>'
            if skipped
            else "none",
        ),
    ]
    table = "\n".join(f"<tr><th>{name}</th><td>{value}</td></tr>" for name, value in rows)
    return (
        '<section id="details">\n<h2>The run and its findings</h2>\n'
        f'<table class="facts">\n{table}\n</table>\n'
        f"{_stragglers(report, findings, hosts)}\n{_phases(report)}\n</section>"
    )


def _ranks_line(ranks: Mapping[str, Any]) -> str:
    if not ranks:
        return "none"
    world = as_int(ranks.get("world_size"))
    present = as_ints(ranks.get("present"))
    missing = as_ints(ranks.get("missing"))
    parts = [f"world size {world}" if world is not None else "world size not known"]
    parts.append(
        f"{len(present)} present ({esc(number_ranges(present))})" if present else "none present"
    )
    line = ", ".join(parts)
    if missing:
        line += (
            f'; <span class="warn">{len(missing)} missing: rank{plural(len(missing))} '
            f"{esc(number_ranges(missing))} (no data from {'it' if len(missing) == 1 else 'them'})</span>"
        )
    else:
        line += "; none missing"
    return line


def _hosts_line(hosts: dict[str, str]) -> str:
    if not hosts:
        return "none"
    by_host: dict[str, list[int]] = {}
    for rank, host in hosts.items():
        number = int_of(rank)
        if number is not None:
            by_host.setdefault(host, []).append(number)
    rows = "".join(
        f"<tr><td>{esc(host)}</td><td>{esc(number_ranges(sorted(ranks)))}</td></tr>"
        for host, ranks in sorted(by_host.items(), key=lambda item: min(item[1]))
    )
    count = len(by_host)
    return (
        f"<details><summary>{count} host{plural(count)}</summary>"
        f'<table class="plain"><tr><th>host</th><th>ranks</th></tr>{rows}</table></details>'
    )


def _steps_line(steps: Mapping[str, Any]) -> str:
    sampled = as_ints(steps.get("sampled"))
    if not sampled:
        return "none"
    first = as_int(steps.get("first"))
    last = as_int(steps.get("last"))
    line = f"{len(sampled)}"
    if len(sampled) > 1:
        gaps = {b - a for a, b in itertools.pairwise(sampled)}
        every = f", every {gaps.pop()}" if len(gaps) == 1 else ""
        line += f", steps {sampled[0]} to {sampled[-1]}{every}"
    else:
        line += f", step {sampled[0]}"
    if first is not None and last is not None:
        line += f" (the run's timings cover steps {first} to {last})"
    return line


def _finding_words(report: Mapping[str, Any], findings: list[Mapping[str, Any]]) -> str:
    """The stragglers' sentences; or that there is none, with the rule; or no analysis."""
    stragglers = as_map(report.get("stragglers"))
    if not stragglers:
        return '<p class="none">No straggler analysis: no timings were read.</p>'
    sentences = [as_text(s) for s in as_list(stragglers.get("summary")) if as_text(s)]
    if not sentences and not findings:
        return (
            f'<p class="clean">No straggler found with the thresholds used ({_rule(stragglers)}).</p>'
            + _clock(stragglers)
        )
    words = "".join(f"<li>{esc(s)}</li>" for s in sentences)
    if not words:  # findings the sentences did not say (a report from elsewhere)
        n = len(findings)
        words = f"<li>{n} finding{plural(n)}: see the table below</li>"
    return f'<ul class="findings">{words}</ul>' + _clock(stragglers)


def _clock(stragglers: Mapping[str, Any]) -> str:
    """Which clock the phases were read on (on a GPU, host time is launch time), and the
    notes: ranks configured apart, what the causes could not use."""
    clock = as_text(stragglers.get("clock"))
    out = f'<p class="note clock">Read on {esc(clock)}.</p>' if clock else ""
    notes = [as_text(n) for n in as_list(stragglers.get("notes")) if as_text(n)]
    return out + "".join(f'<p class="note">Note: {esc(n)}</p>' for n in notes)


def _rule(stragglers: Mapping[str, Any]) -> str:
    threshold = as_float(stragglers.get("threshold"))
    persistence = as_float(stragglers.get("min_persistence"))
    reference = as_text(stragglers.get("reference")) or "median"
    return (
        f"a rank counts as slow in a phase when it is at least {HTML.pct_over(threshold)} slower than the "
        f"{esc(reference)} on at least {HTML.share(persistence)} of sampled steps"
        if threshold is not None and persistence is not None
        else "thresholds not given"
    )


def _stragglers(
    report: Mapping[str, Any], findings: list[Mapping[str, Any]], hosts: dict[str, str]
) -> str:
    """The findings' rule, causes, costs and table (their sentences lead the page)."""
    stragglers = as_map(report.get("stragglers"))
    head = "<h3>Stragglers</h3>\n"
    if not stragglers:
        return (
            head
            + '<p class="none">none: this report has no straggler analysis (no timings read).</p>'
        )
    reference = as_text(stragglers.get("reference")) or "median"
    out = head + f'<p class="rule">Rule: {_rule(stragglers)}.</p>\n'
    out += _costs(stragglers)  # in the order `rankscope stragglers` says them
    # A slow group's ranks are its one finding: their own rows are in the JSON.
    grouped = in_groups(stragglers)
    shown = [
        f
        for f in findings
        if not (f.get("role") == "slow" and (f.get("rank"), f.get("phase")) in grouped)
    ]
    out += _causes(shown) + evidence_list(shown)
    if shown:
        out += _findings_table(shown, hosts, reference)
    if len(shown) < len(findings):
        out += (
            f'<p class="more">{len(findings) - len(shown)} rows of the slow groups\' ranks, '
            "one by one: <code>rankscope report --json</code></p>\n"
        )
    return out


def _causes(findings: list[Mapping[str, Any]]) -> str:
    """Why each slow rank is slow, with its evidence (the first few)."""
    lines: list[str] = []
    for f in findings:
        cause = as_map(f.get("cause"))
        text = as_text(cause.get("text"))
        if text and len(lines) < _MAX_CAUSES:
            lines.append(
                f"<li>why rank {esc(as_text(f.get('rank')))} is slow in "
                f"{esc(as_text(f.get('phase')))}: {esc(text)}</li>"
            )
    return f'<ul class="causes">{"".join(lines)}</ul>\n' if lines else ""


_MAX_CAUSES = 8


def _costs(stragglers: Mapping[str, Any]) -> str:
    """What fixing the findings would save: all of them, then per host (a few)."""
    cost = as_map(stragglers.get("cost"))
    if not cost:
        return ""
    lines = cost_lines(stragglers)
    items = "".join(f"<li>{esc(line)}</li>" for line in lines)
    return (
        f'<ul class="cost">{items}</ul>\n<p class="note">Estimated from the phase timings: each '
        "fix puts the rank's phase at the other ranks' median (balancing an uneven phase keeps "
        "each rank's own noise); the ranks that wait gain what the rank or group they wait "
        "for saves (docs/analysis.md, Cost).</p>\n"
    )


def _findings_table(
    findings: list[Mapping[str, Any]], hosts: dict[str, str], reference: str
) -> str:
    left = len(findings) - _MAX_FINDINGS
    more = (
        f'\n<p class="note">and {left} more finding{plural(left)}, not listed here (the slow '
        "ranks come first; `rankscope stragglers --all` or `--json` has them all).</p>"
        if left > 0
        else ""
    )
    rows = []
    # GPU-hours where the ranks ran on GPUs, rank-hours (ranks x hours) otherwise.
    gpus = any(as_map(f.get("cost")).get("gpu_hours_saved") is not None for f in findings)
    unit = "gpu_hours_saved" if gpus else "rank_hours_saved"
    for f in findings[:_MAX_FINDINGS]:
        rank = as_int(f.get("rank"))
        host = hosts.get(str(rank), "")
        waits = as_ints(f.get("waits_for"))
        role = as_text(f.get("role"))
        cost = as_map(f.get("cost"))
        rows.append(
            f'<tr class="{"slow" if role == "slow" else ""}">'
            f"<td>{esc(as_text(rank)) or HTML.missing}</td>"
            f"<td>{esc(host) or HTML.missing}</td>"
            f"<td>{esc(as_text(f.get('phase'))) or HTML.missing}</td>"
            f"<td>{esc(as_text(f.get('kind'))) or HTML.missing}</td>"
            f"<td>{esc(role) or HTML.missing}</td>"
            f'<td class="num">{HTML.ratio(as_float(f.get("median_ratio")))}</td>'
            f'<td class="num">{HTML.share(as_float(f.get("share_above")))}</td>'
            f'<td class="num">{HTML.ms_text(as_float(f.get("lost_ms")))}</td>'
            f'<td class="num">{esc(as_text(f.get("steps"))) or HTML.missing}</td>'
            f'<td class="num">{esc(as_text(f.get("since_step"))) or HTML.missing}</td>'
            f"<td>{esc(number_ranges(waits)) if waits else ''}</td>"
            f'<td class="num">{_saves(cost, as_map(f.get("cost_of")))}</td>'
            f'<td class="num">{_priced(cost, HTML.speedup, "speedup")}</td>'
            f'<td class="num">{_priced(cost, HTML.number, unit)}</td></tr>'
        )
    return (
        '<div class="table-wrap"><table class="data">\n<tr><th>rank</th><th>host</th>'
        f"<th>phase</th><th>kind</th><th>role</th><th>time vs the {esc(_reference_rank(reference))} (typical step)</th>"
        "<th>steps above threshold</th><th>time lost</th><th>steps</th><th>since step</th>"
        "<th>waits for ranks</th><th>a fix saves per step</th><th>speedup if fixed</th>"
        f"<th>{'GPU' if gpus else 'rank'}-hours saved so far</th></tr>\n"
        + "\n".join(rows)
        + "\n</table></div>"
        + more
    )


def _saves(cost: Mapping[str, Any], cost_of: Mapping[str, Any]) -> str:
    """A fix's saving per step; for a rank that waits, whose fix it is (priced there)."""
    if not cost and cost_of and "group" in cost_of:
        return f"{esc(as_text(cost_of.get('group')))}'s fix"
    if not cost and cost_of:
        return f"rank {esc(as_text(cost_of.get('rank')))}'s fix"
    return HTML.ms_text(as_float(cost.get("step_ms_saved")))


def _priced(cost: Mapping[str, Any], figure: Callable[[object], str], key: str) -> str:
    """A figure of the row's cost; blank on a waiting rank's row, which has none: its fix
    is the rank it waits for, priced on that rank's row (core/_format.py)."""
    return figure(cost.get(key)) if cost else ""


def _reference_rank(reference: str) -> str:
    return "median rank" if reference == "median" else reference


def _phases(report: Mapping[str, Any]) -> str:
    phases = [as_map(p) for p in as_list(report.get("phases"))]
    head = "<h3>Phases</h3>\n"
    if not phases:
        return head + '<p class="none">none</p>'
    rows = "\n".join(
        f"<tr><td>{esc(as_text(p.get('name'))) or HTML.missing}</td><td>{esc(as_text(p.get('kind'))) or HTML.missing}</td>"
        f"<td>{esc(as_text(p.get('clock'))) or HTML.missing}</td>"
        f'<td class="num">{esc(as_text(p.get("records"))) or HTML.missing}</td>'
        f'<td class="num">{HTML.ms_text(as_float(p.get("median_ms")))}</td>'
        f'<td class="num">{HTML.ms_text(as_float(p.get("p90_ms")))}</td></tr>'
        for p in phases
    )
    left = as_float(report.get("phases_left_out")) or 0
    more = (
        f" The run has {int(left)} more phases, shorter and without a finding: "
        "<code>rankscope sql RUN_DIR</code> holds every one."
        if left > 0
        else ""
    )
    return (
        head + '<p class="note">Across all ranks and sampled steps; "step" is the time between '
        f"step() calls.{more}</p>\n"
        '<table class="data">\n<tr><th>phase</th><th>kind</th><th>clock</th><th>records</th><th>median</th>'
        f"<th>90th percentile</th></tr>\n{rows}\n</table>"
    )


def _heatmap(
    report: Mapping[str, Any], findings: list[Mapping[str, Any]], hosts: dict[str, str]
) -> tuple[str, dict[str, Any] | None]:
    head = '<section id="heatmap">\n<h2>Heatmap: rank x sampled step</h2>\n'
    heatmaps = as_map(report.get("heatmaps"))
    ranks = as_ints(heatmaps.get("ranks"))
    steps = as_ints(heatmaps.get("steps"))
    metrics = [as_map(m) for m in as_list(heatmaps.get("metrics"))]
    if not ranks or not steps or not metrics:
        return head + '<p class="none">none (no timings)</p>\n</section>', None
    rows = [as_ints(row) for row in as_list(heatmaps.get("rows"))] or [[r] for r in ranks]
    rows = [row for row in rows if row] or [[r] for r in ranks]
    grouped = heatmaps.get("row_is") == "slowest"
    # step time first, then the phases in the report's order
    metrics.sort(key=lambda m: m.get("name") != "step")
    prepared = [_prepare_metric(m, len(rows), len(steps)) for m in metrics]
    # It opens on the first finding's phase: step time is alike on every rank of a
    # synchronous job, so it shows noise; the slow phase shows the slow rank.
    first = next((f for f in findings if f.get("role") == "slow"), findings[0] if findings else {})
    names = [as_text(m.get("name")) for m in metrics]
    chosen = names.index(as_text(first.get("phase"))) if first.get("phase") in names else 0
    options = "".join(
        f'<option value="{i}"{" selected" if i == chosen else ""}>{esc(_metric_label(m))}</option>'
        for i, m in enumerate(metrics)
    )
    marks: dict[int, list[str]] = {}
    own_rows = {row[0]: i for i, row in reversed(list(enumerate(rows))) if len(row) == 1}
    for f in findings:
        rank = as_int(f.get("rank"))
        # waiting ranks are the consequence; marking all of them would hide the cause
        if rank in own_rows and f.get("role") == "slow":
            ratio = HTML.ratio(as_float(f.get("median_ratio")))
            marks.setdefault(own_rows[rank], []).append(
                f"slow in {as_text(f.get('phase')) or 'a phase'} ({ratio})"
            )
    per = as_int(heatmaps.get("steps_per_column")) or 1
    data = {
        "labels": [number_ranges(row) for row in rows],
        "rows": [len(row) for row in rows],
        "steps": steps,
        "per": per,
        "hosts": [hosts.get(str(row[0]), "") if len(row) == 1 else "" for row in rows],
        "marks": [[row, "; ".join(texts)] for row, texts in sorted(marks.items())],
        "clip": [round(_CLIP[0] * 100), round(_CLIP[1] * 100)],
        "metrics": prepared,
    }
    columns = (
        f"{len(steps)} columns, each the mean of {per} consecutive sampled steps"
        if per > 1
        else f"{len(steps)} sampled step{plural(len(steps))}"
    )
    if grouped:
        alone = [row[0] for row in rows if len(row) == 1]
        size = max(len(row) for row in rows)
        shown = (
            f"{len(rows)} rows for {len(ranks)} ranks x {columns}: "
            + (
                f"{esc(format_ranks(alone))}, named by the findings, on rows of their own at the top, then "
                if alone
                else ""
            )
            + f"groups of up to {size} consecutive ranks, each cell the slowest rank of its group at that step"
        )
    else:
        shown = f"{len(ranks)} rank{plural(len(ranks))} x {columns}; each cell is one rank"
    body = (
        f'<p class="note">{shown}. Dark is fast, yellow is slow; grey cells have no record. '
        '<span class="mark-key"></span> marks a rank the findings name as slow. '
        "It opens on the phase of the first finding; pick another metric below. "
        "Hover a cell for its value.</p>\n"
        '<div class="controls"><label>metric <select id="metric">'
        f"{options}</select></label>\n"
        '<div id="legend" class="legend"><span class="lo"></span><span class="bar"></span>'
        '<span class="hi"></span><span class="missing-key"></span><span>no record</span></div></div>\n'
        '<p id="scale" class="note"></p>\n'
        '<div class="canvas-wrap"><canvas id="heatmap-canvas" width="0" height="0"></canvas></div>\n'
        "</section>"
    )
    return head + body, data


def _prepare_metric(metric: Mapping[str, Any], n_ranks: int, n_steps: int) -> dict[str, Any]:
    rows = as_list(metric.get("values"))
    flat: list[float | None] = []
    for i in range(n_ranks):
        row = as_list(rows[i]) if i < len(rows) else []
        # rows shorter or longer than the step axis are padded with gaps or cut
        flat.extend(as_float(row[j]) if j < len(row) else None for j in range(n_steps))
    present = sorted(v for v in flat if v is not None)
    out: dict[str, Any] = {
        "name": as_text(metric.get("name")),
        "label": _metric_label(metric),
        "unit": as_text(metric.get("unit")),
        "values": _Raw("[" + ",".join(_short_json(v) for v in flat) + "]"),
    }
    if present:
        out.update(
            min=present[0],
            max=present[-1],
            lo=present[round(_CLIP[0] * (len(present) - 1))],
            hi=present[round(_CLIP[1] * (len(present) - 1))],
        )
    return out


def _metric_label(metric: Mapping[str, Any]) -> str:
    return as_text(metric.get("label")) or as_text(metric.get("name")) or "unnamed metric"


def _skipped(report: Mapping[str, Any]) -> str:
    head = '<section id="skipped">\n<h2>Skipped input</h2>\n'
    skipped = [as_text(s) for s in as_list(report.get("skipped"))]
    if not skipped:
        return head + '<p class="none">Nothing was skipped.</p>\n</section>'
    listed = "\n".join(f"<li><code>{esc(s)}</code></li>" for s in skipped[:_MAX_SKIPPED])
    more = (
        f'<p class="note">and {len(skipped) - _MAX_SKIPPED} more, not listed here '
        "(`rankscope report --json` has them all).</p>"
        if len(skipped) > _MAX_SKIPPED
        else ""
    )
    n = len(skipped)
    return (
        head
        + f'<details><summary class="warn">{n} input line{plural(n)} or file{plural(n)} skipped '
        f"(not counted in the analysis)</summary>\n<ol>\n{listed}\n</ol>{more}</details>\n</section>"
    )


# ---------------------------------------------------------------------------- embedded data


class _Raw(str):
    """JSON text already encoded (the big value arrays, built in one join)."""


def _short_json(value: float | None) -> str:
    # 4 significant digits: the colour needs far less, the tooltip is read by people
    return "null" if value is None else f"{value:.4g}"


def _encode(value: object) -> str:
    if isinstance(value, _Raw):
        return str(value)
    if value is None or isinstance(value, (bool, str)):
        # printable's backslash is escaped here: one put in the JSON text after would not be
        return json.dumps(printable(value) if isinstance(value, str) else value, ensure_ascii=False)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _short_json(value if math.isfinite(value) else None)
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{_encode(str(k))}:{_encode(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_encode(v) for v in value) + "]"
    raise TypeError(f"cannot embed {type(value).__name__} in the report's data")


def _script_json(value: object) -> str:
    """JSON that cannot end its <script> element or start markup inside it."""
    text = _encode(value)
    for char, escape in (
        ("&", "\\u0026"),
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(char, escape)
    return text


# ---------------------------------------------------------------------------- page assets


def _asset(name: str) -> str:
    """A file of this package, as its element holds it: on a line of its own."""
    return "\n" + resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


# Read once, at import: this module is imported only to render. The heatmap draws one
# pixel a cell in an offscreen canvas, scaled up without smoothing, so 1024 x 200 cells
# cost one pass over an ImageData; text goes in with textContent only.
_CSS = _asset("report.css")
_SCRIPT = _asset("report.js")
_SCRIPT_SHA256 = base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()
# Only the page's own script may run, and nothing may be fetched: a name that slipped
# past escaping still could not execute or phone home.
_CSP = (
    f"default-src 'none'; script-src 'sha256-{_SCRIPT_SHA256}'; style-src 'unsafe-inline'; "
    "img-src data:; base-uri 'none'; form-action 'none'"
)
