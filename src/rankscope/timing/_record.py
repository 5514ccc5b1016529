"""Timing records (schema v1, DESIGN.md "Timing record"): one JSON object per line."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["RECORD_VERSION", "Span", "format_record"]

RECORD_VERSION = 1

STEP_PHASE = "step"
"""The phase name (and kind) of the record every sampled step gets: time between step() calls."""


class Span:
    """One timed phase (or step), from entry until it is written."""

    __slots__ = (
        "cpu_ns",
        "depth",
        "dev_end",
        "dev_start",
        "error",
        "kind",
        "meta",
        "phase",
        "range",
        "start_ns",
        "step",
        "t0",
        "thread",
    )

    def __init__(  # noqa: PLR0917 - positional: built once per timed phase, where keywords cost 2x
        self,
        step: int,
        phase: str,
        kind: str,
        meta: dict[str, Any] | None,
        depth: int,
        thread: str | None,
    ) -> None:
        self.step = step
        self.phase = phase
        self.kind = kind
        self.meta = meta
        self.depth = depth
        self.thread = thread
        self.start_ns = 0
        self.t0 = 0
        self.cpu_ns = 0
        self.error = False
        self.dev_start: Any = None
        self.dev_end: Any = None
        self.range: Any = None  # a record_function range this span opened, if any


def format_record(rank: int, span: Span, gpu_ms: float | None, dropped: int) -> str:
    """The span as one JSONL line.

    Written out by hand rather than through json.dumps: this runs for every record on
    the training thread, and the fixed fields need no escaping. User meta goes through
    json, with values it cannot encode written as their str().
    """
    gpu = "null" if gpu_ms is None else repr(float(gpu_ms))
    line = (
        f'{{"v":{RECORD_VERSION},"rank":{rank},"step":{span.step},"phase":{_quoted(span.phase)},'
        f'"kind":{_quoted(span.kind)},"start_ns":{span.start_ns},"cpu_ms":{span.cpu_ns / 1e6!r},'
        f'"gpu_ms":{gpu},"depth":{span.depth},"error":{"true" if span.error else "false"}'
    )
    if span.thread is not None:
        line += f',"thread":{_quoted(span.thread)}'
    if span.meta:
        line += f',"meta":{_meta_json(span.meta)}'
    if dropped:
        # Device times lost to the pending bound since the previous record.
        line += f',"dropped":{dropped}'
    return line + "}\n"


_QUOTED: dict[str, str] = {}
_QUOTED_MAX = 4096  # names are few; a run that makes up new ones each step stops filling it


def _quoted(text: str) -> str:
    quoted = _QUOTED.get(text)
    if quoted is None:
        quoted = json.dumps(text, ensure_ascii=False)
        if len(_QUOTED) < _QUOTED_MAX:
            _QUOTED[text] = quoted
    return quoted


def _meta_json(meta: dict[str, Any]) -> str:
    try:
        return json.dumps(
            meta, separators=(",", ":"), default=str, allow_nan=False, ensure_ascii=False
        )
    except (ValueError, TypeError, RecursionError):
        # NaN or infinity, a circular or too deep value, a non-string key somewhere in
        # user meta: keep the record, as strictly valid JSON.
        strict = {str(k): _strict(v) for k, v in meta.items()}
        return json.dumps(strict, separators=(",", ":"), default=str, ensure_ascii=False)


def _strict(value: Any) -> Any:
    """`value` if it is valid JSON as it stands, else its repr ('nan', '[1, inf]')."""
    try:
        json.dumps(value, default=str, allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        return repr(value)
    return value
