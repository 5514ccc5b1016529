"""The report's phase-over-steps charts: one inline SVG per phase, drawn here, no script.

Each chart draws a bounded number of lines whatever the run's size (the report's data
holds at most 120 points, 8 flagged and 8 other ranks per phase): the band of all ranks
(10th to 90th percentile) with their median, a few other ranks as faint lines, the
ranks the findings name in that phase drawn over them, and a dashed line at the step
where a slowdown began. The caption says what is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..._text import format_ranks
from ..core._format import HTML
from ..core._values import as_float, as_int, as_ints, as_list, as_map, as_text, esc, plural

__all__ = ["charts_section"]

_W, _H = 560, 170  # the drawing, in SVG units
_LEFT, _RIGHT, _TOP, _BOTTOM = 58, 70, 18, 22
_FLAG_COLOURS = (
    "#e0301e",
    "#7b4fa0",
    "#d9661f",
    "#1b7f8c",
    "#a3470f",
    "#c46fa0",
    "#3a8a3e",
    "#8c6d31",
)
# Beyond this max over median the flagged line would flatten every other: a log scale.
_LOG_ABOVE = 20.0


def charts_section(report: Mapping[str, Any], findings: list[Mapping[str, Any]]) -> str:
    head = '<section id="over-steps">\n<h2>Each phase over the sampled steps</h2>\n'
    data = as_map(report.get("over_steps"))
    steps = as_ints(data.get("steps"))
    phases = [as_map(p) for p in as_list(data.get("phases"))]
    if not steps or not phases:
        return head + '<p class="none">none (no timings)</p>\n</section>'
    # the phases the findings name first, in the findings' order: the chart to read first
    named = [as_text(f.get("phase")) for f in findings]
    phases.sort(
        key=lambda p: named.index(as_text(p.get("name"))) if p.get("name") in named else len(named)
    )
    n_ranks = as_int(data.get("ranks")) or 0
    band = as_ints(data.get("band")) or [10, 90]
    per = as_int(data.get("steps_per_point")) or 1
    points = f"{len(steps)} point{plural(len(steps))}" + (
        f", each the mean of {per} consecutive sampled steps"
        if per > 1
        else ", one per sampled step"
    )
    note = (
        f'<p class="note">One chart per phase, {points}. The grey band spans the '
        f"{band[0]}th to {band[-1]}th percentile at each step of the {n_ranks} ranks less those "
        "drawn in colour, and the grey line is their median; faint lines are single ranks (all of them, or a few evenly spaced "
        "by rank where there are many: the caption says which); the ranks the findings name in "
        "that phase are drawn over them in colour, and a dashed line marks the step where a "
        "rank became slow, where that was after the first sampled step.</p>\n"
    )
    charts = "\n".join(_chart(p, steps, n_ranks) for p in phases)
    return head + note + f'<div class="charts">\n{charts}\n</div>\n</section>'


def _chart(phase: Mapping[str, Any], steps: list[int], n_ranks: int) -> str:
    name = as_text(phase.get("name")) or "unnamed phase"
    kind = as_text(phase.get("kind"))
    band = as_map(phase.get("band"))
    lo, mid, hi = (_values(band.get(k), len(steps)) for k in ("lo", "median", "hi"))
    faint = [
        (as_int(line.get("rank")), _values(line.get("values"), len(steps)))
        for line in map(as_map, as_list(phase.get("lines")))
    ]
    flagged = [as_map(f) for f in as_list(phase.get("flagged"))]
    bold = [(as_int(f.get("rank")), _values(f.get("values"), len(steps))) for f in flagged]
    drawn = [
        v
        for series in [lo, mid, hi] + [s for _, s in faint + bold]
        for v in series
        if v is not None
    ]
    if not drawn:
        return f'<figure class="chart" data-phase="{esc(name)}"><figcaption>{esc(name)}: none (no records)</figcaption></figure>'
    scale = _Scale(drawn, len(steps))
    parts = [_axes(scale, steps)]
    parts.append(
        f'<path class="band" d="{_area(scale, lo, hi)}"><title>{esc(name)}: 10th to 90th percentile of the other ranks</title></path>'
    )
    parts.append(f'<path class="median" d="{_path(scale, mid)}"/>')
    for rank, series in faint:
        parts.append(
            f'<path class="faint" data-rank="{rank}" d="{_path(scale, series)}"><title>rank {rank}</title></path>'
        )
    onsets: dict[int, list[int]] = {}
    labels: list[float] = []  # the label heights taken: lines that end together are not overwritten
    for n, (f, (rank, series)) in enumerate(zip(flagged, bold, strict=True)):
        colour = _FLAG_COLOURS[n % len(_FLAG_COLOURS)]
        role = as_text(f.get("role"))
        parts.append(
            f'<path class="flagged" data-rank="{rank}" data-role="{esc(role)}" stroke="{colour}" d="{_path(scale, series)}">'
            f"<title>rank {rank} ({esc(role)})</title></path>"
        )
        last = max((i for i, v in enumerate(series) if v is not None), default=None)
        if last is not None and n < 4:
            y = scale.y(series[last]) + 4  # type: ignore[arg-type]
            while any(abs(y - taken) < 11 for taken in labels):
                y += 11
            labels.append(y)
            parts.append(
                f'<text class="line-label" x="{scale.x(last) + 4:.0f}" y="{y:.0f}" fill="{colour}">rank {rank}</text>'
            )
        since = as_int(f.get("since_step"))
        # where a slowdown began; the waiting it causes begins there too
        if role == "slow" and since is not None and rank is not None and since > steps[0]:
            onsets.setdefault(since, []).append(rank)
    for since, ranks in sorted(onsets.items()):
        col = max((i for i, s in enumerate(steps) if s <= since), default=0)
        x = scale.x(col)
        # The label sits in the margin above the plot, where no line is drawn: inside it,
        # it lay over the slow rank's line, which is at the top from the onset on.
        late = x > (_W - _RIGHT) * 0.6
        anchor = ' text-anchor="end"' if late else ""
        parts.append(
            f'<line class="onset" data-step="{since}" x1="{x:.1f}" x2="{x:.1f}" y1="{_TOP}" y2="{_H - _BOTTOM}"/>'
            f'<text class="onset-label" x="{x - 3 if late else x + 3:.0f}" y="{_TOP - 6}"{anchor}>'
            f"{esc(format_ranks(ranks))} from step {since}</text>"
        )
    shown = len(faint)
    others = n_ranks - len(bold)
    caption = f"<b>{esc(name)}</b>{f' ({esc(kind)})' if kind else ''}"
    if bold:
        names = format_ranks([r for r, _ in bold if r is not None])
        of = as_int(phase.get("flagged_of")) or len(bold)
        caption += f" · in colour: {esc(names)}" + (
            f" ({len(bold)} of the {of} ranks the findings name)" if of > len(bold) else ""
        )
    other = " other" if bold else ""
    caption += (
        f" · faint: {'all ' if shown >= others else ''}{shown}{other} rank{plural(shown)}"
        + (f" of {others} ({esc(_listed([r for r, _ in faint]))})" if shown < others else "")
    )
    if scale.log:
        caption += " · log scale"
    return (
        f'<figure class="chart" data-phase="{esc(name)}">'
        f'<svg viewBox="0 0 {_W} {_H}" role="img" aria-label="{esc(name)} over the sampled steps">'
        + "".join(parts)
        + f"</svg><figcaption>{caption}</figcaption></figure>"
    )


def _listed(ranks: list[int | None]) -> str:
    return ", ".join(str(r) for r in ranks if r is not None)


def _values(value: object, n: int) -> list[float | None]:
    values = [as_float(v) for v in as_list(value)][:n]
    return values + [None] * (n - len(values))


class _Scale:
    """Step index and ms to SVG units: linear from 0, or log where one line dwarfs the rest."""

    def __init__(self, drawn: list[float], n: int) -> None:
        self.n = n
        self.top = max(drawn)
        ordered = sorted(drawn)
        typical = ordered[len(ordered) // 2]
        positive = [v for v in ordered if v > 0]
        self.log = bool(positive) and typical > 0 and self.top / typical > _LOG_ABOVE
        self.bottom = positive[0] if self.log else 0.0
        if self.top <= self.bottom:
            self.top = self.bottom + 1.0

    def x(self, i: int) -> float:
        span = _W - _LEFT - _RIGHT
        return _LEFT + (span * i / (self.n - 1) if self.n > 1 else span / 2)

    def y(self, v: float) -> float:
        if self.log:
            v = max(v, self.bottom)
            t = math.log(v / self.bottom) / math.log(self.top / self.bottom)
        else:
            t = (v - self.bottom) / (self.top - self.bottom)
        return _H - _BOTTOM - t * (_H - _TOP - _BOTTOM)

    def ticks(self) -> list[float]:
        if self.log:
            return [self.bottom, math.sqrt(self.bottom * self.top), self.top]
        return [0.0, self.top / 2, self.top]


def _axes(scale: _Scale, steps: list[int]) -> str:
    out = [f'<line class="axis" x1="{_LEFT}" x2="{_LEFT}" y1="{_TOP}" y2="{_H - _BOTTOM}"/>']
    for v in scale.ticks():
        y = scale.y(v)
        out.append(
            f'<line class="grid" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="tick" x="{_LEFT - 4}" y="{y + 4:.0f}" text-anchor="end">{esc(HTML.ms_text(v))}</text>'
        )
    for i in sorted({0, len(steps) // 2, len(steps) - 1}):
        anchor = "start" if i == 0 else "end" if i == len(steps) - 1 else "middle"
        out.append(
            f'<text class="tick" x="{scale.x(i):.0f}" y="{_H - 6}" text-anchor="{anchor}">step {steps[i]}</text>'
        )
    return "".join(out)


def _path(scale: _Scale, values: list[float | None]) -> str:
    """An SVG path through the values, broken where one is missing."""
    out, pen = [], "M"
    for i, v in enumerate(values):
        if v is None:
            pen = "M"
            continue
        out.append(f"{pen}{scale.x(i):.0f} {scale.y(v):.0f}")
        pen = "L"
    return "".join(out)


def _area(scale: _Scale, lo: list[float | None], hi: list[float | None]) -> str:
    """The band between two series, one closed shape per run of steps where both exist."""
    out: list[str] = []
    run: list[int] = []
    for i in [*range(len(lo)), len(lo)]:
        if i < len(lo) and lo[i] is not None and hi[i] is not None:
            run.append(i)
            continue
        if run:
            top = [f"{scale.x(j):.0f} {scale.y(hi[j]):.0f}" for j in run]  # type: ignore[arg-type]
            bottom = [f"{scale.x(j):.0f} {scale.y(lo[j]):.0f}" for j in reversed(run)]  # type: ignore[arg-type]
            out.append("M" + "L".join(top + bottom) + "Z")
        run = []
    return "".join(out)
