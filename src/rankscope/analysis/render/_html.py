"""The HTML report: one self-contained file (inline CSS and JS, no network) that opens from file://.

Sections: summary (ranks, steps, stragglers in words, phases), a rank x sampled-step
heatmap drawn on a canvas, the per-rank phase breakdown, the top kernels per captured
window, and the input that was skipped. Every name from the data is HTML-escaped in the
page, the data embedded for the script is safe inside <script>, the script inserts text
with textContent only, and a Content-Security-Policy lets no other script run.

Size: the heatmap values dominate, at 4 significant digits about 6 bytes a cell: 1024
ranks x 200 steps x 7 metrics (step time and 6 phases) makes a 8.9 MB page (7.5 MB with
6 metrics); everything else is tens of kB. Rendering it takes about 2 s in Python;
Chromium opens it in about 0.3 s and draws a metric in under 20 ms.
"""

from __future__ import annotations

import base64
import hashlib
import html
import itertools
import json
import math
from collections.abc import Mapping
from typing import Any

from ..._text import number_ranges

__all__ = ["render_html"]

_TOP_KERNELS = 15
_TOP_RANKS = 32  # breakdown rows shown before stragglers, the median and the fastest rank
_MAX_SKIPPED = 1000  # skipped-input lines listed; the count is always given in full
# The heatmap's colours span these percentiles, so a warm-up step (3% of the cells at 30
# sampled steps) cannot wash out the rest; values beyond take the end colours (a straggler
# included: it stays the brightest) and the legend says so.
_CLIP = (0.05, 0.95)

# Stacked-bar colours by phase kind, so compute, communication and data read at a glance;
# phases of the same kind take the next shade.
_KIND_COLOURS = {
    "compute": ("#2c5d92", "#5b8fc7", "#9cc0e6", "#1b3a5c"),
    "comm": ("#d9661f", "#f2a154", "#a3470f"),
    "data": ("#3a8a3e", "#7cc47f", "#25602a"),
    "io": ("#7b4fa0", "#b48fd3"),
}
_OTHER_COLOURS = ("#8c6d31", "#bd9e39", "#6b6b6b", "#a6a6a6", "#c46fa0")


def render_html(report: Mapping[str, Any]) -> str:
    """The whole page for a report (the plain JSON data of `rankscope report --json`).

    Any part may be absent, empty or malformed: that part reads "none" and the rest renders.
    """
    run_dir = _text(report.get("run_dir")) or "(run directory not given)"
    findings = [_map(f) for f in _seq(_map(report.get("stragglers")).get("findings"))]
    hosts = {str(k): _text(v) for k, v in _map(_map(report.get("ranks")).get("hosts")).items()}
    heatmap_html, heatmap_data = _heatmap(report, findings, hosts)
    data = _script_json({"heatmap": heatmap_data})
    body = "\n".join(
        [
            _header(report, run_dir),
            _summary(report, findings, hosts),
            heatmap_html,
            _breakdown(report, findings),
            _kernels(report),
            _skipped(report),
        ]
    )
    return (
        "<!doctype html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<link rel="icon" href="data:,">\n'
        f"<title>rankscope report: {_esc(run_dir)}</title>\n"
        f"<style>{_CSS}</style>\n</head>\n<body>\n{body}\n"
        '<div id="tip" class="tip" hidden></div>\n'
        f'<script id="rankscope-data" type="application/json">{data}</script>\n'
        f"<script>{_SCRIPT}</script>\n</body>\n</html>\n"
    )


# ---------------------------------------------------------------------------- sections


def _header(report: Mapping[str, Any], run_dir: str) -> str:
    generated = _text(report.get("generated_at"))
    version = report.get("v")
    meta = [f"generated {_esc(generated)}" if generated else "generation time not given"]
    if version is not None:
        meta.append(f"report schema v{_esc(_text(version))}")
    return (
        "<header>\n<h1>rankscope report</h1>\n"
        f'<p class="run"><code>{_esc(run_dir)}</code></p>\n'
        f'<p class="meta">{" · ".join(meta)}</p>\n'
        '<nav><a href="#summary">summary</a><a href="#heatmap">heatmap</a>'
        '<a href="#breakdown">breakdown</a><a href="#kernels">kernels</a>'
        '<a href="#skipped">skipped input</a></nav>\n</header>'
    )


def _summary(
    report: Mapping[str, Any], findings: list[Mapping[str, Any]], hosts: dict[str, str]
) -> str:
    ranks = _map(report.get("ranks"))
    steps = _map(report.get("steps"))
    skipped = _seq(report.get("skipped"))
    rows = [
        ("ranks", _ranks_line(ranks)),
        ("hosts", _hosts_line(hosts)),
        ("sampled steps", _steps_line(steps)),
        (
            "skipped input",
            f'<a href="#skipped">{len(skipped)} line{_s(len(skipped))} or file{_s(len(skipped))}</a>'
            if skipped
            else "none",
        ),
    ]
    table = "\n".join(f"<tr><th>{name}</th><td>{value}</td></tr>" for name, value in rows)
    return (
        '<section id="summary">\n<h2>Summary</h2>\n'
        f'<table class="facts">\n{table}\n</table>\n'
        f"{_stragglers(report, findings, hosts)}\n{_phases(report)}\n</section>"
    )


def _ranks_line(ranks: Mapping[str, Any]) -> str:
    if not ranks:
        return "none"
    world = _int(ranks.get("world_size"))
    present = _ints(ranks.get("present"))
    missing = _ints(ranks.get("missing"))
    parts = [f"world size {world}" if world is not None else "world size not known"]
    parts.append(
        f"{len(present)} present ({_esc(number_ranges(present))})" if present else "none present"
    )
    line = ", ".join(parts)
    if missing:
        line += (
            f'; <span class="warn">{len(missing)} missing: rank{_s(len(missing))} '
            f"{_esc(number_ranges(missing))} (no data from {'it' if len(missing) == 1 else 'them'})</span>"
        )
    else:
        line += "; none missing"
    return line


def _hosts_line(hosts: dict[str, str]) -> str:
    if not hosts:
        return "none"
    by_host: dict[str, list[int]] = {}
    for rank, host in hosts.items():
        number = _int_text(rank)
        if number is not None:
            by_host.setdefault(host, []).append(number)
    rows = "".join(
        f"<tr><td>{_esc(host)}</td><td>{_esc(number_ranges(sorted(ranks)))}</td></tr>"
        for host, ranks in sorted(by_host.items(), key=lambda item: min(item[1]))
    )
    count = len(by_host)
    return (
        f"<details><summary>{count} host{_s(count)}</summary>"
        f'<table class="plain"><tr><th>host</th><th>ranks</th></tr>{rows}</table></details>'
    )


def _steps_line(steps: Mapping[str, Any]) -> str:
    sampled = _ints(steps.get("sampled"))
    if not sampled:
        return "none"
    first = _int(steps.get("first"))
    last = _int(steps.get("last"))
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


def _stragglers(
    report: Mapping[str, Any], findings: list[Mapping[str, Any]], hosts: dict[str, str]
) -> str:
    stragglers = _map(report.get("stragglers"))
    head = "<h3>Stragglers</h3>\n"
    if not stragglers:
        return (
            head
            + '<p class="none">none: this report has no straggler analysis (no timings read).</p>'
        )
    sentences = [_text(s) for s in _seq(stragglers.get("summary")) if _text(s)]
    threshold = _num(stragglers.get("threshold"))
    persistence = _num(stragglers.get("min_persistence"))
    reference = _text(stragglers.get("reference")) or "median"
    rule = (
        f"a rank counts as slow in a phase when it is at least {_pct_over(threshold)} slower than the "
        f"{_esc(reference)} on at least {_share(persistence)} of sampled steps"
        if threshold is not None and persistence is not None
        else "thresholds not given"
    )
    if not sentences and not findings:
        return head + (
            f'<p class="clean">No straggler found with the thresholds used ({rule}).</p>'
        )
    words = "".join(f"<li>{_esc(s)}</li>" for s in sentences)
    out = head + (f'<ul class="findings">{words}</ul>\n' if words else "")
    out += f'<p class="rule">Rule: {rule}.</p>\n'
    if findings:
        out += _findings_table(findings, hosts, reference)
    return out


def _findings_table(
    findings: list[Mapping[str, Any]], hosts: dict[str, str], reference: str
) -> str:
    rows = []
    for f in findings:
        rank = _int(f.get("rank"))
        host = hosts.get(str(rank), "")
        waits = _ints(f.get("waits_for"))
        role = _text(f.get("role"))
        rows.append(
            f'<tr class="{"slow" if role == "slow" else ""}">'
            f"<td>{_esc(_text(rank) if rank is not None else 'none')}</td>"
            f"<td>{_esc(host) or 'none'}</td>"
            f"<td>{_esc(_text(f.get('phase'))) or 'none'}</td>"
            f"<td>{_esc(_text(f.get('kind'))) or 'none'}</td>"
            f"<td>{_esc(role) or 'none'}</td>"
            f'<td class="num">{_pct_over(_num(f.get("median_ratio")), signed=True)}</td>'
            f'<td class="num">{_share(_num(f.get("share_above")))}</td>'
            f'<td class="num">{_ms(_num(f.get("lost_ms")))}</td>'
            f'<td class="num">{_esc(_text(f.get("steps"))) or "none"}</td>'
            f'<td class="num">{_esc(_text(f.get("since_step"))) or "none"}</td>'
            f"<td>{_esc(number_ranges(waits)) if waits else ''}</td></tr>"
        )
    return (
        '<table class="data">\n<tr><th>rank</th><th>host</th><th>phase</th><th>kind</th>'
        f"<th>role</th><th>slower than the {_esc(reference)} (median)</th><th>steps above threshold</th>"
        "<th>time lost</th><th>steps</th><th>since step</th><th>waits for ranks</th></tr>\n"
        + "\n".join(rows)
        + "\n</table>"
    )


def _phases(report: Mapping[str, Any]) -> str:
    phases = [_map(p) for p in _seq(report.get("phases"))]
    head = "<h3>Phases</h3>\n"
    if not phases:
        return head + '<p class="none">none</p>'
    rows = "\n".join(
        f"<tr><td>{_esc(_text(p.get('name'))) or 'none'}</td><td>{_esc(_text(p.get('kind'))) or 'none'}</td>"
        f'<td class="num">{_esc(_text(p.get("records"))) or "none"}</td>'
        f'<td class="num">{_ms(_num(p.get("median_ms")))}</td>'
        f'<td class="num">{_ms(_num(p.get("p90_ms")))}</td></tr>'
        for p in phases
    )
    return (
        head + '<p class="note">Across all ranks and sampled steps; "step" is the time between '
        "step() calls.</p>\n"
        '<table class="data">\n<tr><th>phase</th><th>kind</th><th>records</th><th>median</th>'
        f"<th>90th percentile</th></tr>\n{rows}\n</table>"
    )


def _heatmap(
    report: Mapping[str, Any], findings: list[Mapping[str, Any]], hosts: dict[str, str]
) -> tuple[str, dict[str, Any] | None]:
    head = '<section id="heatmap">\n<h2>Heatmap: rank x sampled step</h2>\n'
    heatmaps = _map(report.get("heatmaps"))
    ranks = _ints(heatmaps.get("ranks"))
    steps = _ints(heatmaps.get("steps"))
    metrics = [_map(m) for m in _seq(heatmaps.get("metrics"))]
    if not ranks or not steps or not metrics:
        return head + '<p class="none">none (no timings)</p>\n</section>', None
    # step time first, then the phases in the report's order
    metrics.sort(key=lambda m: m.get("name") != "step")
    prepared = [_prepare_metric(m, len(ranks), len(steps)) for m in metrics]
    options = "".join(
        f'<option value="{i}">{_esc(_metric_label(m))}</option>' for i, m in enumerate(metrics)
    )
    row_of = {rank: i for i, rank in enumerate(ranks)}
    marks: dict[int, list[str]] = {}
    for f in findings:
        rank = _int(f.get("rank"))
        # waiting ranks are the consequence; marking all of them would hide the cause
        if rank in row_of and f.get("role") != "waits":
            what = f"{_text(f.get('role')) or 'flagged'} in {_text(f.get('phase')) or 'a phase'}"
            ratio = _num(f.get("median_ratio"))
            marks.setdefault(row_of[rank], []).append(
                what + (f" ({_pct_over(ratio, signed=True)})" if ratio is not None else "")
            )
    data = {
        "ranks": ranks,
        "steps": steps,
        "hosts": [hosts.get(str(rank), "") for rank in ranks],
        "marks": [[row, "; ".join(texts)] for row, texts in sorted(marks.items())],
        "clip": [round(_CLIP[0] * 100), round(_CLIP[1] * 100)],
        "metrics": prepared,
    }
    shown = f"{len(ranks)} rank{_s(len(ranks))} x {len(steps)} sampled step{_s(len(steps))}"
    body = (
        f'<p class="note">{shown}; each cell is one rank at one sampled step. '
        "Dark is fast, yellow is slow; grey cells have no record. "
        '<span class="mark-key"></span> marks a straggler rank from the findings. '
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
    rows = _seq(metric.get("values"))
    flat: list[float | None] = []
    for i in range(n_ranks):
        row = _seq(rows[i]) if i < len(rows) else []
        # rows shorter or longer than the step axis are padded with gaps or cut
        flat.extend(_num(row[j]) if j < len(row) else None for j in range(n_steps))
    present = sorted(v for v in flat if v is not None)
    out: dict[str, Any] = {
        "name": _text(metric.get("name")),
        "label": _metric_label(metric),
        "unit": _text(metric.get("unit")),
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
    return _text(metric.get("label")) or _text(metric.get("name")) or "unnamed metric"


def _breakdown(report: Mapping[str, Any], findings: list[Mapping[str, Any]]) -> str:
    head = '<section id="breakdown">\n<h2>Per-rank phase breakdown</h2>\n'
    bd = _map(report.get("breakdown"))
    ranks = _ints(bd.get("ranks"))
    phases = [_text(p) for p in _seq(bd.get("phases"))]
    kinds = [_text(k) for k in _seq(bd.get("kinds"))]
    matrix = _seq(bd.get("median_ms"))
    if not ranks or not phases:
        return head + '<p class="none">none (no timings)</p>\n</section>'
    kinds = (kinds + [""] * len(phases))[: len(phases)]
    rows: list[_RankRow] = []
    for i, rank in enumerate(ranks):
        cells = _seq(matrix[i]) if i < len(matrix) else []
        values = [_num(cells[j]) if j < len(cells) else None for j in range(len(phases))]
        if any(v is not None for v in values):
            rows.append(_RankRow(rank, values, kinds))
    if not rows:
        return head + '<p class="none">none (no phase times for any rank)</p>\n</section>'
    # Waiting for a straggler shows up as comm time on every other rank, so the totals of
    # a synchronous job are all alike; the time outside comm phases is what tells them apart.
    rows.sort(key=lambda row: (-row.busy, row.rank))
    median = rows[len(rows) // 2]
    slow: dict[int, list[str]] = {}
    for f in findings:
        flagged = _int(f.get("rank"))
        if flagged is not None and f.get("role") == "slow":
            slow.setdefault(flagged, []).append(_text(f.get("phase")))
    if len(rows) <= _TOP_RANKS + 2:
        shown = [(row, "") for row in rows]
        what = f"All {len(rows)} rank{_s(len(rows))}"
    else:
        top = rows[:_TOP_RANKS]
        shown = [(row, "") for row in top]
        shown += [(row, "straggler") for row in rows[_TOP_RANKS:] if row.rank in slow]
        shown += [(median, "median"), (rows[-1], "fastest")]
        what = (
            f"The {_TOP_RANKS} slowest of {len(rows)} ranks, any straggler rank from the "
            "findings, then the median and the fastest rank"
        )
    what += (
        ", slowest first by the time outside communication phases (comm time includes "
        "waiting for other ranks, so a slow rank can have less of it)."
    )
    if len(rows) < len(ranks):
        without = len(ranks) - len(rows)
        what += f" {without} rank{_s(without)} without phase times not shown."
    colours = _phase_colours(kinds)
    widest = max(row.total for row, _ in shown) or 1.0
    lines = []
    for row, tag in shown:
        segments = "".join(
            f'<span style="width:{v / widest * 100:.3f}%;background:{colours[j]}" '
            f'title="{_esc(phases[j])}: {_ms(v)}"></span>'
            for j, v in enumerate(row.values)
            if v is not None and v > 0
        )
        label = f"rank {row.rank}" + (f' <span class="tag">{tag}</span>' if tag else "")
        if row.rank in slow:
            label += f' <span class="slow-tag">slow: {_esc(", ".join(slow[row.rank]))}</span>'
        vs = f"{(row.busy / median.busy - 1) * 100:+.0f}%" if median.busy > 0 else "none"
        lines.append(
            f'<tr class="{"sep" if tag == "median" else ""}"><td class="rank">{label}</td>'
            f'<td class="barcell"><div class="bar">{segments}</div></td>'
            f'<td class="num">{_ms(row.busy)}</td><td class="num">{vs}</td>'
            f'<td class="num">{_ms(row.total)}</td></tr>'
        )
    legend = "".join(
        f'<span class="key"><span class="swatch" style="background:{colours[j]}"></span>'
        f"{_esc(phase)}{f' ({_esc(kinds[j])})' if kinds[j] else ''}</span>"
        for j, phase in enumerate(phases)
    )
    return (
        head + f'<p class="note">{what} Each bar stacks the median time of each phase over the '
        "sampled steps (a sum of medians, so it need not equal the median step time). "
        "Hover a segment for its phase and time.</p>\n"
        f'<div class="keys">{legend}</div>\n'
        '<table class="breakdown">\n<tr><th>rank</th><th></th><th>outside comm</th>'
        "<th>vs median rank</th><th>all phases</th></tr>\n"
        + "\n".join(lines)
        + "\n</table>\n</section>"
    )


class _RankRow:
    """One rank's phase medians, with the sums the breakdown sorts and scales by."""

    def __init__(self, rank: int, values: list[float | None], kinds: list[str]) -> None:
        self.rank = rank
        self.values = [None if v is None else max(v, 0.0) for v in values]
        self.total = sum(v for v in self.values if v is not None)
        busy = [
            v
            for v, kind in zip(self.values, kinds, strict=True)
            if v is not None and kind != "comm"
        ]
        # a rank timed only in comm phases still gets an order
        self.busy = sum(busy) if busy else self.total


def _phase_colours(kinds: list[str]) -> list[str]:
    used: dict[str, int] = {}
    colours = []
    for kind in kinds:
        palette = _KIND_COLOURS.get(kind, _OTHER_COLOURS)
        key = kind if kind in _KIND_COLOURS else ""
        colours.append(palette[used.get(key, 0) % len(palette)])
        used[key] = used.get(key, 0) + 1
    return colours


def _kernels(report: Mapping[str, Any]) -> str:
    head = '<section id="kernels">\n<h2>Top kernels per captured window</h2>\n'
    windows = [_map(w) for w in _seq(_map(report.get("kernels")).get("windows"))]
    if not windows:
        none = '<p class="none">none (no traces captured)</p>\n'
        return head + none + _other_captures(report) + "\n</section>"
    parts = [head]
    for i, window in enumerate(windows):
        items = [_map(item) for item in _seq(window.get("items"))]
        items.sort(key=lambda item: -(_num(item.get("total_us")) or 0.0))
        kind = _text(window.get("kind"))
        what = {"gpu_kernels": "GPU kernels", "cpu_ops": "top-level CPU ops (no GPU kernels)"}.get(
            kind, _esc(kind) or "items"
        )
        ranks = _ints(window.get("ranks"))
        title = (
            f"<code>{_esc(_text(window.get('window')) or 'unnamed window')}</code> · "
            f"rank{_s(len(ranks))} {_esc(number_ranges(ranks)) or 'not given'} · {what} · "
            f"total {_us(_num(window.get('total_us')))}"
        )
        top = items[:_TOP_KERNELS]
        if not top:
            table = '<p class="none">none</p>'
        else:
            rest = sum(_num(item.get("share")) or 0.0 for item in items[_TOP_KERNELS:])
            rows = "\n".join(_kernel_row(n + 1, item) for n, item in enumerate(top))
            table = (
                '<table class="data kernels">\n<tr><th>#</th><th>name</th><th>count</th>'
                "<th>total</th><th>mean</th><th>min</th><th>max</th><th>share</th></tr>\n"
                f"{rows}\n</table>"
            )
            if len(items) > len(top):
                table += (
                    f'<p class="note">Top {len(top)} of {len(items)} by total time; '
                    f"the other {len(items) - len(top)} take {_share(rest)}.</p>"
                )
        why = "".join(
            f'<p class="note">{_esc(_text(reason))}</p>\n' for reason in _seq(window.get("why"))
        )
        parts.append(
            f"<details{' open' if i < 4 else ''}><summary>{title}</summary>\n{why}{table}\n"
            "</details>"
        )
    parts.append(_other_captures(report))
    parts.append("</section>")
    return "\n".join(parts)


def _other_captures(report: Mapping[str, Any]) -> str:
    """nsys capture ranges and CUDA memory snapshots, where the run has any."""
    captures = _map(report.get("captures"))
    lines = []
    for entry in (_map(e) for e in _seq(captures.get("nsys"))):
        ranks = _ints(entry.get("ranks"))
        lines.append(
            f"<li>nsys capture range <code>{_esc(_text(entry.get('window')))}</code> · steps "
            f"{_esc(_text(entry.get('first')))}-{_esc(_text(entry.get('last')))} · "
            f"rank{_s(len(ranks))} {_esc(number_ranges(ranks))}</li>"
        )
    for entry in (_map(e) for e in _seq(captures.get("memory"))):
        ranks = _ints(entry.get("ranks"))
        size = (_num(entry.get("bytes")) or 0.0) / 1e6
        lines.append(
            f"<li>CUDA memory snapshots <code>{_esc(_text(entry.get('path')))}</code> · "
            f"rank{_s(len(ranks))} {_esc(number_ranges(ranks))} · {size:.1f} MB "
            "(open at https://pytorch.org/memory_viz)</li>"
        )
    if not lines:
        return ""
    return "<h3>Also captured</h3>\n<ul>\n" + "\n".join(lines) + "\n</ul>"


def _kernel_row(n: int, item: Mapping[str, Any]) -> str:
    name = _esc(_text(item.get("name")) or "unnamed")
    share = _num(item.get("share"))
    bar = (
        f'<span class="sharebar" style="width:{min(max(share, 0.0), 1.0) * 60:.1f}px"></span>'
        if share
        else ""
    )
    return (
        f'<tr><td class="num">{n}</td><td class="name" title="{name}">{name}</td>'
        f'<td class="num">{_esc(_text(item.get("count"))) or "none"}</td>'
        f'<td class="num">{_us(_num(item.get("total_us")))}</td>'
        f'<td class="num">{_us(_num(item.get("mean_us")))}</td>'
        f'<td class="num">{_us(_num(item.get("min_us")))}</td>'
        f'<td class="num">{_us(_num(item.get("max_us")))}</td>'
        f'<td class="num share">{bar}{_share(share)}</td></tr>'
    )


def _skipped(report: Mapping[str, Any]) -> str:
    head = '<section id="skipped">\n<h2>Skipped input</h2>\n'
    skipped = [_text(s) for s in _seq(report.get("skipped"))]
    if not skipped:
        return head + '<p class="none">Nothing was skipped.</p>\n</section>'
    listed = "\n".join(f"<li><code>{_esc(s)}</code></li>" for s in skipped[:_MAX_SKIPPED])
    more = (
        f'<p class="note">and {len(skipped) - _MAX_SKIPPED} more, not listed here '
        "(`rankscope report --json` has them all).</p>"
        if len(skipped) > _MAX_SKIPPED
        else ""
    )
    n = len(skipped)
    return (
        head + f'<details><summary class="warn">{n} input line{_s(n)} or file{_s(n)} skipped '
        f"(not counted in the analysis)</summary>\n<ol>\n{listed}\n</ol>{more}</details>\n</section>"
    )


# ---------------------------------------------------------------------------- data helpers


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _seq(value: object) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else []


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _int_text(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def _ints(value: object) -> list[int]:
    return [i for i in (_int(v) for v in _seq(value)) if i is not None]


def _text(value: object) -> str:
    return "" if value is None else str(value)


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _s(n: int) -> str:
    return "" if n == 1 else "s"


# ---------------------------------------------------------------------------- number text


def _short(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"


def _ms(value: float | None) -> str:
    if value is None:
        return "none"
    return f"{_short(value)} ms" if abs(value) < 1e3 else f"{_short(value / 1e3)} s"


def _us(value: float | None) -> str:
    if value is None:
        return "none"
    if abs(value) < 1e3:
        return f"{_short(value)} µs"
    return _ms(value / 1e3)


def _share(value: float | None) -> str:
    return "none" if value is None else f"{value * 100:.3g}%"


def _pct_over(ratio: float | None, signed: bool = False) -> str:
    if ratio is None:
        return "none"
    return f"{(ratio - 1) * 100:{'+' if signed else ''}.0f}%"


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
        return json.dumps(value, ensure_ascii=False)
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

_CSS = """
:root { color-scheme: light; --fg: #1d2330; --muted: #5f6b7a; --line: #dde2ea; --warn: #b3261e; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
  margin: 0 auto; padding: 16px 24px 48px; max-width: 1280px; }
h1 { font-size: 22px; margin: 0 0 2px; }
h2 { font-size: 18px; margin: 28px 0 8px; padding-top: 12px; border-top: 1px solid var(--line); }
h3 { font-size: 15px; margin: 18px 0 6px; }
code { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 12.5px; }
.run code { font-size: 14px; word-break: break-all; }
.meta, .note, .rule { color: var(--muted); margin: 4px 0; }
nav a { margin-right: 14px; }
.none { color: var(--muted); font-style: italic; }
.warn { color: var(--warn); }
.clean { background: #eaf6ec; border-left: 4px solid #3a8a3e; padding: 6px 10px; }
ul.findings { background: #fdf0ef; border-left: 4px solid var(--warn); margin: 6px 0;
  padding: 6px 10px 6px 28px; }
table { border-collapse: collapse; }
table.facts th { text-align: left; font-weight: 600; padding: 3px 16px 3px 0; vertical-align: top; }
table.facts td { padding: 3px 0; }
table.data, table.plain { margin: 6px 0; }
table.data th, table.data td, table.plain th, table.plain td { border-bottom: 1px solid var(--line);
  padding: 3px 10px 3px 0; text-align: left; vertical-align: top; }
.num { text-align: right !important; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.slow td { background: #fdf0ef; }
td.name { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; max-width: 640px;
  word-break: break-all; display: -webkit-box; -webkit-line-clamp: 3; -webkit-box-orient: vertical;
  overflow: hidden; }
.sharebar { display: inline-block; height: 9px; background: #5b8fc7; margin-right: 6px; }
details > summary { cursor: pointer; margin: 6px 0; }
select { max-width: 22em; }
.controls { display: flex; flex-wrap: wrap; align-items: center; gap: 18px; margin: 8px 0; }
.legend { display: flex; align-items: center; gap: 6px; color: var(--muted); }
.legend .bar { display: inline-block; width: 180px; height: 12px; border: 1px solid var(--line); }
.missing-key { display: inline-block; width: 12px; height: 12px; background: #d9d9d9;
  margin-left: 10px; }
.mark-key { display: inline-block; width: 5px; height: 11px; background: #e0301e;
  vertical-align: -1px; }
.canvas-wrap { overflow-x: auto; }
canvas { display: block; image-rendering: pixelated; }
.tip { position: fixed; z-index: 10; pointer-events: none; background: #1d2330; color: #fff;
  padding: 5px 8px; border-radius: 4px; font-size: 12px; white-space: pre; }
.keys { display: flex; flex-wrap: wrap; gap: 4px 16px; margin: 6px 0; }
.swatch { display: inline-block; width: 12px; height: 12px; margin-right: 5px; vertical-align: -1px; }
table.breakdown { width: 100%; }
table.breakdown td, table.breakdown th { padding: 2px 8px 2px 0; text-align: left; }
table.breakdown td.rank { white-space: nowrap; width: 1%; }
td.barcell { width: 70%; }
.bar { display: flex; height: 14px; }
.bar span { height: 100%; border-right: 1px solid #fff; }
.tag { background: #eef1f5; color: var(--muted); border-radius: 3px; padding: 0 4px; font-size: 12px; }
.slow-tag { color: var(--warn); font-size: 12px; }
tr.sep td { border-top: 1px dashed var(--muted); }
ol code { word-break: break-all; }
"""

# The heatmap: one pixel a cell in an offscreen canvas, scaled up without smoothing,
# so 1024 x 200 cells cost one pass over an ImageData. Text goes in with textContent only.
_SCRIPT = """
(() => {
  "use strict";
  const data = JSON.parse(document.getElementById("rankscope-data").textContent);
  const hm = data.heatmap;
  if (!hm) return;
  const canvas = document.getElementById("heatmap-canvas");
  const select = document.getElementById("metric");
  const tip = document.getElementById("tip");
  const legend = document.getElementById("legend");
  const scale = document.getElementById("scale");
  const GUTTER = 64, TOP = 20, MISSING = [217, 217, 217];
  // viridis at ten even stops: dark (fast) to yellow (slow)
  const STOPS = [[68,1,84],[72,40,120],[62,73,137],[49,104,142],[38,130,142],
                 [31,158,137],[53,183,121],[110,206,88],[181,222,43],[253,231,37]];
  const LUT = new Uint8ClampedArray(256 * 3);
  for (let k = 0; k < 256; k++) {
    const t = k / 255 * (STOPS.length - 1), i = Math.min(Math.floor(t), STOPS.length - 2), f = t - i;
    for (let c = 0; c < 3; c++) LUT[3 * k + c] = STOPS[i][c] + (STOPS[i + 1][c] - STOPS[i][c]) * f;
  }
  const marks = new Map(hm.marks);
  const nr = hm.ranks.length, ns = hm.steps.length;
  let geo = null;

  function fmt(v, unit) {
    if (v === null || v === undefined) return "no record";
    const a = Math.abs(v);
    const s = a >= 1e4 ? Math.round(v).toLocaleString("en-US") : String(Number(v.toPrecision(4)));
    return unit ? s + " " + unit : s;
  }

  function nice(n, steps) {
    for (const s of steps) if (s >= n) return s;
    return steps[steps.length - 1];
  }

  function draw() {
    const t0 = performance.now();
    const m = hm.metrics[Number(select.value) || 0];
    const avail = Math.max(ns, canvas.parentElement.clientWidth - GUTTER - 4);
    const cw = Math.max(1, Math.min(40, Math.floor(avail / ns)));
    const ch = Math.max(1, Math.min(22, Math.floor(640 / nr)));
    canvas.width = GUTTER + ns * cw;
    canvas.height = TOP + nr * ch;
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    const img = new ImageData(ns, nr), px = img.data, vals = m.values;
    const lo = m.lo, span = m.hi - m.lo;
    let drawn = 0;
    for (let i = 0; i < nr * ns; i++) {
      const v = vals[i], o = 4 * i;
      if (v === null) {
        px[o] = MISSING[0]; px[o + 1] = MISSING[1]; px[o + 2] = MISSING[2];
      } else {
        let k = span > 0 ? Math.round((v - lo) / span * 255) : 128;
        k = 3 * (k < 0 ? 0 : k > 255 ? 255 : k);
        px[o] = LUT[k]; px[o + 1] = LUT[k + 1]; px[o + 2] = LUT[k + 2];
        drawn++;
      }
      px[o + 3] = 255;
    }
    const off = document.createElement("canvas");
    off.width = ns;
    off.height = nr;
    off.getContext("2d").putImageData(img, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, GUTTER, TOP, ns * cw, nr * ch);

    ctx.fillStyle = "#5f6b7a";
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    const every = nice(Math.ceil(13 / ch), [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 65536]);
    const markY = hm.marks.map(([row]) => TOP + row * ch + ch / 2);
    for (let r = 0; r < nr; r += every) {
      const y = TOP + r * ch + ch / 2;
      // a straggler's own label goes there instead
      if (!markY.some((m) => Math.abs(m - y) < 12)) ctx.fillText(String(hm.ranks[r]), GUTTER - 12, y);
    }
    ctx.textAlign = "left";
    ctx.fillText("rank", 2, TOP / 2);
    ctx.textAlign = "center";
    const sEvery = nice(Math.ceil(36 / cw), [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10000, 100000]);
    for (let s = 0; s < ns; s += sEvery) ctx.fillText(String(hm.steps[s]), GUTTER + s * cw + cw / 2, TOP / 2);
    ctx.fillStyle = "#e0301e";
    ctx.textAlign = "right";
    ctx.font = "bold 11px system-ui, sans-serif";
    for (const [row] of hm.marks) {
      const h = Math.max(ch, 5), y = TOP + row * ch + ch / 2;
      ctx.fillRect(GUTTER - 9, y - h / 2, 7, h);
      ctx.fillText(String(hm.ranks[row]), GUTTER - 12, y);
    }
    geo = { cw, ch, m };
    canvas.dataset.cells = String(nr * ns);
    canvas.dataset.values = String(drawn);
    canvas.dataset.metric = m.name;
    canvas.dataset.drawMs = (performance.now() - t0).toFixed(1);
    showLegend(m);
  }

  function showLegend(m) {
    const stops = [];
    for (let k = 0; k <= 10; k++) {
      const i = 3 * Math.round(k * 25.5);
      stops.push("rgb(" + LUT[i] + "," + LUT[i + 1] + "," + LUT[i + 2] + ") " + k * 10 + "%");
    }
    legend.querySelector(".bar").style.background = "linear-gradient(to right," + stops.join(",") + ")";
    legend.querySelector(".missing-key").style.background = "rgb(" + MISSING.join(",") + ")";
    if (m.lo === undefined) {
      legend.querySelector(".lo").textContent = "fast";
      legend.querySelector(".hi").textContent = "slow";
      scale.textContent = "This metric has no values.";
      return;
    }
    const clipped = m.min < m.lo || m.max > m.hi;
    legend.querySelector(".lo").textContent = "fast " + (m.min < m.lo ? "≤ " : "") + fmt(m.lo, m.unit);
    legend.querySelector(".hi").textContent = (m.max > m.hi ? "≥ " : "") + fmt(m.hi, m.unit) + " slow";
    scale.textContent = clipped
      ? "Colours span the " + hm.clip[0] + "th to " + hm.clip[1] + "th percentile (" + fmt(m.lo, m.unit) + " to " + fmt(m.hi, m.unit) +
        "); values beyond take the end colours. Smallest " + fmt(m.min, m.unit) +
        ", largest " + fmt(m.max, m.unit) + "."
      : "Colours span the smallest to the largest value.";
  }

  function hideTip() { tip.hidden = true; }

  canvas.addEventListener("mousemove", (e) => {
    if (!geo) return;
    const box = canvas.getBoundingClientRect();
    const x = (e.clientX - box.left) * canvas.width / box.width - GUTTER;
    const y = (e.clientY - box.top) * canvas.height / box.height - TOP;
    const row = Math.floor(y / geo.ch), col = Math.floor(x / geo.cw);
    if (row < 0 || row >= nr || col >= ns) return hideTip();
    const host = hm.hosts[row];
    const lines = ["rank " + hm.ranks[row] + (host ? " on " + host : "")];
    if (col >= 0) {
      lines.push("step " + hm.steps[col]);
      lines.push(geo.m.label + ": " + fmt(geo.m.values[row * ns + col], geo.m.unit));
    }
    if (marks.has(row)) lines.push("straggler: " + marks.get(row));
    tip.textContent = lines.join("\\n");
    tip.hidden = false;
    const left = e.clientX + 14 + tip.offsetWidth > window.innerWidth ? e.clientX - 14 - tip.offsetWidth : e.clientX + 14;
    tip.style.left = left + "px";
    tip.style.top = (e.clientY + 14) + "px";
  });
  canvas.addEventListener("mouseleave", hideTip);
  select.addEventListener("change", draw);
  let pending = false;
  window.addEventListener("resize", () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; draw(); });
  });
  draw();
})();
"""

_SCRIPT_SHA256 = base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()
# Only the page's own script may run, and nothing may be fetched: a name that slipped
# past escaping still could not execute or phone home.
_CSP = (
    f"default-src 'none'; script-src 'sha256-{_SCRIPT_SHA256}'; style-src 'unsafe-inline'; "
    "img-src data:; base-uri 'none'; form-action 'none'"
)
