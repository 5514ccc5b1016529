"""examples/torchrun_loop.py under a real torchrun, configured by flags, YAML and environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.testing._gloo import free_port

from .._helpers import timing_records

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchrun_loop.py"


def _torchrun(tmp_path: Path, *argv: str, env: dict[str, str] | None = None) -> str:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(EXAMPLE),
        "--steps",
        "12",
        "--batch",
        "32",
        *argv,
    ]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_")}
    done = subprocess.run(
        command,
        cwd=tmp_path,
        env={**clean, "OMP_NUM_THREADS": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _steps(run: Path, rank: int) -> list[int]:
    return sorted({record["step"] for record in timing_records(run, rank)})


def test_flags_configure_every_rank(tmp_path: Path) -> None:
    run = tmp_path / "flags"
    out = _torchrun(
        tmp_path,
        f"--rankscope-output-dir={run}",
        "--rankscope-timer-enable",
        "--rankscope-timer-every-n-steps=4",
        "--rankscope-trace-enable",
        "--rankscope-trace-ranks=1",
        "--rankscope-trace-schedule-wait=5",
    )
    assert f"run directory {run}" in out
    assert _steps(run, 0) == _steps(run, 1) == [0, 4, 8]
    record = timing_records(run, 1)[0]
    assert record["rank"] == 1
    phases = {record["phase"] for record in timing_records(run, 0)}
    assert phases == {
        "host_to_device",
        "forward",
        "backward",
        "optimizer",
        "loss_allreduce",
        "step",
    }
    # wait 5, warmup 1, active 1: step 6, on rank 1 alone
    assert [p.name for p in (run / "traces" / "step-000006-000006").glob("*.pt.trace.json.gz")] == [
        "rank-00001.pt.trace.json.gz"
    ]


def test_yaml_then_flags_then_the_environment(tmp_path: Path) -> None:
    run = tmp_path / "yaml"
    config = tmp_path / "profile.yaml"
    config.write_text(f"output_dir: {run}\ntimer: {{enable: true, every_n_steps: 3}}\n")
    _torchrun(
        tmp_path,
        f"--rankscope-config={config}",
        "--rankscope-timer-every-n-steps=5",  # overrides the file
        env={"RANKSCOPE_TIMER_RANKS": "0"},  # overrides both
    )
    assert _steps(run, 0) == [0, 5, 10]
    assert not (run / "timings" / "rank-00001.jsonl").exists()
    assert not (run / "traces").exists()
