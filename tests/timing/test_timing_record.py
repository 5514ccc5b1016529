"""Timing records and attempt lines written by hand must read back as the JSON they claim to be."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rankscope.analysis.read._attempts import AttemptMark, host_problem, mark_of
from rankscope.analysis.read._timings import _ATTEMPT_LINE
from rankscope.timing._record import (
    RECORD_VERSION,
    Span,
    format_attempt,
    format_record,
    meta_json,
)

META = st.dictionaries(
    st.text(max_size=8),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
        ),
        max_leaves=6,
    ),
    max_size=4,
)


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


@settings(max_examples=300, deadline=None)
@given(
    rank=st.integers(0, 100_000),
    step=st.integers(0, 10**9),
    # any code points, lone surrogates too (names decoded with surrogateescape)
    phase=st.text(st.characters(codec=None), min_size=1, max_size=20),
    kind=st.text(min_size=1, max_size=8),
    thread=st.none() | st.text(max_size=10),
    meta=st.none() | META,
    start_ns=st.integers(0, 2**63 - 1),
    cpu_ns=st.integers(0, 10**13),
    gpu_ms=st.none() | st.floats(min_value=0, max_value=1e7, allow_nan=False),
    depth=st.integers(0, 50),
    error=st.booleans(),
    dropped=st.integers(0, 10**6),
)
def test_a_record_reads_back_as_what_was_recorded(
    *,
    rank: int,
    step: int,
    phase: str,
    kind: str,
    thread: str | None,
    meta: dict[str, Any] | None,
    start_ns: int,
    cpu_ns: int,
    gpu_ms: float | None,
    depth: int,
    error: bool,
    dropped: int,
) -> None:
    span = Span(step, phase, kind, meta_json(meta), depth, thread)
    span.start_ns, span.cpu_ns, span.error = start_ns, cpu_ns, error
    line = format_record(rank, span, gpu_ms, dropped)
    assert line.endswith("}\n") and "\n" not in line[:-1]
    line.encode("utf-8")  # always writable as UTF-8
    # strict JSON: no NaN or Infinity, whatever the user's meta held
    got = json.loads(line, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    expected: dict[str, Any] = {
        "v": RECORD_VERSION,
        "rank": rank,
        "step": step,
        "phase": phase,
        "kind": kind,
        "start_ns": start_ns,
        "cpu_ms": cpu_ns / 1e6,
        "gpu_ms": gpu_ms,
        "depth": depth,
        "error": error,
    }
    if thread is not None:
        expected["thread"] = thread
    if dropped:
        expected["dropped"] = dropped
    got_meta = got.pop("meta", None)
    assert got == expected
    if not meta:
        assert got_meta is None
    elif _finite(meta):
        assert got_meta == meta
    else:
        assert set(got_meta) == set(meta)  # kept, with the values JSON cannot hold as strings


ATTEMPT = {
    "attempt": "4f0c2a9e1b7d",
    "started_ns": 1795432166401223980,
    "launcher": "torchelastic",
    "job": "exp1",
    "restart": 1,
    "pid": 12880,
}


@settings(max_examples=200, deadline=None)
@given(
    rank=st.integers(0, 100_000),
    # any code points, lone surrogates too; names past what any host has
    host=st.none() | st.text(st.characters(codec=None), max_size=300),
)
def test_an_attempt_line_names_its_host_and_reads_back(rank: int, host: str | None) -> None:
    line = format_attempt(rank, ATTEMPT, host)
    assert line.endswith("}\n") and "\n" not in line[:-1]
    line.encode("utf-8")
    # The timings reader's pattern for an attempt line takes it, with the host last.
    assert _ATTEMPT_LINE.fullmatch(line.encode()) is not None
    got = json.loads(line)
    assert got == {
        "v": RECORD_VERSION,
        "rank": rank,
        **ATTEMPT,
        **({} if host is None else {"host": host}),
    }
    if host is None:
        assert line == format_attempt(rank, ATTEMPT)  # a line as before hosts were named
    mark = mark_of(got)
    assert isinstance(mark, AttemptMark)
    # The host is no part of the attempt: the same start on any host is the same attempt.
    assert (mark.token, mark.started_ns, mark.launcher, mark.job, mark.restart) == (
        "4f0c2a9e1b7d",
        1795432166401223980,
        "torchelastic",
        "exp1",
        1,
    )
    problem = None if host is None else host_problem(host)
    assert (mark.host, mark.host_problem) == ((host, None) if problem is None else (None, problem))
