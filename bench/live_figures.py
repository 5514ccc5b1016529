"""What rankscope's figures for a trainer's logs cost, at 1024 simulated ranks.

Two figures, measured side by side in one run:

- the log call: nanoseconds per `metrics()` on the training thread (what a logging step
  pays), next to a plain `dict(figures)` of the same dict: the goal is a dictionary copy;
- the reader: milliseconds per read of the run directory by the background thread
  (watch/_peers.py), with 1024 ranks' timings files and heartbeats, each rank having
  appended one flush since the read before: with the timer's defaults (every_n_steps=10,
  flush_every_n_steps=10) a flush holds one sampled step of 5 phases; timing every step,
  ten. And again when nothing changed; each as a share of one core at the reader's
  interval.

The ranks' files are written the way the timer writes them (timing/_record.py) into a
temporary run directory. Prints figures and ratios; absolute times mean little on a
shared machine.

    python bench/live_figures.py [--quick] [--ranks N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import timeit
from pathlib import Path

from rankscope.config._ranks import RankInfo
from rankscope.rundir._attempt import current_attempt
from rankscope.rundir._layout import live_path, timing_path
from rankscope.timing._record import STEP_PHASE, Span, format_attempt, format_record
from rankscope.watch._peers import PACE, REFRESH_S, PeerView

PHASES = (
    ("data", "data"),
    ("forward", "compute"),
    ("backward", "compute"),
    ("allreduce", "comm"),
    ("optimizer", "compute"),
)
FLUSH = 10  # steps between two writes of the default timer


def _flush(rank: int, first: int, start_ns: int, every: int) -> str:
    """One rank's records of one flush (FLUSH steps, one in `every` sampled), as the timer
    writes them."""
    lines = [format_attempt(rank, current_attempt().to_dict(), "host-0")]
    for step in range(first, first + FLUSH, every):
        for phase, kind in (*PHASES, (STEP_PHASE, STEP_PHASE)):
            span = Span(step, phase, kind, None, 0, None)
            span.start_ns = start_ns + step * 10**8
            span.cpu_ns = (3 + rank % 7) * 10**6
            lines.append(format_record(rank, span, None, 0))
    return "".join(lines)


def _append(run: Path, ranks: int, first: int, every: int) -> None:
    start = current_attempt().started_ns
    for rank in range(ranks):
        with open(timing_path(run, rank), "a", encoding="utf-8") as file:
            file.write(_flush(rank, first, start, every))


def _beats(run: Path, ranks: int) -> None:
    now = time.time_ns()
    for rank in range(ranks):
        beat = {"v": 1, "rank": rank, "written_ns": now, "state": "running", "hang": None}
        path = live_path(run, rank)
        path.write_text(json.dumps(beat, indent=1), encoding="utf-8")


def _ms(fn: object, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    parser.add_argument("--ranks", type=int, default=1024)
    opts = parser.parse_args()
    ranks, repeat = opts.ranks, 3 if opts.quick else 10
    rows: dict[str, float] = {}
    for every in (10, 1):
        with tempfile.TemporaryDirectory() as tmp:
            run = Path(tmp)
            timing_path(run, 0).parent.mkdir()
            live_path(run, 0).parent.mkdir()
            _beats(run, ranks)
            _append(run, ranks, 0, every)
            view = PeerView(str(run), RankInfo(0, 0, ranks, 8, "host-0"))
            rows[f"first {every}"] = _ms(view.refresh, 1)
            read = []
            for flush in range(1, repeat + 1):
                _append(run, ranks, flush * FLUSH, every)
                read.append(_ms(view.refresh, 1))
            rows[f"new {every}"] = statistics.median(read)
            rows[f"idle {every}"] = _ms(view.refresh, repeat)
            figures = view.metrics()
            assert figures["rankscope/ranks/compared"] == ranks, figures
            view.metrics()  # the second call: across-rank figures only, the usual case
            env = {"view": view, "figures": dict(view._latest[0])}
            number = 2000 if opts.quick else 20000
            call = min(timeit.repeat("view.metrics()", globals=env, number=number, repeat=5))
            copy = min(timeit.repeat("dict(figures)", globals=env, number=number, repeat=5))
            rows[f"call {every}"], rows[f"copy {every}"] = call / number * 1e9, copy / number * 1e9
    call_ns, copy_ns = rows["call 10"], rows["copy 10"]
    print(f"{ranks} ranks, {len(figures)} figures, the reader every {REFRESH_S:.0f} s")
    print(f"{'what':<58} {'figure':>10}")
    print(f"{'metrics() on the training thread':<58} {call_ns:>7.0f} ns")
    print(f"{'dict(figures), the same dict':<58} {copy_ns:>7.0f} ns")
    for every, said in ((10, "the timer's defaults"), (1, "every step timed")):
        for key, what in (("first", "the first read"), ("new", "a flush"), ("idle", "nothing new")):
            label = f"a read, {said}: {what}"
            print(f"{label:<58} {rows[f'{key} {every}']:>7.1f} ms")
    print(f"\nmetrics() vs a dict copy: {call_ns / copy_ns:.2f}x (goal: a dictionary copy)")
    for every, said in ((10, "the timer's defaults"), (1, "every step timed")):
        new_ms = rows[f"new {every}"]
        interval = max(REFRESH_S, PACE * new_ms / 1e3)  # as the reader paces itself
        print(
            f"the reader at {ranks} ranks, {said}: {new_ms:.1f} ms a read, one every "
            f"{interval:.1f} s: {new_ms / (interval * 1e3):.1%} of one core"
        )


if __name__ == "__main__":
    main()
