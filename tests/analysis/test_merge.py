from __future__ import annotations

import gzip
import json
import math
import os
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rankscope import ConfigError, TraceError
from rankscope.analysis.core import _parallel
from rankscope.analysis.merge import _header, _merge_traces, merge_traces
from rankscope.testing._synthetic_traces import write_trace
from rankscope.traces._stream import scan_trace

BASE = 1_790_000_000_000_000_000
META = {"process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"}
ID_ARGS = ("correlation", "External id")

settings.register_profile("rankscope", deadline=None, max_examples=150)
settings.load_profile("rankscope")


def _load(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


def _dump(path: Path, trace: Any) -> Path:
    text = json.dumps(trace).encode()
    path.write_bytes(gzip.compress(text) if path.name.endswith(".gz") else text)
    return path


def _traces(tmp: Path, bases: list[int | None], size: int = 30_000) -> list[Path]:
    paths = []
    for rank, base in enumerate(bases):
        path = tmp / f"rank-{rank:05d}.pt.trace.json.gz"
        write_trace(path, rank=rank, world_size=len(bases), size_bytes=size, base_time_ns=base)
        paths.append(path)
    return paths


def _absorbed(event: Any) -> bool:
    return isinstance(event, dict) and event.get("ph") == "M" and event.get("name") in META


def _rank_of_pid(merged: dict[str, Any]) -> dict[int, int]:
    names = {}
    for ev in merged["traceEvents"]:
        if ev.get("ph") == "M" and ev.get("name") == "process_name":
            assert ev["pid"] not in names, f"pid {ev['pid']} named twice"
            names[ev["pid"]] = ev["args"]["name"]
    ranks = {}
    for pid, name in names.items():
        assert name.startswith("rank "), name
        ranks[pid] = int(name.removeprefix("rank "))
    return ranks


def _ns(ts: Any, base: int | None) -> int:
    """Absolute ns of a ts as written: `base` plus ts in us, exact to the ns."""
    return (base or 0) + int(Decimal(str(ts)) * 1000)


def _same_time(new: Any, out_base: int | None, old: Any, base: int | None) -> bool:
    # To the ns, or as near as a double holding the new ts can come (far from its base).
    slack = max(1.0, math.ulp(float(new)) * 1000)
    return abs(_ns(new, out_base) - _ns(old, base)) <= slack


def _perfetto_id(value: Any) -> Any:
    """A flow id as Perfetto reads it: a hex string is that number."""
    if isinstance(value, str):
        try:
            return int(value, 16)
        except ValueError:
            return value
    return value


def _flow_groups(events: list[dict[str, Any]], read: Any) -> set[frozenset[int]]:
    groups: dict[Any, set[int]] = defaultdict(set)
    for i, ev in enumerate(events):
        if ev.get("ph") in ("s", "t", "f"):
            groups[(ev.get("cat"), read(ev.get("id")))].add(i)
    return {frozenset(members) for members in groups.values()}


def _check_merge(inputs: list[Path], output: Path, ranks: list[int]) -> dict[str, Any]:
    """Everything a merged trace must satisfy whatever its inputs; returns the parsed output."""
    merged = _load(output)
    events = merged["traceEvents"]
    rank_of = _rank_of_pid(merged)
    assert sorted(rank_of.values()) == sorted(ranks)
    info = merged["rankscope"]["merged"]
    assert [item["rank"] for item in info] == ranks
    assert [item["source"] for item in info] == [str(p) for p in inputs]

    # Every event lies in exactly one rank's group; every thread in exactly one group,
    # and no thread id is another group's pid (Perfetto names threads by tid alone).
    owner: dict[Any, int] = {}
    for ev in events:
        assert ev["pid"] in rank_of, ev
        assert owner.setdefault(ev["tid"], ev["pid"]) == ev["pid"], ev
    for tid, pid in owner.items():
        assert tid not in rank_of or tid == pid

    # Per rank, the input's events in order (less the metadata the merge absorbs), with
    # absolute times kept to the ns and every field but pid/tid/ts and ids untouched.
    out_base = merged.get("baseTimeNanoseconds")
    by_pid: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for ev in events:
        if not (ev["ph"] == "M" and ev["name"] in META):
            by_pid[ev["pid"]].append(ev)
    for path, item in zip(inputs, info, strict=True):
        source = _load(path)
        base = source.get("baseTimeNanoseconds")
        assert item["baseTimeNanoseconds"] == base
        expected = [ev for ev in source["traceEvents"] if not _absorbed(ev)]
        got = by_pid[item["pid"]]
        assert len(got) == len(expected)
        # Flows join the same events as before (the same partition by id).
        assert _flow_groups(got, lambda i: i) == _flow_groups(expected, _perfetto_id)
        for old, new in zip(expected, got, strict=True):
            assert set(old) == set(new)
            for key in set(old) - {"pid", "tid", "ts", "id", "bind_id", "args", "s"}:
                assert new[key] == old[key]
            if isinstance(old.get("ts"), (int, float)):
                assert _same_time(new["ts"], out_base, old["ts"], base), (old, new)
            old_args, new_args = old.get("args"), new.get("args")
            if isinstance(old_args, dict):
                assert isinstance(new_args, dict)
                assert {k: v for k, v in new_args.items() if k not in ID_ARGS} == {
                    k: v for k, v in old_args.items() if k not in ID_ARGS
                }

    # Ids: no id (flow, correlation, External id) is used by two ranks.
    ids: dict[Any, set[int]] = defaultdict(set)
    for ev in events:
        for value in [ev.get("id"), *(ev.get("args", {}).get(k) for k in ID_ARGS)]:
            if value is not None:
                ids[value].add(ev["pid"])
    assert all(len(pids) == 1 for pids in ids.values())
    return merged


def test_merges_ranks_into_groups_with_aligned_clocks(tmp_path: Path) -> None:
    bases = [BASE, BASE + 1_500_000_123, None, BASE - 7_000_000]
    inputs = _traces(tmp_path, bases)
    out = tmp_path / "merged.pt.trace.json.gz"
    result = merge_traces(inputs, out)

    merged = _check_merge(inputs, out, [0, 1, 2, 3])
    assert result.output == out
    assert result.ranks == (0, 1, 2, 3)
    assert merged["baseTimeNanoseconds"] == result.base_time_ns == BASE - 7_000_000
    assert merged["displayTimeUnit"] == "ms"
    assert result.events_written == len(merged["traceEvents"])
    assert [item.rank_from for item in result.inputs] == ["distributedInfo"] * 4
    assert result.bytes_read == sum(p.stat().st_size for p in inputs)
    # It also reads back as a trace, streamed.
    streamed: list[Any] = []
    meta = scan_trace(out, streamed.append)
    assert streamed == merged["traceEvents"]
    assert meta["rankscope"] == merged["rankscope"]


def test_every_flow_pairs_up_inside_its_rank(tmp_path: Path) -> None:
    inputs = _traces(tmp_path, [BASE, BASE, BASE])
    truth_flows = 0
    for path in inputs:
        truth_flows += sum(1 for ev in _load(path)["traceEvents"] if ev.get("ph") == "s")
    out = tmp_path / "merged.json"
    merge_traces(inputs, out)
    events = _check_merge(inputs, out, [0, 1, 2])["traceEvents"]
    starts = {(ev["cat"], ev["id"]): ev["pid"] for ev in events if ev["ph"] == "s"}
    finishes = Counter((ev["cat"], ev["id"], ev["pid"]) for ev in events if ev["ph"] == "f")
    assert len(starts) == truth_flows > 0  # the same ids on every rank: all kept apart
    assert finishes == Counter({(cat, i, pid): 1 for (cat, i), pid in starts.items()})


def test_counts_events_written(tmp_path: Path) -> None:
    inputs = _traces(tmp_path, [BASE, None])
    out = tmp_path / "m.json"
    result = merge_traces(inputs, out)
    events = _load(out)["traceEvents"]
    read = [ev for path in inputs for ev in _load(path)["traceEvents"]]
    added = sum(1 for ev in events if ev["ph"] == "M" and ev["name"] in META)
    assert len(events) == result.events_written == len(read) - sum(map(_absorbed, read)) + added
    assert [item.events for item in result.inputs] == [
        len(_load(path)["traceEvents"]) for path in inputs
    ]


def _thread_names(events: list[dict[str, Any]], pid: int) -> list[str]:
    """The thread names of one rank's group, in their sort order."""
    names = {ev["tid"]: ev["args"]["name"] for ev in events if ev["name"] == "thread_name"}
    order = {
        ev["tid"]: ev["args"]["sort_index"] for ev in events if ev["name"] == "thread_sort_index"
    }
    assert names.keys() == order.keys()
    return [names[tid] for tid in sorted(names, key=order.__getitem__) if tid >> 12 == pid >> 12]


def test_keeps_thread_names_cpu_first(tmp_path: Path) -> None:
    inputs = _traces(tmp_path, [BASE, BASE])
    out = tmp_path / "m.json"
    merge_traces(inputs, out)
    events = _load(out)["traceEvents"]
    assert _thread_names(events, 1 << 12) == [
        "CPU · thread 4001 (python)",
        "GPU 0 · stream 7",
        "GPU 0 · stream 20",
    ]
    labels = [ev["args"]["labels"] for ev in events if ev["name"] == "process_labels"]
    assert labels == ["python", "python"]


def test_output_text_has_no_float_noise(tmp_path: Path) -> None:
    # Bases 0.000123 ms apart: every ts moves by a fraction that floats cannot hold exactly.
    inputs = _traces(tmp_path, [BASE, BASE + 123_456, BASE + 1])
    out = tmp_path / "m.json"
    merge_traces(inputs, out)
    merged = json.loads(out.read_text(), parse_float=Decimal)
    for ev in merged["traceEvents"]:
        if isinstance(ev["ts"], Decimal):
            exponent = ev["ts"].as_tuple().exponent
            assert isinstance(exponent, int) and exponent >= -3, ev
    _check_merge(inputs, out, [0, 1, 2])


def test_in_process_and_worker_merges_agree_and_repeat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inputs = _traces(tmp_path, [BASE, BASE + 3_000, None, BASE], size=200_000)
    here = tmp_path / "here.json"
    merge_traces(inputs, here)
    monkeypatch.setattr(_merge_traces, "_lane_count", lambda sources: 2)
    first, second = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    result = merge_traces(inputs, first)
    merge_traces(inputs, second)
    assert gzip.decompress(first.read_bytes()) == gzip.decompress(second.read_bytes())
    _check_merge(inputs, first, [0, 1, 2, 3])

    def per_pid(path: Path) -> dict[int, list[Any]]:
        groups: dict[int, list[Any]] = defaultdict(list)
        for ev in _load(path)["traceEvents"]:
            groups[ev["pid"]].append(ev)
        return groups

    assert per_pid(first) == per_pid(here)
    assert result.events_written == len(_load(here)["traceEvents"])


def test_workers_that_cannot_start_leave_the_reading_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inputs = _traces(tmp_path, [BASE, BASE])
    monkeypatch.setattr(_merge_traces, "_lane_count", lambda sources: 2)
    monkeypatch.setattr(_parallel, "_WORKER_BOOT", "import sys; sys.exit(3)")
    merge_traces(inputs, tmp_path / "m.json")
    _check_merge(inputs, tmp_path / "m.json", [0, 1])


def test_a_worker_that_dies_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = _traces(tmp_path, [BASE, BASE])
    monkeypatch.setattr(_merge_traces, "_lane_count", lambda sources: 2)
    ready_then_gone = "import pickle, sys; pickle.dump(('ready',), sys.stdout.buffer)"
    monkeypatch.setattr(_parallel, "_WORKER_BOOT", ready_then_gone)
    with pytest.raises(TraceError, match=r"rank-00000.*stopped \(exit code 0\)"):
        merge_traces(inputs, tmp_path / "m.json")
    assert _left(tmp_path, inputs) == []


def test_odd_pids_and_ids_stay_apart(tmp_path: Path) -> None:
    trace = {
        "traceEvents": [
            {"ph": "X", "name": "a", "pid": [1], "tid": {"x": 1}, "ts": 1.5, "dur": 1},
            {"ph": "X", "name": "b", "pid": [1], "tid": {"x": 1}, "ts": 2.5, "dur": 1},
            {"ph": "X", "name": "c", "pid": None, "tid": None, "ts": 3, "dur": 1},
            {"ph": "s", "id": "0x10", "cat": "c", "name": "c", "pid": 1, "tid": 1, "ts": 1},
            {"ph": "f", "id": 16, "cat": "c", "name": "c", "pid": 1, "tid": 2, "ts": 2},
            {"ph": "X", "name": "d", "pid": 1, "tid": 1, "ts": 1, "dur": 2, "bind_id": 2**40},
            {"ph": "i", "s": "g", "name": "mark", "pid": "", "tid": "", "ts": 4},
        ]
    }
    inputs = [_dump(tmp_path / f"t{i}.json", trace) for i in range(2)]
    merge_traces(inputs, tmp_path / "m.json", ranks=[0, 3])
    events = _check_merge(inputs, tmp_path / "m.json", [0, 3])["traceEvents"]
    rank3 = [ev for ev in events if ev["pid"] == 3 << 12 and ev["ph"] != "M"]
    assert rank3[0]["tid"] == rank3[1]["tid"] != rank3[2]["tid"]
    assert rank3[3]["id"] == rank3[4]["id"] == (3 << 32) + 16  # as Perfetto reads "0x10"
    assert rank3[5]["bind_id"] == f"rank3:{2**40}"
    assert rank3[6]["s"] == "p"


def test_result_as_plain_data(tmp_path: Path) -> None:
    inputs = _traces(tmp_path, [BASE, None])
    result = merge_traces(inputs, tmp_path / "m.json.gz")
    data = json.loads(json.dumps(result.to_dict()))
    assert data["output"] == str(tmp_path / "m.json.gz")
    assert data["ranks"] == [0, 1]
    assert data["base_time_ns"] == BASE
    assert [item["rank_from"] for item in data["inputs"]] == ["distributedInfo"] * 2
    assert data["json_bytes"] > data["bytes_read"]  # gzipped inputs


def test_progress_counts_up_to_the_files_sizes(tmp_path: Path) -> None:
    inputs = _traces(tmp_path, [BASE, BASE], size=200_000)
    seen: list[int] = []
    result = merge_traces(inputs, tmp_path / "m.json", progress=seen.append)
    assert seen == sorted(seen)
    assert len(seen) > 2 * len(inputs)  # within an input too, not only at its end
    assert seen[-1] == result.bytes_read == sum(p.stat().st_size for p in inputs)


# -- where ranks come from --------------------------------------------------------------


def _without_rank(source: Path, target: Path) -> Path:
    trace = _load(source)
    del trace["distributedInfo"]
    return _dump(target, trace)


def test_rank_from_the_file_name_or_given(tmp_path: Path) -> None:
    a, b = _traces(tmp_path, [BASE, BASE])
    named = _without_rank(b, tmp_path / "job-rank7_trace.json")
    result = merge_traces([a, named], tmp_path / "m.json")
    assert result.ranks == (0, 7)
    assert [item.rank_from for item in result.inputs] == ["distributedInfo", "file name"]

    result = merge_traces([a, named], tmp_path / "m.json", ranks=[5, 3])
    assert result.ranks == (5, 3)
    assert [item.rank_from for item in result.inputs] == ["given", "given"]
    _check_merge([a, named], tmp_path / "m.json", [5, 3])


def test_no_rank_is_an_error_not_rank_0(tmp_path: Path) -> None:
    (a,) = _traces(tmp_path, [BASE])
    anonymous = _without_rank(a, tmp_path / "trace.json")
    with pytest.raises(TraceError, match=r"trace\.json: cannot tell its rank"):
        merge_traces([anonymous], tmp_path / "m.json")
    assert merge_traces([anonymous], tmp_path / "m.json", ranks=[0]).ranks == (0,)


def test_real_traces_of_two_ranks(real_traces: Path, tmp_path: Path) -> None:
    inputs = [real_traces / f"gpu-128rank-sampled-rank{r}.json.gz" for r in (0, 1)]
    out = tmp_path / "merged.pt.trace.json.gz"
    result = merge_traces(inputs, out)
    assert result.ranks == (0, 1)
    merged = _check_merge(inputs, out, [0, 1])
    assert "baseTimeNanoseconds" not in merged  # neither input has one: ts stay absolute
    # Kineto's own order (its sort indices), not the order the threads first appear in.
    assert _thread_names(merged["traceEvents"], 0) == [
        "CPU · thread 4037 (python3.8)",
        "CPU · thread 23695 (python3.8)",
        "GPU 0 · stream 7",
        "GPU 0 · stream 23",
        "GPU 0 · stream 25",
        "GPU 0 · stream 84",
        "GPU 0 · stream 203",
        "Spans · PyTorch Profiler",
    ]
    kernels = Counter(
        _rank_of_pid(merged)[ev["pid"]] for ev in merged["traceEvents"] if ev.get("cat") == "kernel"
    )
    assert kernels == {0: 1154, 1: 1104}  # as the traces' README counts them


def test_all_real_traces_together(real_traces: Path, tmp_path: Path) -> None:
    inputs = sorted(real_traces.glob("*.json.gz"))
    out = tmp_path / "all.json"
    ranks = list(range(len(inputs)))
    result = merge_traces(inputs, out, ranks=ranks)
    merged = _check_merge(inputs, out, ranks)
    assert result.events_written == len(merged["traceEvents"])
    # Global instants became the rank's own.
    assert not [ev for ev in merged["traceEvents"] if ev.get("s") == "g"]


# -- bad input ----------------------------------------------------------------------------


def _left(tmp: Path, inputs: list[Path]) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p not in inputs)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        (b"{hello}", "not valid JSON"),
        (b'{"schemaVersion": 1}', "not a trace"),
        (b'{"traceEvents": [1, 2]}', "not a trace"),
        (b'{"traceEvents": [{"ph": "X"}', "truncated"),
        ("truncated-gz", "truncated or corrupt gzip"),
    ],
)
def test_bad_input_names_the_file_and_leaves_nothing(
    tmp_path: Path, content: bytes | str | None, message: str
) -> None:
    (good,) = _traces(tmp_path, [BASE])
    bad = tmp_path / "rank-00001.json.gz"
    if content == "truncated-gz":
        whole = gzip.compress(json.dumps(_load(good)).encode())
        bad.write_bytes(whole[: len(whole) // 2])
    elif isinstance(content, bytes):
        bad = bad.with_suffix("")  # rank-00001.json
        bad.write_bytes(content)
    out = tmp_path / "m.json.gz"
    with pytest.raises(TraceError, match=message) as caught:
        merge_traces([good, bad], out)
    assert str(caught.value).startswith(f"{bad}: ")
    assert _left(tmp_path, [good, bad]) == []


def test_bad_event_found_by_a_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = _traces(tmp_path, [BASE, BASE])
    trace = _load(inputs[1])
    trace["traceEvents"].insert(5, [1, 2])
    _dump(inputs[1], trace)
    monkeypatch.setattr(_merge_traces, "_lane_count", lambda sources: 2)
    with pytest.raises(TraceError, match=r"rank-00001.*event 6 is a list, not an object"):
        merge_traces(inputs, tmp_path / "m.json")
    assert _left(tmp_path, inputs) == []


def test_duplicate_rank_names_both_files(tmp_path: Path) -> None:
    a, b = _traces(tmp_path, [BASE, BASE])
    twin = _dump(tmp_path / "other.json", {**_load(b), "distributedInfo": {"rank": 0}})
    with pytest.raises(TraceError, match="rank 0") as caught:
        merge_traces([a, b, twin], tmp_path / "m.json")
    assert str(twin) in str(caught.value)
    assert str(a) in str(caught.value)
    with pytest.raises(TraceError, match="rank 0"):
        merge_traces([a, a], tmp_path / "m.json")
    with pytest.raises(TraceError, match="rank 4"):
        merge_traces([a, b], tmp_path / "m.json", ranks=[4, 4])
    assert _left(tmp_path, [a, b, twin]) == []


def test_bad_arguments(tmp_path: Path) -> None:
    (a,) = _traces(tmp_path, [BASE])
    with pytest.raises(ConfigError, match="inputs"):
        merge_traces([], tmp_path / "m.json")
    with pytest.raises(ConfigError, match="inputs"):
        merge_traces(str(a), tmp_path / "m.json")  # a str is a Sequence too
    with pytest.raises(ConfigError, match="ranks"):
        merge_traces([a], tmp_path / "m.json", ranks=[0, 1])
    with pytest.raises(ConfigError, match="ranks"):
        merge_traces([a], tmp_path / "m.json", ranks=[-1])
    assert _left(tmp_path, [a]) == []


def test_output_where_it_cannot_be_written(tmp_path: Path, read_only_dir: Path) -> None:
    (a,) = _traces(tmp_path, [BASE])
    with pytest.raises(TraceError, match=r"directory .*missing does not exist"):
        merge_traces([a], tmp_path / "missing" / "m.json")
    assert not (tmp_path / "missing").exists()
    with pytest.raises(TraceError, match="is a directory"):
        merge_traces([a], tmp_path)
    with pytest.raises(TraceError, match="cannot write"):
        merge_traces([a], read_only_dir / "m.json")
    assert list(read_only_dir.iterdir()) == []


def test_an_output_that_is_an_input_is_refused_whatever_its_name(tmp_path: Path) -> None:
    a, b = _traces(tmp_path, [BASE, BASE])
    before = a.read_bytes()
    (tmp_path / "link.json.gz").symlink_to(a)
    os.link(a, tmp_path / "hard.json.gz")
    for out in (a, tmp_path / "." / a.name, tmp_path / "link.json.gz", tmp_path / "hard.json.gz"):
        with pytest.raises(TraceError, match=rf"is the input {a} \(the same file\)"):
            merge_traces([a, b], out)
    assert a.read_bytes() == before
    merge_traces([a, b], tmp_path / "merged.json.gz")  # a new name, or another file, is fine
    merge_traces([a, b], tmp_path / "merged.json.gz")


def test_an_input_that_is_not_a_regular_file_is_never_opened(tmp_path: Path) -> None:
    (a,) = _traces(tmp_path, [BASE])
    fifo = tmp_path / "rank-00001.pt.trace.json"
    os.mkfifo(fifo)
    with pytest.raises(
        TraceError, match=r"rank-00001\.pt\.trace\.json: not a regular file \(a FIFO\)"
    ):
        merge_traces([a, fifo], tmp_path / "m.json")  # before: blocked in open()
    assert _left(tmp_path, [a, fifo]) == []


@pytest.mark.parametrize(
    ("base", "said"),
    [
        (10**500, "a number of about 501 digits"),
        (2**63, "9223372036854775808"),
        (-1, "-1"),
        (float("inf"), "Infinity"),
        ("1790000000000000000", '"1790000000000000000"'),
    ],
)
def test_a_base_time_that_is_not_one_is_named(tmp_path: Path, base: Any, said: str) -> None:
    a, b = _traces(tmp_path, [BASE, BASE])
    _dump(b, {**_load(b), "baseTimeNanoseconds": base})
    with pytest.raises(TraceError) as caught:
        merge_traces([a, b], tmp_path / "m.json")
    assert str(caught.value) == (
        f"{b}: baseTimeNanoseconds is {said}, not a time in nanoseconds (0 to 2**63 - 1)"
    )


def test_numbers_json_has_no_word_for_are_written_as_null(tmp_path: Path) -> None:
    a, b = _traces(tmp_path, [BASE, BASE + 1])  # b's shift is not whole microseconds
    trace = _load(b)
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    events[0]["dur"] = float("nan")
    events[1]["ts"] = 10**400  # past a float: kept as written
    events[2]["ts"] = float("inf")
    _dump(b, trace)
    result = merge_traces([a, b], tmp_path / "m.json")
    assert [i.not_finite for i in result.inputs] == [0, 2]
    merged = json.loads((tmp_path / "m.json").read_text(), parse_constant=_refuse_constant)
    assert sum(e.get("ts") == 10**400 for e in merged["traceEvents"]) == 1


def _refuse_constant(word: str) -> None:
    raise AssertionError(f"{word} written")


def test_base_time_beyond_the_cheap_look_is_still_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first read finds no base (a big field follows it, past the tail it looks at);
    # the full read does, and the merge runs again with it rather than write wrong times.
    a, b = _traces(tmp_path, [BASE, BASE])
    trace = _load(b)
    del trace["baseTimeNanoseconds"]
    trace["baseTimeNanoseconds"] = BASE + 5_000  # after the events, as Kineto writes it
    trace["zz"] = "x" * 5000
    _dump(b, trace)
    monkeypatch.setattr(_header, "_READ_CHUNK", 500)
    monkeypatch.setattr(_header, "_TAIL_BYTES", 1000)
    header = _header._read_header(str(b))
    assert header.base is _header._MISSING
    result = merge_traces([a, b], tmp_path / "m.json")
    assert result.inputs[1].base_time_ns == BASE + 5_000
    _check_merge([a, b], tmp_path / "m.json", [0, 1])


# -- fuzzed -----------------------------------------------------------------------------

PIDS = st.one_of(st.integers(0, 5), st.sampled_from(["Spans", "", "Traces"]))
TS = st.one_of(
    st.integers(-(10**6), 10**12),
    st.decimals(-(10**9), 10**9, places=3).map(float),
    st.decimals(10**12, 2 * 10**15, places=3).map(float),  # absolute us, as old traces hold
)
IDS = st.one_of(
    st.integers(0, 2**32 - 1),
    st.integers(-(2**40), 2**40),
    st.sampled_from(["0x1f", "0xAB", "17", "launch-3", "ff"]),
)


@st.composite
def _trace(draw: st.DrawFn) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(0, 12))):
        event: dict[str, Any] = {
            "ph": draw(st.sampled_from(["X", "i", "M", "C"])),
            "name": draw(st.sampled_from(["op", "thread_name", "process_name", "x"])),
            "pid": draw(PIDS),
            "tid": draw(PIDS),
            "ts": draw(TS),
        }
        if event["ph"] == "M":
            event["args"] = {"name": draw(st.text(max_size=5))}
        elif draw(st.booleans()):
            event["args"] = {key: draw(IDS) for key in draw(st.sets(st.sampled_from(ID_ARGS)))}
        events.append(event)
    for _ in range(draw(st.integers(0, 4))):
        flow_id, cat = draw(IDS), draw(st.sampled_from(["ac2g", "fwdbwd"]))
        for ph in "sf":
            events.insert(
                draw(st.integers(0, len(events))),
                {"ph": ph, "id": flow_id, "cat": cat, "name": cat, "pid": draw(PIDS),
                 "tid": draw(PIDS), "ts": draw(TS)},
            )  # fmt: skip
    trace: dict[str, Any] = {"traceEvents": events}
    base = draw(st.one_of(st.none(), st.integers(BASE - 10**12, BASE + 10**12)))
    if base is not None:
        trace["baseTimeNanoseconds"] = base
    return trace


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=60)
@given(traces=st.lists(_trace(), min_size=1, max_size=3))
def test_any_traces_merge_with_their_invariants(
    tmp_path_factory: pytest.TempPathFactory, traces: list[dict[str, Any]]
) -> None:
    tmp = tmp_path_factory.mktemp("fuzz")
    inputs = [_dump(tmp / f"t{i}.json", trace) for i, trace in enumerate(traces)]
    ranks = list(range(len(inputs)))[::-1]
    result = merge_traces(inputs, tmp / "m.json", ranks=ranks)
    merged = _check_merge(inputs, tmp / "m.json", ranks)
    assert result.events_written == len(merged["traceEvents"])
