"""GPU health read from the real NVML, where a GPU is at hand (skipped cleanly without CUDA)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

from rankscope import TimerConfig
from rankscope.config._ranks import RankInfo
from rankscope.rundir._health import THROTTLE_REASONS
from rankscope.timing import PhaseTimer
from rankscope.timing._health import GpuSource, gpu_source

pytestmark = pytest.mark.gpu


def test_the_real_nvml_gives_this_ranks_gpu_at_each_sampled_step(tmp_path: Path) -> None:
    pynvml = pytest.importorskip("pynvml")
    source = gpu_source(torch)
    assert isinstance(source, GpuSource), source
    assert source.nvml is pynvml
    info = RankInfo(rank=0, local_rank=0, world_size=1, local_world_size=1, host="gpu-host")
    timer = PhaseTimer(TimerConfig(enable=True, every_n_steps=2), str(tmp_path), info)
    a = torch.randn(1024, 1024, device="cuda")
    timer.start()
    for _ in range(6):
        span = timer.enter("matmul", "compute", None, False)
        (a @ a).relu_()
        assert span is not None
        timer.exit(span, False)
        assert timer.wait_written()
        timer.step()
    timer.stop()
    lines = (tmp_path / "health" / "rank-00000.jsonl").read_text().splitlines()
    samples = [json.loads(line) for line in lines if '"attempt"' not in line]
    assert [s["step"] for s in samples] == [0, 2, 4, 6]
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
