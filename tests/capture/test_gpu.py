"""Capture with CUDA activities, where a GPU is at hand (skipped cleanly without CUDA)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rankscope import Profiler, Schedule

from .._helpers import profiler_steps, read_trace, trace_config

pytestmark = pytest.mark.gpu


def test_gpu_window_summarises_kernels(tmp_path: Path) -> None:
    prof = Profiler(
        trace_config(tmp_path, schedule=Schedule(warmup=1, active=2)), rank=0, world_size=1
    )
    a = torch.randn(512, 512, device="cuda")
    with prof:
        for _ in range(4):
            with prof.phase("matmul"):
                (a @ a).relu_()
            prof.step()
    window = tmp_path / "traces" / "step-000001-000002"
    trace = read_trace(window / "rank-00000.pt.trace.json.gz")
    assert profiler_steps(trace) == [1, 2]
    kernels = [ev for ev in trace["traceEvents"] if ev.get("cat") == "kernel"]
    assert kernels, "CUDA activity was captured by default"
    summary = prof.last_summary()
    assert summary is not None
    assert summary["kind"] == "gpu_kernels"
    assert summary["count"] == len(kernels)
    assert summary["total_us"] == pytest.approx(sum(ev["dur"] for ev in kernels))
