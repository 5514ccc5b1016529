from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rankscope import TraceError
from rankscope.traces import _stream
from rankscope.traces._stream import scan_trace

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
EVENT = st.dictionaries(
    st.sampled_from(["ph", "name", "cat", "ts", "dur", "pid", "tid", "args", "ünï"]),
    JSON,
    max_size=6,
)
TRACE = st.fixed_dictionaries(
    {"traceEvents": st.lists(EVENT, max_size=20)},
    optional={"distributedInfo": JSON, "schemaVersion": st.integers(), "tail": st.text()},
)

settings.register_profile("rankscope", deadline=None, max_examples=150)
settings.load_profile("rankscope")


def _scan(path: Path) -> tuple[dict[str, Any], list[Any]]:
    events: list[Any] = []
    meta = scan_trace(path, events.append)
    return meta, events


@pytest.fixture(
    params=[(1, 1), (7, 30), (64, 1 << 19), (1 << 20, 1 << 19)],
    ids=["chunk1", "chunk7-batch30", "chunk64-batch512KiB", "chunk1MiB"],
)
def chunk(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """The reader at several sizes of chunk (what is read at once) and of batch (what is
    decoded at once): batches cut in every place, and events read one by one."""
    size, batch = request.param
    monkeypatch.setattr(_stream, "_CHUNK", size)
    monkeypatch.setattr(_stream, "_BATCH", batch)
    return int(size)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(trace=TRACE, indent=st.sampled_from([None, 1]), compress=st.booleans())
def test_streaming_equals_a_whole_parse(
    tmp_path: Path, chunk: int, trace: dict[str, Any], indent: int | None, compress: bool
) -> None:
    text = json.dumps(trace, indent=indent, ensure_ascii=False).encode()
    path = tmp_path / "t.json"
    path.write_bytes(gzip.compress(text) if compress else text)
    meta, events = _scan(path)
    assert events == trace["traceEvents"]
    assert meta == {k: v for k, v in trace.items() if k != "traceEvents"}


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes_give_only_trace_errors(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "junk.json"
    path.write_bytes(data)
    try:
        _scan(path)
    except TraceError as exc:
        assert str(path) in str(exc)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(trace=TRACE, cut=st.floats(min_value=0.0, max_value=0.999), compress=st.booleans())
def test_any_truncation_is_a_trace_error(
    tmp_path: Path, trace: dict[str, Any], cut: float, compress: bool
) -> None:
    text = json.dumps(trace).encode()
    data = gzip.compress(text) if compress else text
    path = tmp_path / "cut.json"
    path.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(TraceError):
        _scan(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"traceEvents": [{"a": 1}, {"b": 2}', "truncated"),
        ('{"traceEvents": [{"a": 1}] ', "truncated"),
        ('{"traceEvents": [{"a": 1}]} {}', "data after the trace"),
        ('{"traceEvents": [{"a": 1} {"b": 2}]}', "expected , or ]"),
        ('{"traceEvents": {"a": 1}}', "no traceEvents list"),
        ('{"other": []}', "no traceEvents list"),
        ("[1, 2]", r"event 1 is a number, not an object"),
        ('{"traceEvents": [{"a": 1}, null]}', r"event 2 is null, not an object"),
        ('{"traceEvents": [{"a": 1}, {}, ["x"]]}', r"event 3 is a list, not an object"),
        ("", "empty"),
        ("   ", "empty"),
    ],
)
def test_bad_structure_is_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(TraceError, match=message):
        _scan(path)


def test_an_error_raised_by_the_visitor_passes_through(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [{"a": 1}]}))

    def visit(_: Any) -> None:
        raise KeyError("mine")

    with pytest.raises(KeyError, match="mine"):
        scan_trace(path, visit)


def test_real_traces_stream_equal_to_a_whole_parse(real_traces: Path) -> None:
    for path in sorted(real_traces.glob("*.gz")):
        with gzip.open(path, "rt") as fh:
            whole = json.load(fh)
        meta, events = _scan(path)
        assert events == whole["traceEvents"], path.name
        assert meta == {k: v for k, v in whole.items() if k != "traceEvents"}, path.name


@pytest.mark.parametrize("number", ["0.0", "-12.5e-3", "123456", "1E+9"])
def test_a_number_split_across_chunks_is_read_whole(
    tmp_path: Path, chunk: int, number: str
) -> None:
    path = tmp_path / "t.json"
    path.write_text(
        f'{{"baseTimeNanoseconds": {number}, "traceEvents": [{{"ts": {number}}}], '
        f'"distributedInfo": {number}}}'
    )
    meta, events = _scan(path)
    value = json.loads(number)
    assert events == [{"ts": value}]
    assert meta == {"baseTimeNanoseconds": value, "distributedInfo": value}
