"""What checking for on-demand windows costs per step(), next to the unsampled timer path.

A rank that captures looks for trigger files every `trace.trigger_check_every_n_steps`
steps (one stat of RUN_DIR/triggers) and, with `trace.on_signal`, reads the SIGUSR2
flag every step. Measured here on Profiler.step() between windows (the schedule's
window is over and no torch.profiler is held), with the checks off and on, next to
Profiler.step() of a timer-only rank on an unsampled step, an empty method call and
`with contextlib.nullcontext()`; and the anomaly watcher (`trace.auto`), which times
every step. Every variant is timed in turn, round after round,
in one run; the check's cost is the difference from the same step() with checks
off. Prints ratios (absolute times mean little on a shared machine). The goal
(issue 6): the trigger check costs no more than the unsampled timer path.

    python bench/trigger_check.py [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

import rankscope
from rankscope.capture._trigger import TriggerPoller, trigger_dir


class _Empty:
    def step(self) -> None:
        return None


def _trace_only(
    run_dir: Path, every: int, on_signal: bool = False, auto: bool = False
) -> rankscope.Profiler:
    """A rank that captures, past its only window (step 0) after one step(): no profiler held.

    With `auto`, the anomaly watcher measures every step; its ratio is set out of reach,
    so what is timed is the bookkeeping, never a capture.
    """
    trace = rankscope.TraceConfig(
        enable=True,
        schedule=rankscope.Schedule(warmup=0, active=1),
        trigger_check_every_n_steps=every,
        on_signal=on_signal,
        auto=rankscope.AutoTrigger(enable=auto, ratio=1e9),
    )
    prof = rankscope.Profiler(
        rankscope.ProfileConfig(output_dir=run_dir, trace=trace), rank=0, world_size=1
    )
    prof.start()
    prof.step()  # saves the window of step 0 and releases the profiler
    return prof


def _timer_only(run_dir: Path) -> rankscope.Profiler:
    """A rank that times phases every 10**9 steps: every step() after the first is unsampled."""
    timer = rankscope.TimerConfig(enable=True, every_n_steps=10**9)
    prof = rankscope.Profiler(
        rankscope.ProfileConfig(output_dir=run_dir, timer=timer), rank=0, world_size=1
    )
    prof.start()
    prof.step()
    return prof


def _unchanged_folder(run_dir: Path) -> None:
    """Make RUN_DIR/triggers exist with an old mtime: polls then cost one stat, no listing."""
    folder = trigger_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    old = time.time() - 3600  # past the 2 s in which a watcher scans a fresh folder again
    os.utime(folder, (old, old))


def measure(root: Path, quick: bool) -> dict[str, float]:
    """ns per call of each statement, median over rounds that time every variant in turn."""
    number, rounds = (5_000, 3) if quick else (200_000, 9)  # --quick: the tests' smoke run
    profilers = {
        "timer": _timer_only(root / "timer"),
        "off": _trace_only(root / "off", 0),
        "every10": _trace_only(root / "every10", 10),
        "every10_folder": _trace_only(root / "every10_folder", 10),
        "every1": _trace_only(root / "every1", 1),
        "signal": _trace_only(root / "signal", 10, on_signal=True),
        "auto": _trace_only(root / "auto", 10, auto=True),
    }
    _unchanged_folder(root / "every10_folder")
    missing = TriggerPoller(str(root / "off"), 0)
    _unchanged_folder(root / "present")
    present = TriggerPoller(str(root / "present"), 0)
    present.poll()  # the first poll lists it; later ones find the same mtime
    env: dict[str, Any] = {
        "nullcontext": contextlib.nullcontext,
        "empty": _Empty(),
        "missing": missing,
        "present": present,
        **profilers,
    }
    statements = {
        "empty method call": "empty.step()",
        "with nullcontext()": "with nullcontext(): pass",
        "timer on, unsampled step()": "timer.step()",
        "trace, checks off: step()": "off.step()",
        "trace, check every 10, no folder": "every10.step()",
        "trace, check every 10, folder": "every10_folder.step()",
        "trace, check every step, no folder": "every1.step()",
        "trace, every 10 + on_signal": "signal.step()",
        "trace, every 10 + auto": "auto.step()",
        "poll(), no folder": "missing.poll()",
        "poll(), folder unchanged": "present.poll()",
    }
    times: dict[str, list[float]] = {name: [] for name in statements}
    try:
        for _ in range(rounds):
            for name, stmt in statements.items():
                seconds = timeit.timeit(stmt, globals=env, number=number)
                times[name].append(seconds / number * 1e9)
    finally:
        for prof in profilers.values():
            prof.stop()
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (a smoke test)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(Path(tmp), args.quick)
    call = rows["empty method call"]
    ctx = rows["with nullcontext()"]
    timer = rows["timer on, unsampled step()"]
    print(f"{'what (per call)':<36} {'ns':>8} {'vs empty call':>14} {'vs nullcontext':>15}")
    for name, ns in rows.items():
        print(f"{name:<36} {ns:>8.1f} {ns / call:>13.2f}x {ns / ctx:>14.2f}x")
    off = rows["trace, checks off: step()"]
    print(f"\nthe check's cost per step() (the step() with checks off, {off:.1f} ns, subtracted):")
    print(f"{'checks':<36} {'ns':>8} {'vs unsampled timer step()':>26}")
    goal_rows = {
        "every 10 steps, no folder (default)": rows["trace, check every 10, no folder"],
        "every 10 steps, folder unchanged": rows["trace, check every 10, folder"],
        "every 10 steps + on_signal": rows["trace, every 10 + on_signal"],
        "every 10 steps + auto (measuring)": rows["trace, every 10 + auto"],
        "every step, no folder": rows["trace, check every step, no folder"],
    }
    costs = {name: ns - off for name, ns in goal_rows.items()}
    for name, cost in costs.items():
        print(f"{name:<36} {cost:>8.1f} {cost / timer:>25.2f}x")
    default = ["every 10 steps, no folder (default)", "every 10 steps, folder unchanged"]
    worst = max(costs[name] for name in default)
    signal_cost = costs["every 10 steps + on_signal"]
    met = max(worst, signal_cost) <= timer
    print(
        f"\ntrigger check (default interval) vs unsampled timer step(): {worst / timer:.2f}x, "
        f"with on_signal {signal_cost / timer:.2f}x (goal <= 1x): "
        + ("goal met" if met else "goal NOT met")
    )
    flag = rows["trace, every 10 + on_signal"] - rows["trace, check every 10, no folder"]
    print(
        f"on_signal's flag check alone: {flag:.1f} ns per step() (within the noise when near 0); "
        f"checking every step instead: {costs['every step, no folder'] / timer:.2f}x; "
        f"one poll(): {rows['poll(), no folder']:.0f} ns without the folder, "
        f"{rows['poll(), folder unchanged']:.0f} ns with it"
    )
    auto = rows["trace, every 10 + auto"] - rows["trace, check every 10, no folder"]
    print(
        f"trace.auto's step-time watch alone: {auto:.1f} ns per step(), "
        f"{auto / timer:.2f}x the unsampled timer step()"
    )


if __name__ == "__main__":
    main()
