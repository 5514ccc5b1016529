"""Merge speed and memory: 8 rank traces of 20 MB of JSON each into one timeline.

Goal (issue 4): at least 50 MB/s of input JSON, in memory that does not grow with the
inputs. Each run is a fresh process that reports its wall time and peak RSS (its own,
and its largest worker's); the floor is a process that only streams the same inputs
with scan_trace, doing nothing with the events. Every rank's clock starts at its own
baseTimeNanoseconds, so every ts is moved: the merge's slowest path. The traces are
generated once (rankscope.testing._synthetic) and cached in bench/.results/merge.

    python bench/_merge_bench.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / ".results" / "merge"
RANKS = 8
BASE_NS = 1_790_000_000_000_000_000

# Imports first, then times the work alone; prints wall time, peak RSS and bytes read.
_CHILD = """
import json, resource, sys, time
from rankscope.analysis.merge import merge_traces
from rankscope.traces._stream import scan_trace
what, paths = sys.argv[1], sys.argv[2:]
t0 = time.perf_counter()
if what == "floor":
    for path in paths:
        scan_trace(path, lambda event: None)
    json_bytes = None
else:
    json_bytes = merge_traces(paths, what).json_bytes
wall = time.perf_counter() - t0
print(json.dumps({
    "wall": wall,
    "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "workers_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    "json_bytes": json_bytes,
}))
"""


def _traces(size_mb: int) -> list[Path]:
    """Generated rank traces (gzipped), each starting its clock 0.25 s after the last."""
    from rankscope.testing._synthetic_traces import write_trace

    folder = RESULTS / f"{RANKS}x{size_mb}mb"
    paths = [folder / f"rank-{rank:05d}.pt.trace.json.gz" for rank in range(RANKS)]
    for rank, path in enumerate(paths):
        if path.exists():
            continue
        print(f"  generating {path.name} ({size_mb} MB, cached in {folder}) ...", flush=True)
        partial = path.with_name(f".partial-{path.name}")  # a cut-off run leaves no bad cache
        write_trace(
            partial,
            rank=rank,
            world_size=RANKS,
            size_bytes=size_mb << 20,
            base_time_ns=BASE_NS + rank * 250_000_123,
            seed=rank,
            compact=False,
        )
        os.replace(partial, path)
    return paths


def _measure(what: str, paths: list[Path]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, what, *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed: {done.stderr.strip()[-2000:]}")
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def run(quick: bool = False) -> dict[str, float]:
    """Merge the rank traces (best of 3, 1 when quick) and print the figures against the floor."""
    size_mb, rounds = (2, 1) if quick else (20, 3)
    paths = _traces(size_mb)
    output = RESULTS / "merged.pt.trace.json.gz"
    floors, merges = [], []
    try:
        for _ in range(rounds):  # interleaved, so that a busy moment hits both alike
            floors.append(_measure("floor", paths))
            merges.append(_measure(str(output), paths))
            output_mb = output.stat().st_size / 1e6
            output.unlink()
    finally:
        output.unlink(missing_ok=True)
    floor = min(floors, key=lambda m: m["wall"])
    merge = min(merges, key=lambda m: m["wall"])
    input_mb = merge["json_bytes"] / 1e6
    stored_mb = sum(p.stat().st_size for p in paths) / 1e6
    floor_rss = max(m["rss_mb"] for m in floors)
    main_rss = max(m["rss_mb"] for m in merges)
    worker_rss = max(m["workers_rss_mb"] for m in merges)
    figures = {
        "input_mb": input_mb,
        "seconds": merge["wall"],
        "mb_per_s": input_mb / merge["wall"],
        "floor_seconds": floor["wall"],
        "floor_mb_per_s": input_mb / floor["wall"],
        "peak_rss_mb": main_rss,
        "worker_peak_rss_mb": worker_rss,
        "floor_peak_rss_mb": floor_rss,
        "output_mb": output_mb,
    }
    print(
        f"-- merge {RANKS} traces x {size_mb} MB: {input_mb:.1f} MB of JSON "
        f"({stored_mb:.1f} MB gzipped), clocks apart; best of {rounds}, {os.cpu_count()} cores"
    )
    workers = f"{worker_rss:.0f} MB (largest worker)" if worker_rss else "no workers"
    print(
        f"    floor (scan_trace only)  {floor['wall']:6.2f} s  "
        f"{figures['floor_mb_per_s']:6.1f} MB/s   peak RSS {floor_rss:5.0f} MB"
    )
    print(
        f"    rankscope merge          {merge['wall']:6.2f} s  {figures['mb_per_s']:6.1f} MB/s"
        f"   peak RSS {main_rss:5.0f} MB (writer), {workers}   -> {output_mb:.1f} MB gzipped"
    )
    goal = "goal >= 50" if not quick else "a smoke run: the goal >= 50 is for 8 x 20 MB"
    print(
        f"    merge: {figures['mb_per_s']:.1f} MB/s ({goal}); "
        f"{merge['wall'] / floor['wall']:.2f}x the floor's time; peak RSS per process "
        f"{max(main_rss, worker_rss) / floor_rss:.2f}x the floor's"
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small inputs (a smoke test)")
    run(quick=parser.parse_args().quick)


if __name__ == "__main__":
    main()
