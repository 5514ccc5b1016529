"""What step() and phase() cost on a rank that does not profile, next to doing nothing.

Prints nanoseconds per call and ratios against `contextlib.nullcontext()` and an empty
method call, measured side by side in one run (absolute numbers mean little here).

    python bench/unselected_cost.py [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import timeit

import rankscope

FULL = (200_000, 7)  # calls a repeat, repeats
QUICK = (20_000, 3)


def _best_ns(stmt: str, env: dict[str, object], sizes: tuple[int, int]) -> float:
    number, repeat = sizes
    runs = timeit.repeat(stmt, globals=env, number=number, repeat=repeat)
    return statistics.median(runs) / number * 1e9


class _Empty:
    def step(self) -> None:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (a smoke test)")
    sizes = QUICK if parser.parse_args().quick else FULL
    with tempfile.TemporaryDirectory() as tmp:
        trace = rankscope.TraceConfig(enable=True, ranks="0")
        deaf = rankscope.TraceConfig(enable=True, ranks="0", trigger_check_every_n_steps=0)
        timer = rankscope.TimerConfig(enable=True, every_n_steps=1_000_000_000, start_step=1)
        quiet = rankscope.HangConfig(enable=False)
        profilers = {
            # Outside trace.ranks, listening for triggers (the default): an idle capture.
            "listening": rankscope.Profiler(
                rankscope.ProfileConfig(output_dir=tmp, trace=trace), rank=1, world_size=2
            ),
            # Outside trace.ranks with trigger checks off: nothing can ask it for a window.
            "unselected": rankscope.Profiler(
                rankscope.ProfileConfig(output_dir=tmp, trace=deaf), rank=1, world_size=2
            ),
            "disabled": rankscope.Profiler(
                rankscope.ProfileConfig(output_dir=tmp), rank=0, world_size=1
            ),
            # The phase timer on a step it does not sample: the always-on path (with the
            # heartbeat, on by default, and without it: what the heartbeat adds).
            "timer": rankscope.Profiler(
                rankscope.ProfileConfig(output_dir=f"{tmp}/timer", timer=timer),
                rank=0,
                world_size=1,
            ),
            "timer_nobeat": rankscope.Profiler(
                rankscope.ProfileConfig(output_dir=f"{tmp}/nobeat", timer=timer, hang=quiet),
                rank=0,
                world_size=1,
            ),
        }
        env: dict[str, object] = {
            "nullcontext": contextlib.nullcontext,
            "empty": _Empty(),
            **profilers,
        }
        for prof in profilers.values():
            prof.start()
        rows = {
            "empty method call": _best_ns("empty.step()", env, sizes),
            "with nullcontext()": _best_ns("with nullcontext(): pass", env, sizes),
        }
        for name, prof in profilers.items():
            rows[f"{name} step()"] = _best_ns(f"{name}.step()", env, sizes)
            rows[f"{name} with phase()"] = _best_ns(
                f"with {name}.phase('forward'): pass", env, sizes
            )
            if name == "timer":
                # Its heartbeat listens on this thread: stopped, the next one runs without.
                prof.stop()
        for prof in profilers.values():
            prof.stop()
    base_call = rows["empty method call"]
    base_ctx = rows["with nullcontext()"]
    print(f"{'what':<26} {'ns/call':>8} {'vs empty call':>14} {'vs nullcontext':>15}")
    for name, ns in rows.items():
        print(f"{name:<26} {ns:>8.1f} {ns / base_call:>13.2f}x {ns / base_ctx:>14.2f}x")
    print(
        f"\nunselected phase() vs nullcontext(): {rows['unselected with phase()'] / base_ctx:.2f}x "
        "(goal <= 2x)"
    )
    print(
        f"unselected step() vs an empty method call: {rows['unselected step()'] / base_call:.2f}x "
        "(goal <= 2x: an attribute check)"
    )
    # Issue 6's goal is on the trigger check itself (bench/trigger_check.py); these say what
    # a rank that listens pays in all, next to the always-on timer's unsampled path.
    print(
        "listening step() vs an unsampled timer step(): "
        f"{rows['listening step()'] / rows['timer step()']:.2f}x (its check alone: "
        "bench/trigger_check.py)"
    )
    print(
        "listening phase() vs an unsampled timer phase(): "
        f"{rows['listening with phase()'] / rows['timer with phase()']:.2f}x"
    )
    for what, calls in (("step()", 1), ("with phase()", 2)):  # a phase: enter and exit
        extra = rows[f"timer {what}"] - rows[f"timer_nobeat {what}"]
        print(
            f"the heartbeat's share of an unsampled timer {what}: {extra:+.1f} ns, "
            f"{extra / calls:+.1f} ns a call (goal <= 100 ns a call: memory only)"
        )


if __name__ == "__main__":
    main()
