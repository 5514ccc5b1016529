"""Timing records (schema v1): one JSON object per line.

Their fields are what docs/run-directory.md ("timings/rank-NNNNN.jsonl") tells users.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["RECORD_VERSION", "Span", "format_attempt", "format_record", "meta_json", "safe_str"]

RECORD_VERSION = 1

STEP_PHASE = "step"
"""The phase name (and kind) of the record every sampled step gets: time between step() calls."""


class Span:
    """One timed phase (or step), from entry until it is written. `meta` is JSON text."""

    __slots__ = (
        "c0",
        "coll",
        "cpu_ns",
        "depth",
        "dev_end",
        "dev_start",
        "error",
        "ident",
        "kind",
        "meta",
        "nvtx",
        "oncpu_ns",
        "phase",
        "q0",
        "range",
        "raw_meta",
        "runq_ns",
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
        meta: str | None,
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
        self.nvtx: Any = None  # the NVTX range this span opened, if any
        self.raw_meta: dict[str, Any] | None = None  # the user's meta until the span ends
        # Collectives issued so far at entry (timing/_collectives.py), then in the span; -1:
        # not counted (no process group, or one that cannot say).
        self.coll = -1
        # The thread's CPU time at entry, then in the span; -1: not read (a span left on
        # another thread than the one that entered it: a thread's clock is its own).
        self.c0 = 0
        self.ident = 0
        self.oncpu_ns = -1
        # The thread's wait for a CPU so far at entry (timing/_runqueue.py), then in the
        # span; -1: not read (another thread, or a host that cannot say).
        self.q0 = -1
        self.runq_ns = -1


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
    if span.coll >= 0:
        # How many collectives the phase issued: the analysis reads "ranks wait for each
        # other here" from it (docs/run-directory.md).
        line += f',"coll":{span.coll}'
    if span.oncpu_ns >= 0:
        # How long the thread ran on a CPU in the span: the rest it slept, waited or was
        # kept off a core (docs/run-directory.md).
        line += f',"oncpu_ms":{span.oncpu_ns / 1e6!r}'
    if span.runq_ns >= 0:
        # How long of that it was ready to run and waited for a core: a busy host.
        line += f',"runq_ms":{span.runq_ns / 1e6!r}'
    if span.thread is not None:
        line += f',"thread":{_quoted(span.thread)}'
    if span.meta:
        line += f',"meta":{span.meta}'
    if dropped:
        # Device times lost to the pending bound since the previous record.
        line += f',"dropped":{dropped}'
    return line + "}\n"


def format_attempt(
    rank: int, attempt: dict[str, Any], host: str | None = None, world: int | None = None
) -> str:
    """The line that opens an attempt's records in a rank's file (no step, no phase).

    Records that follow it, up to the next such line, belong to that attempt; a file
    without one (written before attempts existed) holds one attempt. `host` is where
    this start runs (RankInfo.host): the meta file names only a rank's latest start's
    host, so an earlier attempt's host is known from this line alone. It is said after
    the attempt's own fields and is no part of its identity (the token is); so is
    `world`, the world size of this start (an elastic restart may have fewer ranks).
    """
    said = attempt if host is None else {**attempt, "host": host}
    if world is not None:
        said = {**said, "world": world}
    fields = json.dumps(said, separators=(",", ":"))[1:]
    return f'{{"v":{RECORD_VERSION},"rank":{rank},{fields}\n'


_QUOTED: dict[str, str] = {}
_QUOTED_MAX = 4096  # names are few; a run that makes up new ones each step stops filling it


def _quoted(text: str) -> str:
    quoted = _QUOTED.get(text)
    if quoted is None:
        # ASCII escapes: a lone surrogate (a file name decoded with surrogateescape)
        # stays valid JSON and never fails to encode.
        quoted = json.dumps(text)
        if len(_QUOTED) < _QUOTED_MAX:
            _QUOTED[text] = quoted
    return quoted


def meta_json(meta: dict[str, Any] | None) -> str | None:
    """User meta as JSON text, taken when the phase ends so later changes to it do not leak in.

    Never raises: values JSON cannot hold become strings (tensors by shape, never by
    value: reading a CUDA tensor would wait for the device).
    """
    if not meta:
        return None
    try:
        return json.dumps(meta, separators=(",", ":"), default=_describe, allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        # NaN or infinity, a circular or too deep value, a non-string key somewhere.
        strict = {safe_str(k): _strict(v) for k, v in meta.items()}
        return json.dumps(strict, separators=(",", ":"), default=_describe)


def safe_str(value: object) -> str:
    """str(value), or a stand-in when str() itself fails."""
    if type(value) is str:
        return value
    try:
        return str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def _describe(value: object) -> str:
    shape, device = getattr(value, "shape", None), getattr(value, "device", None)
    if shape is not None and device is not None:
        return f"<{type(value).__name__} shape={list(shape)} dtype={getattr(value, 'dtype', '?')} device={device}>"
    return safe_str(value)


def _strict(value: Any) -> Any:
    """`value` if it is valid JSON as it stands, else its repr ('nan', '[1, inf]')."""
    try:
        json.dumps(value, default=_describe, allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        try:
            return repr(value)
        except Exception:
            return f"<unprintable {type(value).__name__}>"
    return value
