"""What GPU health sampling costs the training step: side by side, with and without it.

Three phase timers in one run, every step sampled, five phases a step of Python work the
training thread spins on (holding the interpreter lock, as a loop's own work does): one
without health, one reading health every 5 s (the default, TimerConfig.health_every_s),
and one reading it every 10 ms, about every step here (what the sampler did before it
read by wall time: at every sampled step). Blocks of steps of each in turn, compared by
their medians: the whole step's time (where the sampler's turns at the interpreter lock
show) and the time inside the timer's calls. NVML is the real one (pynvml) where this
host has a CUDA GPU and nvidia-ml-py, else a stand-in (testing/_nvml.py); the run says
which. The stand-in counts its calls per thread, so the run also shows that the training
thread makes none. Prints ratios; absolute times mean little on a shared machine.

    python bench/health_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from rankscope import TimerConfig
from rankscope.config._ranks import RankInfo
from rankscope.testing._clock import CountingClock
from rankscope.testing._nvml import StandInGpu, StandInNvml
from rankscope.timing import PhaseTimer
from rankscope.timing._health import GpuSource, HealthSampler, gpu_source

PHASES = ("data", "forward", "backward", "allreduce", "optimizer")
VARIANTS = {"without health": None, "every 5 s (default)": 5.0, "every 10 ms": 0.01}


def _timer(run_dir: Path, gpu: GpuSource, every_s: float | None) -> PhaseTimer:
    info = RankInfo(rank=0, local_rank=0, world_size=1, local_world_size=1, host="bench")
    config = TimerConfig(
        enable=True,
        every_n_steps=1,
        flush_every_n_steps=10,
        health=every_s is not None,
        health_every_s=every_s or 5.0,
    )
    return PhaseTimer(config, str(run_dir), info, clock=CountingClock(), gpu=gpu)


def _steps(timer: PhaseTimer, n: int, work_ns: int) -> tuple[float, float]:
    """(ns per step, ns per step inside the timer's calls) over `n` sampled steps of five
    phases, each phase spinning `work_ns`."""
    clock = time.perf_counter_ns
    spent = 0
    began = clock()
    for _ in range(n):
        for name in PHASES:
            t0 = clock()
            span = timer.enter(name, "compute", None, False)
            spent += clock() - t0
            end = clock() + work_ns
            while clock() < end:
                pass
            t0 = clock()
            if span is not None:
                timer.exit(span, False)
            spent += clock() - t0
        t0 = clock()
        timer.step()
        spent += clock() - t0
    return (clock() - began) / n, spent / n


def _readings(run_dir: Path) -> int:
    """Health lines written under `run_dir` (not the attempt lines that open each write)."""
    return sum(
        '"attempt"' not in line
        for path in run_dir.glob("health/*.jsonl")
        for line in path.read_text().splitlines()
    )


def _source() -> tuple[GpuSource, str, StandInNvml | None]:
    """The real NVML for this host's GPU where there is one, else a stand-in; and which."""
    try:
        import torch

        found = gpu_source(torch)
    except ImportError:
        found = "torch is not installed"
    if isinstance(found, GpuSource):
        return found, "the real NVML (pynvml) of this host's GPU", None
    nvml = StandInNvml([StandInGpu.throttling()])
    return GpuSource(nvml, 0), f"a stand-in NVML (testing/_nvml.py): {found}", nvml


def _at_ns(source: GpuSource, tmp: Path, number: int) -> float:
    """ns per at() of a running sampler: the training thread's own part, at a sampled step."""
    sampler = HealthSampler(source, str(tmp / "at"), 0, "bench")
    sampler.start()
    runs = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for step in range(number):
            sampler.at(step)
        runs.append((time.perf_counter_ns() - t0) / number)
    sampler.close(10.0)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (a smoke test)")
    args = parser.parse_args()
    rounds, block, work_ns = (6, 10, 1_000_000) if args.quick else (30, 20, 2_000_000)
    source, which, stand_in = _source()
    print(f"NVML: {which}")
    with tempfile.TemporaryDirectory() as tmp:
        print(f"at() of a running sampler: {_at_ns(source, Path(tmp), 100_000):.0f} ns")
        timers = {
            name: _timer(Path(tmp) / f"v{i}", source, every)
            for i, (name, every) in enumerate(VARIANTS.items())
        }
        for timer in timers.values():
            timer.start()
        step: dict[str, list[float]] = {name: [] for name in timers}
        calls: dict[str, list[float]] = {name: [] for name in timers}
        for i in range(rounds):
            order = list(timers)[i % 3 :] + list(timers)[: i % 3]
            for name in order:
                whole, inside = _steps(timers[name], block, work_ns)
                step[name].append(whole)
                calls[name].append(inside)
        for timer in timers.values():
            timer.stop()
        read = {name: _readings(Path(tmp) / f"v{i}") for i, name in enumerate(VARIANTS)}
    base = statistics.median(step["without health"])
    base_calls = statistics.median(calls["without health"])
    without = step["without health"]
    half = len(without) // 2
    noise = abs(statistics.median(without[:half]) - statistics.median(without[half:]))
    print(
        f"\n{rounds * block} sampled steps per variant, 5 phases of {work_ns / 1e6:.1f} ms "
        "of Python work each, blocks interleaved"
    )
    print(f"{'':<22} {'step us':>9} {'vs without':>11} {'timer calls us':>15} {'readings':>9}")
    for name in timers:
        med = statistics.median(step[name])
        print(
            f"{name:<22} {med / 1e3:>9.1f} {med / base:>10.4f}x "
            f"{statistics.median(calls[name]) / 1e3:>15.2f} {read[name]:>9}"
        )
    print(
        f"noise floor (without health, first half vs second): {noise / base:.4%} of a step; "
        f"the timer's calls without health: {base_calls / 1e3:.2f} us a step"
    )
    if stand_in is not None:
        me = threading.get_ident()
        on = stand_in.on(me)
        off = sum(n for (_, ident), n in stand_in.calls.items() if ident != me)
        print(f"NVML calls on the training thread: {sum(on.values())}; off it: {off}")


if __name__ == "__main__":
    main()
