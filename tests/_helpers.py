"""Helpers shared by the capture tests: a tiny training step and trace readers."""

from __future__ import annotations

import gzip
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import rankscope


def tiny_step(model: torch.nn.Module, opt: torch.optim.Optimizer, prof: rankscope.Profiler) -> None:
    with prof.phase("forward"):
        loss = model(torch.randn(4, 8)).sum()
    with prof.phase("backward"):
        loss.backward()
    with prof.phase("optimizer"):
        opt.step()
        opt.zero_grad()


def tiny_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def trace_config(run_dir: Path, **trace: Any) -> rankscope.ProfileConfig:
    schedule = trace.pop("schedule", rankscope.Schedule())
    return rankscope.ProfileConfig(
        output_dir=run_dir,
        trace=rankscope.TraceConfig(enable=True, schedule=schedule, **trace),
    )


def read_trace(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


def profiler_steps(trace: dict[str, Any]) -> list[int]:
    """The N of every ProfilerStep#N range in a trace, sorted."""
    return sorted(
        int(ev["name"].split("#", 1)[1])
        for ev in trace["traceEvents"]
        if str(ev.get("name", "")).startswith("ProfilerStep#") and ev.get("ph") == "X"
    )


def event_names(trace: dict[str, Any]) -> set[str]:
    return {ev.get("name", "") for ev in trace["traceEvents"]}


def final_files(run_dir: Path, heartbeats: bool = False) -> list[str]:
    """Every file under run_dir with a final name, relative; temporary names start with a dot.

    The heartbeats (live/, on wherever the timer or capture is) are left out unless asked
    for: tests/watch/test_watchdog.py checks them.
    """
    return sorted(
        str(p.relative_to(run_dir))
        for p in run_dir.rglob("*")
        if p.is_file()
        and not p.name.startswith(".")
        and (heartbeats or p.relative_to(run_dir).parts[0] != "live")
    )


def temp_files(run_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob(".*") if p.is_file())


def timing_records(run_dir: Path, rank: int = 0) -> list[dict[str, Any]]:
    """A rank's timing records as written, without the lines that open an attempt."""
    path = run_dir / "timings" / f"rank-{rank:05d}.jsonl"
    lines = map(json.loads, path.read_text(encoding="utf-8").splitlines())
    return [record for record in lines if "attempt" not in record]


def within(call: Callable[[], Any], seconds: float = 60) -> Any:
    """`call()`, failing the test instead of hanging it (a FIFO opened blocks forever)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the test below
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"hung for {seconds} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def rankscope_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The warnings rankscope logged."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("rankscope")
    ]


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`rankscope ARGV` in this process: (exit code, stdout, stderr)."""
    from rankscope.cli import main

    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def measured_saving_ms(truth: list[float], before: slice, after: slice) -> float:
    """What a fault cost a job by its own clock (step times in seconds): its typical step
    after the fault's onset less its typical step before, in ms. Medians, not means: on a
    busy machine one burst moves a mean of twenty steps by as much as the fault."""
    import statistics

    return 1000 * (statistics.median(truth[after]) - statistics.median(truth[before]))
