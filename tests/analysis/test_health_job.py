"""End to end on CPU: gloo ranks whose timers sample a stand-in NVML, one rank's GPU
throttling and that rank slow from then on; the straggler analysis names the throttle
and the clock figures as the cause."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rankscope import TimerConfig
from rankscope.analysis.stragglers._analyse import analyse_stragglers
from rankscope.config._ranks import RankInfo
from rankscope.testing._gloo import GlooRanks
from rankscope.testing._nvml import StandInGpu, StandInNvml
from rankscope.timing import PhaseTimer
from rankscope.timing._health import GpuSource

from .._helpers import run_cli

STEPS = 48
HOT_FROM = 16
SLOW_RANK = 1


def throttled_job(rank: int, world: int, run_dir: str) -> None:
    """Every rank times forward and an all-reduce; from step HOT_FROM, rank SLOW_RANK's
    stand-in GPU throttles (thermal, 1410 MHz) and its forward takes twice as long."""
    gpu = StandInGpu()
    nvml = StandInNvml([gpu])
    info = RankInfo(
        rank=rank, local_rank=rank, world_size=world, local_world_size=world, host="node-a"
    )
    # Read every 0.1 s: a run of 2-3 s here is minutes of a real job's, read every 5 s.
    config = TimerConfig(enable=True, every_n_steps=1, health_every_s=0.1)
    timer = PhaseTimer(config, run_dir, info, clock=None, gpu=GpuSource(nvml, gpu.uuid))
    grad = torch.zeros(64)
    timer.start()
    for step in range(STEPS):
        hot = rank == SLOW_RANK and step >= HOT_FROM
        if hot and gpu.throttle == 0:
            hotter = StandInGpu.throttling()
            gpu.sm_mhz, gpu.throttle, gpu.temp_c = hotter.sm_mhz, hotter.throttle, hotter.temp_c
        span = timer.enter("forward", "compute", None, False)
        # 30 ms, not 6: on a loaded 2-core machine, scheduler jitter made 6 ms steps before
        # the throttle look slow and moved the onset 3 steps early
        time.sleep(0.06 if hot else 0.03)
        assert span is not None
        timer.exit(span, False)
        span = timer.enter("allreduce", "comm", None, False)
        dist.all_reduce(grad)
        assert span is not None
        timer.exit(span, False)
        timer.step()
    timer.stop()
    assert nvml.on(threading.get_ident()) == {}, "no NVML call on the training thread"
    assert not nvml.initialised


@pytest.mark.slow
def test_a_throttling_ranks_cause_names_the_throttle_and_its_clock(
    tmp_path: Path, gloo_ranks: GlooRanks, capsys: pytest.CaptureFixture[str]
) -> None:
    gloo_ranks.run(throttled_job, 3, tmp_path)
    for rank in range(3):
        lines = (tmp_path / "health" / f"rank-{rank:05d}.jsonl").read_text().splitlines()
        samples = [json.loads(line) for line in lines if '"attempt"' not in line]
        assert samples and all(s["rank"] == rank for s in samples)
    found = analyse_stragglers(tmp_path).report
    slow = [f for f in found.findings if f.role == "slow"]
    assert [(f.rank, f.phase) for f in slow] == [(SLOW_RANK, "forward")]
    (finding,) = slow
    assert finding.cause is not None and finding.cause.kind == "machine"
    said = re.match(
        r"machine: rank 1's SM clock 1410 MHz against a median of 1980 since step (\d+), "
        r"thermal throttling \(set at \d+% of its \d+ samples; its GPU at 91 C against a "
        r"median of 62 C\)$",
        finding.cause.text,
    )
    assert said is not None, finding.cause.text
    # The onset is the finding's: a step of noise either side of the throttle's start.
    assert int(said.group(1)) == finding.since_step
    assert HOT_FROM - 2 <= finding.since_step <= HOT_FROM + 2
    # The command says the same, in --json and in the terminal.
    code, out, _ = run_cli(["stragglers", str(tmp_path), "--json"], capsys)
    assert code == 0
    causes = [f["cause"] for f in json.loads(out)["findings"] if f["role"] == "slow"]
    assert causes == [{"kind": "machine", "text": finding.cause.text, "could_be": []}]
    code, out, _ = run_cli(["stragglers", str(tmp_path)], capsys)
    assert code == 0 and "thermal throttling" in " ".join(out.split())
