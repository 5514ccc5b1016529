"""GPU health read from the real NVML, where a GPU is at hand (skipped cleanly without CUDA)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch

from rankscope import TimerConfig
from rankscope.config._ranks import RankInfo
from rankscope.rundir._health import THROTTLE_REASONS
from rankscope.timing import PhaseTimer
from rankscope.timing._health import GpuSource, gpu_source

pytestmark = pytest.mark.gpu


def test_the_real_nvml_gives_this_ranks_gpu_by_the_steps_it_ran(tmp_path: Path) -> None:
    pynvml = pytest.importorskip("pynvml")
    source = gpu_source(torch)
    assert isinstance(source, GpuSource), source
    assert source.nvml is pynvml
    info = RankInfo(rank=0, local_rank=0, world_size=1, local_world_size=1, host="gpu-host")
    config = TimerConfig(enable=True, every_n_steps=2, health_every_s=0.01)
    timer = PhaseTimer(config, str(tmp_path), info)
    a = torch.randn(1024, 1024, device="cuda")
    timer.start()
    for step in range(12):
        span = timer.enter("matmul", "compute", None, False)
        (a @ a).relu_()
        # A phase of an unsampled step is not timed (every_n_steps=2): no span.
        assert (span is None) == (step % 2 == 1)
        if span is not None:
            timer.exit(span, False)
        torch.cuda.synchronize()
        time.sleep(0.02)  # steps of 20 ms or more, read every 10 ms
        timer.step()
    timer.stop()
    lines = (tmp_path / "health" / "rank-00000.jsonl").read_text().splitlines()
    samples = [json.loads(line) for line in lines if '"attempt"' not in line]
    steps = [s["step"] for s in samples]
    # Each reading carries the sampled step it was read in; stop() reads the last (12).
    assert steps == sorted(set(steps)) and set(steps) <= set(range(0, 13, 2))
    assert steps[-1] == 12 and len(steps) >= 3, steps
    words = {word for _, word in THROTTLE_REASONS}
    for s in samples:
        assert s["sm_mhz"] > 0 and s["mem_mhz"] > 0
        assert 0 < s["temp_c"] < 130
        assert s["power_w"] is None or 0 < s["power_w"] <= 2 * s["power_limit_w"]
        assert set(s["throttle"]) <= words
        assert s["ecc_corrected"] is None or s["ecc_corrected"] >= 0
    # The handle the sampler read is the device this process runs on (by UUID, not index).
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(source.device)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
    finally:
        pynvml.nvmlShutdown()
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    assert uuid == source.device
    assert not [t for t in threading.enumerate() if t.name.startswith("rankscope-health")]
