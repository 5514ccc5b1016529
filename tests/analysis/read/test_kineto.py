from __future__ import annotations

import gzip
import json
import os
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rankscope import TraceError
from rankscope.analysis import load_trace, summarize_events, summarize_trace
from rankscope.traces._kineto import MAX_DUR_US, left_out_lines, summary_problem

GPU_TRACES = [
    "gpu-128rank-sampled-rank0.json.gz",
    "gpu-128rank-sampled-rank1.json.gz",
    "gpu-alexnet-1rank.json.gz",
    "rocm-mi250-minitoy.json.gz",
]


def _plain_kernel_sums(path: Path) -> dict[str, tuple[int, float]]:
    with gzip.open(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    sums: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for ev in events:
        if ev.get("cat") == "kernel":
            sums[ev["name"]][0] += 1
            sums[ev["name"]][1] += ev["dur"]
    return {name: (int(c), t) for name, (c, t) in sums.items()}


@pytest.mark.parametrize("name", GPU_TRACES)
def test_kernel_summary_equals_plain_sum_of_dur(real_traces: Path, name: str) -> None:
    path = real_traces / name
    summary = summarize_trace(path)
    expected = _plain_kernel_sums(path)
    assert summary["kind"] == "gpu_kernels"
    got = {item["name"]: (item["count"], item["total_us"]) for item in summary["items"]}
    assert got.keys() == expected.keys()
    for kernel, (count, total) in expected.items():
        assert got[kernel][0] == count
        assert got[kernel][1] == pytest.approx(total)
    assert summary["total_us"] == pytest.approx(sum(t for _, t in expected.values()))
    kernel_categories = [c for c in summary["categories"] if c["name"].endswith("tion")]
    assert sum(c["total_us"] for c in kernel_categories) == pytest.approx(summary["total_us"])
    assert sum(item["share"] for item in summary["items"]) == pytest.approx(1.0)
    totals = [item["total_us"] for item in summary["items"]]
    assert totals == sorted(totals, reverse=True)


def test_known_kernel_totals_from_the_traces_readme(real_traces: Path) -> None:
    # The README of ../shared/data/traces states these totals.
    for name, total_us, count in [
        ("gpu-128rank-sampled-rank0.json.gz", 606519, 1154),
        ("gpu-alexnet-1rank.json.gz", 10692, 79),
    ]:
        summary = summarize_trace(real_traces / name)
        assert summary["total_us"] == pytest.approx(total_us, abs=1)
        assert summary["count"] == count


def test_trace_without_kernels_falls_back_to_cpu_ops(real_traces: Path) -> None:
    summary = summarize_trace(real_traces / "cpu-gloo-rank34-of-300.pt.trace.json.gz")
    assert summary["kind"] == "cpu_ops"
    assert summary["rank"] == 34
    assert summary["count"] >= 1


def _op(name: str, ts: float, dur: float, tid: int = 1) -> dict[str, object]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def test_cpu_ops_are_ranked_by_self_time_so_nothing_counts_twice() -> None:
    events = [
        _op("aten::linear", 0, 10),
        _op("aten::addmm", 1, 8),  # inside linear: linear's own time is 2
        _op("aten::relu", 12, 3),
        _op("aten::linear", 20, 6),
        _op("aten::addmm", 0, 5, tid=2),  # another thread: not inside anything there
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 30},
    ]
    summary = summarize_events(events)
    items = {i["name"]: i for i in summary["items"]}
    assert summary["kind"] == "cpu_ops"
    assert (items["aten::linear"]["count"], items["aten::linear"]["total_us"]) == (2, 8)
    assert (items["aten::linear"]["min_us"], items["aten::linear"]["max_us"]) == (2, 6)
    assert (items["aten::addmm"]["count"], items["aten::addmm"]["total_us"]) == (2, 13)
    # Self times add up to the time the threads were busy in ops: 10 + 3 + 6 and 5.
    assert summary["total_us"] == 24
    assert [i["name"] for i in summary["items"]] == ["aten::addmm", "aten::linear", "aten::relu"]


def test_self_time_of_deep_and_overlapping_ops() -> None:
    events = [
        _op("a", 0, 100),
        _op("b", 10, 50),  # in a
        _op("c", 20, 10),  # in b
        _op("d", 35, 10),  # in b, after c
        _op("e", 70, 20),  # in a, after b ended
        _op("f", 95, 10),  # starts inside a, ends past it: not held by a
    ]
    items = {i["name"]: i["total_us"] for i in summarize_events(events)["items"]}
    assert items == {"a": 30, "b": 30, "c": 10, "d": 10, "e": 20, "f": 10}


def test_kernels_by_category_add_memory_time() -> None:
    def kernel(name: str, dur: float, cat: str = "kernel") -> dict[str, object]:
        return {"ph": "X", "cat": cat, "name": name, "ts": 0, "dur": dur, "pid": 0, "tid": 7}

    summary = summarize_events(
        [
            kernel("sm90_gemm", 30),
            kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 50),
            kernel("elementwise", 10),
            kernel("Memcpy HtoD (Pinned -> Device)", 7, "gpu_memcpy"),
            kernel("Memset (Device)", 1, "gpu_memset"),
        ]
    )
    assert summary["total_us"] == 90  # kernels only: memory ops are not kernels
    categories = {c["name"]: (c["count"], c["total_us"]) for c in summary["categories"]}
    assert categories == {
        "communication": (1, 50),
        "computation": (2, 40),
        "memcpy": (1, 7),
        "memset": (1, 1),
    }


def test_malformed_events_are_skipped() -> None:
    events = [
        "not an event",
        {"ph": "X", "cat": "kernel", "name": "k", "dur": "5"},
        {"ph": "X", "cat": "kernel", "name": None, "dur": 5},
        {"ph": "X", "cat": "kernel", "name": "k", "dur": True},
        {"ph": "X", "cat": "kernel", "name": "k", "dur": 5},
    ]
    summary = summarize_events(events)
    assert summary["count"] == 1
    assert summary["items"][0]["total_us"] == 5
    assert summary["left_out"] == {"dur": 2, "name": 1}  # counted, to be said
    assert left_out_lines(summary["left_out"]) == [
        "2 events with a bad dur (not a number from 0 to 1e15 us) left out",
        "1 event with a bad name (not a string) left out",
    ]
    assert "left_out" not in summarize_events(events[-1:])


@pytest.mark.parametrize(
    "dur",
    [10**400, float("nan"), float("inf"), -1.0, MAX_DUR_US, "7", {"us": 7}, [7]],
    ids=["10**400", "nan", "inf", "negative", "1e15", "string", "object", "list"],
)
@pytest.mark.parametrize("cat", ["kernel", "gpu_memcpy", "cpu_op"])
def test_a_dur_that_is_not_a_time_never_reaches_a_figure(dur: object, cat: str) -> None:
    first = "cpu_op" if cat == "cpu_op" else "kernel"  # memcpy counts in a GPU trace
    good = {"ph": "X", "cat": first, "name": "k", "ts": 0, "dur": 4, "pid": 1, "tid": 1}
    summary = summarize_events([good, dict(good, cat=cat, dur=dur, ts=10)])
    json.dumps(summary, allow_nan=False)
    assert summary["total_us"] == 4 and summary["count"] == 1
    assert summary["left_out"] == {"dur": 1}


def test_a_cpu_op_with_a_bad_ts_is_left_out_and_counted() -> None:
    op = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 4, "pid": 1, "tid": 1}
    events = [op, dict(op, ts="10"), dict(op, ts=float("nan")), dict(op, ts=10**400)]
    summary = summarize_events(events)
    assert summary["count"] == 1 and summary["left_out"] == {"ts": 3}
    # In a trace with kernels its CPU ops are not in the table, nor in what is said.
    kernel = {"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 1}
    assert "left_out" not in summarize_events([kernel, *events[1:]])


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        ({}, None),
        ({"kind": "gpu"}, 'kind is "gpu", not gpu_kernels or cpu_ops'),
        ({"rank": -1}, "rank is -1, not a rank"),
        ({"rank": True}, "rank is true, not a rank"),
        ({"rank": 2}, "it says rank 2, its name rank 1"),
        ({"count": 2.0}, "count is 2.0, not a whole number >= 0"),
        ({"total_us": 10**400}, "total_us is a number of about 401 digits"),
        ({"items": {}}, "items is {}, not a list"),
        ({"categories": None}, "categories is null, not a list"),
        ({"count": 3}, "its items' counts do not add up to its count"),
        ({"left_out": {"dur": -1}}, 'left_out is {"dur": -1}, not counts of events'),
    ],
)
def test_a_summary_read_back_is_checked_before_it_is_summed(
    edit: dict[str, object], problem: str | None
) -> None:
    kernel = {"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 2}
    summary = {"v": 2, "rank": 1, **summarize_events([kernel, kernel]), **edit}
    found = summary_problem(summary, name_rank=1)
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(problem), found


def test_a_fifo_is_never_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "rank-00000.pt.trace.json"
    os.mkfifo(fifo)
    done = ThreadPoolExecutor(1).submit(load_trace, fifo)  # a hang fails, not blocks
    with pytest.raises(TraceError, match="not a regular file \\(a FIFO\\)"):
        done.result(timeout=30)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not valid JSON"),
        (b"{not json", "not valid JSON"),
        (b'{"foo": 1}', "not a trace"),
        (b"42", "not a trace"),
        (gzip.compress(b'{"traceEvents": []}', mtime=0)[:-10], "truncated or corrupt gzip"),
        (b'{"traceEvents": [{"dur": ' + b"9" * 5000 + b"}]}", "a number of thousands of digits"),
        (b'{"traceEvents": [' + b"[" * 10**5 + b"]" * 10**5 + b"]}", "nested too deep"),
    ],
)
def test_bad_trace_files_give_a_trace_error_naming_the_file(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(TraceError, match=message) as info:
        load_trace(path)
    assert str(path) in str(info.value)


def test_missing_trace(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "absent.json.gz")


def test_bare_array_form_is_read(tmp_path: Path) -> None:
    path = tmp_path / "array.json"
    path.write_text(json.dumps([{"ph": "X", "cat": "kernel", "name": "k", "dur": 2, "ts": 0}]))
    assert summarize_trace(path)["total_us"] == 2
