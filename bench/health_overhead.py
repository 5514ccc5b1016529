"""What GPU health sampling costs the training thread: a sampled step with and without it.

Two phase timers side by side in one run, every step sampled, five phases a step: one
without health, one whose sampler reads a stand-in NVML (testing/_nvml.py) on its own
thread. What is timed is the training thread's time inside the timer's calls (enter,
exit, step), blocks of steps of each in turn, compared by their medians; the stand-in counts its calls per thread, so the run also shows that the
training thread makes none. On a host without a GPU this is the whole of the training
thread's part: one Event.set() per sampled step (timing/_health.py). Prints ratios;
absolute times mean little on a shared machine.

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
from rankscope.timing._health import GpuSource, HealthSampler

PHASES = ("data", "forward", "backward", "allreduce", "optimizer")


def _timer(run_dir: Path, gpu: GpuSource | None) -> PhaseTimer:
    info = RankInfo(rank=0, local_rank=0, world_size=1, local_world_size=1, host="bench")
    config = TimerConfig(enable=True, every_n_steps=1, flush_every_n_steps=10)
    return PhaseTimer(config, str(run_dir), info, clock=CountingClock(), gpu=gpu)


def _steps(timer: PhaseTimer, n: int, work_ns: int) -> float:
    """ns per step spent in the timer's calls (enter, exit, step) over `n` sampled steps of
    five phases, each phase spinning `work_ns` between them (the training thread's own
    Python work, which holds the GIL as a loop's does; not counted)."""
    clock = time.perf_counter_ns
    spent = 0
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
    return spent / n


def _compare(tmp: Path, nvml: StandInNvml, rounds: int, block: int, work_ns: int) -> None:
    timers = {
        "without health": _timer(tmp / f"without-{work_ns}", None),
        "with health": _timer(tmp / f"with-{work_ns}", GpuSource(nvml, 0)),
    }
    for timer in timers.values():
        timer.start()
    times: dict[str, list[float]] = {name: [] for name in timers}
    for i in range(rounds):
        order = list(timers) if i % 2 == 0 else list(reversed(timers))
        for name in order:
            times[name].append(_steps(timers[name], block, work_ns))
    for timer in timers.values():
        timer.stop()
    base = statistics.median(times["without health"])
    print(
        f"\nsampled steps of 5 phases of {work_ns / 1000:.0f} us ({rounds * block} per variant): "
        "the timer's calls per step"
    )
    print(f"{'':<24} {'median ns':>10} {'vs without':>11}")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:<24} {med:>10.0f} {med / base:>10.3f}x")
    extra = statistics.median(times["with health"]) - base
    without = times["without health"]
    half = len(without) // 2
    noise = abs(statistics.median(without[:half]) - statistics.median(without[half:]))
    print(
        f"health sampling on the training thread: {extra:+.0f} ns per sampled step "
        f"(noise floor, without health's first vs second half: {noise:.0f} ns)"
    )


def _wake_ns(tmp: Path, nvml: StandInNvml, number: int) -> float:
    """ns per wake() of a running sampler: the training thread's own part, at a sampled step."""
    sampler = HealthSampler(GpuSource(nvml, 0), str(tmp / "wake"), 0, "bench")
    sampler.start()
    runs = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for step in range(number):
            sampler.wake(step)
        runs.append((time.perf_counter_ns() - t0) / number)
    sampler.close(10.0)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (a smoke test)")
    args = parser.parse_args()
    rounds, block = (10, 20) if args.quick else (100, 100)
    nvml = StandInNvml([StandInGpu.throttling()])
    with tempfile.TemporaryDirectory() as tmp:
        # Empty phases: the sampler's thread reads and writes while the next steps run,
        # and the two threads take turns at the GIL. Phases of 200 us (a 1 ms step, still
        # shorter than a real one): the sample is read between the training thread's turns.
        print(f"wake() of a running sampler: {_wake_ns(Path(tmp), nvml, rounds * block):.0f} ns")
        for work_ns in (0, 200_000):
            _compare(Path(tmp), nvml, rounds, block, work_ns)
    me = threading.get_ident()
    on = nvml.on(me)
    off = sum(n for (_, ident), n in nvml.calls.items() if ident != me)
    print(f"\nNVML calls on the training thread: {sum(on.values())}; off it: {off}")


if __name__ == "__main__":
    main()
