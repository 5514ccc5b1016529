"""What the phase timer costs: per phase() call, and per training step.

Micro: nanoseconds per `with prof.phase(...)` when the profiler is disabled, on an
unsampled step and on a sampled step (also with four gloo process groups, whose
collective counts a sampled phase reads), next to `with contextlib.nullcontext()` in
the same run. Macro: a small MLP trained on the CPU with 5 phases a step, the step times of
three variants interleaved step by step (no profiler, timer every 10 steps, timer every
step), compared by their medians. With --device cuda the macro loop runs on the GPU and
the timer records CUDA events. With --device stand-in the loop runs on the CPU and the
timer's device clock is a stand-in (CountingClock) that counts the device calls a
sampled phase makes on the training thread and off it: on a host without a GPU, this
shows that the training thread makes the phase's two event records and nothing else. The timer's variants run with the heartbeat and hang
watchdog on, as they are by default (what the heartbeat alone adds to step() and phase():
bench/unselected_cost.py). Prints ratios; absolute times mean little on a shared
machine.

    python bench/timer_overhead.py [--quick] [--device cpu|cuda|stand-in]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import tempfile
import threading
import time
import timeit
from pathlib import Path
from typing import Any

import torch

import rankscope
from rankscope.testing._clock import CountingClock

PHASES = (
    ("data", "data"),
    ("forward", "compute"),
    ("backward", "compute"),
    ("allreduce", "comm"),
    ("optimizer", "compute"),
)


def _ns_per(stmt: str, env: dict[str, Any], number: int, repeat: int) -> float:
    return (
        statistics.median(timeit.repeat(stmt, globals=env, number=number, repeat=repeat))
        / number
        * 1e9
    )


def _profiler(
    run_dir: Path, every: int | None, flush: int = 10, clock: CountingClock | None = None
) -> rankscope.Profiler:
    timer = rankscope.TimerConfig(
        enable=every is not None, every_n_steps=every or 1, flush_every_n_steps=flush
    )
    prof = rankscope.Profiler(
        rankscope.ProfileConfig(output_dir=run_dir, timer=timer), rank=0, world_size=1
    )
    if clock is not None and prof._timer is not None:
        # The Profiler picks CUDA events or no clock; the stand-in replaces it before start().
        prof._timer._clock = clock
    return prof


def _stand_in(device: str) -> CountingClock | None:
    return CountingClock() if device == "stand-in" else None


def micro(run_dir: Path, quick: bool, device: str) -> tuple[dict[str, float], CountingClock | None]:
    # --quick on a CPU is the tests' smoke run; make test-gpu's --quick on a GPU measures.
    number, repeat = (200_000, 7) if not quick else (20_000, 3) if device == "cuda" else (5_000, 3)
    disabled = _profiler(run_dir / "disabled", None)
    unsampled = _profiler(run_dir / "unsampled", 10**9)
    # flushed apart, below
    sampled = _profiler(run_dir / "sampled", 1, flush=10**9, clock=_stand_in(device))
    for prof in (disabled, unsampled, sampled):
        prof.start()
    unsampled.step()  # step 1 of every 10**9: not sampled
    env: dict[str, Any] = {
        "nullcontext": contextlib.nullcontext,
        "d": disabled,
        "u": unsampled,
        "s": sampled,
    }
    rows = {
        "with nullcontext()": _ns_per("with nullcontext(): pass", env, number, repeat),
        "disabled phase()": _ns_per("with d.phase('forward'): pass", env, number, repeat),
        "unsampled phase()": _ns_per("with u.phase('forward'): pass", env, number, repeat),
    }
    # Sampled: the record is made on exit and formatted and written at the next flush;
    # count both, as a loop of 5-phase steps flushed every 10 steps.
    s_number = number // 10
    rows["sampled phase(), record only"] = _ns_per(
        "with s.phase('forward'): pass", env, s_number, repeat
    )
    sampled.stop()
    rows["sampled phase(), 4 process groups"] = _with_groups(run_dir, env, s_number, repeat, device)
    counted = _stand_in(device)
    written = _profiler(run_dir / "written", 1, flush=10, clock=counted)
    written.start()
    env["w"] = written
    loop = "for _ in range(5):\n    with w.phase('forward'): pass\nw.step()"
    rows["sampled phase(), with its write"] = _ns_per(loop, env, s_number // 5, repeat) / 5
    written.stop()
    disabled.stop()
    unsampled.stop()
    return rows, counted


def _with_groups(
    run_dir: Path, env: dict[str, Any], number: int, repeat: int, device: str
) -> float:
    """A sampled phase in a process with a world of one and three more groups over gloo:
    the timer reads each group's collective count at the phase's entry and exit
    (timing/_collectives.py)."""
    import torch.distributed as dist

    run_dir.mkdir(parents=True, exist_ok=True)
    dist.init_process_group("gloo", init_method=f"file://{run_dir / 'store'}", rank=0, world_size=1)
    try:
        for _ in range(3):
            dist.new_group([0])
        grouped = _profiler(run_dir / "grouped", 1, flush=10**9, clock=_stand_in(device))
        grouped.start()
        env["g"] = grouped
        try:
            return _ns_per("with g.phase('forward'): pass", env, number, repeat)
        finally:
            grouped.stop()
    finally:
        dist.destroy_process_group()


def parts(run_dir: Path, quick: bool, device: str) -> dict[str, float]:
    """ns per call of each thing a sampled phase does, each timed alone in this run: where
    a phase's microseconds go on this host (with --device cuda: what a CUDA event's creation,
    its record on the cached stream, an NVTX range and the profiler check cost on a real
    CUDA context). The rows sum to about a phase's enter and exit, without the write."""
    from rankscope.timing._record import Span, format_record, meta_json

    number, repeat = (20_000, 3) if quick else (200_000, 5)
    prof = _profiler(run_dir / "parts", 1, flush=10**9, clock=_stand_in(device))
    prof.start()
    timer = prof._timer
    assert timer is not None
    span = Span(0, "forward", "compute", None, 0, None)
    span.cpu_ns = 1_000_000
    env: dict[str, Any] = {
        "time": time,
        "threading": threading,
        "timer": timer,
        "Span": Span,
        "span": span,
        "meta_json": meta_json,
        "format_record": format_record,
        "profiler_enabled": torch.autograd._profiler_enabled,
    }
    stmts = {
        "time.perf_counter_ns() x2": "time.perf_counter_ns(); time.perf_counter_ns()",
        "time.thread_time_ns() x2": "time.thread_time_ns(); time.thread_time_ns()",
        "threading.get_ident() x2": "threading.get_ident(); threading.get_ident()",
        "depth: contextvar get + set x2": (
            "d = timer._depth.get(); timer._depth.set(d + 1); timer._depth.set(d)"
        ),
        "Span(...)": "Span(0, 'forward', 'compute', None, 0, None)",
        "torch profiler running? (check)": "profiler_enabled()",
        "collective count x2": "timer._collectives.now(); timer._collectives.now()",
        "meta_json(None)": "meta_json(None)",
        "format_record (the write's part)": "format_record(0, span, None, 0)",
    }
    if timer._runq is not None and timer._runq.fd >= 0:
        stmts["run-queue wait read"] = "timer._runq.now()"
    clock = timer._clock
    if clock is not None:
        env["clock"] = clock
        stmts["device mark x2 (pooled, recorded)"] = (
            "a = clock.mark(); b = clock.mark(); clock.release(a); clock.release(b)"
        )
        if device == "cuda":
            env["torch"] = torch
            stmts["cuda Event(enable_timing) (new)"] = "torch.cuda.Event(enable_timing=True)"
            stmts["cuda current_stream() lookup"] = "clock._current_stream()"
            stmts["cuda NVTX range start + end"] = (
                "torch.cuda.nvtx.range_end(torch.cuda.nvtx.range_start('forward'))"
            )
    rows = {name: _ns_per(stmt, env, number, repeat) for name, stmt in stmts.items()}
    prof.stop()
    return rows


def device_calls(clock: CountingClock, records: int) -> None:
    """Print the stand-in's device calls per sampled phase, on the training thread and off it."""
    me = threading.get_ident()
    for where, calls in (("on the training thread", clock.on(me)), ("off it", clock.off(me))):
        said = ", ".join(f"{method} {n / records:.2f}" for method, n in calls.items())
        print(f"  {where:<24} {said or 'none'}")


def records_in(run_dir: Path) -> int:
    """Timing records (not attempt lines) under `run_dir`."""
    return sum(
        '"phase"' in line
        for path in run_dir.rglob("rank-*.jsonl")
        for line in path.read_text().splitlines()
    )


class _Loop:
    """A small MLP step of about 10-30 ms on one CPU thread (or a bigger one on a GPU)."""

    def __init__(self, device: str) -> None:
        torch.manual_seed(0)
        width = 1024 if device == "cpu" else 4096
        self.device = device
        self.batch = 64 if device == "cpu" else 512
        self.width = width
        self.model = torch.nn.Sequential(
            torch.nn.Linear(width, 2 * width), torch.nn.ReLU(), torch.nn.Linear(2 * width, width)
        ).to(device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)

    def step(self, prof: rankscope.Profiler | None) -> None:
        phase = prof.phase if prof is not None else (lambda name, kind: contextlib.nullcontext())
        with phase("data", "data"):
            x = torch.randn(self.batch, self.width, device=self.device)
        with phase("forward", "compute"):
            loss = self.model(x).square().mean()
        with phase("backward", "compute"):
            loss.backward()
        with phase("allreduce", "comm"):  # a stand-in: flatten and reduce the gradients
            grads = torch.cat(
                [p.grad.flatten() for p in self.model.parameters() if p.grad is not None]
            )
            grads.div_(2.0)
        with phase("optimizer", "compute"):
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        if self.device == "cuda":
            torch.cuda.synchronize()  # the loop's own sync: step times then mean device time
        if prof is not None:
            prof.step()


def macro(run_dir: Path, quick: bool, device: str) -> dict[str, list[float]]:
    loop = _Loop("cuda" if device == "cuda" else "cpu")
    variants: dict[str, rankscope.Profiler | None] = {
        "no profiler": None,
        "timer every 10 steps": _profiler(run_dir / "every10", 10, clock=_stand_in(device)),
        "timer every step": _profiler(run_dir / "every1", 1, clock=_stand_in(device)),
    }
    for prof in variants.values():
        if prof is not None:
            prof.start()
    for _ in range(10):  # warm up allocator and caches
        loop.step(None)
    rounds = 1500 if not quick else 30 if device == "cuda" else 10
    times: dict[str, list[float]] = {name: [] for name in variants}
    rng = random.Random(0)
    names = list(variants)
    for _ in range(rounds):
        rng.shuffle(names)  # interleaved step by step, in a fresh order each round
        for name in names:
            t0 = time.perf_counter_ns()
            loop.step(variants[name])
            times[name].append((time.perf_counter_ns() - t0) / 1e6)
    for prof in variants.values():
        if prof is not None:
            prof.stop()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (a smoke test)")
    parser.add_argument("--device", choices=("cpu", "cuda", "stand-in"), default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        rows, counted = micro(Path(tmp) / "micro", args.quick, args.device)
        base = rows["with nullcontext()"]
        print(f"{'phase() enter+exit':<34} {'ns':>9} {'vs nullcontext':>15}")
        for name, ns in rows.items():
            print(f"{name:<34} {ns:>9.1f} {ns / base:>14.2f}x")
        print(
            f"\ndisabled vs nullcontext: {rows['disabled phase()'] / base:.2f}x, "
            f"unsampled vs nullcontext: {rows['unsampled phase()'] / base:.2f}x (goal <= 2x); "
            f"sampled on CPU with its write: {rows['sampled phase(), with its write'] / 1000:.2f} us (goal < 10 us)"
        )
        if counted is not None:
            print("\ndevice calls per sampled phase (stand-in clock, the 'with its write' loop):")
            device_calls(counted, records_in(Path(tmp) / "micro" / "written"))
        costs = parts(Path(tmp) / "parts", args.quick, args.device)
        print(f"\na sampled phase's parts, each timed alone ({args.device}):")
        for name, ns in costs.items():
            print(f"  {name:<36} {ns:>9.1f} ns")
        print(
            f"  {'sum':<36} {sum(costs.values()):>9.1f} ns, against "
            f"{rows['sampled phase(), with its write']:.1f} ns for a phase with its write"
        )
        times = macro(Path(tmp) / "macro", args.quick, args.device)
    base_ms = statistics.median(times["no profiler"])
    print(f"\nmacro ({args.device}, {len(times['no profiler'])} steps per variant, interleaved):")
    print(f"{'variant':<24} {'median ms':>10} {'mean ms':>9} {'overhead':>9}")
    for name, values in times.items():
        med = statistics.median(values)
        print(
            f"{name:<24} {med:>10.3f} {statistics.fmean(values):>9.3f} {100 * (med / base_ms - 1):>+8.2f}%"
        )
    every10 = statistics.median(times["timer every 10 steps"]) / base_ms - 1
    every1 = statistics.median(times["timer every step"]) / base_ms - 1
    # The step-time noise floor: the spread of the baseline's own medians over halves of the run.
    half = len(times["no profiler"]) // 2
    halves = [
        statistics.median(times["no profiler"][:half]),
        statistics.median(times["no profiler"][half:]),
    ]
    noise = abs(halves[0] - halves[1]) / base_ms
    print(
        f"\ntimer every 10 steps: {100 * every10:+.2f}% (goal < 0.5%); every step: {100 * every1:+.2f}% "
        f"(goal < 2%); noise floor (baseline, first vs second half): {100 * noise:.2f}%"
    )
    per_step_us = (len(PHASES) + 1) * rows["sampled phase(), with its write"] / 1000
    print(
        f"expected from the micro figures: every step {per_step_us:.1f} us of a {base_ms:.1f} ms step "
        f"= {100 * per_step_us / 1000 / base_ms:.3f}%"
    )


if __name__ == "__main__":
    main()
