"""Flight Recorder dumps a user already has, read by `rankscope hang --flight-recorder`:
NCCL's format as the project's generator builds it (rankscope.testing._flight, marked
"generated" in each dump: no GPU here to run NCCL), older and newer versions, ranks
missing, and bad dumps (truncated, a wrong version, a pickle that would run code)."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from rankscope import TraceError
from rankscope.analysis import find_hangs
from rankscope.analysis.read._flight import FlightDumpError, dumps_at, read_flight_dump
from rankscope.testing._flight import GENERATED, Call, NcclJob

CALLS = [Call("all_gather"), Call("reduce_scatter"), Call("all_reduce", 8)] * 2
TP = {str(g + 1): ("tp", (2 * g, 2 * g + 1)) for g in range(4)}


def _job(**kw: Any) -> NcclJob:
    return NcclJob(world=8, calls=CALLS, groups=dict(TP), **kw)


def _groups(report: Any) -> dict[str, Any]:
    return {g.name: g for g in report.collectives}


@pytest.mark.parametrize("version", ["2.10", "2.2"])
def test_a_tensor_parallel_rank_that_never_entered_is_named_in_its_group(
    tmp_path: Path, version: str
) -> None:
    # Rank 5 entered 3 of its TP group's collectives; rank 4 waits in the 4th.
    job = _job(stop={("3", 5): 3}, hang_at={"3": 4}, version=version)
    job.write(tmp_path / "fr")
    assert (
        pickle.loads((tmp_path / "fr" / "nccl_trace_rank_0").read_bytes())["comm_lib_version"]
        == GENERATED
    )
    report = find_hangs(tmp_path, flight_recorder=tmp_path / "fr" / "nccl_trace_rank_")
    groups = _groups(report)
    tp = groups["3"]
    assert (tp.state, tp.members_from, tp.ranks) == ("waits", "dump", (4, 5))
    assert (tp.last_done, tp.pending, tp.pending_op, tp.entered, tp.absent) == (
        3,
        4,
        "all_gather",
        (4,),
        (5,),
    )
    assert tp.calls[4].frames[-1].function == "all_gather"  # outermost first
    assert {n: g.state for n, g in groups.items() if n != "3"} == dict.fromkeys("0124", "done")
    assert groups["0"].last_done == 6
    assert report.state == "hung"
    assert report.summary == (
        "rank 5 never entered all_gather #4 of process group 3 (tp, ranks 4-5), in which "
        "rank 4 waits (rank 5's last: all_reduce #3)"
    )
    assert sorted(report.dumps) == list(range(8))


def test_every_rank_in_a_collective_none_completed_is_a_stalled_collective(tmp_path: Path) -> None:
    _job(hang_at={"0": 5}).write(tmp_path / "fr")
    report = find_hangs(tmp_path, flight_recorder=tmp_path / "fr")
    world = _groups(report)["0"]
    assert (world.state, world.pending, world.entered, world.absent) == (
        "stalled",
        5,
        tuple(range(8)),
        (),
    )
    assert "every rank entered reduce_scatter #5 and none completed it" in report.summary


def test_calls_of_other_sizes_are_a_mismatch_and_ranks_without_a_dump_are_said(
    tmp_path: Path,
) -> None:
    job = _job(hang_at={"0": 6})
    folder = tmp_path / "fr"
    folder.mkdir()
    for rank in (0, 2, 3, 4, 5, 6, 7):  # rank 1 left no dump
        dump = job.dump(rank)
        if rank == 6:  # its 6th world all-reduce is of another size
            (call,) = [
                e
                for e in dump["entries"]
                if e["process_group"][0] == "0" and e["collective_seq_id"] == 6
            ]
            call["input_sizes"] = [[4]]
        (folder / f"trace_{rank}").write_bytes(pickle.dumps(dump))
    report = find_hangs(tmp_path, flight_recorder=folder)
    world = _groups(report)["0"]
    assert world.missing == (1,)
    assert world.state == "mismatched"
    (m,) = world.mismatches
    assert (m.seq, m.what) == (6, "sizes")
    assert m.ways == {"in [8] out [8]": (0, 2, 3, 4, 5, 7), "in [4] out [8]": (6,)}
    assert "rank 1 left no dump, so what it did there is not known" in report.summary
    # TP group 1 (ranks 0 and 1) is read from rank 0's dump alone: it cannot hang on it.
    assert _groups(report)["1"].missing == (1,)


def test_a_json_dump_reads_as_its_pickle(tmp_path: Path) -> None:
    job = _job(stop={("3", 5): 3}, hang_at={"3": 4})
    for rank in range(8):
        (tmp_path / f"r{rank}").write_text(json.dumps(job.dump(rank)))
    dump = read_flight_dump(tmp_path / "r4", 4)
    assert (dump.form, len(dump.entries)) == ("json", 6 + 4)
    report = find_hangs(tmp_path, flight_recorder=tmp_path)
    assert _groups(report)["3"].absent == (5,)


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


def test_bad_dumps_are_each_one_clear_line_and_the_others_still_read(tmp_path: Path) -> None:
    job = _job(stop={("3", 5): 3}, hang_at={"3": 4})
    folder = tmp_path / "fr"
    job.write(folder, prefix="t")
    good = (folder / "t0").read_bytes()
    (folder / "t0").write_bytes(good[: len(good) // 2])  # truncated
    old = job.dump(1)
    old["version"] = "1.5"
    (folder / "t1").write_bytes(pickle.dumps(old))
    marker = tmp_path / "ran"
    evil = job.dump(2)
    evil["entries"][0]["frames"] = [_RunsCode(marker)]
    (folder / "t2").write_bytes(pickle.dumps(evil))
    (folder / "t3").write_bytes(b"\x00garbage\xff" * 10)
    broken = job.dump(6)
    broken["entries"][2]["collective_seq_id"] = "three"
    (folder / "t6").write_bytes(pickle.dumps(broken))

    report = find_hangs(tmp_path, flight_recorder=folder / "t")
    assert not marker.exists()  # nothing in the pickle ran
    lines = {line.split(": ", 1)[0]: line for line in report.skipped}
    assert "truncated" in lines[str(folder / "t0")]
    assert (
        "its version is 1.5: this rankscope reads the 2.x dumps of torch 2.4 and later"
        in lines[str(folder / "t1")]
    )
    assert f'the pickle names "{os.mkdir.__module__}.mkdir"' in lines[str(folder / "t2")]
    assert "rankscope loads no pickle that builds objects or runs code" in lines[str(folder / "t2")]
    assert "Flight Recorder dump" in lines[str(folder / "t3")]
    assert (
        'entries[2].collective_seq_id is "three", expected an integer >= 0'
        in lines[str(folder / "t6")]
    )
    # What the good dumps say still holds: ranks 4, 5, 7 were read, rank 5 never entered.
    assert sorted(report.dumps) == [4, 5, 7]
    assert _groups(report)["3"].absent == (5,)


def test_a_place_with_no_dumps_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rankscope.cli import main

    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(TraceError, match="no Flight Recorder dumps"):
        dumps_at(tmp_path)
    with pytest.raises(TraceError, match="no such folder of Flight Recorder dumps"):
        dumps_at(tmp_path / "nowhere" / "prefix_")
    assert main(["hang", str(tmp_path), "--flight-recorder", str(tmp_path / "trace_")]) == 2
    assert "no Flight Recorder dumps (files named trace_<rank>)" in capsys.readouterr().err
    with pytest.raises(FlightDumpError, match="over"):
        big = tmp_path / "big0"
        with open(big, "wb") as fh:
            fh.truncate((512 << 20) + 1)
        read_flight_dump(big, 0)
