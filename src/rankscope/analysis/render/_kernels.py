"""The report page's kernels section: the top kernels (or CPU ops) of the trace windows,
and the other captures (nsys ranges, CUDA memory snapshots)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..._text import number_ranges
from ..core._format import HTML
from ..core._values import as_float, as_ints, as_list, as_map, as_text, esc, plural

__all__ = ["kernels_section"]

_TOP_KERNELS = 15


def kernels_section(report: Mapping[str, Any]) -> str:
    head = '<section id="kernels">\n<h2>Top kernels per captured window</h2>\n'
    windows = [as_map(w) for w in as_list(as_map(report.get("kernels")).get("windows"))]
    if not windows:
        none = '<p class="none">none (no traces captured)</p>\n'
        return head + none + _other_captures(report) + "\n</section>"
    parts = [head]
    for i, window in enumerate(windows):
        items = [as_map(item) for item in as_list(window.get("items"))]
        items.sort(key=lambda item: -(as_float(item.get("total_us")) or 0.0))
        kind = as_text(window.get("kind"))
        what = {"gpu_kernels": "GPU kernels", "cpu_ops": "top-level CPU ops (no GPU kernels)"}.get(
            kind, esc(kind) or "items"
        )
        ranks = as_ints(window.get("ranks"))
        title = (
            f"<code>{esc(as_text(window.get('window')) or 'unnamed window')}</code> · "
            f"rank{plural(len(ranks))} {esc(number_ranges(ranks)) or 'not given'} · {what} · "
            f"total {HTML.us_text(as_float(window.get('total_us')))}"
        )
        top = items[:_TOP_KERNELS]
        if not top:
            table = '<p class="none">none</p>'
        else:
            rest = sum(as_float(item.get("share")) or 0.0 for item in items[_TOP_KERNELS:])
            rows = "\n".join(_kernel_row(n + 1, item) for n, item in enumerate(top))
            table = (
                '<table class="data kernels">\n<tr><th>#</th><th>name</th><th>count</th>'
                "<th>total</th><th>mean</th><th>min</th><th>max</th><th>share</th></tr>\n"
                f"{rows}\n</table>"
            )
            if len(items) > len(top):
                table += (
                    f'<p class="note">Top {len(top)} of {len(items)} by total time; '
                    f"the other {len(items) - len(top)} take {HTML.share(rest)}.</p>"
                )
        why = "".join(
            f'<p class="note">{esc(as_text(reason))}</p>\n' for reason in as_list(window.get("why"))
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
    captures = as_map(report.get("captures"))
    lines = []
    for entry in (as_map(e) for e in as_list(captures.get("nsys"))):
        ranks = as_ints(entry.get("ranks"))
        lines.append(
            f"<li>nsys capture range <code>{esc(as_text(entry.get('window')))}</code> · steps "
            f"{esc(as_text(entry.get('first')))}-{esc(as_text(entry.get('last')))} · "
            f"rank{plural(len(ranks))} {esc(number_ranges(ranks))}</li>"
        )
    for entry in (as_map(e) for e in as_list(captures.get("memory"))):
        ranks = as_ints(entry.get("ranks"))
        size = (as_float(entry.get("bytes")) or 0.0) / 1e6
        lines.append(
            f"<li>CUDA memory snapshots <code>{esc(as_text(entry.get('path')))}</code> · "
            f"rank{plural(len(ranks))} {esc(number_ranges(ranks))} · {size:.1f} MB "
            "(open at https://pytorch.org/memory_viz)</li>"
        )
    if not lines:
        return ""
    return "<h3>Also captured</h3>\n<ul>\n" + "\n".join(lines) + "\n</ul>"


def _kernel_row(n: int, item: Mapping[str, Any]) -> str:
    name = esc(as_text(item.get("name")) or "unnamed")
    share = as_float(item.get("share"))
    bar = (
        f'<span class="sharebar" style="width:{min(max(share, 0.0), 1.0) * 60:.1f}px"></span>'
        if share
        else ""
    )
    return (
        f'<tr><td class="num">{n}</td><td class="name" title="{name}">{name}</td>'
        f'<td class="num">{esc(as_text(item.get("count"))) or HTML.missing}</td>'
        f'<td class="num">{HTML.us_text(as_float(item.get("total_us")))}</td>'
        f'<td class="num">{HTML.us_text(as_float(item.get("mean_us")))}</td>'
        f'<td class="num">{HTML.us_text(as_float(item.get("min_us")))}</td>'
        f'<td class="num">{HTML.us_text(as_float(item.get("max_us")))}</td>'
        f'<td class="num share">{bar}{HTML.share(share)}</td></tr>'
    )
