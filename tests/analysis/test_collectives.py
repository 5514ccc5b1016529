"""`rankscope collectives`: matching collectives across ranks, clocks, last arrivals, bad input."""

from __future__ import annotations

import gzip
import json
import math
import shutil
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rankscope.analysis.collectives import _collectives as collectives
from rankscope.analysis.collectives._collectives import (
    HostOffsets,
    collectives_of_run,
    find_collectives,
)
from rankscope.analysis.render._collectives import collectives_section
from rankscope.cli._collectives import add_commands
from rankscope.rundir._layout import meta_path, timing_path, trace_path
from rankscope.testing._gloo import GlooRanks
from rankscope.testing._synthetic import PhaseSpec, write_timings

from .._helpers import run_cli

WINDOW = "step-000001-000002"
BASE = 1_790_000_000_000_000_000
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
BROADCAST = "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """`rankscope ARGV` through the real entry point: (exit code, stdout, stderr)."""
    from rankscope.cli import _main

    if "collectives" not in _main._parser()._commands().choices:
        # Until cli/_main.py registers the command: add it where `sql` is added.
        sql = _main._sql.add_commands

        def both(commands: Any) -> None:
            sql(commands)
            add_commands(commands)

        monkeypatch.setattr(_main._sql, "add_commands", both)
    return lambda *argv: run_cli([str(a) for a in argv], capsys)


def _kernel(ts: float, name: str = ALLREDUCE, **args: Any) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "pid": 0,
        "tid": 7,
        "ts": ts,
        "dur": 9.0,
        "args": args,
    }


def _op(ts: float, name: str, dur: float = 20.0, tid: int = 1, **args: Any) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "cpu_op",
        "name": name,
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def _write(
    path: Path, rank: int, events: list[dict[str, Any]], base: int | None = BASE, **info: Any
) -> Path:
    data: dict[str, Any] = {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 4, **info},
        "traceEvents": events,
    }
    if base is not None:
        data["baseTimeNanoseconds"] = base
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = json.dumps(data).encode()
    path.write_bytes(gzip.compress(raw) if path.name.endswith(".gz") else raw)
    return path


def _window(root: Path, per_rank: dict[int, list[dict[str, Any]]], **kw: Any) -> Path:
    for rank, events in per_rank.items():
        _write(trace_path(root, WINDOW, rank, gzip=True), rank, events, **kw)
    return root / "traces" / WINDOW


def _meta(root: Path, rank: int, host: str, wall_ns: int, mono_ns: int) -> None:
    path = meta_path(root, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    clock = {"time_ns": wall_ns, "perf_counter_ns": mono_ns}
    path.write_text(
        json.dumps({"v": 1, "rank": rank, "world_size": 4, "host": host, "clock": clock})
    )


def _rank(found: dict[str, Any], rank: int) -> dict[str, Any]:
    (row,) = [r for r in found["ranks"] if r["rank"] == rank]
    return row


# -- the two ranks of a real 128-rank NCCL job --------------------------------------------


def _nccl_calls(path: Path) -> dict[str, list[float]]:
    """Per c10d call, the starts of the NCCL kernels it launched, read plainly: the
    kernel's correlation id to its cudaLaunchKernel, then the c10d op around that launch."""
    with gzip.open(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    launch = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"}
    calls = [e for e in events if e.get("cat") == "cpu_op" and e["name"].startswith("c10d::")]
    out: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") != "kernel" or "nccl" not in e["name"].lower():
            continue
        at = launch[e["args"]["correlation"]]
        (call,) = [
            c
            for c in calls
            if (c["pid"], c["tid"]) == (at["pid"], at["tid"])
            and c["ts"] <= at["ts"] <= c["ts"] + c["dur"]
        ]
        out.setdefault(call["name"].split("::")[1].strip("_"), []).append(e["ts"])
    return {name: sorted(starts) for name, starts in out.items()}


def test_the_real_ranks_match_and_their_figures_are_those_of_the_kernels(real_traces: Path) -> None:
    """Every NCCL kernel of these traces is named SendRecv, though the c10d calls that
    launched them are all-reduces, all-to-alls and all-gathers: matched as those."""
    paths = [real_traces / f"gpu-128rank-sampled-rank{r}.json.gz" for r in (0, 1)]
    found = find_collectives(paths).to_dict()
    calls = [_nccl_calls(path) for path in paths]
    assert {n: len(s) for n, s in calls[0].items()} == {
        "alltoall_base": 4,
        "allreduce": 4,
        "allgather_base": 2,
    }
    assert {n: len(s) for n, s in calls[1].items()} == {n: len(s) for n, s in calls[0].items()}
    assert found["source"] == "gpu"
    assert found["unmatched"] == []
    rows = found["collectives"]
    assert len(rows) == 10
    first = min(min(starts) for per_rank in calls for starts in per_rank.values())
    last_counts = {0: 0, 1: 0}
    late = {0: 0.0, 1: 0.0}
    for name, starts in calls[0].items():
        mine = sorted((r for r in rows if r["name"] == name), key=lambda r: r["index"])
        assert [r["index"] for r in mine] == list(range(len(starts)))
        for row, a, b in zip(mine, starts, calls[1][name], strict=True):
            assert row["skew_ms"] == pytest.approx(abs(a - b) / 1000, abs=1e-3)
            later = 1 if b > a else 0
            assert (row["first_rank"], row["last_rank"]) == (1 - later, later)
            assert row["at_ms"] == pytest.approx((min(a, b) - first) / 1000, abs=1e-3)
            last_counts[later] += 1
            late[later] += abs(a - b) / 1000
    for rank in (0, 1):
        assert _rank(found, rank)["arrived_last"] == last_counts[rank]
        assert _rank(found, rank)["late_ms"] == pytest.approx(late[rank], abs=1e-2)
        assert _rank(found, rank)["collectives"] == 10
    assert last_counts[1] == 8  # what these traces hold
    assert found["summary"].startswith("rank 1 arrives last at most collectives")
    notes = " ".join(found["notes"])
    assert "no meta files" in notes
    assert "SendRecv kernels" in notes and "8 allreduce, 8 alltoall_base" in notes
    assert "do not tell apart" not in notes
    assert found["alignment"] == "as written"


def test_the_stdlib_reader_finds_what_msgspec_finds(
    real_traces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where msgspec is absent the same events go through json: the figures are the same."""
    from rankscope.analysis.read import _collective_events as events

    paths = [real_traces / f"gpu-128rank-sampled-rank{r}.json.gz" for r in (0, 1)]
    typed = find_collectives(paths).to_dict()
    plain = events.BatchDecoder(events._plain, events._shape)
    monkeypatch.setattr(events, "_DECODERS", [plain])
    assert events._decoder() is plain
    assert find_collectives(paths).to_dict() == typed


def test_the_real_ranks_through_the_cli_as_strict_json(
    real_traces: Path, cli: Callable[..., Any]
) -> None:
    paths = [real_traces / f"gpu-128rank-sampled-rank{r}.json.gz" for r in (0, 1)]
    code, out, err = cli("collectives", *paths, "--json")
    assert (code, err) == (0, "")
    found = json.loads(out, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    assert [(r["rank"], r["arrived_last"]) for r in found["ranks"]] == [(0, 2), (1, 8)]
    assert all(isinstance(r["late_ms"], float) for r in found["ranks"])
    code, out, _ = cli("collectives", *paths)
    assert code == 0
    assert "rank 1 arrives last at most collectives" in out
    assert "alltoall_base" in out and "clocks: trace times as written" in out


# -- a spawned gloo job with one rank made late --------------------------------------------

WORLD = 3
LATE = 1
SLEEP_S = 0.05
LATE_WINDOW = "step-000002-000003"  # after a warm-up step: starting the profiler takes a while


def _late_rank_job(rank: int, world_size: int, run_dir: str) -> None:
    """Each step: rank LATE sleeps before an all-reduce and a broadcast of the world; then
    ranks 0 and 1 all-reduce in a group of their own (rank 2 is not in it)."""

    import torch
    import torch.distributed as dist

    import rankscope

    pair = dist.new_group([0, 1])
    config = rankscope.ProfileConfig(
        output_dir=run_dir,
        trace=rankscope.TraceConfig(
            enable=True, ranks="all", schedule=rankscope.Schedule(wait=1, warmup=1, active=2)
        ),
    )
    x = torch.ones(64)
    with rankscope.Profiler(config) as prof:
        for _ in range(5):
            if rank == LATE:
                time.sleep(SLEEP_S)
            dist.all_reduce(x)
            if rank == LATE:
                time.sleep(SLEEP_S)
            dist.broadcast(x, 0)
            if rank in (0, 1):
                dist.all_reduce(x, group=pair)
            prof.step()
    dist.barrier()


@pytest.fixture(scope="module")
def late_run(tmp_path_factory: pytest.TempPathFactory, gloo_ranks: GlooRanks) -> Path:
    root = tmp_path_factory.mktemp("late")
    gloo_ranks.run(_late_rank_job, WORLD, root)
    return root


@pytest.mark.slow
def test_the_late_rank_is_named_last_at_most_collectives(late_run: Path) -> None:
    found = find_collectives([late_run / "traces" / LATE_WINDOW]).to_dict()
    assert found["source"] == "cpu"
    assert found["window"] == LATE_WINDOW
    broadcasts = [c for c in found["collectives"] if c["name"] == "broadcast"]
    assert len(broadcasts) == 2 and all(c["ranks"] == WORLD for c in broadcasts)
    assert all(c["last_rank"] == LATE for c in broadcasts)
    # The world all-reduces it slept before; the pair's own all-reduces are a toss-up.
    late = _rank(found, LATE)
    assert late["arrived_last"] >= 4
    assert late["arrived_last"] == max(r["arrived_last"] for r in found["ranks"])
    assert late["arrived_last"] > late["collectives"] / 2
    assert found["summary"].startswith(f"rank {LATE} arrives last at most collectives")
    # It called each collective after its sleep, so it was at least that much behind.
    assert min(c["late_ms"] for c in broadcasts) >= SLEEP_S * 1000 / 4
    assert all(c["skew_ms"] >= c["late_ms"] >= c["gap_ms"] > 0 for c in broadcasts)
    assert {r["clock"] for r in found["ranks"]} == {"wall"}
    assert len({r["host"] for r in found["ranks"]}) == 1


@pytest.mark.slow
def test_a_group_some_ranks_are_not_in_is_reported_unmatched(late_run: Path) -> None:
    found = find_collectives([late_run / "traces" / LATE_WINDOW]).to_dict()
    (entry,) = found["unmatched"]
    assert entry["name"] == "allreduce" and entry["ranks"] == [2]
    assert entry["counts"] == {"0": 4, "1": 4, "2": 2}
    assert "rank 2 has 2 allreduce where ranks 0, 1 have 4" in entry["reason"]
    reduces = [c for c in found["collectives"] if c["name"] == "allreduce"]
    assert len(reduces) == 4 and all(c["ranks"] == 2 for c in reduces)
    assert any("pg_config" in note for note in found["notes"])


@pytest.mark.slow
def test_the_cli_and_the_report_section_on_the_spawned_run(
    late_run: Path, cli: Callable[..., Any]
) -> None:
    code, out, _ = cli("collectives", late_run / "traces" / LATE_WINDOW)
    assert code == 0
    assert f"rank {LATE} arrives last at most collectives" in out
    assert "unmatched: rank 2 has 2 allreduce" in out
    skipped: list[str] = []
    part = collectives_of_run(late_run, skipped)
    assert part is not None and [w["window"] for w in part["windows"]] == [LATE_WINDOW]
    html = collectives_section({"collectives": part})
    assert html.startswith('<section id="collectives">') and html.endswith("</section>")
    assert f"rank {LATE} arrives last at most collectives" in html
    assert html.count("<tr") >= 1 + WORLD


# -- matching, synthetic ------------------------------------------------------------------


def test_a_rank_with_fewer_collectives_is_left_out_and_named(tmp_path: Path) -> None:
    per_rank = {r: [_kernel(1000.0 * i + r) for i in range(4)] for r in range(3)}
    per_rank[2] = per_rank[2][:3]
    found = find_collectives([_window(tmp_path, per_rank)]).to_dict()
    (entry,) = found["unmatched"]
    assert entry["ranks"] == [2] and entry["counts"] == {"0": 4, "1": 4, "2": 3}
    assert "rank 2 has 3 AllReduce where ranks 0, 1 have 4" in entry["reason"]
    assert len(found["collectives"]) == 4
    assert all(c["ranks"] == 2 and c["last_rank"] == 1 for c in found["collectives"])


def test_a_group_is_matched_until_its_ranks_disagree_on_a_name(tmp_path: Path) -> None:
    group = {"Process Group Name": "3", "Process Group Ranks": "[0, 1]"}
    names = {0: ["allreduce", "allreduce", "broadcast"], 1: ["allreduce", "allgather", "broadcast"]}
    per_rank = {
        r: [
            _kernel(100.0 * i + r, **group, **{"Collective name": n})
            for i, n in enumerate(names[r])
        ]
        for r in (0, 1)
    }
    found = find_collectives([_window(tmp_path, per_rank)]).to_dict()
    assert [(c["group"], c["name"], c["index"]) for c in found["collectives"]] == [
        ("3", "allreduce", 0)
    ]
    (entry,) = found["unmatched"]
    assert (
        entry["group"] == "3" and "collective #1 of group 3: the ranks disagree" in entry["reason"]
    )


def test_sequence_numbers_match_whatever_the_order_and_a_missing_one_is_said(
    tmp_path: Path,
) -> None:
    group = {"Process Group Name": "0", "Collective name": "allreduce"}
    per_rank = {r: [_kernel(500.0 * s + 3 * r, Seq=s, **group) for s in range(5)] for r in range(3)}
    per_rank[0].reverse()  # file order is no time order
    del per_rank[2][3]
    found = find_collectives([_window(tmp_path, per_rank)]).to_dict()
    assert [c["seq"] for c in found["collectives"]] == [0, 1, 2, 4]
    assert all(
        c["last_rank"] == 2 and c["skew_ms"] == pytest.approx(0.006) for c in found["collectives"]
    )
    (entry,) = found["unmatched"]
    assert "1 collectives of group 0 (seq 3) were seen by only some of ranks 0-2" in entry["reason"]


def test_cpu_calls_keep_the_outermost_op_and_leave_point_to_point_out(tmp_path: Path) -> None:
    def calls(late: float) -> list[dict[str, Any]]:
        return [
            _op(100.0 + late, "c10d::allreduce_", dur=50.0),
            _op(110.0 + late, "c10d::broadcast_", dur=5.0),  # inside the all-reduce: part of it
            _op(
                112.0 + late, "record_param_comms", dur=1.0, **{"Process Group Name": "0", "Seq": 7}
            ),
            _op(300.0 + late, "c10d::send", dur=5.0),
            _op(400.0 + late, "c10d::barrier", dur=5.0, tid=2),
        ]

    found = find_collectives([_window(tmp_path, {0: calls(0.0), 1: calls(40.0)})]).to_dict()
    assert found["source"] == "cpu"
    rows = [(c["group"], c["name"], c["seq"], c["last_rank"]) for c in found["collectives"]]
    assert rows == [("0", "allreduce", 7, 1), (None, "barrier", None, 1)]
    assert _rank(found, 1)["late_ms"] == pytest.approx(0.08)


def test_ranks_with_different_bases_are_put_on_one_clock(tmp_path: Path) -> None:
    root = tmp_path / "run"
    for rank, base in ((0, BASE), (1, BASE + 2_000_000)):  # rank 1's base 2 ms later
        _write(trace_path(root, WINDOW, rank, gzip=False), rank, [_kernel(1000.0)], base=base)
    found = find_collectives([root / "traces" / WINDOW]).to_dict()
    (row,) = found["collectives"]
    assert (row["last_rank"], row["skew_ms"]) == (1, pytest.approx(2.0))


def test_traces_on_the_monotonic_clock_are_aligned_through_each_hosts_clock_pair(
    tmp_path: Path,
) -> None:
    wall = BASE + 5 * 10**9
    uptimes = {0: 3_600 * 10**9, 1: 7_200 * 10**9, 2: 7_200 * 10**9}  # two hosts, two uptimes
    hosts = {0: "node-a", 1: "node-b", 2: "node-b"}
    for rank in range(3):
        _meta(tmp_path, rank, hosts[rank], wall + rank * 1000, uptimes[rank] + rank * 1000)
    # The same instant, 1 s after the pairs were read, on each host's monotonic clock; rank 2 4 ms later.
    per_rank = {
        r: [_kernel((uptimes[r] + 10**9) / 1000 + (4000.0 if r == 2 else 0.0))] for r in range(3)
    }
    found = find_collectives([_window(tmp_path, per_rank, base=None)]).to_dict()
    (row,) = found["collectives"]
    assert row["last_rank"] == 2
    assert row["skew_ms"] == pytest.approx(4.0, abs=1e-3)
    assert [r["clock"] for r in found["ranks"]] == ["monotonic"] * 3
    assert [r["host"] for r in found["ranks"]] == ["node-a", "node-b", "node-b"]
    notes = " ".join(found["notes"])
    assert "moved onto the wall clock with their host's clock pair" in notes
    assert "ranks on 2 hosts" in notes and "NTP" in notes


def test_a_shared_last_arrival_counts_for_no_rank(tmp_path: Path) -> None:
    per_rank = {0: [_kernel(100.0)], 1: [_kernel(150.0)], 2: [_kernel(150.0)]}
    found = find_collectives([_window(tmp_path, per_rank)]).to_dict()
    (row,) = found["collectives"]
    assert row["last_rank"] is None and row["skew_ms"] == pytest.approx(0.05)
    assert all(r["arrived_last"] == 0 for r in found["ranks"])
    assert "at none did one rank arrive last alone" in found["summary"]


def test_the_section_escapes_and_survives_malformed_data() -> None:
    window = {
        "window": "<script>w</script>",
        "source": "gpu",
        "summary": "<b>x</b>",
        "ranks": [{"rank": 0, "host": "<i>h</i>", "arrived_last": "many", "late_ms": math.nan}, 7],
        "collectives": [{"name": "<img>", "skew_ms": "wide", "last_rank": None}, None],
        "unmatched": [{"reason": "<u>r</u>"}],
        "notes": None,
    }
    html = collectives_section(
        {"collectives": {"windows": [window, "odd", {"error": "<e>"}], "left_out": 3}}
    )
    assert (
        "<script>" not in html and "<img>" not in html and "<i>h" not in html and "<u>" not in html
    )
    assert "&lt;script&gt;w&lt;/script&gt;" in html and "&lt;e&gt;" in html
    assert collectives_section({}) == collectives_section({"collectives": None}) == ""
    assert "none (no window" in collectives_section({"collectives": "odd"})


# -- bad input ----------------------------------------------------------------------------


@pytest.fixture
def good(tmp_path: Path) -> Iterator[Path]:
    yield _window(tmp_path, {r: [_kernel(100.0 + r), _kernel(900.0 + r)] for r in range(3)})


def test_a_bad_file_among_good_ones_is_named_and_skipped(
    good: Path, cli: Callable[..., Any]
) -> None:
    broken = good / "rank-00003.pt.trace.json.gz"
    broken.write_bytes(b"\x1f\x8b not gzip at all")
    other = _write(good / "rank-00004.pt.trace.json", 5, [_kernel(100.0)])  # says rank 5
    code, out, err = cli("collectives", good, "--json")
    assert (code, err) == (0, "")
    found = json.loads(out)
    assert [r["rank"] for r in found["ranks"]] == [0, 1, 2]
    said = " ".join(found["skipped"])
    assert f"{broken}: truncated or corrupt gzip" in said
    assert f"{other}: a trace of rank 5 (its distributedInfo) under the name of rank 4" in said


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("empty", "no trace files"),
        (
            "one rank",
            "1 usable trace of 1 (only rank 0): matching collectives needs two ranks or more",
        ),
        ("one readable", "1 usable trace of 2 (only rank 0)"),
        ("no collectives", "no collectives to match: 0 of the 2 ranks' traces hold any"),
        ("run dir", "a run directory; the collectives of one window are matched"),
        ("missing", "no such file or directory"),
    ],
)
def test_nothing_usable_is_one_line_and_exit_2(
    tmp_path: Path, cli: Callable[..., Any], case: str, expected: str
) -> None:
    folder = tmp_path / "traces" / WINDOW
    folder.mkdir(parents=True)
    given = folder
    if case == "one rank":
        _window(tmp_path, {0: [_kernel(1.0)]})
    elif case == "one readable":
        _window(tmp_path, {0: [_kernel(1.0)]})
        trace_path(tmp_path, WINDOW, 1, gzip=False).write_text('{"traceEvents": [')
    elif case == "no collectives":
        _window(tmp_path, {r: [_op(1.0, "aten::mm")] for r in (0, 1)})
    elif case == "run dir":
        given = tmp_path
    elif case == "missing":
        given = tmp_path / "nowhere"
    code, out, err = cli("collectives", given)
    assert (code, out) == (2, "")
    assert err.startswith("rankscope collectives: ") and expected in err
    assert err.count("\n") == 1
    if case == "one readable":
        assert "truncated" in err


def test_traces_of_two_windows_are_refused(tmp_path: Path, cli: Callable[..., Any]) -> None:
    a = _write(trace_path(tmp_path, WINDOW, 0, gzip=True), 0, [_kernel(1.0)])
    b = _write(trace_path(tmp_path, "step-000005-000006", 1, gzip=True), 1, [_kernel(1.0)])
    code, _, err = cli("collectives", a, b)
    assert code == 2 and "traces of several windows or folders" in err


# -- untrusted values of every kind --------------------------------------------------------

_BAD_VALUES = ([1], {"a": 1}, "7", 7.5, True, None, -1, 10**30, math.nan, math.inf)
SENDRECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"


def _launch(ts: float, correlation: int, tid: int = 1) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "dur": 2.0,
        "args": {"correlation": correlation, "External id": correlation},
    }


def _busy_rank(rank: int) -> list[dict[str, Any]]:
    """Kernels with every arg the reader uses, and the c10d calls that launched them."""
    group = {"Process Group Name": "0", "Process Group Ranks": "[0, 1, 2]"}
    events = []
    for i in range(3):
        at = 1000.0 * i + 10 * rank
        events += [
            _op(at, "c10d::allreduce_", dur=30.0),
            _op(at + 1, "record_param_comms", dur=1.0, **group, Seq=i),
            _launch(at + 2, 100 + i),
            _kernel(
                at + 40, correlation=100 + i, Seq=i, **group, **{"Collective name": "allreduce"}
            ),
        ]
    events += [
        _op(5000.0 + rank, "c10d::alltoall_base_", dur=30.0),
        _launch(5002.0 + rank, 200),
        _kernel(5040.0 + rank, SENDRECV, correlation=200),
    ]
    return events


def _bad_field(where: str, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def spoil(data: dict[str, Any]) -> None:
        if where == "top":
            data[key] = value
        elif where == "info":
            data["distributedInfo"][key] = value
        else:
            for event in data["traceEvents"]:
                if where == "event":
                    event[key] = value
                elif key == "*":
                    event["args"] = value
                else:
                    event["args"][key] = value

    return spoil


_BAD_FIELDS = [
    ("info", "world_size"),
    ("info", "rank"),
    ("info", "pg_config"),
    ("top", "distributedInfo"),
    ("top", "baseTimeNanoseconds"),
    ("event", "ts"),
    ("event", "dur"),
    ("event", "pid"),
    ("event", "tid"),
    ("event", "name"),
    ("event", "cat"),
    ("event", "ph"),
    ("args", "*"),
    ("args", "Seq"),
    ("args", "Process Group Name"),
    ("args", "Process Group Ranks"),
    ("args", "Collective name"),
    ("args", "correlation"),
]


@pytest.mark.parametrize(("where", "key"), _BAD_FIELDS, ids=[f"{w}.{k}" for w, k in _BAD_FIELDS])
def test_a_value_of_the_wrong_type_anywhere_in_a_trace_is_no_traceback(
    tmp_path: Path, cli: Callable[..., Any], where: str, key: str
) -> None:
    for i, value in enumerate(_BAD_VALUES):
        root = tmp_path / str(i)
        folder = _window(root, {r: _busy_rank(r) for r in (0, 2)})
        path = trace_path(root, WINDOW, 1, gzip=False)
        data = {
            "schemaVersion": 1,
            "distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 3},
            "baseTimeNanoseconds": BASE,
            "traceEvents": _busy_rank(1),
        }
        _bad_field(where, key, value)(data)
        path.write_text(json.dumps(data))
        code, out, err = cli("collectives", folder, "--json")
        assert "Traceback" not in err, (value, err)
        assert code == 0, (value, err)
        found = json.loads(out, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
        assert {r["rank"] for r in found["ranks"]} >= {0, 2}
        rows = found["collectives"]
        assert rows and all(r["ranks"] >= 2 for r in rows)
        named = (where, key) in (("info", "rank"), ("top", "baseTimeNanoseconds"))
        a_rank = key == "rank" and type(value) is int and value >= 0  # said under another name
        if named and value is not None and not a_rank:
            assert str(path) in " ".join(found["skipped"]), value


def test_the_world_size_of_any_type_is_ignored_and_disagreeing_numbers_said(
    tmp_path: Path,
) -> None:
    for i, size in enumerate(([8], {"n": 8}, "8", 8.0)):
        per_rank = {r: [_kernel(100.0 + r)] for r in range(3)}
        root = tmp_path / str(i)
        for rank, events in per_rank.items():
            world = size if rank == 1 else 4
            _write(trace_path(root, WINDOW, rank, gzip=True), rank, events, world_size=world)
        found = find_collectives([root / "traces" / WINDOW]).to_dict()
        assert len(found["collectives"]) == 1
        assert not any("world size" in note for note in found["notes"])
    _write(trace_path(root, WINDOW, 2, gzip=True), 2, [_kernel(102.0)], world_size=16)
    found = find_collectives([root / "traces" / WINDOW]).to_dict()
    assert any("disagree on the world size (4, 16)" in note for note in found["notes"])


def test_bad_meta_values_are_ignored(tmp_path: Path) -> None:
    for rank, (host, clock) in enumerate(
        (([1], {"time_ns": [1], "perf_counter_ns": {}}), ({"h": 1}, "now"), ("node-a", None))
    ):
        path = meta_path(tmp_path, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"v": 1, "rank": rank, "host": host, "clock": clock}))
    found = find_collectives([_window(tmp_path, {r: [_kernel(100.0 + r)] for r in range(3)})])
    assert [r["host"] for r in found.to_dict()["ranks"]] == [None, None, "node-a"]
    assert found.alignment == "wall clocks"  # hosts not all known: they may differ


# -- NCCL SendRecv: point-to-point or all_to_all ----------------------------------------------


def test_sendrecv_kernels_are_named_by_the_call_that_launched_them(tmp_path: Path) -> None:
    def rank_events(rank: int) -> list[dict[str, Any]]:
        late = 30.0 * rank
        return [
            # An all-to-all: a collective, named by its c10d call.
            _op(100.0 + late, "c10d::alltoall_base_", dur=20.0),
            _launch(105.0 + late, 1),
            _kernel(150.0 + late, SENDRECV, correlation=1),
            # A pipeline send: point-to-point, left out.
            _op(300.0 + 7 * rank, "c10d::send", dur=20.0),
            _launch(305.0 + 7 * rank, 2),
            _kernel(350.0 + 7 * rank, SENDRECV, correlation=2),
            # A recv named by torch's own arg: left out too.
            _kernel(450.0, SENDRECV, **{"Collective name": "recv"}),
            # An all-to-all that torch names.
            _kernel(550.0 + late, SENDRECV, **{"Collective name": "all_to_all"}),
        ]

    found = find_collectives([_window(tmp_path, {0: rank_events(0), 1: rank_events(1)})])
    rows = [(c["name"], c["last_rank"], c["skew_ms"]) for c in found.to_dict()["collectives"]]
    assert rows == [
        ("alltoall_base", 1, pytest.approx(0.03)),
        ("all_to_all", 1, pytest.approx(0.03)),
    ]
    notes = " ".join(found.notes)
    assert "named by their Collective name arg or the c10d call that launched them" in notes
    assert "1 all_to_all, 1 alltoall_base" not in notes  # per rank counts are summed
    assert "2 all_to_all, 2 alltoall_base; 4 send or recv (point-to-point) left out" in notes
    assert "do not tell apart" not in notes


def test_sendrecv_kernels_nothing_names_are_kept_and_said_never_matched_to_another_name(
    tmp_path: Path,
) -> None:
    group = {"Process Group Name": "5"}
    per_rank = {
        0: [_kernel(100.0, SENDRECV, **group), _kernel(200.0, SENDRECV, **group)],
        1: [_kernel(110.0, SENDRECV, **group), _kernel(210.0, ALLREDUCE, **group)],
    }
    found = find_collectives([_window(tmp_path, per_rank)])
    assert [(c["name"], c["index"]) for c in found.collectives] == [("SendRecv", 0)]
    (entry,) = found.unmatched
    assert "collective #1 of group 5: the ranks disagree on it" in entry["reason"]
    assert "SendRecv on rank 0" in entry["reason"] and "AllReduce on rank 1" in entry["reason"]
    (note,) = [n for n in found.notes if "SendRecv" in n]
    assert note.startswith("ranks 0, 1: 3 NCCL SendRecv kernels that the trace does not tell apart")
    assert "pipeline stages" in note and "never with a collective of another name" in note


# -- sequence numbers that repeat ---------------------------------------------------------


def test_repeated_sequence_numbers_fall_back_to_order_and_say_so(tmp_path: Path) -> None:
    group = {"Process Group Name": "0", "Collective name": "allreduce", "Seq": 3}
    per_rank = {r: [_kernel(100.0 * i + 5 * r, **group) for i in range(10)] for r in (0, 1)}
    found = find_collectives([_window(tmp_path, per_rank)])
    assert [(c["index"], c["seq"], c["last_rank"]) for c in found.collectives] == [
        (i, None, 1) for i in range(10)
    ]
    assert found.unmatched == []
    (note,) = [n for n in found.notes if "sequence numbers" in n]
    assert note.startswith("group 0: ranks 0, 1 repeat sequence numbers (seq 3)")
    assert "matched by order instead" in note


def test_a_sequence_number_repeated_on_one_rank_is_not_a_silent_loss(tmp_path: Path) -> None:
    group = {"Process Group Name": "0", "Collective name": "allreduce"}
    per_rank = {r: [_kernel(100.0 * s + r, Seq=s, **group) for s in range(4)] for r in (0, 1)}
    per_rank[1][2]["args"]["Seq"] = 1  # rank 1 says seq 1 twice, and no seq 2
    found = find_collectives([_window(tmp_path, per_rank)])
    assert len(found.collectives) == 4
    assert any("rank 1 repeat sequence numbers (seq 1)" in n for n in found.notes)


# -- clocks of several hosts, from the run's timings ----------------------------------------


def _loss_ends(root: Path, rank: int) -> list[int]:
    """When the rank's timings say it left loss_allreduce (all ranks leave it together)."""
    ends = []
    for line in timing_path(root, rank).read_text().splitlines():
        record = json.loads(line)
        if record["phase"] == "loss_allreduce":
            ends.append(record["start_ns"] + round(record["cpu_ms"] * 1e6))
    return ends


def test_hosts_clock_offsets_from_the_timings_are_taken_off(
    tmp_path: Path, cli: Callable[..., Any]
) -> None:
    root = write_timings(
        tmp_path / "run", ranks=4, steps=12, ranks_per_host=2, clock_skew_ms=40, noise=0.0, seed=5
    )
    # The truth, from the files: host node001's clock reads this far ahead of node000's.
    ahead = statistics.median(
        b - a for a, b in zip(_loss_ends(root, 0), _loss_ends(root, 2), strict=True)
    )
    assert abs(ahead) > 5e6  # ns: far more than the lateness below
    # One instant on every rank, as each host's wall clock read it; rank 3 1 ms late.
    instant_us = 2_000.0
    per_rank = {
        r: [_kernel(instant_us + (ahead / 1000 if r >= 2 else 0.0) + (1000.0 if r == 3 else 0.0))]
        for r in range(4)
    }
    folder = _window(root, per_rank)
    found = find_collectives([folder])
    (row,) = found.collectives
    assert found.alignment == "timings"
    assert (row["last_rank"], row["skew_ms"]) == (3, pytest.approx(1.0, abs=1e-3))
    offsets = [r["offset_ms"] for r in found.ranks]
    assert offsets[2] - offsets[0] == pytest.approx(ahead / 1e6, abs=1e-3)
    assert offsets[0] == offsets[1] and offsets[2] == offsets[3]
    assert any("each host's clock offset, as the run's timings show it" in n for n in found.notes)
    code, out, _ = cli("collectives", folder)
    assert code == 0 and "clocks: each host's clock offset, from the run's timings" in out
    # Offsets given (the report has read the timings) are used as given.
    given = find_collectives([folder], offsets=HostOffsets({"node000": 0, "node001": 0}))
    assert given.alignment == "timings"
    assert given.collectives[0]["skew_ms"] == pytest.approx(abs(ahead / 1e6 + 1.0), abs=1e-3)
    # Without timings, hosts are compared on their wall clocks, and the output says so.
    shutil.rmtree(root / "timings")
    bare = find_collectives([folder])
    assert bare.alignment == "wall clocks"
    assert bare.collectives[0]["skew_ms"] == pytest.approx(abs(ahead / 1e6 + 1.0), abs=1e-3)
    assert any("NTP" in n and "no timings to measure it from" in n for n in bare.notes)
    assert all(r["offset_ms"] is None for r in bare.ranks)


def test_ranks_of_one_host_need_no_timings(tmp_path: Path) -> None:
    root = write_timings(tmp_path / "run", ranks=2, steps=3, ranks_per_host=2, noise=0.0)
    found = find_collectives([_window(root, {r: [_kernel(100.0 + r)] for r in range(2)})])
    assert found.alignment == "one host"
    assert not any("NTP" in n or "offset" in n for n in found.notes)


def test_host_offsets_need_a_comm_phase(tmp_path: Path) -> None:
    root = write_timings(
        tmp_path / "run", ranks=4, steps=3, ranks_per_host=2, phases=[PhaseSpec("forward")]
    )
    found = find_collectives([_window(root, {r: [_kernel(100.0 + r)] for r in range(4)})])
    assert found.alignment == "wall clocks"
    assert any("no phase of kind comm" in n for n in found.notes)


def test_host_offsets_past_an_hour_are_not_used(tmp_path: Path) -> None:
    root = write_timings(
        tmp_path / "run", ranks=2, steps=3, ranks_per_host=1, clock_skew_ms=4e7, seed=1
    )
    found = find_collectives([_window(root, {r: [_kernel(100.0 + r)] for r in range(2)})])
    assert found.alignment == "wall clocks"
    assert any("offset past an hour" in n for n in found.notes)
    assert found.collectives[0]["skew_ms"] == pytest.approx(0.001)


# -- the report's part, and naming what was given -------------------------------------------


def test_the_report_reads_the_latest_window_alone(
    tmp_path: Path, cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = write_timings(tmp_path / "run", ranks=2, steps=3, noise=0.0)
    for window in ("step-000001-000002", "step-000003-000004", "step-000010-000011"):
        for rank in range(2):
            _write(trace_path(root, window, rank, gzip=True), rank, [_kernel(100.0 + 3 * rank)])
    part = collectives_of_run(root, [])
    assert part is not None
    assert [w["window"] for w in part["windows"]] == ["step-000010-000011"]
    assert part["left_out"] == ["step-000001-000002", "step-000003-000004"]
    assert part["windows"][0]["ranks"][1]["arrived_last"] == 1
    code, out, _ = cli("report", root, "--no-html")
    assert code == 0
    assert "Last arrivals at collectives, window step-000010-000011" in out
    assert "rank 1 arrives last at most collectives" in out
    monkeypatch.setattr(collectives, "_REPORT_BYTES", 10)
    (window,) = collectives_of_run(root, [])["windows"]  # type: ignore[index]
    assert "more than the report reads" in window["not_read"]
    assert "not read:" in collectives_section({"collectives": {"windows": [window]}})


def test_a_file_given_is_named_in_the_error(
    tmp_path: Path, cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "afile", 0, [_kernel(1.0)])
    code, _, err = cli("collectives", "afile")
    assert code == 2
    assert err.startswith("rankscope collectives: afile: 1 usable trace of 1 (only rank 0)")


def test_sources_are_read_linearly_in_the_calls_of_a_thread(tmp_path: Path) -> None:
    """Many collectives on one thread: each record_param_comms finds its call by bisection."""
    group = {"Process Group Name": "0"}
    per_rank = {
        r: [
            e
            for i in range(3000)
            for e in (
                _op(100.0 * i + r, "c10d::allreduce_", dur=20.0),
                _op(100.0 * i + r + 1, "record_param_comms", dur=1.0, Seq=i, **group),
            )
        ]
        for r in (0, 1)
    }
    found = find_collectives([_window(tmp_path, per_rank)])
    assert len(found.collectives) == 3000
    assert {c["seq"] for c in found.collectives} == set(range(3000))
