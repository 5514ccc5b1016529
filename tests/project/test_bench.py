"""The benchmarks still run (their goals are printed ratios, never asserted here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("script", "args", "expect"),
    [
        ("capture_stall.py", ["--quick"], "stall vs raw export:"),
        ("unselected_cost.py", ["--quick"], "unselected phase() vs nullcontext():"),
        ("timer_overhead.py", ["--quick"], "timer every 10 steps:"),
        ("timer_overhead.py", ["--quick", "--device", "stand-in"], "a sampled phase's parts"),
        ("health_overhead.py", ["--quick"], "NVML calls on the training thread: 0;"),
        ("trigger_check.py", ["--quick"], "trigger check (default interval) vs unsampled timer"),
        ("analysis.py", ["--quick", "--no-hta"], "rankscope stragglers --json, end to end:"),
        ("live_figures.py", ["--quick", "--ranks", "64"], "metrics() vs a dict copy:"),
        ("window_settle.py", ["--repeats", "3"], "settle, other threads idle:"),
        ("field.py", ["--quick", "--jobs", "ddp", "--clean", "1"], "field: clean runs 1"),
    ],
)
def test_benchmark_runs(script: str, args: list[str], expect: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert expect in done.stdout
