"""What torch's Flight Recorder costs a collective-heavy job: a gloo loop of small
all-reduces (the worst case: the buffer's bookkeeping against the least work per call),
run with the buffer off (TORCH_FR_BUFFER_SIZE=0), at torch's default (2,000 entries) and
larger, side by side in one run, the settings taken in turn round after round (this
machine is noisy). Printed: microseconds per all-reduce, the ratio against the buffer
off, and what a dump holds and weighs (what rankscope's watchdog writes on a hang).

    python bench/flight_recorder.py [--ranks 2] [--calls 3000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

_SETTINGS = {"off": "0", "default (2000)": None, "20000": "20000"}


def _loop(  # noqa: PLR0917 - torch.multiprocessing.spawn passes them by position
    rank: int, world: int, out: str, size: str | None, calls: int, port: int
) -> None:
    if size is None:
        os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
    else:
        os.environ["TORCH_FR_BUFFER_SIZE"] = size
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    x = torch.ones(16)
    for _ in range(200):  # warm-up
        dist.all_reduce(x)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(x)
    elapsed = time.perf_counter() - start
    dump = bytes(torch._C._distributed_c10d._dump_fr_trace())
    entries = len(pickle.loads(dump).get("entries", []))
    if rank == 0:
        Path(out).write_text(f"{elapsed} {entries} {len(dump)}")
    dist.destroy_process_group()


def _one(setting: str, world: int, calls: int, port: int) -> tuple[float, int, int]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result")
        mp.spawn(_loop, args=(world, out, _SETTINGS[setting], calls, port), nprocs=world)
        elapsed, entries, size = Path(out).read_text().split()
    return float(elapsed) / calls * 1e6, int(entries), int(size)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    times: dict[str, list[float]] = {s: [] for s in _SETTINGS}
    held: dict[str, tuple[int, int]] = {}
    port = 29600
    for _ in range(args.rounds):
        for setting in _SETTINGS:
            port += 1
            us, entries, size = _one(setting, args.ranks, args.calls, port)
            times[setting].append(us)
            held[setting] = (entries, size)
    base = statistics.median(times["off"])
    print(
        f"gloo all_reduce of 16 floats, {args.ranks} ranks, {args.calls} calls, "
        f"median of {args.rounds} rounds taken in turn"
    )
    print(f"{'buffer':>16} {'us/call':>9} {'vs off':>7} {'dump entries':>13} {'dump bytes':>11}")
    for setting, values in times.items():
        median = statistics.median(values)
        entries, size = held[setting]
        print(f"{setting:>16} {median:9.1f} {median / base:6.3f}x {entries:13d} {size:11d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
