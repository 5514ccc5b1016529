"""Which clock each phase is read on: the one that measures the phase's work.

On a GPU the host's time in a phase is mostly the time it took to launch the phase's
kernels: a rank whose GPU is slower (a throttled or failing part) launches as fast as
the others, and on host time it is not seen at all; DDP's all-reduce waits on the GPU,
so the ranks that wait for a slow one wait on device time too. The device time of a
phase (CUDA events around it, timing/_clock.py) measures what the GPU did there. Where
the host is the work (a data loader, a host-side sampler), the GPU's events are passed
back to back while it still runs the previous step: device time there is near zero,
and host time measures the work.

A phase that waits on the GPU (DDP's wait for its all-reduce, a loss.item(), a
synchronize) holds the GPU's time in its host time too, and more: host time there is
the longer, yet it says little, since the rank that is slow on its GPU waits there for
its own kernels as long as the others wait for it. "The longer clock" read such a
backward on host time and saw every rank alike (a real H200 run). So "auto" reads a
phase on device time wherever its GPU is busy through a real part of it: its records
carry device times, and its device time is at least half its host time (the medians
over the records that have both; rundir/_clocks.py, which the live figures read by too). Host time is kept where the GPU passed the
phase's two marks back to back, busy with the step before: a host-side loader or
sampler, and where the two clocks agree at nearly every record (the GPU idle in the
phase, or a job that runs on the host): the same figure, with timestamps that say when
each rank arrived. A run without device times (CPU-only) is read on host time
throughout: the same figures as `--time host`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from ...rundir._clocks import on_device

__all__ = ["CLOCKS", "COVERED", "choose_clock", "clock_words", "same_clocks"]

CLOCKS = ("host", "device")

COVERED = 0.9
"""The share of a phase's records that must carry a device time for auto to read the
phase on it (a phase timed on some ranks' GPUs only is compared on host time)."""

AGREE = 0.1
"""Device and host times within this share of each other agree: where they do at nearly
every record (`COVERED`), the phase is read on host time, the same figure with arrivals."""

Floats = npt.NDArray[np.float64]


def choose_clock(time: str, device: Floats, host: Floats) -> str:
    """The clock a phase is read on, given the basis asked for (auto, host, device) and
    its records' device and host times in ms (device NaN where a record has none)."""
    if time != "auto":
        return time
    timed = np.isfinite(device) & np.isfinite(host)
    count = int(timed.sum())
    if count == 0 or count < COVERED * len(device):
        return "host"
    d, h = device[timed], host[timed]
    if np.mean(np.abs(d - h) <= AGREE * h) >= COVERED:
        # Both clocks say the same (the GPU idles, or the job runs on the host): host
        # time, whose timestamps tell when each rank arrived.
        return "host"
    return "device" if on_device(float(np.median(d)), float(np.median(h))) else "host"


def clock_words(clocks: Mapping[str, str], untimed: Sequence[str] = ()) -> str:
    """The clocks as one phrase: "host time", or "device time; host time for data" where
    phases differ (the fewer named), and the phases asked on device time that have none."""
    read = {clock: [p for p, c in clocks.items() if c == clock] for clock in CLOCKS}
    used = [clock for clock in CLOCKS if read[clock]]
    if not used:
        said = "host time"
    elif len(used) == 1:
        said = f"{used[0]} time"
    else:
        most, fewer = sorted(used, key=lambda clock: (-len(read[clock]), clock))
        said = f"{most} time; {fewer} time for {', '.join(read[fewer])}"
    if untimed:
        said += f"; no device times for {', '.join(untimed)}"
    return said


def same_clocks(
    phases: Sequence[str], a: Mapping[str, str], b: Mapping[str, str]
) -> tuple[list[str], list[str]]:
    """The phases read on one clock in both runs, and a note naming the others: a launch
    time against a GPU's time is no change, so those are not compared."""
    apart = [p for p in phases if a[p] != b[p]]
    if not apart:
        return list(phases), []
    said = ", ".join(f"{p} ({a[p]} time in A, {b[p]} in B)" for p in apart)
    note = f"read on different clocks, so not compared: {said}; --time host or --time device reads both on one"
    return [p for p in phases if p not in apart], [note]
