"""trace.tool="nsys": cudaProfilerStart/Stop at the windows' edges, NVTX ranges inside them.

Without a GPU, the CUDA entry points rankscope calls (is_available, synchronize,
cuda.profiler.start/stop, cuda.nvtx.range_start/end) are replaced by a recorder, so the
tests check which calls happen at which step through the real capture, schedule,
triggers and signals. The `gpu` tests at the end make the real calls.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import rankscope
import rankscope.timing._timer
from rankscope import Profiler, Schedule
from rankscope.analysis import build_report
from rankscope.capture._nsys import NsysWindows
from rankscope.capture._schedule import Action, StepPlan
from rankscope.capture._trigger import SignalHook
from rankscope.rundir._trigger import Trigger, write_trigger

from .._helpers import final_files, tiny_model, tiny_step


class CudaRecorder:
    """Stands in for the CUDA calls rankscope makes, and writes down each with the step."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.open: dict[int, str] = {}
        self._next = 0

    def start(self) -> None:
        self.calls.append(("start", None))

    def stop(self) -> None:
        self.calls.append(("stop", None))

    def synchronize(self) -> None:
        self.calls.append(("sync", None))

    def range_start(self, name: str) -> int:
        self._next += 1
        self.open[self._next] = name
        self.calls.append(("push", name))
        return self._next

    def range_end(self, range_id: int) -> None:
        self.calls.append(("pop", self.open.pop(range_id)))

    def ranges(self) -> list[tuple[str, list[str]]]:
        """Each cudaProfilerStart..Stop range: the NVTX ranges opened inside it."""
        out: list[tuple[str, list[str]]] = []
        inside: list[str] | None = None
        for call, arg in self.calls:
            if call == "start":
                inside = []
            elif call == "stop":
                assert inside is not None, "stop without start"
                out.append((inside[0] if inside else "", inside))
                inside = None
            elif call == "push" and inside is not None:
                inside.append(arg)
        assert inside is None, "a range was left open"
        return out


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> CudaRecorder:
    recorder = CudaRecorder()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", recorder.synchronize)
    monkeypatch.setattr(torch.cuda.profiler, "start", recorder.start)
    monkeypatch.setattr(torch.cuda.profiler, "stop", recorder.stop)
    monkeypatch.setattr(torch.cuda.nvtx, "range_start", recorder.range_start)
    monkeypatch.setattr(torch.cuda.nvtx, "range_end", recorder.range_end)
    # The timer keeps host times only: CUDA events need the device this stands in for.
    monkeypatch.setattr(rankscope.timing._timer, "CudaEventClock", lambda _torch: None)
    return recorder


def _config(run_dir: Path, **trace: Any) -> rankscope.ProfileConfig:
    return rankscope.ProfileConfig(
        output_dir=run_dir,
        trace=rankscope.TraceConfig(enable=True, tool="nsys", **trace),
        timer=rankscope.TimerConfig(enable=True, every_n_steps=1),
    )


def _train(prof: Profiler, steps: int, at: dict[int, Any] | None = None) -> None:
    model, opt = tiny_model()
    with prof:
        for i in range(steps):
            tiny_step(model, opt, prof)
            if at and i in at:
                at[i]()
            prof.step()


def _steps(names: list[str]) -> list[int]:
    return [int(n.split("#")[1]) for n in names if n.startswith("ProfilerStep#")]


def _phases(names: list[str]) -> list[str]:
    return [n for n in names if not n.startswith("ProfilerStep#")]


def test_scheduled_windows_are_cuda_profiler_ranges_with_steps_and_phases(
    tmp_path: Path, cuda: CudaRecorder
) -> None:
    schedule = Schedule(wait=1, warmup=1, active=2, repeat=2)  # records 2-3 and 6-7
    _train(Profiler(_config(tmp_path, schedule=schedule), rank=0, world_size=1), 10)
    ranges = cuda.ranges()
    assert [_steps(names) for _, names in ranges] == [[2, 3], [6, 7]]
    for _, names in ranges:
        assert _phases(names) == ["forward", "backward", "optimizer"] * 2
    # Every stop comes right after a synchronize: the window's kernels end inside it.
    stops = [i for i, (call, _) in enumerate(cuda.calls) if call == "stop"]
    assert all(cuda.calls[i - 1][0] == "sync" for i in stops)
    # Nothing is pushed outside the windows (the timer's ranges are left to the capture there).
    assert not cuda.open
    # One record per window names its steps; no torch.profiler trace is written.
    files = final_files(tmp_path)
    assert not [f for f in files if f.startswith("traces/")]
    notes = sorted(f for f in files if f.startswith("nsys/"))
    assert notes == [
        "nsys/step-000002-000003/rank-00000.json",
        "nsys/step-000006-000007/rank-00000.json",
    ]
    note = json.loads((tmp_path / notes[0]).read_text())
    assert (note["first"], note["last"], note["rank"], note["pid"]) == (2, 3, 0, os.getpid())
    assert 0 < note["start_ns"] <= note["end_ns"]
    # The report lists the ranges beside the timings.
    report = build_report(tmp_path)
    assert report["captures"]["nsys"] == [
        {"window": "step-000002-000003", "first": 2, "last": 3, "ranks": [0]},
        {"window": "step-000006-000007", "first": 6, "last": 7, "ranks": [0]},
    ]
    assert not report.get("kernels", {}).get("windows")  # no torch.profiler trace


def test_the_timer_times_phases_inside_windows_without_a_second_nvtx_range(
    tmp_path: Path, cuda: CudaRecorder
) -> None:
    _train(
        Profiler(_config(tmp_path, schedule=Schedule(warmup=0, active=1)), rank=0, world_size=1), 3
    )
    (only,) = cuda.ranges()
    assert only[1] == ["ProfilerStep#0", "forward", "backward", "optimizer"]
    # Outside the window the timer (every step sampled) opens its own NVTX ranges.
    pushed = [arg for call, arg in cuda.calls if call == "push"]
    assert pushed.count("forward") == 3
    records = (tmp_path / "timings" / "rank-00000.jsonl").read_text().splitlines()
    assert sum('"phase":"forward"' in line for line in records) == 3


def test_a_trigger_and_a_signal_open_ranges_named_after_who_asked(
    tmp_path: Path, cuda: CudaRecorder
) -> None:
    config = _config(
        tmp_path,
        schedule=Schedule(warmup=1, active=1, repeat=1),  # records step 1
        trigger_check_every_n_steps=1,
        on_signal=True,
    )
    previous = signal.getsignal(signal.SIGUSR2)
    at = {
        3: lambda: write_trigger(tmp_path, Trigger("t1", 7, 2, "0")),
        10: lambda: os.kill(os.getpid(), signal.SIGUSR2),
    }
    _train(Profiler(config, rank=0, world_size=1), 16, at)
    assert signal.getsignal(signal.SIGUSR2) is previous
    assert [_steps(names) for _, names in cuda.ranges()] == [[1], [7, 8], [13]]
    notes = sorted(p.parent.name for p in (tmp_path / "nsys").glob("*/rank-00000.json"))
    assert notes == [
        "step-000001-000001",
        "step-000007-000008-trigger-t1",
        "step-000013-000013-sigusr2",
    ]
    note = json.loads((tmp_path / "nsys" / notes[1] / "rank-00000.json").read_text())
    assert note["captured_because"] == {"by": "trigger", "trigger": "t1", "seen_at_step": 4}


def test_a_window_cut_short_by_stop_is_closed(tmp_path: Path, cuda: CudaRecorder) -> None:
    config = _config(tmp_path, schedule=Schedule(warmup=0, active=5))
    _train(Profiler(config, rank=0, world_size=1), 3)
    # Stopped during step 3 (after three step() calls), as a torch.profiler window would be.
    (only,) = cuda.ranges()
    assert _steps(only[1]) == [0, 1, 2, 3]
    note = json.loads((tmp_path / "nsys/step-000000-000003/rank-00000.json").read_text())
    assert (note["first"], note["last"]) == (0, 3)


def test_a_phase_target_gets_a_range_per_recorded_invocation(
    tmp_path: Path, cuda: CudaRecorder
) -> None:
    config = _config(
        tmp_path, target="phase:backward", schedule=Schedule(warmup=0, active=1, repeat=2)
    )
    _train(Profiler(config, rank=0, world_size=1), 4)
    ranges = cuda.ranges()
    assert [names for _, names in ranges] == [["backward"], ["backward"]]
    notes = sorted((tmp_path / "nsys").glob("*/*.json"))
    assert [p.parent.name for p in notes] == ["phase-backward-000000", "phase-backward-000001"]
    # Each record names the step the invocation ran in.
    steps = [json.loads(p.read_text()) for p in notes]
    assert [(n["first"], n["last"]) for n in steps] == [(0, 0), (1, 1)]


def test_without_cuda_one_warning_and_everything_else_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert not torch.cuda.is_available()
    reached: list[int] = []
    before = signal.signal(signal.SIGUSR2, lambda *_: reached.append(1))  # pytest must survive

    def send() -> None:
        # SIGUSR2 still has rankscope's handler in front: its default action would end the job.
        assert isinstance(signal.getsignal(signal.SIGUSR2), SignalHook)
        os.kill(os.getpid(), signal.SIGUSR2)

    try:
        with caplog.at_level(logging.INFO, logger="rankscope"):
            prof = Profiler(_config(tmp_path, on_signal=True), rank=0, world_size=1)
            _train(prof, 5, {2: send})
    finally:
        signal.signal(signal.SIGUSR2, before)
    assert reached == [1]  # passed on to the handler found at start()
    said = [r.getMessage() for r in caplog.records if "SIGUSR2" in r.getMessage()]
    assert said == [
        "rankscope: SIGUSR2 received before step 3; no window on rank 0: capture is off "
        "(see the warning at start)"
    ]
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == [
        "rankscope: trace.tool is 'nsys' but CUDA is not available in this process; no window "
        "is recorded on rank 0 (timing and everything else go on)"
    ]
    assert prof.faults == []
    files = final_files(tmp_path)
    assert files == ["meta/rank-00000.json", "timings/rank-00000.jsonl"]
    lines = (tmp_path / "timings/rank-00000.jsonl").read_text().splitlines()
    assert len(lines) == 1 + 5 * 4  # the attempt's line, then the records


def test_nsys_windows_follow_torch_profiler_transitions() -> None:
    """The stand-in drives the same transitions as torch.profiler for every action sequence
    a StepPlan produces: a range per window, back to back windows included."""

    class Cuda:
        def __init__(self) -> None:
            self.log: list[str] = []
            self.profiler = self
            self.nvtx = self

        def start(self) -> None:
            self.log.append("start")

        def stop(self) -> None:
            self.log.append("stop")

        def synchronize(self) -> None:
            pass

        def range_start(self, name: str) -> int:
            self.log.append(name)
            return 0

        def range_end(self, _: int) -> None:
            pass

    class Torch:
        cuda = Cuda()

    plan = StepPlan(Schedule(wait=0, warmup=0, active=2, repeat=3))  # 0-1, 2-3, 4-5 back to back
    saved: list[int] = []
    windows = NsysWindows(Torch(), plan.action, lambda w: saved.append(w.step_num))  # type: ignore[arg-type]
    windows.start()
    for _ in range(8):
        windows.step()
    windows.stop()
    log = Torch.cuda.log
    assert log == [
        "start", "ProfilerStep#0", "ProfilerStep#1", "stop",
        "start", "ProfilerStep#2", "ProfilerStep#3", "stop",
        "start", "ProfilerStep#4", "ProfilerStep#5", "stop",
    ]  # fmt: skip
    assert saved == [2, 4, 6]  # torch calls on_trace_ready in the step after the window
    assert [plan.action(s) for s in range(7)][-1] is Action.NONE


# -- on a GPU -------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_real_cuda_profiler_calls_and_nvtx_ranges(tmp_path: Path) -> None:
    """No nsys attached: cudaProfilerStart/Stop succeed and record nothing; the run goes on."""
    config = _config(tmp_path, schedule=Schedule(warmup=1, active=2))
    a = torch.randn(256, 256, device="cuda")
    prof = Profiler(config, rank=0, world_size=1)
    with prof:
        for _ in range(5):
            with prof.phase("matmul"):
                (a @ a).relu_()
            prof.step()
    assert prof.faults == []
    note = json.loads((tmp_path / "nsys/step-000001-000002/rank-00000.json").read_text())
    assert (note["first"], note["last"]) == (1, 2)


_UNDER_NSYS = """
import pathlib, sys, torch, rankscope
config = rankscope.ProfileConfig(output_dir=sys.argv[1], trace=rankscope.TraceConfig(
    enable=True, tool="nsys", schedule=rankscope.Schedule(wait=2, warmup=1, active=2, repeat=2)))
a = torch.randn(512, 512, device="cuda")
with rankscope.Profiler(config, rank=0, world_size=1) as prof:
    for _ in range(14):
        with prof.phase("matmul"):
            (a @ a).relu_()
        prof.step()
pathlib.Path(sys.argv[1], "job-finished").touch()
"""

NSYS_TIMEOUT_S = 240.0
"""How long `nsys profile` may take: the job runs in seconds; the rest is nsys's own import."""


def run_nsys(command: list[str], out_dir: Path, timeout: float) -> str | None:
    """Run `nsys profile ...` with a bound on the wait; None if it made its reports, else
    what failed, in one line naming the tool and the timeout.

    nsys imports its .qdstrm into a .nsys-rep after the job ends; a broken importer was
    seen to keep `nsys profile` running past 100 s. nsys starts children of its own, so
    the whole process group is killed at the bound, leaving nothing running.
    """
    proc = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        ended = f"did not finish within {timeout:.0f} s"
    else:
        ended = f"exited with {proc.returncode}"
        if proc.returncode == 0 and any(out_dir.glob("*.nsys-rep")):
            return None
    left = sorted(p.name for p in out_dir.glob("*.qdstrm"))
    made = f"it left {', '.join(left)} and no .nsys-rep" if left else "it made no report"
    tail = output.decode(errors="replace").strip().splitlines()[-3:]
    return f"nsys {ended} ({made}): {' | '.join(tail)}"


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nsys") is None, reason="needs Nsight Systems (nsys) on PATH")
def test_gpu_under_nsys_each_window_is_one_report(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(_UNDER_NSYS)
    run_dir = tmp_path / "run"
    command = [
        "nsys", "profile", "--capture-range=cudaProfilerApi", "--capture-range-end=repeat",
        "--trace=cuda,nvtx", "-o", str(tmp_path / "report"), sys.executable, str(script),
        str(run_dir),
    ]  # fmt: skip
    failed = run_nsys(command, tmp_path, NSYS_TIMEOUT_S)
    if failed is not None and (run_dir / "job-finished").exists():
        # The job under it ran to its end: what failed is nsys making its reports.
        pytest.skip(f"the nsys on PATH cannot make reports: {failed}")
    assert failed is None, failed
    reports = sorted(tmp_path.glob("report*.nsys-rep"))
    assert len(reports) == 2, reports


_BROKEN_NSYS = """#!/bin/sh
# Writes its .qdstrm as nsys does, then {ending}.
while [ "$#" -gt 0 ]; do
    if [ "$1" = "-o" ]; then out="$2"; fi
    shift
done
echo "Generating '$out.qdstrm'"
: > "$out.qdstrm"
{command}
"""


@pytest.mark.parametrize(
    ("ending", "command", "said"),
    [
        ("never finishes", "sleep 600 & wait", "did not finish within 3 s"),
        ("fails to import it", 'echo "Importer error status: Importation failed."; exit 1',
         "exited with 1"),
    ],
)  # fmt: skip
def test_a_broken_nsys_is_bounded_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ending: str, command: str, said: str
) -> None:
    """The runner of the gpu test above, against an `nsys` on PATH that hangs or fails as
    a broken install does: it returns within its bound, kills what nsys started, and says
    what failed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nsys"
    fake.write_text(_BROKEN_NSYS.format(ending=ending, command=command))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "out"
    out.mkdir()
    t0 = time.monotonic()
    failed = run_nsys(["nsys", "profile", "-o", str(out / "report"), "true"], out, 3.0)
    assert time.monotonic() - t0 < 3.0 + 10.0
    assert failed is not None
    assert failed.startswith(f"nsys {said} (it left report.qdstrm and no .nsys-rep)"), failed


@pytest.mark.parametrize("error", [RuntimeError("device lost"), KeyboardInterrupt()])
def test_a_failure_while_a_range_ends_still_ends_it(
    tmp_path: Path, cuda: CudaRecorder, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    """The device synchronize before cudaProfilerStop raises (a CUDA error, or Ctrl-C while
    the GPU drains): the range is closed all the same, so nsys does not record what follows."""

    def synchronize() -> None:
        cuda.calls.append(("sync", None))
        raise error

    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    prof = Profiler(_config(tmp_path, schedule=Schedule(warmup=0, active=1)), rank=0, world_size=1)
    model, opt = tiny_model()
    interrupted = False
    try:
        with prof:
            for _ in range(4):
                tiny_step(model, opt, prof)
                prof.step()
    except KeyboardInterrupt:
        interrupted = True
    assert interrupted is isinstance(error, KeyboardInterrupt)
    calls = [call for call, _ in cuda.calls if call in ("start", "stop")]
    assert calls == ["start", "stop"]
    assert not cuda.open  # no NVTX range left open either
    if not interrupted:
        assert prof.faults and "device lost" in prof.faults[0]
