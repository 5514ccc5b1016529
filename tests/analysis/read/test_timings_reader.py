"""Reading the timer's JSONL files back: whole runs, torn and bad lines, fuzzed input."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rankscope import TraceError
from rankscope.analysis.read._timings import read_rank_timings, read_timings

settings.register_profile("timings", deadline=None, max_examples=200)


def _record(rank: int, step: int, phase: str = "forward", **extra: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "v": 1,
        "rank": rank,
        "step": step,
        "phase": phase,
        "kind": "compute",
        "start_ns": 1_700_000_000_000_000_000 + step,
        "cpu_ms": 1.5 + step,
        "gpu_ms": None,
        "depth": 0,
        "error": False,
    }
    record.update(extra)
    return record


def _write(run_dir: Path, rank: int, lines: list[str], end: str = "\n") -> Path:
    path = run_dir / "timings" / f"rank-{rank:05d}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + end if lines else "", encoding="utf-8")
    return path


def _rows(timings: Any) -> list[tuple[Any, ...]]:
    return [
        (
            timings.step[i],
            timings.names[timings.phase[i]],
            timings.kinds[timings.kind[i]],
            timings.start_ns[i],
            timings.cpu_ms[i],
            None if math.isnan(timings.gpu_ms[i]) else timings.gpu_ms[i],
            timings.depth[i],
            bool(timings.error[i]),
        )
        for i in range(len(timings))
    ]


def _expected(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (
            r["step"],
            r["phase"],
            r["kind"],
            r["start_ns"],
            r["cpu_ms"],
            r["gpu_ms"],
            r["depth"],
            r["error"],
        )
        for r in records
    ]


def test_a_real_run_reads_back_record_for_record(tmp_path: Path) -> None:
    import rankscope

    config = rankscope.ProfileConfig(
        output_dir=tmp_path, timer=rankscope.TimerConfig(enable=True, every_n_steps=2)
    )
    for rank in range(3):
        prof = rankscope.Profiler(config, rank=rank, world_size=3)
        with prof:
            for _ in range(6):
                with (
                    prof.phase("forward"),
                    prof.phase("inner", kind="comm", meta_key=[1, {"a": 2}]),
                ):
                    pass
                prof.step()
    run = read_timings(tmp_path)
    assert sorted(run.ranks) == [0, 1, 2]
    assert run.skipped == []
    for rank, timings in run.ranks.items():
        path = tmp_path / "timings" / f"rank-{rank:05d}.jsonl"
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        records = [r for r in lines if "attempt" not in r]
        assert len(records) == 3 * 3 and len(lines) == len(records) + 1
        assert _rows(timings) == _expected(records)


def test_a_torn_last_line_is_skipped_and_said(tmp_path: Path) -> None:
    lines = [json.dumps(_record(0, s)) for s in range(3)]
    _write(tmp_path, 0, [*lines, lines[0][:40]], end="")
    run = read_timings(tmp_path)
    assert len(run.ranks[0]) == 3
    assert len(run.skipped) == 1 and "last line is cut short" in run.skipped[0]
    assert "rank-00000.jsonl:4" in run.skipped[0]


def test_a_bad_line_in_the_middle_is_skipped_with_its_number(tmp_path: Path) -> None:
    good = [json.dumps(_record(1, s)) for s in range(4)]
    _write(
        tmp_path,
        1,
        [good[0], "{not json", good[1], "[1, 2]", good[2], json.dumps(_record(7, 9)), good[3]],
    )
    run = read_timings(tmp_path)
    assert [row[0] for row in _rows(run.ranks[1])] == [0, 1, 2, 3]
    assert [s.split(": ", 1)[0].rsplit(":", 1)[1] for s in run.skipped] == ["2", "4", "6"]
    assert "rank 7 in the file of rank 1" in run.skipped[2]


def test_unknown_fields_are_ignored_and_missing_ones_named(tmp_path: Path) -> None:
    incomplete = _record(0, 1)
    del incomplete["cpu_ms"]
    _write(tmp_path, 0, [json.dumps(_record(0, 0, future_field={"x": 1})), json.dumps(incomplete)])
    run = read_timings(tmp_path)
    assert len(run.ranks[0]) == 1
    assert "without cpu_ms" in run.skipped[0]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda root: root / "missing", "no such directory"),
        (lambda root: (root / "file").touch() or root / "file", "not a directory"),
        (lambda root: root, "no timings"),
        (lambda root: (root / "timings").mkdir() or root, "no timings"),
    ],
)
def test_a_run_without_timings_is_a_named_error(tmp_path: Path, make: Any, message: str) -> None:
    target = make(tmp_path)
    with pytest.raises(TraceError, match=message) as info:
        read_timings(target)
    assert str(target) in str(info.value)


def test_files_that_give_nothing_are_said_and_the_rest_is_read(tmp_path: Path) -> None:
    _write(tmp_path, 0, [json.dumps(_record(0, 0))])
    _write(tmp_path, 1, [])
    (tmp_path / "timings" / "rank-x.jsonl").write_text("{}\n")
    run = read_timings(tmp_path)
    assert sorted(run.ranks) == [0]
    assert any("rank-00001.jsonl: no records" in s for s in run.skipped)
    assert any("rank-x.jsonl: not a timings file" in s for s in run.skipped)


def test_nothing_usable_at_all_is_a_named_error(tmp_path: Path) -> None:
    _write(tmp_path, 0, ["garbage"])
    with pytest.raises(TraceError, match=r"no usable timings.*not valid JSON"):
        read_timings(tmp_path)


RECORD = st.builds(
    _record,
    rank=st.just(0),
    step=st.integers(0, 10**6),
    phase=st.text(max_size=12),
    depth=st.integers(0, 5),
    gpu_ms=st.none() | st.floats(0, 1e6),
    meta=st.dictionaries(st.text(max_size=3), st.integers() | st.text(max_size=5), max_size=2),
)
GARBAGE = st.binary(max_size=40).filter(lambda b: b"\n" not in b)


@settings(
    settings.get_profile("timings"), suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(items=st.lists(st.one_of(RECORD, GARBAGE), max_size=30), batch=st.sampled_from([1, 3, 4096]))
def test_good_lines_are_read_exactly_whatever_lies_between(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, items: list[Any], batch: int
) -> None:
    from rankscope.analysis.read import _any_lines

    monkeypatch.setattr(_any_lines, "_BATCH", batch)
    path = tmp_path / "rank-00000.jsonl"
    path.write_bytes(
        b"".join((json.dumps(i).encode() if isinstance(i, dict) else i) + b"\n" for i in items)
    )
    timings = read_rank_timings(path)
    # 40 bytes cannot hold a whole record, so no garbage line passes for one: every record
    # line is read, in order, and every garbage line that is not blank is said once.
    good = [i for i in items if isinstance(i, dict)]
    assert _rows(timings) == _expected(good)
    garbage = [i for i in items if isinstance(i, bytes) and i.strip()]
    assert len(timings.skipped) == len(garbage)


@settings(
    settings.get_profile("timings"), suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=400))
def test_arbitrary_bytes_give_only_trace_errors(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "timings" / "rank-00000.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    try:
        run = read_timings(tmp_path)
    except TraceError as exc:
        assert str(tmp_path) in str(exc)
    else:
        assert len(run.ranks[0]) >= 1


# -- the column path for the timer's own lines ----------------------------------------


def _timer_line(
    rank: int, step: int, phase: str, cpu_ns: int, gpu_ms: float | None, **kw: Any
) -> str:
    from rankscope.timing._record import Span, format_record

    span = Span(step, phase, kw.get("kind", "compute"), kw.get("meta"), kw.get("depth", 0), None)
    span.start_ns = kw.get("start_ns", 1_790_000_000_000_000_000 + step)
    span.cpu_ns = cpu_ns
    span.error = kw.get("error", False)
    span.coll = kw.get("coll", -1)
    oncpu = kw.get("oncpu_ns")
    span.oncpu_ns = -1 if oncpu is None else oncpu
    runq = kw.get("runq_ns")
    span.runq_ns = -1 if runq is None else runq
    return format_record(rank, span, gpu_ms, 0)


def _columns(timings: Any) -> tuple[Any, ...]:
    return (
        timings.names,
        timings.kinds,
        timings.step.tolist(),
        timings.phase.tolist(),
        timings.kind.tolist(),
        timings.start_ns.tolist(),
        timings.cpu_ms.tolist(),
        [None if math.isnan(v) else v for v in timings.gpu_ms.tolist()],
        timings.depth.tolist(),
        timings.error.tolist(),
        timings.coll.tolist(),
        [None if math.isnan(v) else v for v in timings.oncpu_ms.tolist()],
        [None if math.isnan(v) else v for v in timings.runq_ms.tolist()],
        timings.skipped,
    )


def test_the_timers_own_lines_are_read_as_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rankscope.analysis.read import _any_lines, _timings

    lines = [
        _timer_line(3, s, name, 1_234_567 * (s + 1), None if s % 2 else 0.25 * s, error=s == 4)
        for s in range(6)
        for name in ("forward", "bäckward \u2603", 'q"uote\\')
    ]
    path = tmp_path / "rank-00003.jsonl"
    path.write_text("".join(lines), encoding="utf-8")
    expected = _columns(_any_lines.read_any_lines(path.read_bytes(), 3, path))

    def refuse(*args: Any) -> None:
        raise AssertionError("the line-by-line reader was used")

    monkeypatch.setattr(_timings, "read_any_lines", refuse)
    got = _columns(read_rank_timings(path))
    assert got == expected
    assert got[0] == ["forward", "bäckward \u2603", 'q"uote\\']
    assert got[9][12:15] == [True, True, True]  # step 4 raised
    assert sum(got[9]) == 3


TIMER_LINE = st.builds(
    _timer_line,
    rank=st.sampled_from([0, 0, 0, 1]),
    step=st.integers(0, 10**6),
    phase=st.text(max_size=8),
    cpu_ns=st.integers(0, 10**15),
    gpu_ms=st.none() | st.floats(allow_nan=False) | st.floats(0, 1e3),
    depth=st.integers(0, 3),
    start_ns=st.integers(0, 2**63 - 1),
    meta=st.sampled_from([None] * 9 + ['{"k":[1,2]}']),
    error=st.booleans(),
    coll=st.sampled_from([-1, 0, 3]),
    oncpu_ns=st.none() | st.integers(0, 10**15),
    runq_ns=st.none() | st.integers(0, 10**15),
)


@settings(
    settings.get_profile("timings"), suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lines=st.lists(TIMER_LINE, max_size=20)
    | st.lists(
        st.one_of(TIMER_LINE, GARBAGE.map(lambda b: b.decode("latin-1") + "\n")), max_size=20
    )
)
def test_the_column_path_reads_exactly_what_json_reads(tmp_path: Path, lines: list[str]) -> None:
    from rankscope.analysis.read import _any_lines

    path = tmp_path / "rank-00000.jsonl"
    path.write_bytes("".join(lines).encode("utf-8", "surrogatepass"))
    body = path.read_bytes()
    assert _columns(read_rank_timings(path)) == _columns(_any_lines.read_any_lines(body, 0, path))


@pytest.mark.parametrize(
    ("field", "value", "usable"),
    [
        ("step", 2**63 - 1, True),
        ("step", 2**63, False),
        ("start_ns", 9_223_372_036_854_775_807, True),
        ("start_ns", 9_223_372_036_854_775_808, False),
        ("start_ns", 10**19, False),
        ("start_ns", 10**20, False),
    ],
)
def test_integers_past_int64_are_skipped_on_both_paths(
    tmp_path: Path, field: str, value: int, usable: bool
) -> None:
    from rankscope.analysis.read import _any_lines

    fields = {"step": 1, "start_ns": 5, field: value}
    lines = [
        _timer_line(0, 0, "a", 10, None),
        _timer_line(0, cpu_ns=20, phase="b", gpu_ms=1.0, **fields),
    ]
    path = tmp_path / "rank-00000.jsonl"
    path.write_text("".join(lines), encoding="utf-8")
    got = read_rank_timings(path)
    assert _columns(got) == _columns(_any_lines.read_any_lines(path.read_bytes(), 0, path))
    assert len(got) == (2 if usable else 1)
    assert bool(got.skipped) is not usable


@pytest.mark.parametrize("fast", [True, False], ids=["timer-layout", "line-by-line"])
def test_a_phases_time_on_cpu_is_read_and_a_bad_one_is_none(tmp_path: Path, fast: bool) -> None:
    lines = [
        _timer_line(0, 0, "compute", 2_000_000, None, oncpu_ns=1_500_000, runq_ns=250_000),
        _timer_line(0, 0, "sleep", 20_000_000, None, oncpu_ns=0, runq_ns=0),
        _timer_line(0, 0, "older", 3_000_000, None),  # an older rankscope: neither time
        _timer_line(0, 0, "no-queue", 3_000_000, None, oncpu_ns=1_000_000),  # not Linux
    ]
    if not fast:  # values no timer writes: the whole file is read line by line
        lines += [
            json.dumps(_record(0, 1, f"bad-{i}", oncpu_ms=bad, runq_ms=bad)) + "\n"
            for i, bad in enumerate(["1", True, -1.0, 10**400, None, [1]])
        ]
    path = _write(tmp_path, 0, [x.rstrip("\n") for x in lines])
    got = read_rank_timings(path)
    names = [got.names[p] for p in got.phase.tolist()]
    oncpu = dict(zip(names, got.oncpu_ms.tolist(), strict=True))
    runq = dict(zip(names, got.runq_ms.tolist(), strict=True))
    assert oncpu["compute"] == 1.5 and oncpu["sleep"] == 0.0
    assert runq["compute"] == 0.25 and runq["sleep"] == 0.0
    assert math.isnan(oncpu["older"]) and math.isnan(runq["older"])
    assert oncpu["no-queue"] == 1.0 and math.isnan(runq["no-queue"])
    assert len(got) == len(lines)  # every record stands, with or without the times
    assert all(math.isnan(v) for name, v in oncpu.items() if name.startswith("bad-"))
    assert all(math.isnan(v) for name, v in runq.items() if name.startswith("bad-"))
