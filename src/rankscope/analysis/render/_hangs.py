"""The report page's "Hangs" section: who is stuck where, who waits, the stuck rank's stack.

Drawn from `report["hangs"]` (the data of `rankscope hang --json`), which may come from
anywhere: every part may be absent or of the wrong type, and every string is escaped.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ..._text import number_ranges
from ..core._format import HTML, seconds_text
from ..core._values import as_float, as_int, as_ints, as_list, as_map, as_text, esc, plural

__all__ = ["hangs_section"]

_STACKS = 8  # stuck ranks whose stacks are shown; `rankscope hang --json` has them all
_ROWS = 200  # groups of stalled ranks listed


def hangs_section(report: Mapping[str, Any]) -> str:
    """The section, or "" when the report has no hangs part (the run had no watch)."""
    if "hangs" not in report:
        return ""
    hangs = as_map(report.get("hangs"))
    state = as_text(hangs.get("state")) or "not given"
    summary = esc(as_text(hangs.get("summary")) or "no summary")
    verdict = (
        f'<ul class="findings"><li><b>hung</b>: {summary}</li></ul>'
        if state == "hung"
        else f'<p class="clean">{esc(state)}: {summary}</p>'
    )
    parts = [
        '<section id="hangs">\n<h2>Hangs</h2>',
        f'<p class="meta">{_as_of(hangs)}</p>',
        verdict,
        _groups(as_list(hangs.get("groups"))),
        _collectives(as_list(as_map(hangs.get("flight_recorder")).get("groups"))),
        _stacks(as_list(hangs.get("findings"))),
        _others(hangs),
        _rule(as_map(hangs.get("rules"))),
        "</section>",
    ]
    return "\n".join(part for part in parts if part)


def _utc(epoch_s: float | None) -> str:
    if epoch_s is None or not 0 <= epoch_s < 1e11:
        return HTML.missing
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch_s))


def _for(seconds: float | None) -> str:
    return HTML.missing if seconds is None else seconds_text(max(seconds, 0.0))


def _as_of(hangs: Mapping[str, Any]) -> str:
    age = as_float(hangs.get("newest_heartbeat_age_s"))
    newest = "" if age is None else f"; the newest heartbeat of a running rank is {_for(age)} old"
    when = _utc(as_float(hangs.get("as_of")))
    said = "as of a time not given" if when == HTML.missing else f"as of {esc(when)}"
    return f"{said}{esc(newest)}"


def _groups(groups: list[Any]) -> str:
    if not groups:
        return ""
    rows = []
    for g in (as_map(g) for g in groups[:_ROWS]):
        role = as_text(g.get("role"))
        ranks = as_ints(g.get("ranks"))
        phase = as_text(g.get("phase"))
        rows.append(
            f'<tr class="{"slow" if role == "stuck" else ""}"><td>{esc(role) or HTML.missing}</td>'
            f"<td>{esc(number_ranges(ranks)) or HTML.missing}</td>"
            f'<td class="num">{len(ranks)}</td>'
            f"<td>{esc(phase) if phase else '<i>outside any phase</i>'}</td>"
            f"<td>{esc(as_text(g.get('kind'))) or HTML.missing}</td>"
            f'<td class="num">{esc(as_text(as_int(g.get("step")))) or HTML.missing}</td>'
            f'<td class="num">{esc(_for(as_float(g.get("for_s"))))}</td>'
            f"<td>{esc(_utc(as_float(g.get('since'))))}</td></tr>"
        )
    more = (
        f'<p class="note">The first {_ROWS} of {len(groups)} groups; '
        "`rankscope hang --json` has them all.</p>"
        if len(groups) > _ROWS
        else ""
    )
    return (
        "<h3>Stalled ranks</h3>\n"
        '<table class="data hang-groups">\n<tr><th>role</th><th>ranks</th><th>count</th>'
        "<th>phase</th><th>kind</th><th>step</th><th>for</th><th>since</th></tr>\n"
        + "\n".join(rows)
        + f"\n</table>{more}"
    )


def _collectives(groups: list[Any]) -> str:
    """The process groups as the ranks' Flight Recorder dumps show them."""
    if not groups:
        return ""
    rows = []
    for g in (as_map(g) for g in groups[:_ROWS]):
        state = as_text(g.get("state"))
        never = [as_int(as_map(n).get("rank")) for n in as_list(g.get("never_entered"))]
        rows.append(
            f'<tr class="{"slow" if state not in ("done", "") else ""}">'
            f"<td>{esc(as_text(g.get('group')))} {esc(as_text(g.get('desc')))}</td>"
            f"<td>{esc(state) or HTML.missing}</td>"
            f"<td>{_call(g, 'last_completed')}</td><td>{_call(g, 'pending')}</td>"
            f"<td>{esc(number_ranges(as_ints(g.get('entered')))) or HTML.missing}</td>"
            f"<td>{esc(number_ranges([r for r in never if r is not None]))}</td>"
            f"<td>{esc(number_ranges(as_ints(g.get('missing'))))}</td></tr>"
        )
    return (
        "<h3>Collectives by process group (Flight Recorder)</h3>\n"
        '<table class="data hang-collectives">\n<tr><th>group</th><th>state</th>'
        "<th>last completed</th><th>hangs in</th><th>inside</th><th>never entered</th>"
        "<th>no dump</th></tr>\n" + "\n".join(rows) + "\n</table>"
    )


def _call(group: Mapping[str, Any], key: str) -> str:
    seq = as_int(group.get(key))
    if seq is None:
        return HTML.missing
    op = as_text(group.get(f"{key}_op" if key == "pending" else "last_completed_op"))
    return esc(f"{op or 'collective'} #{seq}")


def _stacks(findings: list[Any]) -> str:
    stuck = [f for f in (as_map(f) for f in findings) if f.get("role") == "stuck"]
    if not stuck:
        return ""
    parts = ["<h3>Where the stuck rank is</h3>"]
    for i, f in enumerate(stuck[:_STACKS]):
        rank = esc(as_text(as_int(f.get("rank")))) or "?"
        host = as_text(f.get("host"))
        phases = " &gt; ".join(esc(as_text(as_map(p).get("phase"))) for p in as_list(f.get("open")))
        title = (
            f"rank {rank}{' on ' + esc(host) if host else ''} · step "
            f"{esc(as_text(as_int(f.get('step'))))} · {phases or 'no open phase'}"
        )
        frames = [as_map(frame) for frame in as_list(f.get("frames"))]
        if frames:
            thread = esc(as_text(f.get("thread")) or "the training thread")
            lines = []
            for frame in frames:
                lines.append(
                    f"{esc(as_text(frame.get('file')))}:{esc(as_text(frame.get('line')))} "
                    f"in {esc(as_text(frame.get('function')))}"
                )
                code = as_text(frame.get("code"))
                if code:
                    lines.append(f"    {esc(code)}")
            body = (
                f'<p class="note">The innermost frames of {thread}, outermost first; '
                "a rank stuck inside C code shows the Python line that called it.</p>"
                f'<pre class="stack">{chr(10).join(lines)}</pre>'
            )
        else:
            body = (
                '<p class="none">No stack: no hang file for this stall yet (the rank\'s '
                "watchdog writes one once its threshold has passed).</p>"
            )
        recorder = as_text(f.get("flight_recorder"))
        recorder_skipped = as_text(f.get("flight_recorder_skipped"))
        if recorder:
            body += f'<p class="note">Flight Recorder dump: <code>{esc(recorder)}</code></p>'
        elif recorder_skipped:
            body += f'<p class="note">No Flight Recorder dump: {esc(recorder_skipped)}</p>'
        hang_file = as_text(f.get("hang_file"))
        if hang_file:
            body += f'<p class="note">Hang file: <code>{esc(hang_file)}</code></p>'
        parts.append(
            f"<details{' open' if i == 0 else ''}><summary>{title}</summary>\n{body}</details>"
        )
    if len(stuck) > _STACKS:
        parts.append(
            f'<p class="note">{len(stuck) - _STACKS} more stuck ranks; '
            "`rankscope hang --json` has their stacks.</p>"
        )
    return "\n".join(parts)


def _others(hangs: Mapping[str, Any]) -> str:
    ranks = as_map(hangs.get("ranks"))
    lines = []
    missing = as_ints(ranks.get("missing"))
    if missing:
        lines.append(
            f"<li>no heartbeat: rank{plural(len(missing))} {esc(number_ranges(missing))}</li>"
        )
    lines.extend(f"<li>{esc(as_text(note))}</li>" for note in as_list(hangs.get("notes")))
    if not lines:
        return ""
    return '<ul class="hang-notes">\n' + "\n".join(lines) + "\n</ul>"


def _rule(rules: Mapping[str, Any]) -> str:
    factor = as_float(rules.get("stall_factor"))
    floor = as_float(rules.get("stall_floor_s"))
    if factor is None or floor is None:
        return ""
    return (
        '<p class="rule">Rule: a running rank is stalled when its watchdog wrote a hang file for '
        "its step, or it has not moved (no step(), no phase entered or left) for longer than "
        "its threshold (the one its watchdog used, from its hang file, heartbeat or meta "
        f"file; where none says, the defaults: {factor:g} x its median step time, at least "
        f"{floor:g} s). The stalled ranks outside a comm phase at the earliest step and phase "
        "(the step's phase order from the run's timings) are stuck; the others wait.</p>"
    )
