"""What a window's stop pays on a gloo process to let gloo's workers end their ranges
(capture/_settle.py), beside what the stop itself costs.

One gloo rank (a group of one) times, interleaved in one run:

- settle: `settle_gloo_workers` with the process's other threads idle, then beside a thread
  that keeps a core busy in torch (without the GIL), then beside one that holds the GIL in
  Python; the last two wait for the cap (SETTLE_S), which is what the first must stay far
  under;
- stop: one torch.profiler window of the same tiny step ended by `stop()` (its export not
  counted), the cost the settle is added to.

Prints medians and their ratios to the stop: absolute times mean little on a small,
shared machine.

    python bench/window_settle.py [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # Kineto's start/stop lines, once a window

import torch
import torch.distributed as dist

from rankscope.capture._settle import SETTLE_S, settle_gloo_workers


def _timed(call: Callable[[], None], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


def _beside(work: Callable[[threading.Event], None], repeats: int) -> float:
    done = threading.Event()
    thread = threading.Thread(target=work, args=(done,), daemon=True)
    thread.start()
    time.sleep(0.05)
    try:
        return _timed(lambda: settle_gloo_workers(torch), repeats)
    finally:
        done.set()
        thread.join()


def _torch_busy(done: threading.Event) -> None:
    a = torch.randn(256, 256)
    while not done.is_set():
        a @ a


def _python_busy(done: threading.Event) -> None:
    while not done.is_set():
        sum(range(1000))


def _window_stop() -> None:
    x = torch.randn(64, 64)
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    prof.start()
    for _ in range(20):
        x = torch.tanh(x @ x)
    began = time.perf_counter()
    prof.stop()
    _STOPS.append(time.perf_counter() - began)


_STOPS: list[float] = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    with tempfile.NamedTemporaryFile() as rendezvous:
        dist.init_process_group(
            "gloo", init_method=f"file://{rendezvous.name}", rank=0, world_size=1
        )
        torch.set_num_threads(1)
        for _ in range(args.repeats):
            _window_stop()
        stop = statistics.median(_STOPS) * 1e3
        idle = _timed(lambda: settle_gloo_workers(torch), args.repeats)
        torch_busy = _beside(_torch_busy, max(3, args.repeats // 5))
        python_busy = _beside(_python_busy, max(3, args.repeats // 5))
        dist.destroy_process_group()
    print(f"torch.profiler stop() of a tiny window: {stop:.2f} ms (median of {args.repeats})")
    print(f"settle, other threads idle:             {idle:.2f} ms = {idle / stop:.2f}x the stop")
    print(
        f"settle, a thread busy in torch:         {torch_busy:.2f} ms (cap {SETTLE_S * 1e3:.0f} ms)"
    )
    print(
        f"settle, a thread holding the GIL:       {python_busy:.2f} ms (cap {SETTLE_S * 1e3:.0f} ms)"
    )


if __name__ == "__main__":
    main()
