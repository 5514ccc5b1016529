"""What step() and phase() cost on a rank that does not profile, next to doing nothing.

Prints nanoseconds per call and ratios against `contextlib.nullcontext()` and an empty
method call, measured side by side in one run (absolute numbers mean little here).
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import timeit

import rankscope

N = 200_000
REPEATS = 7


def _best_ns(stmt: str, env: dict[str, object]) -> float:
    runs = timeit.repeat(stmt, globals=env, number=N, repeat=REPEATS)
    return statistics.median(runs) / N * 1e9


class _Empty:
    def step(self) -> None:
        return None


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = rankscope.ProfileConfig(
            output_dir=tmp, trace=rankscope.TraceConfig(enable=True, ranks="0")
        )
        unselected = rankscope.Profiler(config, rank=1, world_size=2)
        disabled = rankscope.Profiler(rankscope.ProfileConfig(output_dir=tmp), rank=0, world_size=1)
        env: dict[str, object] = {
            "nullcontext": contextlib.nullcontext,
            "empty": _Empty(),
            "unselected": unselected,
            "disabled": disabled,
        }
        unselected.start()
        disabled.start()
        rows = {
            "empty method call": _best_ns("empty.step()", env),
            "with nullcontext()": _best_ns("with nullcontext(): pass", env),
            "unselected step()": _best_ns("unselected.step()", env),
            "disabled step()": _best_ns("disabled.step()", env),
            "unselected with phase()": _best_ns("with unselected.phase('forward'): pass", env),
            "disabled with phase()": _best_ns("with disabled.phase('forward'): pass", env),
        }
        unselected.stop()
        disabled.stop()
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


if __name__ == "__main__":
    main()
