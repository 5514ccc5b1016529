"""Ranks that ended without stop(): a process that is gone is not hung, where it was last
seen is the latest of its heartbeat and its timings, and every command says a rank whose
records end early."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import rankscope
from rankscope.analysis import find_hangs
from rankscope.cli._main import main
from rankscope.testing._gloo import GlooRanks
from rankscope.testing._synthetic import write_timings

from .test_hang_analysis import NOW, heartbeat, write_heartbeat


def _dead_pid() -> int:
    """The pid of a process that has ended."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _keep(path: Path, last_step: int) -> None:
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(line for line in lines if json.loads(line)["step"] <= last_step))


def test_a_job_whose_files_stopped_early_and_whose_processes_are_gone_is_not_hung(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A full disk: the timer stopped writing at step 70, the heartbeat at step 22 (the
    last that could be written), and the processes ended after training."""
    write_timings(tmp_path, ranks=2, steps=71)
    pid = _dead_pid()
    for rank in range(2):
        write_heartbeat(
            tmp_path, heartbeat(rank, step=22, moved_ago=600, host=socket.gethostname(), pid=pid)
        )
    found = find_hangs(tmp_path, now_ns=NOW)
    assert found.state == "ended" and not found.findings
    assert found.summary == (
        "not hung: ranks 0, 1 ended at step 70 without stop(): their processes are gone"
    )
    assert any(
        n.startswith(
            "the heartbeats of ranks 0, 1 stop at step 22 while their timings reach step 70"
        )
        for n in found.notes
    ), found.notes
    assert "None" not in found.summary + " ".join(found.notes)
    assert main(["report", str(tmp_path), "--json", "--no-html"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["hangs"]["state"] == "ended"


def test_a_rank_that_ends_early_is_said_by_stragglers_and_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_timings(tmp_path, ranks=3, steps=100)
    _keep(tmp_path / "timings" / "rank-00001.jsonl", 59)
    said = (
        "rank 1: its records end at step 59, the others' go on to step 99: ended early "
        "(killed, crashed, or stopped apart; `rankscope hang` says which where the watch was on)"
    )
    assert main(["stragglers", str(tmp_path), "--json"]) == 0
    assert said in json.loads(capsys.readouterr().out)["notes"]
    assert main(["stragglers", str(tmp_path)]) == 0
    assert "note: rank 1: its records end at step 59" in " ".join(capsys.readouterr().out.split())
    assert main(["report", str(tmp_path), "--json", "--no-html"]) == 0
    assert said in json.loads(capsys.readouterr().out)["stragglers"]["notes"]


KILLED_RANK, KILLED_AT, WORLD = 1, 80, 3


def _job(rank: int, world_size: int, run_dir: str) -> None:
    config = {
        "output_dir": run_dir,
        "timer": {"enable": True, "every_n_steps": 1},
        "hang": {"enable": True, "after_s": 1.0},
    }
    with rankscope.Profiler(config) as prof:
        x = torch.ones(4)
        for step in range(200):
            with prof.phase("forward"):
                time.sleep(0.002)
                if rank == KILLED_RANK and step == KILLED_AT:
                    os.kill(os.getpid(), signal.SIGKILL)
            with prof.phase("sync", kind="comm"):
                dist.all_reduce(x)
            prof.step()


@pytest.mark.slow
def test_a_rank_killed_mid_step_is_said_ended_where_last_seen_and_the_others_stopped_on_an_error(
    tmp_path: Path, gloo_ranks: GlooRanks, capsys: pytest.CaptureFixture[str]
) -> None:
    ranks = gloo_ranks.start(_job, WORLD, tmp_path)
    codes = ranks.join()
    assert codes[KILLED_RANK] == -signal.SIGKILL, codes
    found = find_hangs(tmp_path)
    # Gloo's collectives raise on the others once a peer is gone: an error, not a hang.
    assert found.state == "ended" and not found.findings, found.summary
    # Its heartbeat is written every few seconds; its timings reach the step before.
    assert found.gone == {KILLED_RANK: KILLED_AT - 1}, found.to_dict()
    assert sorted(found.errors) == [0, 2]
    assert found.summary.startswith(
        f"not hung: rank {KILLED_RANK} ended at step {KILLED_AT - 1} without stop(): its "
        "process is gone; ranks 0, 2 stopped on an error (RuntimeError; --json has its text)"
    ), found.summary
    assert "None" not in found.summary + " ".join(found.notes)
    assert main(["hang", str(tmp_path)]) == 0
    assert "ended at step 79 without stop()" in " ".join(capsys.readouterr().out.split())
