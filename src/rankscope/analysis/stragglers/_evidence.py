"""Evidence for a slow finding: the ops that grew on the slow rank against a healthy peer.

A window that holds the slow rank's trace and another rank's at the same steps (the pair
an anomaly detector captures, capture/_pair.py, or any scheduled or triggered window that
covers both) is read twice per trace through the Kineto summariser (traces/_kineto.py,
streamed, so memory follows the ops, not the file): once for the finding's phase ranges
(the record_function ranges rankscope opens for each phase while a window records),
once for the GPU kernels, or CPU ops by self time, inside them. Per op, its time a step
on each rank and the difference, biggest first. A finding without such a window says
so, with the `rankscope trigger` command that would capture the pair.
"""

from __future__ import annotations

import bisect
import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..._errors import TraceError
from ..._text import printable
from ...rundir._files import read_json_object
from ...rundir._layout import ack_path, window_key, window_steps
from ...rundir._listing import RunDir, TraceFile
from ...traces._kineto import summarize_trace
from ._model import Evidence, OpDelta, StragglerFinding

__all__ = ["READ_FINDINGS", "TOP_OPS", "evidence_for", "evidence_line"]

TOP_OPS = 10
"""Ops kept per finding (biggest delta first); the terminal and the report show three."""
READ_FINDINGS = 8
"""Slow findings whose traces are read: each reads two traces twice, and a finding past
these loses less time than they do."""
_SHOWN = 3
_SAID_MS = 0.05  # what rounds to +0.1 ms: smaller growth is not worth a place in the line
_PAIR_STEPS = 2  # the steps the suggested trigger records (trace.auto.window_steps' default)
_RANGES = ("user_annotation", "gpu_user_annotation")  # record_function ranges, host and device
_DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")
_AUTO_BYTES = 1 << 20
_WHOLE_STEPS = ""  # a phase name no range has: _phase_ops then sums over whole steps
_Ops = tuple[str, bool, dict[str, float], float]
"""What a trace shows of one phase: (kind, inside the phase's ranges?, op -> total us, the
phase's own ranges in us: on the device where it has ranges there and the ops are
kernels, else on the host; 0 where the trace marks none)."""


def evidence_for(
    root: Path, findings: Sequence[StragglerFinding], ranks: Sequence[int]
) -> dict[tuple[int, str], Evidence]:
    """The evidence of each slow finding, by (rank, phase). `ranks`: the run's ranks (a
    healthy one is named in the command that would capture a pair). Traces are read for
    the first READ_FINDINGS slow findings (those that lose the most time), each trace and
    phase once."""
    slow = [f for f in findings if f.role == "slow"]
    if not slow:
        return {}
    windows: dict[str, dict[int, Path]] = {}
    for trace in RunDir(root).traces():
        _add(windows, trace)
    run = _Run(root, windows, {f.rank for f in slow}, ranks)
    out = {}
    for i, f in enumerate(slow):
        if i < READ_FINDINGS:
            out[f.rank, f.phase] = _one(run, f)
        else:
            out[f.rank, f.phase] = Evidence(
                None,
                None,
                missing=f"not read: traces are compared for the {READ_FINDINGS} slow findings "
                "that lose the most time",
            )
    return out


@dataclass
class _Run:
    """What every finding's evidence reads: the run's step windows and their traces by
    rank, its slow ranks, its ranks, and the traces summarised so far."""

    root: Path
    windows: dict[str, dict[int, Path]]
    slow_ranks: set[int]
    ranks: Sequence[int]
    read: dict[tuple[Path, str], _Ops | str] = field(default_factory=dict)

    def ops(self, path: Path, phase: str, problems: list[str]) -> _Ops | None:
        """`_phase_ops` of a trace, read once however many findings compare it."""
        key = (path, phase)
        if key not in self.read:
            self.read[key] = _phase_ops(path, phase)
        found = self.read[key]
        if isinstance(found, str):
            problems.append(found)
            return None
        return found


def _add(windows: dict[str, dict[int, Path]], trace: TraceFile) -> None:
    if trace.rank is not None and window_steps(trace.window) is not None:
        windows.setdefault(trace.window, {}).setdefault(trace.rank, trace.path)


def _one(run: _Run, f: StragglerFinding) -> Evidence:
    root, slow_ranks = run.root, run.slow_ranks
    holding = {name: held for name, held in run.windows.items() if f.rank in held}
    pairs = [(name, held) for name, held in holding.items() if any(r != f.rank for r in held)]
    after = [(n, h) for n, h in pairs if _steps(n)[1] >= f.since_step]
    if not after:
        return _no_pair(root, f, holding, pairs, slow_ranks=slow_ranks, ranks=run.ranks)

    def preference(item: tuple[str, Mapping[int, Path]]) -> tuple[bool, int]:
        name, _ = item
        tag = (window_key(name) or (0, ""))[1]
        return tag.startswith("slow-"), _steps(name)[0]  # an anomaly pair, then the latest

    name, held = max(after, key=preference)
    others = sorted(held.keys() - {f.rank}, key=lambda r: (r in slow_ranks, abs(r - f.rank), r))
    peer = others[0]
    first, last = _steps(name)
    asked = _asked(root, f.rank, name)
    problems: list[str] = []
    slow_ops = run.ops(held[f.rank], f.phase, problems)
    peer_ops = run.ops(held[peer], f.phase, problems)
    if slow_ops is not None and peer_ops is not None and slow_ops[1] != peer_ops[1]:
        # One trace marks the phase, the other does not: both over whole steps, alike.
        slow_ops = run.ops(held[f.rank], _WHOLE_STEPS, problems)
        peer_ops = run.ops(held[peer], _WHOLE_STEPS, problems)
    base = Evidence(name, peer, steps=(first, last), asked=asked, problems=problems)
    if slow_ops is None or peer_ops is None:
        return replace(base, missing="a trace of the window cannot be read: " + "; ".join(problems))
    (slow_kind, slow_scoped, slow_us, slow_phase), (peer_kind, peer_scoped, peer_us, peer_phase) = (
        slow_ops,
        peer_ops,
    )
    if slow_kind != peer_kind:
        return replace(
            base,
            missing=f"rank {f.rank}'s trace holds {_words(slow_kind)}, rank {peer}'s "
            f"{_words(peer_kind)}: not comparable",
        )
    per_step = 1000.0 * (last - first + 1)
    deltas = [
        OpDelta(
            name=op,
            slow_ms=slow_us.get(op, 0.0) / per_step,
            peer_ms=peer_us.get(op, 0.0) / per_step,
            delta_ms=(slow_us.get(op, 0.0) - peer_us.get(op, 0.0)) / per_step,
            peer_rank=peer,
        )
        for op in slow_us.keys() | peer_us.keys()
    ]
    deltas.sort(key=lambda d: (-d.delta_ms, d.name))
    scope = f"phase {f.phase}" if slow_scoped and peer_scoped else "whole steps"
    phase_ms = (slow_phase / per_step, peer_phase / per_step) if slow_phase and peer_phase else None
    return replace(
        base, ops=tuple(deltas[:TOP_OPS]), kind=slow_kind, scope=scope, phase_ms=phase_ms
    )


def _steps(name: str) -> tuple[int, int]:
    return window_steps(name) or (0, 0)  # only step windows are gathered (_add)


def _words(kind: str) -> str:
    return "GPU kernels" if kind == "gpu_kernels" else "CPU ops only"


def _no_pair(
    root: Path,
    f: StragglerFinding,
    holding: Mapping[str, Mapping[int, Path]],
    pairs: Sequence[tuple[str, Mapping[int, Path]]],
    *,
    slow_ranks: set[int],
    ranks: Sequence[int],
) -> Evidence:
    """Why no window compares this rank with a peer, and the trigger that would."""
    if pairs:
        latest = max(_steps(n)[1] for n, _ in pairs)
        missing = (
            f"the windows that hold rank {f.rank} and another rank end at step {latest}, "
            f"before it turned slow at step {f.since_step}"
        )
    elif holding:
        name = max(holding, key=lambda n: _steps(n)[0])
        asked = _asked(root, f.rank, name)
        answer = "" if asked is None else f" ({_asked_words(asked)})"
        missing = f"window {name} holds rank {f.rank} alone{answer}"
    else:
        missing = f"no trace window holds rank {f.rank}"
    healthy = sorted((r for r in ranks if r not in slow_ranks), key=lambda r: abs(r - f.rank))
    command = None
    if healthy:
        command = (
            f"rankscope trigger {shlex.quote(str(root))} --ranks {f.rank},{healthy[0]} "
            f"--steps {_PAIR_STEPS}"
        )
    return Evidence(None, None, missing=missing, command=command)


def _asked(root: Path, rank: int, window: str) -> dict[str, Any] | None:
    """For a window `rank`'s anomaly detector asked for: the peer it asked, why, and the answer."""
    for line in _auto_lines(root, rank):
        peer = line.get("peer")
        if line.get("window") != window or not isinstance(peer, dict):
            continue
        # The file is untrusted: only what has the type the capture writes is passed on.
        trigger, who, why = peer.get("trigger"), peer.get("rank"), peer.get("why")
        who = who if isinstance(who, int) and not isinstance(who, bool) else None
        asked: dict[str, Any] = {
            "by": rank,
            "rank": who,
            "why": why if isinstance(why, str) else None,
        }
        if isinstance(trigger, str) and who is not None:
            answer = read_json_object(ack_path(root, trigger, who), _AUTO_BYTES)
            if answer is None:
                asked["answer"] = "no answer (it never looked, or the run stopped first)"
            elif answer.get("status") == "accepted":
                asked["answer"] = "accepted"
            else:
                asked["answer"] = f"declined: {printable(str(answer.get('reason')))}"
        return asked
    return None


def _asked_words(asked: Mapping[str, Any]) -> str:
    who = asked.get("rank")
    if who is None:
        why = asked.get("why")
        return "no peer was asked" if why is None else f"no peer was asked: {printable(str(why))}"
    return f"rank {who} was asked and answered {asked.get('answer', 'nothing')}"


def _auto_lines(root: Path, rank: int) -> Iterable[dict[str, Any]]:
    for record in RunDir(root).auto_records():
        if record.rank != rank:
            continue
        try:
            with record.path.open("rb") as fh:
                text = fh.read(_AUTO_BYTES)
        except OSError:
            return
        for raw in text.splitlines():
            try:
                line = json.loads(raw)
            except ValueError:
                continue  # a torn or foreign line: the record is evidence, not a figure
            if isinstance(line, dict):
                yield line


def _phase_ops(path: Path, phase: str) -> _Ops | str:
    """(kind, inside the phase's ranges?, op -> total us) of one trace; the problem, named,
    where it cannot be read."""
    host: list[tuple[float, float]] = []
    device: list[tuple[float, float]] = []

    def ranges(events: list[Any]) -> list[Any]:
        for ev in events:
            if ev.ph == "X" and ev.cat in _RANGES and ev.name == phase:
                span = _span(ev)
                if span is not None:
                    (host if ev.cat == "user_annotation" else device).append(span)
        return []

    try:
        summarize_trace(path, keep=ranges)
        host.sort()
        device.sort()
        on_host, on_device = _Within(host), _Within(device or host)

        def inside(events: list[Any]) -> list[Any]:
            return [
                ev for ev in events if (on_device if ev.cat in _DEVICE else on_host).holds(ev.ts)
            ]

        summary = summarize_trace(path, keep=inside if host else None)
    except TraceError as exc:
        return str(exc)
    items = summary.get("items", [])
    totals = {str(item["name"]): float(item["total_us"]) for item in items}
    kind = str(summary.get("kind"))
    spans = device if kind == "gpu_kernels" and device else host
    return kind, bool(host), totals, sum(end - start for start, end in spans)


def _span(ev: Any) -> tuple[float, float] | None:
    ts, dur = ev.ts, ev.dur
    if type(ts) not in (int, float) or type(dur) not in (int, float) or not dur >= 0:
        return None
    return float(ts), float(ts) + float(dur)


class _Within:
    """Whether a time lies inside one of a sorted list of ranges (phases do not overlap
    one another on a thread; where nested, the outermost holds)."""

    def __init__(self, spans: list[tuple[float, float]]) -> None:
        self._starts = [s for s, _ in spans]
        ends: list[float] = []
        reach = float("-inf")
        for _, end in spans:
            reach = max(reach, end)
            ends.append(reach)  # the furthest any range so far reaches
        self._reach = ends

    def holds(self, ts: object) -> bool:
        if not isinstance(ts, (int, float)) or isinstance(ts, bool):
            return False
        i = bisect.bisect_right(self._starts, ts) - 1
        return i >= 0 and ts <= self._reach[i]


def evidence_line(finding: Mapping[str, Any]) -> str | None:
    """The evidence of a finding (as `to_dict` gives it) in one line, its top three ops:
    "rank 2 is slow in forward: aten::mm +28.1 ms a step against rank 0 at steps 57-58";
    None for a finding that carries none."""
    evidence = finding.get("evidence")
    if not isinstance(evidence, Mapping):
        return None
    head = f"rank {finding.get('rank')} is slow in {finding.get('phase')}"
    ops = [op for op in evidence.get("ops") or [] if isinstance(op, Mapping)]
    grew = [op for op in ops if _number(op.get("delta_ms")) >= _SAID_MS][:_SHOWN]
    steps = evidence.get("steps")
    missing = evidence.get("missing")
    if not missing and isinstance(steps, list) and len(steps) == 2:
        span = f"step {steps[0]}" if steps[0] == steps[1] else f"steps {steps[0]}-{steps[1]}"
        where = "" if evidence.get("scope") != "whole steps" else " (whole steps: no range of it)"
        said = ", ".join(
            f"{printable(str(op.get('name')))} {_number(op.get('delta_ms')):+.1f} ms a step"
            for op in grew
        )
        if not grew:
            said = "no op grew by 0.1 ms a step or more"
        line = f"{head}: {said} against rank {evidence.get('peer_rank')} at {span}{where}"
        return line + _share_of_growth(evidence.get("phase_ms"), grew)
    missing = missing or "no op to compare"
    command = evidence.get("command")
    capture = f"; `{command}` captures it with a healthy peer" if command else ""
    return f"{head}: no trace evidence ({printable(str(missing))}){capture}"


def _share_of_growth(phase_ms: object, shown: list[Mapping[str, Any]]) -> str:
    """How much of the phase's own growth the ops shown hold: a slowdown no op shows (a
    sleep, a wait outside the ops, a slower clock on the host) is then seen as such."""
    if not isinstance(phase_ms, list) or len(phase_ms) != 2:
        return ""
    slow, peer = (_number(v) for v in phase_ms)
    grew = slow - peer
    if not grew > 0:
        return ""
    held = sum(_number(op.get("delta_ms")) for op in shown)
    return (
        f" (the phase {slow:.1f} ms a step against {peer:.1f}: the ops shown hold "
        f"{held:+.1f} of its {grew:+.1f} ms)"
    )


def _number(value: object) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return float("nan")  # a report read back that holds no number here: never said
