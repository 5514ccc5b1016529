"""Hangs named from torch's Flight Recorder, on real gloo jobs: the watchdog saves each
rank's dump and process groups beside its hang file, and `rankscope hang` matches the
collectives across the ranks (analysis/hangs/_flight.py)."""

from __future__ import annotations

import json
import pickle
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from rankscope.testing._gloo import GlooRanks

pytestmark = pytest.mark.slow

WORLD = 4
FAULT_STEP = 3


def _hung(
    run: Path, gloo_ranks: GlooRanks, fault: str, capsys: pytest.CaptureFixture[str]
) -> tuple[dict[str, Any], str]:
    """Run the fault until every rank's watchdog saved its dump; `rankscope hang`'s
    answer, as JSON and on the terminal."""
    from rankscope.cli import main

    from .._dist_workers import flight_recorder_hang

    ranks = gloo_ranks.start(flight_recorder_hang, WORLD, run, fault)
    try:
        deadline = time.monotonic() + 90
        pattern = f"step-{FAULT_STEP:06d}-*/rank-*.flight-recorder.pickle"
        while len(list((run / "hangs").glob(pattern))) < WORLD and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1.0)  # the heartbeats that say the stall, the hang files rewritten
        assert main(["hang", str(run), "--json"]) == 0
        found = json.loads(capsys.readouterr().out)
        assert main(["hang", str(run)]) == 0
        terminal = " ".join(capsys.readouterr().out.split())
    finally:
        ranks.kill()
    return found, terminal


def _group(found: dict[str, Any], name: str) -> dict[str, Any]:
    (group,) = [g for g in found["flight_recorder"]["groups"] if g["group"] == name]
    return group


def test_a_rank_that_skips_an_all_reduce_is_named_as_never_entering_it(
    tmp_path: Path, gloo_ranks: GlooRanks, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    found, terminal = _hung(run, gloo_ranks, "skip", capsys)
    assert sorted(found["flight_recorder"]["dumps"]) == ["0", "1", "2", "3"]
    world = _group(found, "0")
    # Each step: one world all-reduce (the pair's are in group 1): steps 0-2 done.
    assert (world["state"], world["members_from"], world["ranks"]) == (
        "waits",
        "recorded",
        [0, 1, 2, 3],
    )
    assert (world["last_completed"], world["pending"], world["pending_op"]) == (3, 4, "all_reduce")
    assert world["entered"] == [0, 1, 2]
    assert world["never_entered"] == [{"rank": 3, "last": 3, "last_op": "all_reduce"}]
    assert _group(found, "1")["state"] == "done"
    assert (found["ranks"]["stuck"], found["ranks"]["waiting"]) == ([3], [0, 1, 2])
    by_rank = {f["rank"]: f for f in found["findings"]}
    assert (by_rank[3]["phase"], by_rank[3]["why"]) == (
        "data",
        "never entered a collective its group waits in",
    )
    assert by_rank[3]["frames"][-1]["function"] == "wait"  # its stack: where it sits
    # One sentence: who never entered which collective, where its heartbeat has it.
    summary = found["summary"]
    assert summary.startswith(f"rank 3, stuck in data (data) at step {FAULT_STEP} for "), summary
    assert (
        "never entered all_reduce #4 of process group 0 (default_pg, ranks 0-3), in which "
        "ranks 0-2 wait (rank 3's last: all_reduce #3)"
    ) in summary
    assert "Collectives by process group (4 Flight Recorder dumps)" in terminal
    assert "called all_reduce at" in terminal and "_dist_workers.py" in terminal
    # A dump saved by the watchdog reads as torch's own analyzer's input would: a pickle.
    dump = next((run / "hangs").glob("step-*/rank-00003.flight-recorder.pickle"))
    assert pickle.loads(dump.read_bytes())["entries"][-1]["collective_seq_id"] == 3
    # Beside it, the groups the rank is in (gloo's dump names none of their ranks).
    for rank, groups in (
        (3, {("0", "default_pg", (0, 1, 2, 3))}),
        (0, {("0", "default_pg", (0, 1, 2, 3)), ("1", "pair", (0, 1))}),
    ):
        hang = json.loads(next((run / "hangs").glob(f"step-*/rank-{rank:05d}.json")).read_text())
        assert {(g["name"], g["desc"], tuple(g["ranks"])) for g in hang["process_groups"]} == groups

    # The same dumps read as a user's own (torch's `<prefix><rank>`), one rank's missing.
    mine = tmp_path / "mine"
    mine.mkdir()
    for path in (run / "hangs").glob("step-*/rank-*.flight-recorder.pickle"):
        rank = int(path.name[5:10])
        if rank != 1:
            shutil.copy(path, mine / f"nccl_trace_rank_{rank}")
    from rankscope.analysis import find_hangs

    report = find_hangs(run, flight_recorder=mine / "nccl_trace_rank_")
    world = next(g for g in report.collectives if g.name == "0")
    assert (world.missing, world.entered, world.absent) == ((1,), (0, 2), (3,))
    assert "rank 1 left no dump, so what it did there is not known" in report.summary


def test_a_rank_that_calls_all_gather_where_the_others_all_reduce_is_a_mismatch(
    tmp_path: Path, gloo_ranks: GlooRanks, capsys: pytest.CaptureFixture[str]
) -> None:
    found, terminal = _hung(tmp_path / "run", gloo_ranks, "mismatch", capsys)
    world = _group(found, "0")
    assert (world["state"], world["pending"], world["entered"]) == ("mismatched", 4, [0, 1, 2, 3])
    (first, *_) = world["mismatches"]
    assert (first["seq"], first["what"]) == (4, "ops")
    assert {w["value"]: w["ranks"] for w in first["ways"]} == {
        "all_reduce": [0, 2, 3],
        "all_gather": [1],
    }
    assert (
        "process group 0 (default_pg, ranks 0-3): collective #4 does not match across its "
        "ranks (ops: ranks 0, 2, 3 all_reduce, rank 1 all_gather); ranks 0-3 wait in it"
    ) in found["summary"]
    assert "collective #4: the ops differ" in terminal
    assert "rank 1 called all_gather at" in terminal and "rank 0 called all_reduce at" in terminal


def test_a_sub_group_hung_while_the_world_group_is_not(
    tmp_path: Path, gloo_ranks: GlooRanks, capsys: pytest.CaptureFixture[str]
) -> None:
    found, _ = _hung(tmp_path / "run", gloo_ranks, "subgroup", capsys)
    pair = _group(found, "1")
    assert (pair["state"], pair["ranks"], pair["desc"]) == ("waits", [0, 1], "pair")
    assert (pair["pending"], pair["entered"], [n["rank"] for n in pair["never_entered"]]) == (
        4,
        [0],
        [1],
    )
    world = _group(found, "0")
    assert (world["state"], world["last_completed"], world["pending"]) == ("done", 3, None)
    assert found["ranks"]["stuck"][:1] == [1]
    assert found["summary"].startswith("rank 1, stuck in data (data) at step 3 for ")
    assert (
        "never entered all_reduce #4 of process group 1 (pair, ranks 0-1), in which rank 0 waits"
        in found["summary"]
    )
